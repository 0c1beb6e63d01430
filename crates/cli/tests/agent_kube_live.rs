//! The agent with `[kubernetes] discover = true` against a stand-in API server on 127.0.0.1
//! (no cluster runs here), `sleep` processes standing in for pods in real cgroups of kubelet's
//! cgroupfs layout (root + writable v1 cgroups; skips otherwise, and when a `kubepods` group
//! exists already: a real kubelet's is not ours to touch). A pod listed at start is an LC in
//! `ctl status`; a pod with `headroom.io/slo-p99-us: "fast"` is refused by key while the others
//! stay protected; a pod with only a TCP `containerPort` is measured on it, and one with no port
//! at all is listed as unmeasured with BE held for it, the reason in `be_held_off`; a pod added
//! later becomes an LC; a pod deleted (its group removed too) leaves and the agent goes on;
//! SIGTERM restores and removes only what the agent made; the decision log, with the set's
//! changes in it, replays exactly.
#![cfg(feature = "kube")]

use headroom_kube::stand_in;

mod support;

use std::path::Path;
use std::process::Child;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use headroom_host::{Cgroups, Controller, LinuxHost};
use headroom_types::GroupPath;
use serde_json::{json, Value};
use stand_in::{with_ports, StandIn};
use support::{sigterm_and_wait, status_json as status, wait_exit};

const UID_A: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
const UID_B: &str = "bbbbbbbb-0000-4000-8000-00000000000b";
const UID_BAD: &str = "cccccccc-0000-4000-8000-00000000000c";
const UID_PORTS: &str = "dddddddd-0000-4000-8000-00000000000d";
/// shop/ports' declared TCP containerPort (no pod serves it: the sensor only watches it).
const TCP_PORT: u16 = 47311;

fn pod(name: &str, uid: &str, slo: &str, rv: u32) -> Value {
    let slo = json!({"headroom.io/slo-p99-us": slo});
    stand_in::pod(name, uid, "node-a", "Running", "Burstable", slo, rv)
}

/// A pod whose one container declares `ports` (`spec.containers[0].ports`).
fn pod_with_ports(name: &str, uid: &str, slo: &str, rv: u32, ports: Value) -> Value {
    with_ports(pod(name, uid, slo, rv), ports)
}

/// The test's groups (removed deepest first) and processes.
struct Guard {
    cgroups: Cgroups,
    groups: Vec<GroupPath>,
    children: Vec<Child>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // A frozen process dies only once thawed (an agent killed with BE frozen).
        for g in &self.groups {
            if self.cgroups.exists(g) {
                let _ = self.cgroups.thaw(g);
            }
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for g in self.groups.iter().rev() {
            for _ in 0..50 {
                if !self.cgroups.exists(g) || self.cgroups.remove(g).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn group(s: &str) -> GroupPath {
    GroupPath::new(s).unwrap()
}

/// Kubelet's groups of pod `a` (`kubepods/burstable/pod<UID_A>`, a sleeper in it) made for the
/// test, and the groups the agent makes (BestEffort, discovery), all removed by the guard; the
/// pod's group.
fn pod_a_group(cgroups: &Cgroups, guard: &mut Guard) -> GroupPath {
    let pa = group(&format!("kubepods/burstable/pod{UID_A}"));
    for g in ["kubepods", "kubepods/burstable"] {
        cgroups.create(&group(g)).unwrap();
        guard.groups.push(group(g));
    }
    cgroups.create(&pa).unwrap();
    guard.groups.push(pa.clone());
    sleeper_in(guard, &pa);
    guard.groups.insert(2, group("kubepods/besteffort"));
    guard.groups.insert(0, group("headroom-discovery"));
    pa
}

/// The stand-in API server listing pod `a` (SLO 500 µs) and an agent discovering it, its
/// config, state, socket and `agent.log` in the returned directory: the server's event sender
/// and the server (both kept until the test ends) and the agent's index in the guard.
fn discovery_agent_on_pod_a(
    guard: &mut Guard,
) -> (mpsc::Sender<Value>, StandIn, tempfile::TempDir, usize) {
    let (tx, rx) = mpsc::channel();
    let server = StandIn::start(vec![pod("a", UID_A, "500", 3)], rx).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kubeconfig = server.kubeconfig(d).unwrap();
    let cfg = write_discovery_config(d, &kubeconfig, "");
    let agent_idx = spawn_agent(guard, &cfg, &d.join("agent.log"), &[]);
    (tx, server, dir, agent_idx)
}

fn sleeper_in(guard: &mut Guard, g: &GroupPath) -> u32 {
    let c = support::sleep_60();
    let pid = c.id();
    guard.cgroups.move_process(g, pid as i32).unwrap();
    guard.children.push(c);
    pid
}

fn wait_for(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    support::within(timeout, Duration::from_millis(50), f)
}

/// A log without its colours' escape sequences.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // `ESC [ … m`
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn lc_names(st: &Value) -> Vec<String> {
    st["lcs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Root, writable cpu/cpuset cgroups and no `kubepods` or `headroom-discovery` group yet (a
/// real kubelet's is not ours to touch): the cgroups, an empty guard, and this file's one-at-a-
/// time lock; `None` after saying SKIP.
fn live_setup(test: &str) -> Option<(Cgroups, std::sync::MutexGuard<'static, ()>, Guard)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP {test}: not root");
        return None;
    }
    let cgroups = match LinuxHost::system().cgroups() {
        Ok(c) if c.backend(Controller::Cpu).is_ok() && c.backend(Controller::Cpuset).is_ok() => c,
        _ => {
            eprintln!("SKIP {test}: no writable cpu/cpuset cgroups");
            return None;
        }
    };
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if cgroups.exists(&group("kubepods")) || cgroups.exists(&group("headroom-discovery")) {
        eprintln!("SKIP {test}: a kubepods (or headroom-discovery) group exists already");
        return None;
    }
    let guard = Guard {
        cgroups: cgroups.clone(),
        groups: Vec::new(),
        children: Vec::new(),
    };
    Some((cgroups, one, guard))
}

#[test]
fn discovered_pods_come_are_refused_and_go_while_the_agent_runs() {
    let test = "discovered_pods_come_are_refused_and_go_while_the_agent_runs";
    // The lock is released after the guard has removed the groups (drop order).
    let Some((cgroups, _one, mut guard)) = live_setup(test) else {
        return;
    };
    let (pa, pb, pbad, pports) = (
        group(&format!("kubepods/burstable/pod{UID_A}")),
        group(&format!("kubepods/burstable/pod{UID_B}")),
        group(&format!("kubepods/burstable/pod{UID_BAD}")),
        group(&format!("kubepods/burstable/pod{UID_PORTS}")),
    );
    for g in ["kubepods", "kubepods/burstable"] {
        cgroups.create(&group(g)).unwrap();
        guard.groups.push(group(g));
    }
    for g in [&pa, &pb, &pbad, &pports] {
        cgroups.create(g).unwrap();
        guard.groups.push(g.clone());
        sleeper_in(&mut guard, g);
    }
    // Made by the agent (removed on exit), listed so a failed test cleans up too.
    guard.groups.insert(2, group("kubepods/besteffort"));
    guard.groups.insert(0, group("headroom-discovery"));

    let (tx, rx) = mpsc::channel();
    let server = StandIn::start(
        vec![
            pod("a", UID_A, "500", 3),
            pod("bad", UID_BAD, "fast", 4),
            // No latency-port annotation: measured on its TCP containerPort (UDP ignored).
            pod_with_ports(
                "ports",
                UID_PORTS,
                "700",
                5,
                json!([{"containerPort": TCP_PORT}, {"containerPort": 5353, "protocol": "UDP"}]),
            ),
        ],
        rx,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kubeconfig = server.kubeconfig(d).unwrap();
    let cfg = write_discovery_config(d, &kubeconfig, "");
    let log_path = d.join("decisions.jsonl");
    let log_arg = log_path.display().to_string();
    let agent_idx = spawn_agent(&mut guard, &cfg, &d.join("agent.log"), &["--log", &log_arg]);
    let log = || std::fs::read_to_string(d.join("agent.log")).unwrap_or_default();

    // The listed pod is an LC; the bad one refused by key; the others protected.
    let mut st = Value::Null;
    let found = wait_for(Duration::from_secs(30), || {
        st = status(d).unwrap_or(Value::Null);
        lc_names(&st).contains(&"shop/a".to_string())
            && st["be_held_off"]
                .as_str()
                .is_some_and(|h| h.contains("no latency port"))
    });
    assert!(found, "shop/a became an LC; status {st}\nlog:\n{}", log());
    let k = &st["kubernetes"];
    assert_eq!(k["synced"], true, "{st}");
    let refused = k["refused"].as_array().expect("kubernetes.refused");
    assert_eq!(refused.len(), 1, "{st}");
    assert_eq!(refused[0]["pod"], "shop/bad");
    assert_eq!(refused[0]["key"], "headroom.io/slo-p99-us");
    assert_eq!(refused[0]["value"], "fast");
    assert!(!lc_names(&st).contains(&"shop/bad".to_string()), "{st}");
    let a = st["lcs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "shop/a")
        .unwrap()
        .clone();
    assert_eq!(a["slo_us"], 500.0);
    assert_eq!(a["group"], pa.as_str());
    assert!(
        log().contains("shop/bad"),
        "the refusal is logged:\n{}",
        log()
    );

    // shop/ports, with only a containerPort, is an LC measured on it; shop/a, with neither,
    // is an LC too, listed as unmeasured, and BE is held for it with the reason said.
    assert!(lc_names(&st).contains(&"shop/ports".to_string()), "{st}");
    let kube_lc = |st: &Value, name: &str| {
        k["lcs"]
            .as_array()
            .and_then(|a| a.iter().find(|l| l["name"] == name).cloned())
            .unwrap_or_else(|| panic!("{name} in kubernetes.lcs: {st}"))
    };
    let p = kube_lc(&st, "shop/ports");
    assert_eq!(p["container_ports"], json!([TCP_PORT]), "{st}");
    assert!(p.get("latency_port").is_none(), "{st}");
    let unmeasured = k["unmeasured"].as_array().expect("kubernetes.unmeasured");
    assert_eq!(unmeasured.len(), 1, "{st}");
    assert_eq!(unmeasured[0]["pod"], "shop/a");
    assert_eq!(unmeasured[0]["key"], "headroom.io/latency-port");
    assert_eq!(
        unmeasured[0]["reason"],
        "no latency port: annotate headroom.io/latency-port or declare a containerPort"
    );
    let held = st["be_held_off"].as_str().unwrap_or_default().to_string();
    assert!(
        held.contains("shop/a") && held.contains("no latency port") && !held.contains("shop/ports"),
        "be_held_off names the unmeasured pod: {st}"
    );
    assert!(
        plain(&log()).contains(&format!(
            "lc=shop/ports cgroup={pports} target_us=700.0 ports=[{TCP_PORT}]"
        )),
        "shop/ports' sensor ports are logged:\n{}",
        log()
    );

    // A pod added while the agent runs.
    tx.send(json!({"type": "ADDED", "object": pod("b", UID_B, "800", 11)}))
        .unwrap();
    let added = wait_for(Duration::from_secs(20), || {
        st = status(d).unwrap_or(Value::Null);
        lc_names(&st).contains(&"shop/b".to_string())
    });
    assert!(added, "shop/b became an LC; status {st}\nlog:\n{}", log());

    // A pod deleted, its group gone with it: the LC leaves, the agent goes on.
    let a_pid = guard.children[0].id();
    let _ = guard.children[0].kill();
    let _ = guard.children[0].wait();
    assert!(wait_for(Duration::from_secs(5), || cgroups
        .remove(&pa)
        .is_ok()
        || !cgroups.exists(&pa)));
    tx.send(json!({"type": "DELETED", "object": pod("a", UID_A, "500", 12)}))
        .unwrap();
    let gone = wait_for(Duration::from_secs(20), || {
        st = status(d).unwrap_or(Value::Null);
        let n = lc_names(&st);
        !n.contains(&"shop/a".to_string())
            && n.contains(&"shop/b".to_string())
            && n.contains(&"shop/ports".to_string())
    });
    assert!(
        gone,
        "shop/a left (pid {a_pid}); status {st}\nlog:\n{}",
        log()
    );
    assert!(status(d).is_some(), "the agent still answers");

    // SIGTERM: restored; the agent's own groups removed, the pods' left to kubelet.
    let exit = sigterm_and_wait(&mut guard.children[agent_idx]);
    assert!(exit.success(), "agent exit {exit}; log:\n{}", log());
    assert!(!cgroups.exists(&group("kubepods/besteffort")), "{}", log());
    assert!(!cgroups.exists(&group("headroom-discovery")), "{}", log());
    assert!(
        cgroups.exists(&pb) && cgroups.exists(&pbad) && cgroups.exists(&pports),
        "pods' groups left"
    );
    assert!(!d.join("state.json").exists(), "state file removed");

    // The decision log holds the set's changes and replays exactly.
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert!(text.contains("\"event\":\"lc_set\""), "{text}");
    support::assert_replays_exactly(&cfg, &log_path);
}

#[test]
fn a_pod_whose_group_another_agent_holds_is_refused_until_it_lets_go() {
    let test = "a_pod_whose_group_another_agent_holds_is_refused_until_it_lets_go";
    // The lock is released after the guard has removed the groups (drop order).
    let Some((cgroups, _one, mut guard)) = live_setup(test) else {
        return;
    };
    let pa = pod_a_group(&cgroups, &mut guard);

    // Another agent's lock on the pod's group, held by this test.
    let dirs: Vec<std::path::PathBuf> = cgroups
        .group_dirs(&pa)
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    let other = headroom_agent::state::GroupLock::acquire(
        &headroom_agent::state::lock_dir(Path::new("/")),
        &dirs,
        headroom_types::control::LockHolder {
            pid: std::process::id(),
            config: "/etc/other-agent.toml".into(),
            socket: "/run/other.sock".into(),
            state_file: String::new(),
            groups: Vec::new(),
        },
    )
    .expect("the other agent's lock");

    let (_tx, _server, dir, agent_idx) = discovery_agent_on_pod_a(&mut guard);
    let d = dir.path();
    let log = || std::fs::read_to_string(d.join("agent.log")).unwrap_or_default();

    // Refused, naming the holder; not an LC of this agent.
    let mut st = Value::Null;
    let refused = wait_for(Duration::from_secs(30), || {
        st = status(d).unwrap_or(Value::Null);
        st["kubernetes"]["refused"].as_array().is_some_and(|r| {
            r.iter().any(|p| {
                p["pod"] == "shop/a"
                    && p["key"] == "cgroup"
                    && p["reason"]
                        .as_str()
                        .is_some_and(|why| why.contains("/etc/other-agent.toml"))
            })
        })
    });
    assert!(
        refused,
        "shop/a refused while held; status {st}\nlog:\n{}",
        log()
    );
    assert!(!lc_names(&st).contains(&"shop/a".to_string()), "{st}");

    // The other agent lets go: taken on the next retry.
    drop(other);
    let taken = wait_for(Duration::from_secs(15), || {
        st = status(d).unwrap_or(Value::Null);
        lc_names(&st).contains(&"shop/a".to_string())
    });
    assert!(
        taken,
        "shop/a became an LC once free; status {st}\nlog:\n{}",
        log()
    );
    assert!(
        st["kubernetes"]["refused"]
            .as_array()
            .is_none_or(|r| r.is_empty()),
        "{st}"
    );

    let exit = sigterm_and_wait(&mut guard.children[agent_idx]);
    assert!(exit.success(), "agent exit {exit}; log:\n{}", log());
}

/// Another agent's lock on `g` as `acquire_nested` takes it at start: `g`'s directories
/// exclusive, the groups above shared.
fn other_agents_lock(
    cgroups: &Cgroups,
    g: &GroupPath,
) -> Result<headroom_agent::state::GroupLock, headroom_agent::state::StateError> {
    let dirs: Vec<std::path::PathBuf> = cgroups.group_dirs(g).into_iter().map(|(_, d)| d).collect();
    let mut above = Vec::new();
    let mut up = g.parent();
    while let Some(p) = up.filter(|p| !p.is_root()) {
        above.extend(cgroups.group_dirs(&p).into_iter().map(|(_, d)| d));
        up = p.parent();
    }
    headroom_agent::state::GroupLock::acquire_nested(
        &headroom_agent::state::lock_dir(Path::new("/")),
        &dirs,
        &above,
        headroom_types::control::LockHolder {
            pid: std::process::id(),
            config: "/etc/other-agent-hostile3.toml".into(),
            ..Default::default()
        },
    )
}

/// Third hostile pass (issue 42): a discovered pod's group was locked by its exact path only,
/// so another agent naming the pod group's parent (which contains the pod) was not refused.
/// Locked as configured groups are now: the groups above shared.
#[test]
fn another_agent_on_a_parent_or_child_of_a_discovered_pod_group_is_refused() {
    let test = "another_agent_on_a_parent_or_child_of_a_discovered_pod_group_is_refused";
    let Some((cgroups, _one, mut guard)) = live_setup(test) else {
        return;
    };
    pod_a_group(&cgroups, &mut guard);

    let (_tx, _server, dir, agent_idx) = discovery_agent_on_pod_a(&mut guard);
    let d = dir.path();
    let log = || std::fs::read_to_string(d.join("agent.log")).unwrap_or_default();
    let mut st = Value::Null;
    let taken = wait_for(Duration::from_secs(30), || {
        st = status(d).unwrap_or(Value::Null);
        lc_names(&st).contains(&"shop/a".to_string())
    });
    assert!(taken, "shop/a an LC; status {st}\nlog:\n{}", log());

    // The pod group's parent (it contains the pod) and a group inside the pod's.
    let child = group(&format!("kubepods/burstable/pod{UID_A}/hostile3-ctr"));
    for g in [group("kubepods/burstable"), child] {
        let r = other_agents_lock(&cgroups, &g);
        assert!(
            matches!(r, Err(headroom_agent::state::StateError::Held { .. })),
            "another agent on {g} was not refused: {r:?}"
        );
    }
    let exit = sigterm_and_wait(&mut guard.children[agent_idx]);
    assert!(exit.success(), "agent exit {exit}; log:\n{}", log());
}

/// The groups this file's tests make (`kubepods`, `headroom-discovery`) are the same names:
/// one test at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The knobs the agent writes on the BestEffort parent (and may on an LC's group), as read.
fn be_knobs(cg: &Cgroups, be: &GroupPath) -> String {
    format!(
        "cpuset.cpus {:?}, weight {:?}, quota {:?}, freezer {:?}",
        cg.cpuset_cpus(be).map(|c| c.to_string()).ok(),
        cg.cpu_weight(be).ok(),
        cg.cpu_quota(be).ok(),
        cg.freeze_state(be).ok()
    )
}

/// agent_multi_lc's kill -9 check with discovery on: the agent is killed at deterministic
/// "random" moments of start-up (before and after the first pod list) and while running. Once
/// an agent has confined the BestEffort parent (frozen: no LC latency is known here), it stays
/// confined after every later kill: BE never runs unconfined between agents. A final agent
/// takes the state file (originals kept), reuses the `headroom-discovery` holder group an
/// earlier one made, protects the listed pod, and its SIGTERM restores the parent's originals
/// and removes the holder group, leaving the pods' groups to kubelet.
#[test]
fn kill_9_with_discovery_leaves_be_confined_and_the_next_start_cleans_up() {
    let test = "kill_9_with_discovery_leaves_be_confined_and_the_next_start_cleans_up";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP {test}: not root");
        return;
    }
    let cgroups = match LinuxHost::system().cgroups() {
        Ok(c)
            if c.backend(Controller::Cpu).is_ok()
                && c.backend(Controller::Cpuset).is_ok()
                && c.backend(Controller::Freezer).is_ok() =>
        {
            c
        }
        _ => {
            eprintln!("SKIP {test}: no writable cpu/cpuset/freezer cgroups");
            return;
        }
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let holder = group("headroom-discovery");
    if cgroups.exists(&group("kubepods")) || cgroups.exists(&holder) {
        eprintln!("SKIP {test}: a kubepods (or headroom-discovery) group exists already");
        return;
    }
    let mut guard = Guard {
        cgroups: cgroups.clone(),
        groups: Vec::new(),
        children: Vec::new(),
    };
    // kubelet's groups, made by the test: an LC pod, and a BestEffort pod under the parent.
    let be = group("kubepods/besteffort");
    let lc_pod = group(&format!("kubepods/burstable/pod{UID_PORTS}"));
    let be_pod = group(&format!("kubepods/besteffort/pod{UID_A}"));
    guard.groups.push(holder.clone());
    for g in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
        cgroups.create(&group(g)).unwrap();
        guard.groups.push(group(g));
    }
    for g in [&lc_pod, &be_pod] {
        cgroups.create(g).unwrap();
        guard.groups.push(g.clone());
        sleeper_in(&mut guard, g);
    }
    let be_pid = guard.children[1].id();
    let originals = be_knobs(&cgroups, &be);
    let lc_originals = be_knobs(&cgroups, &lc_pod);

    let (_tx, rx) = mpsc::channel();
    let server = StandIn::start(
        vec![pod_with_ports(
            "ports",
            UID_PORTS,
            "700",
            3,
            json!([{"containerPort": TCP_PORT}]),
        )],
        rx,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kubeconfig = server.kubeconfig(d).unwrap();
    let cfg = write_discovery_config(d, &kubeconfig, "metrics = \"\"\n");
    let spawn = |guard: &mut Guard, log: &str| spawn_agent(guard, &cfg, &d.join(log), &[]);
    // Kills at 0-20 ms (start-up, before the holder group or the first list) and at 0.1-2.5 s
    // (the first list taken, the pod an LC, BE held).
    let mut confined_since = None;
    let mut x: u64 = 0x2545_f491;
    for i in 0..10 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let after_ms = if i % 3 == 0 {
            (x >> 33) % 20
        } else {
            100 + (x >> 33) % 2400
        };
        let idx = spawn(&mut guard, &format!("crash{i}.log"));
        std::thread::sleep(Duration::from_millis(after_ms));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(guard.children[idx].id() as i32, libc::SIGKILL) };
        wait_exit(&mut guard.children[idx]);
        let now = be_knobs(&cgroups, &be);
        let frozen = cgroups.freeze_state(&be).ok() != Some(headroom_host::FreezeState::Thawed);
        eprintln!("{test}: round {i}: kill -9 at {after_ms} ms: BestEffort parent {now}");
        if frozen {
            confined_since.get_or_insert(i);
        }
        if let Some(first) = confined_since {
            assert!(
                frozen,
                "round {i} (kill -9 at {after_ms} ms): the BestEffort parent, confined since round \
                 {first}, runs unconfined: {now}; log:\n{}",
                std::fs::read_to_string(d.join(format!("crash{i}.log"))).unwrap_or_default()
            );
        }
        let in_be = std::fs::read_to_string(format!("/proc/{be_pid}/cgroup")).unwrap_or_default();
        assert!(
            in_be.contains(be_pod.as_str()),
            "round {i}: the BestEffort pod left its group: {in_be}"
        );
    }
    assert!(
        confined_since.is_some(),
        "no agent got as far as confining BE in 10 rounds (kills too early?)"
    );

    // The final agent: up, the pod an LC, BE still held; SIGTERM restores the originals.
    let idx = spawn(&mut guard, "final.log");
    let log = || std::fs::read_to_string(d.join("final.log")).unwrap_or_default();
    let mut st = Value::Null;
    let up = wait_for(Duration::from_secs(30), || {
        st = status(d).unwrap_or(Value::Null);
        lc_names(&st).contains(&"shop/ports".to_string())
    });
    assert!(
        up,
        "the final agent protects shop/ports; status {st}\nlog:\n{}",
        log()
    );
    assert!(cgroups.exists(&holder), "the holder group is there");
    assert_ne!(
        cgroups.freeze_state(&be).ok(),
        Some(headroom_host::FreezeState::Thawed),
        "BE held (no latency known): {}; status {st}",
        be_knobs(&cgroups, &be)
    );
    // On v1 the BestEffort pod's own group follows its parent's narrower cpuset (a v1 child
    // must stay within its parent: without that the parent's write is EBUSY, BE on every CPU).
    let all = cgroups.cpuset_cpus(&be_pod).map(|c| c.len()).unwrap_or(0);
    if all > 1 {
        let narrowed = wait_for(Duration::from_secs(10), || {
            let (p, c) = (cgroups.cpuset_cpus(&be), cgroups.cpuset_cpus(&be_pod));
            matches!((p, c), (Ok(p), Ok(c)) if p.len() < all && p == c)
        });
        assert!(
            narrowed,
            "the BestEffort parent narrowed, its pod with it: {} / pod {:?}; log:\n{}",
            be_knobs(&cgroups, &be),
            cgroups.cpuset_cpus(&be_pod).map(|c| c.to_string()),
            plain(&log())
        );
        assert!(!plain(&log()).contains("EBUSY"), "{}", plain(&log()));
    }
    let exit = sigterm_and_wait(&mut guard.children[idx]);
    assert!(exit.success(), "agent exit {exit}; log:\n{}", log());
    assert_eq!(
        be_knobs(&cgroups, &be),
        originals,
        "the BestEffort parent's originals back; log:\n{}",
        log()
    );
    assert_eq!(
        be_knobs(&cgroups, &lc_pod),
        lc_originals,
        "the LC pod's group as kubelet left it; log:\n{}",
        log()
    );
    assert!(
        !cgroups.exists(&holder),
        "the holder group an earlier (killed) agent made is removed; log:\n{}",
        log()
    );
    assert!(
        cgroups.exists(&lc_pod) && cgroups.exists(&be_pod) && cgroups.exists(&be),
        "kubelet's groups left"
    );
    assert!(!d.join("state.json").exists(), "state file removed");
}

/// The agent's config with live discovery on the stand-in (multi, BE = the BestEffort parent,
/// restore on exit), `api_extra` appended to its `[api]` table.
fn write_discovery_config(
    d: &std::path::Path,
    kubeconfig: &std::path::Path,
    api_extra: &str,
) -> std::path::PathBuf {
    let cfg = d.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[kubernetes]
discover = true
node_name = "node-a"
kubeconfig = "{kc}"
cgroup_layout = "cgroupfs"

[[be]]
name = "besteffort-pods"
cgroup = "kubepods/besteffort"

[policy]
kind = "multi"

[safety]
on_exit = "restore"
state_file = "{d}/state.json"

[api]
socket = "{d}/ctl.sock"
{api_extra}"#,
            kc = kubeconfig.display(),
            d = d.display()
        ),
    )
    .unwrap();
    cfg
}

/// Starts `headroom agent --config cfg` with `extra` arguments, its stderr in `stderr_to`; the
/// index of its child in the guard.
fn spawn_agent(guard: &mut Guard, cfg: &Path, stderr_to: &Path, extra: &[&str]) -> usize {
    guard
        .children
        .push(support::spawn_agent(cfg, stderr_to, extra));
    guard.children.len() - 1
}
