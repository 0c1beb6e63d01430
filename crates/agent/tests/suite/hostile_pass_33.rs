//! Hostile pass 33 (issue 42): a SIGTERM that comes while the agent starts.
//!
//! - The agent installed its signal handlers at the end of its start: a SIGTERM (`systemctl
//!   stop`, a rollout) that came while the start moved the LC and froze the BE group killed it
//!   by the default action, without its exit action: the LC left in the agent's group, the BE
//!   group frozen, the groups and the state file left. systemd counts a death by SIGTERM as a
//!   clean stop, so nothing started the agent again to recover them.

use crate::live;

use std::path::PathBuf;
use std::time::{Duration, Instant};

const TERM: &str = "a_sigterm_during_the_start_runs_the_exit_action";

/// In the agent's process: SIGTERM to this process once the start has written its state file
/// (the record it writes before it makes the groups and moves the LC), so the signal lands
/// while the start runs.
fn term_once_the_start_writes(state: PathBuf) {
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if state.exists() {
                // SAFETY: kill(2) on this process's own pid.
                unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    });
}

#[test]
fn a_sigterm_during_the_start_runs_the_exit_action() {
    if let Some(text) = std::env::var_os("HEADROOM_TEST_OWN_PROCESS_CONFIG") {
        let config = headroom_control::config::Config::from_toml_str(&text.to_string_lossy())
            .expect("the test's config");
        term_once_the_start_writes(PathBuf::from(&config.safety.state_file));
    }
    if live::own_process::play_the_agent(true) {
        return;
    }
    if !live::is_root() {
        return eprintln!("SKIP {TERM}: needs root (cgroups)");
    }
    let lc = live::Children::sleepers(1);
    let top = format!("p33term{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("agent.log");
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("pids = [{}]", lc.pid(0)),
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let run_for = Duration::from_secs(6);
    let _groups = live::RemoveOnDrop::new(&top).wait_for_agent(run_for);
    let mut agent =
        live::own_process::spawn(&format!("hostile_pass_33::{TERM}"), &text, run_for, &log);
    let ended = agent.wait().unwrap();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        ended.success(),
        "a SIGTERM during the start ended the agent without its exit action ({ended}): {said}"
    );
    assert!(said.contains("exit action"), "{said}");
    let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|m| m.path().join(&top))
        .filter(|p| p.exists())
        .collect();
    assert!(left.is_empty(), "restore left {left:?}: {said}");
    let freezer = std::fs::read_to_string(format!("/proc/{}/cgroup", lc.pid(0))).unwrap();
    assert!(
        !freezer.contains(&top),
        "the LC was left in the agent's groups: {freezer}"
    );
}
