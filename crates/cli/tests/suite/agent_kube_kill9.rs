//! kill -9 of an agent with live discovery at deterministic moments of start-up and while it
//! runs: BE (the BestEffort parent) never runs unconfined between agents, and the last agent's
//! SIGTERM restores the parent and removes only what agents made (see `agent_kube_live.rs` for
//! the stand-in and the groups).
#![cfg(feature = "kube")]

use crate::support;

use std::sync::mpsc;
use std::time::Duration;

use headroom_host::{Cgroups, Controller, LinuxHost};
use headroom_kube::stand_in::StandIn;
use headroom_types::GroupPath;
use serde_json::{json, Value};
use support::kube_live::*;
use support::{sigterm_and_wait, status_json as status, wait_exit};

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
