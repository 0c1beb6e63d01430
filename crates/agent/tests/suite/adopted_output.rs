//! Hostile pass 23's low (issue 42): a BE run as a user, left frozen by `on_exit = "freeze"`
//! and adopted by the next agent, died once thawed if it wrote anything: its fds 1 and 2 were
//! the earlier agent's relay pipe, whose only reader had ended with that agent's process
//! (SIGPIPE), and it was launched again, its work lost. The adopting agent now opens a read
//! end of that same pipe before it thaws BE and relays it as it relays a BE it launched.
//!
//! The agents here run in processes of their own (`live::own_process`): an agent run in a
//! thread of the test process would leave its relay thread reading after its run, where an
//! agent's exit ends it.

use crate::live;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use live::marked::{alive, with_marker, MarkedGroup as Guard};

const TEST: &str = "a_frozen_be_adopted_by_the_next_agent_keeps_writing_its_output";
/// The config on `top`: the LC pid `lc`, one BE as nobody writing a line every 100 ms (its
/// command line holds `marker`), `on_exit`, the state file and socket in `dir`.
fn config(top: &str, lc: u32, marker: &str, on_exit: &str, dir: &Path) -> String {
    let script = format!("i=0; while :; do i=$((i+1)); echo {marker}-line $i; sleep 0.1; done");
    let be = format!(
        "command = [\"sh\", \"-c\", {script:?}]\nuser = \"nobody\"\n\
         restart_backoff_ms = 50\nrestart_backoff_max_ms = 100"
    );
    live::own_process_config(top, lc, &be, on_exit, dir)
}

/// Agent one runs a BE as nobody that writes a line every 100 ms and stops with `freeze`;
/// agent two adopts and thaws it: the same BE process still runs 2 s after the thaw, and
/// agent two's log holds its lines (target `headroom_output`, its pid). On the code before,
/// the BE died at its first write once thawed and agent two launched another.
#[test]
fn a_frozen_be_adopted_by_the_next_agent_keeps_writing_its_output() {
    if live::own_process::play_the_agent(true) {
        return;
    }
    let Some(guard) = Guard::setup(TEST, "l24", 3, "adopted-output", 24) else {
        return;
    };
    if live::nobody(TEST).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let lc = live::Children::sleepers(1);
    let top = guard.top.to_string();
    let text = |on_exit| config(&top, lc.pid(0), &guard.marker, on_exit, dir.path());
    let one_log = dir.path().join("agent-one.log");
    let mut one = agent_process(&text("freeze"), Duration::from_millis(1500), &one_log);
    let ended = one.wait().unwrap();
    let one_said = std::fs::read_to_string(&one_log).unwrap_or_default();
    assert!(ended.success(), "agent one ({ended}): {one_said}");
    let left = with_marker(&guard.marker);
    assert_eq!(left.len(), 1, "agent one left its BE frozen: {left:?}");
    let be = left[0];
    let be_group = guard.top.join("be").unwrap();
    let two_log = dir.path().join("agent-two.log");
    let mut two = agent_process(&text("restore"), Duration::from_secs(30), &two_log);
    let thawed = live::eventually(Duration::from_secs(20), || {
        guard
            .cgroups
            .freeze_state(&be_group)
            .is_ok_and(|s| s == headroom_host::FreezeState::Thawed)
    });
    std::thread::sleep(Duration::from_secs(2));
    let running = alive(be);
    let now = with_marker(&guard.marker);
    let _ = headroom_host::process::send_signal(
        two.id() as i32,
        headroom_host::process::Signal::SIGTERM,
    );
    let ended = two.wait().unwrap();
    let two_said = std::fs::read_to_string(&two_log).unwrap_or_default();
    assert!(thawed, "agent two never thawed BE: {two_said}");
    assert!(
        running && now == vec![be],
        "the adopted BE {be} died once thawed (running now: {now:?}): {two_said}"
    );
    let relayed = two_said
        .lines()
        .filter(|l| l.contains("headroom_output") && l.contains(&format!("pid={be}")))
        .filter(|l| l.contains(&format!("{}-line ", guard.marker)))
        .count();
    assert!(
        relayed > 0,
        "agent two relayed none of the adopted BE's lines: {two_said}"
    );
    assert!(ended.success(), "agent two ({ended}): {two_said}");
}

fn agent_process(text: &str, run_for: Duration, log: &Path) -> std::process::Child {
    live::own_process::spawn(&format!("adopted_output::{TEST}"), text, run_for, log)
}
