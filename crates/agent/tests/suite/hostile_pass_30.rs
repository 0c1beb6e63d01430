//! Hostile pass 30 (issue 42): the control socket's reserved slot against the agent's fd limit.
//!
//! - The reserved slot kept up to 1024 clients whatever the agent's `RLIMIT_NOFILE`; under the
//!   shipped unit's default (1024) a flood of local clients took every fd: the state file, the
//!   sensors and `restore`'s cgroup writes failed with EMFILE, and with a connect left queued
//!   the accepts failed and the clients were kept past their deadline.

use crate::live;

use std::time::{Duration, Instant};

use headroom_agent::publish::control::request;
use headroom_types::control::Request;

const FLOOD: &str = "a_flood_of_ctl_clients_leaves_restore_its_files";

/// The soft fd limit of this process lowered to `n` (the hard one kept).
fn lower_open_files(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit pointers.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim), 0);
        lim.rlim_cur = n.min(lim.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim), 0);
    }
}

#[test]
fn a_flood_of_ctl_clients_leaves_restore_its_files() {
    // The agent's process: the shipped unit's default soft limit.
    if std::env::var_os("HEADROOM_TEST_OWN_PROCESS_CONFIG").is_some() {
        lower_open_files(1024);
    }
    if live::own_process::play_the_agent(true) {
        return;
    }
    if !live::is_root() {
        return eprintln!("SKIP {FLOOD}: needs root (cgroups)");
    }
    // The clients are this process's fds.
    if headroom_host::process::open_files_limit().is_some_and(|n| n < 1400) {
        return eprintln!("SKIP {FLOOD}: this process may open fewer than 1400 files");
    }
    let lc = live::Children::sleepers(1);
    let top = format!("p30fd{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let log = dir.path().join("agent.log");
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("pids = [{}]", lc.pid(0)),
        &dir.path().join("state.json"),
        &sock,
    );
    let run_for = Duration::from_secs(6);
    let _groups = live::RemoveOnDrop::new(&top).wait_for_agent(run_for);
    let mut agent =
        live::own_process::spawn(&format!("hostile_pass_30::{FLOOD}"), &text, run_for, &log);
    let up = live::eventually(Duration::from_secs(5), || {
        request(&sock, &Request::Status).is_ok()
    });
    if !up {
        let _ = agent.kill();
        let _ = agent.wait();
        panic!(
            "the agent does not answer: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    // 1100 local clients that send nothing, held until the agent has ended (its restore run
    // among them): 16 take the slots, the rest land in the reserved one.
    let mut held = Vec::new();
    let end = Instant::now() + Duration::from_secs(3);
    while held.len() < 1100 && Instant::now() < end {
        match headroom_host::net::connect_unix_now(&sock) {
            Ok(s) => held.push(s),
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    let ended = agent.wait().unwrap();
    drop(held);
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(ended.success(), "the agent ({ended}): {said}");
    let emfile: Vec<&str> = said.lines().filter(|l| l.contains("EMFILE")).collect();
    assert!(emfile.is_empty(), "the agent ran out of fds: {emfile:#?}");
    let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .flat_map(|m| ["lc", "be"].map(|leaf| m.path().join(&top).join(leaf)))
        .filter(|p| p.exists())
        .collect();
    assert!(left.is_empty(), "restore left {left:?}: {said}");
}
