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

use crate::support;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use headroom_host::Cgroups;
use headroom_types::GroupPath;
use serde_json::{json, Value};
use stand_in::StandIn;
use support::kube_live::*;
use support::{sigterm_and_wait, status_json as status};

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
