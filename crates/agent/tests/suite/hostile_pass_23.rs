//! Hostile pass 23 (issue 42): after a clean stop with `on_exit = "restore"` the LC command
//! the agent launched was left running, and the next start launched a second copy (a
//! routine `systemctl restart` doubled the LC). A start must take the one the agent before
//! it recorded (pid and start time, the same command as the same user), and never a
//! process that merely runs the same command line.

use crate::live;

use std::time::Duration;

use live::marked::MarkedGroup as Guard;

const AFTER_RESTORE: &str = "a_restart_after_restore_takes_the_recorded_lc_command";

/// Agent one launches `sleep <marker>` as the LC command and stops with `restore`; the test
/// moves that LC out of its group and starts a copy of the same command line that no agent
/// launched beside it. Agent two,
/// on the same config, must take agent one's copy (into the LC group) and launch none: the
/// same two processes run the command, and the stranger is not in the LC group.
#[test]
fn a_restart_after_restore_takes_the_recorded_lc_command() {
    let Some(guard) = Guard::setup(AFTER_RESTORE, "hp23", 2, "restore-lc", 23) else {
        return;
    };
    let case = live::lc_command::LcCommand::new(guard);
    let (guard, text, copies) = (&case.guard, &case.text, || case.copies());
    let first = match live::start_agent(text, Duration::from_millis(1200)) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {AFTER_RESTORE}: {e}"),
    };
    first
        .join()
        .unwrap()
        .expect("the first agent ran and restored");
    let left = copies();
    assert_eq!(left.len(), 1, "the first agent's LC command runs: {left:?}");
    // Out of the LC group, into each hierarchy's root, as an operator (or a restore that
    // hands the LC back) leaves it: the in-group look of pass 22 cannot find it there.
    let lc_group = &case.lc_group;
    for (backend, _) in guard.cgroups.group_dirs(lc_group) {
        guard
            .cgroups
            .move_process_to_dir(backend.mount(), left[0] as i32)
            .expect("the LC command moved out of its group");
    }
    // A process running the same command line, started by no agent: never to be taken.
    let mut stranger = std::process::Command::new("sleep")
        .arg(&guard.marker)
        .spawn()
        .unwrap();
    // (once it has exec'd)
    live::eventually(Duration::from_secs(10), || copies().len() == 2);
    let before = copies();
    assert_eq!(before.len(), 2, "{before:?}");
    let second = live::start_agent(text, Duration::from_millis(1200))
        .expect("the second agent starts after the first's restore");
    let during = copies();
    let in_group = guard.cgroups.procs(lc_group).unwrap_or_default();
    second
        .join()
        .unwrap()
        .expect("the second agent ran and restored");
    let _ = stranger.kill();
    let _ = stranger.wait();
    assert_eq!(
        during, before,
        "the restart launched the LC command again beside the one a restore left running"
    );
    assert!(
        in_group.contains(&(left[0] as i32)),
        "the recorded LC {} was not taken into its group: {in_group:?}",
        left[0]
    );
    assert!(
        !in_group.contains(&(stranger.id() as i32)),
        "a process that merely runs the same command was taken as the LC: {in_group:?}"
    );
}
