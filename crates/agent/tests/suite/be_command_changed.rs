//! A lows list's item (issue 42): an agent restarted with a changed `[[be]] command` adopted
//! the earlier agent's BE, still running the old command, and never launched the new one. The
//! state file now records what each BE runs; a restart whose command differs stops that BE and
//! launches the new one, and one whose command is the same adopts it as before.

use crate::live;

use std::path::Path;
use std::time::Duration;

use live::marked::{alive, with_marker, MarkedGroup as Guard};

const TEST: &str = "a_restart_with_a_changed_be_command_runs_the_new_command";

/// The config on `top`: the LC pid `lc`, one BE running `sh` whose command line holds
/// `marker` and `which`, `on_exit`, the state file and socket in `dir`.
fn config(top: &str, lc: u32, marker: &str, which: &str, on_exit: &str, dir: &Path) -> String {
    let script = format!("while :; do sleep 0.2; done # {marker} {which}");
    let be = format!(
        "command = [\"sh\", \"-c\", {script:?}]\nrestart_backoff_ms = 50\nrestart_backoff_max_ms = 100"
    );
    live::own_process_config(top, lc, &be, on_exit, dir)
}

/// Agent one runs BE command "one" and stops with `freeze` (its BE left running, frozen).
/// Agent two, on the same groups with command "two", stops BE "one" and runs "two"; agent
/// three, with "two" again, adopts it (the same process runs on). On the code before, agent
/// two adopted "one" and "two" never ran.
#[test]
fn a_restart_with_a_changed_be_command_runs_the_new_command() {
    if live::own_process::play_the_agent(true) {
        return;
    }
    let Some(guard) = Guard::setup(TEST, "bcc", 3, "be-command-changed", 26) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top = guard.top.to_string();
    let text = |which, on_exit| config(&top, lc.pid(0), &guard.marker, which, on_exit, dir.path());
    let running = |which: &str| {
        with_marker(&guard.marker)
            .into_iter()
            .filter(|&p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&format!(" {which}")))
            })
            .collect::<Vec<u32>>()
    };
    let log = |n: &str| dir.path().join(format!("agent-{n}.log"));
    let said = |n: &str| std::fs::read_to_string(log(n)).unwrap_or_default();

    let mut one = agent_process(
        &text("one", "freeze"),
        Duration::from_millis(1500),
        &log("one"),
    );
    let ended = one.wait().unwrap();
    assert!(ended.success(), "agent one ({ended}): {}", said("one"));
    let old = running("one");
    assert_eq!(old.len(), 1, "agent one left its BE: {old:?}");

    let mut two = agent_process(&text("two", "freeze"), Duration::from_secs(3), &log("two"));
    let new_ran = live::eventually(Duration::from_secs(20), || running("two").len() == 1);
    let old_gone = live::eventually(Duration::from_secs(5), || !alive(old[0]));
    let new = running("two");
    let ended = two.wait().unwrap();
    assert!(ended.success(), "agent two ({ended}): {}", said("two"));
    assert!(
        new_ran && old_gone,
        "the changed command: old BE {old:?} alive {}, new {new:?}: {}",
        alive(old[0]),
        said("two")
    );
    assert!(
        said("two").contains("command changed"),
        "agent two did not say why it stopped the BE: {}",
        said("two")
    );

    let mut three = agent_process(
        &text("two", "restore"),
        Duration::from_secs(3),
        &log("three"),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let kept = new.iter().all(|&p| alive(p)) && running("two") == new;
    let ended = three.wait().unwrap();
    assert!(ended.success(), "agent three ({ended}): {}", said("three"));
    assert!(
        kept,
        "the same command was not adopted: {new:?} then {:?}: {}",
        running("two"),
        said("three")
    );
}

fn agent_process(text: &str, run_for: Duration, log: &Path) -> std::process::Child {
    live::own_process::spawn(&format!("be_command_changed::{TEST}"), text, run_for, log)
}
