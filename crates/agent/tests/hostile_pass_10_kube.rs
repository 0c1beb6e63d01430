//! The tenth hostile pass's defects on the agent's `[kubernetes]` side (issue 42,
//! docs/safety-hostile-pass-10-kube.md). Live: needs root (cgroups) and prints SKIP otherwise;
//! the groups are `p10k-*`, removed (processes killed first) by a guard, also when a test fails.
//! The discovery's sets are sent by the test itself (the binary connects headroom-kube).
//!
//! - a pod recreated under its name (a StatefulSet's `web-0`: a new UID, so a new group) whose
//!   removal the agent did not see (a relist after a watch gap, or both within one tick) kept
//!   its sensor, and its lock, on the old group: the dead group was sampled (an error every
//!   100 ms) for the life of the new pod, and the new group was neither sampled nor locked;
//! - a discovered pod whose latency port (or group) changed had its old sources dropped without
//!   being stopped: each change left a sensor thread running for the agent's life.

#[allow(dead_code)] // not every helper of `live` is used here
#[path = "suite/live/mod.rs"]
mod live;

use std::path::Path;
use std::time::Duration;

use headroom_agent::publish::control::{request, Request};
use headroom_agent::runtime::{Agent, LcEvents};

use live::discovery;
use live::marked::MarkedGroup as Guard;

/// Both tests' agents make and use the one `headroom-discovery` holder group: one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The agent's sensor errors by name (empty when it does not answer).
fn sensor_errors(sock: &Path) -> std::collections::BTreeMap<String, u64> {
    request(sock, &Request::Status)
        .ok()
        .and_then(|r| r.status)
        .map(|s| s.sensor_errors)
        .unwrap_or_default()
}

const RECREATED: &str = "a_pod_recreated_under_its_name_is_sampled_in_its_new_group";

#[test]
fn a_pod_recreated_under_its_name_is_sampled_in_its_new_group() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(guard) = Guard::setup(RECREATED, "p10k", 7, "uid", 1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let old = guard.top.join("podold").unwrap();
    let new = guard.top.join("podnew").unwrap();
    for g in [&old, &new] {
        if let Err(e) = guard.cgroups.create(g) {
            return eprintln!("SKIP {RECREATED}: creating {g}: {e}");
        }
    }
    let (tx, rx) = LcEvents::channel();
    let mut opts = live::options(
        &discovery::config(
            &guard.top,
            &dir.path().join("state.json"),
            &dir.path().join("ctl.sock"),
        ),
        Duration::from_secs(7),
    );
    opts.discovery = Some(rx);
    let agent = match Agent::start(opts) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {RECREATED}: the agent does not start here: {e}"),
    };
    let run = std::thread::spawn(move || agent.run().map(|_| ()));
    let sock = dir.path().join("ctl.sock");
    discovery::send(
        &tx,
        1,
        vec![discovery::pod(
            "shop/web-0",
            "0a0a0a0a-0000-4000-8000-000000000001",
            &old,
            None,
        )],
    );
    let answering = live::eventually(Duration::from_secs(5), || {
        request(&sock, &Request::Status)
            .ok()
            .and_then(|r| r.status)
            .is_some_and(|s| s.lcs.iter().any(|l| l.name == "shop/web-0"))
    });
    // The pod is deleted and made again under its name; the agent sees only the new one.
    let removed = guard.cgroups.remove(&old);
    discovery::send(
        &tx,
        2,
        vec![discovery::pod(
            "shop/web-0",
            "0a0a0a0a-0000-4000-8000-000000000002",
            &new,
            None,
        )],
    );
    std::thread::sleep(Duration::from_millis(1500));
    let before = sensor_errors(&sock);
    std::thread::sleep(Duration::from_millis(1500));
    let after = sensor_errors(&sock);
    let status = request(&sock, &Request::Status).ok().and_then(|r| r.status);
    let result = run.join().expect("the agent's thread");
    let groups: Vec<String> = status
        .map(|s| {
            s.lcs
                .iter()
                .map(|l| format!("{} on {}", l.name, l.group))
                .collect()
        })
        .unwrap_or_default();
    assert!(answering, "the agent took the first set");
    assert!(removed.is_ok(), "removing {old}: {removed:?}");
    assert!(result.is_ok(), "the run: {result:?}");
    // Sampling the old, removed group fails every 100 ms; the new group is there.
    let grew: Vec<(&String, u64, u64)> = after
        .iter()
        .filter(|(k, _)| ["cgroup_cpu_usage", "lc_threads", "lc_memory"].contains(&k.as_str()))
        .map(|(k, v)| (k, before.get(k).copied().unwrap_or(0), *v))
        .filter(|(_, b, a)| a > b)
        .collect();
    assert!(
        grew.is_empty(),
        "the recreated pod's sensor still reads its old group (errors growing: {grew:?}), while \
         ctl status says {groups:?}"
    );
}

const PORTS: &str = "a_pod_whose_latency_port_changes_leaves_no_sensor_thread_behind";

/// The agent's latency sensor threads (kernel sensor and prober), by their names.
fn sensor_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            matches!(comm.trim(), "headroom-klat" | "headroom-probe")
        })
        .count()
}

#[test]
fn a_pod_whose_latency_port_changes_leaves_no_sensor_thread_behind() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(guard) = Guard::setup(PORTS, "p10k", 7, "port", 2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let group = guard.top.join("pod").unwrap();
    if let Err(e) = guard.cgroups.create(&group) {
        return eprintln!("SKIP {PORTS}: creating {group}: {e}");
    }
    let (tx, rx) = LcEvents::channel();
    let mut opts = live::options(
        &discovery::config(
            &guard.top,
            &dir.path().join("state.json"),
            &dir.path().join("ctl.sock"),
        ),
        Duration::from_secs(8),
    );
    opts.discovery = Some(rx);
    let agent = match Agent::start(opts) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {PORTS}: the agent does not start here: {e}"),
    };
    let run = std::thread::spawn(move || agent.run().map(|_| ()));
    let base = sensor_threads();
    let uid = "0a0a0a0a-0000-4000-8000-000000000003";
    discovery::send(
        &tx,
        1,
        vec![discovery::pod("shop/cache-0", uid, &group, Some(31000))],
    );
    let started = live::eventually(Duration::from_secs(5), || sensor_threads() > base);
    let one = sensor_threads().saturating_sub(base);
    // The pod's port annotation changes eight times (a hostile server, or an operator's edits).
    for (i, port) in (31001..31009).enumerate() {
        std::thread::sleep(Duration::from_millis(300));
        discovery::send(
            &tx,
            2 + i as u64,
            vec![discovery::pod("shop/cache-0", uid, &group, Some(port))],
        );
    }
    // The stopped threads end within a tick or two (they are woken).
    let settled = live::eventually(Duration::from_secs(3), || {
        sensor_threads().saturating_sub(base) <= one
    });
    let left = sensor_threads().saturating_sub(base);
    let result = run.join().expect("the agent's thread");
    if !started {
        return eprintln!("SKIP {PORTS}: no latency sensor thread starts here ({result:?})");
    }
    assert!(result.is_ok(), "the run: {result:?}");
    assert!(
        settled,
        "{left} sensor threads after eight port changes, {one} for the one service: the \
         replaced sensors were never stopped"
    );
}
