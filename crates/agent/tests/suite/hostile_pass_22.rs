//! Hostile pass 22 (issue 42): an agent's restart launched a second copy of the `[lc]
//! command` beside the one the agent before it had launched and left running (an LC is never
//! stopped: a kill -9, `on_exit = "freeze"`), one more at every restart.

use crate::live;

use std::time::Duration;

use live::marked::MarkedGroup as Guard;

const ONE_LC: &str = "a_restart_takes_the_lc_command_left_running_instead_of_a_second";

/// Agent one launches the LC command (`sleep <marker>`) in the LC group and exits with
/// `freeze`, leaving it running there (as a kill -9 does); agent two, on the same config and
/// state, must take it: one process runs the command, not two.
#[test]
fn a_restart_takes_the_lc_command_left_running_instead_of_a_second() {
    let Some(guard) = Guard::setup(ONE_LC, "hp22", 2, "one-lc", 22) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let top = &guard.top;
    let command = vec!["sleep".to_string(), guard.marker.clone()];
    let text = |on_exit: &str| {
        live::agent_config(
            &format!("{top}/lc"),
            &format!("{top}/be"),
            &format!("command = [\"sleep\", \"{}\"]", guard.marker),
            &dir.path().join("state.json"),
            &dir.path().join("ctl.sock"),
        )
        .replace("on_exit = \"restore\"", &format!("on_exit = \"{on_exit}\""))
    };
    let copies = || headroom_host::pids::running(std::path::Path::new("/"), &command);
    let first = match live::start_agent(&text("freeze"), Duration::from_millis(1200)) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {ONE_LC}: {e}"),
    };
    first
        .join()
        .unwrap()
        .expect("the first agent ran and froze");
    let left = copies();
    assert_eq!(left.len(), 1, "the first agent's LC command runs: {left:?}");
    let second = live::start_agent(&text("restore"), Duration::from_millis(1200))
        .expect("the second agent starts on the first's state");
    let during = copies();
    second
        .join()
        .unwrap()
        .expect("the second agent ran and restored");
    assert_eq!(
        during, left,
        "the restart launched the LC command again beside the one left running"
    );
}
