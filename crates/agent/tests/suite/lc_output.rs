//! Found while fixing pass 23's lows (issue 42): an LC command run as a user died at its first
//! write after any exit of the agent. Its fds 1 and 2 were the agent's relay pipe, whose only
//! reader was a thread of the agent, and the agent leaves LC commands running at every exit
//! (a `systemctl restart` killed the LC it left, SIGPIPE). Now its output outlives the agent:
//! a journald stream of its own where the agent logs to journald, else the agent's own fds.
//!
//! The agent runs in a process of its own (`live::own_process`), its fds 1 and 2 a log file: the LC's lines must go on reaching
//! that file after the agent has exited.

use crate::live;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use live::marked::{alive, with_marker, MarkedGroup as Guard};

const TEST: &str = "a_user_run_lc_command_keeps_writing_after_the_agent_exits";
/// The config on `top`: the LC command as nobody, writing a line every 100 ms (its command
/// line holds `marker`), one BE `sleep`, `restore` at exit, the state file and socket in `dir`.
fn config(top: &str, marker: &str, dir: &Path) -> String {
    let script = format!("i=0; while :; do i=$((i+1)); echo {marker}-line $i; sleep 0.1; done");
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\ncommand = [\"sh\", \"-c\", {script:?}]\n\
         user = \"nobody\"\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"30\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{}/state.json\"\n\n\
         [api]\nsocket = \"{}/ctl.sock\"\nmetrics = \"\"\n",
        dir.display(),
        dir.display()
    )
}

fn lines_of(log: &Path, marker: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&format!("{marker}-line ")))
        .count()
}

/// The agent launches the LC command as nobody and exits (`restore`) after 1.5 s: 2 s later
/// the same LC process still runs and its lines go on reaching the agent's log file. On the
/// code before, it died at its first write after the exit.
#[test]
fn a_user_run_lc_command_keeps_writing_after_the_agent_exits() {
    if live::own_process::play_the_agent(false) {
        return;
    }
    let Some(guard) = Guard::setup(TEST, "lco", 3, "lc-output", 25) else {
        return;
    };
    if live::nobody(TEST).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let log = dir.path().join("agent.log");
    let text = config(guard.top.as_str(), &guard.marker, dir.path());
    let mut agent = live::own_process::spawn(
        &format!("lc_output::{TEST}"),
        &text,
        Duration::from_millis(1500),
        &log,
    );
    let ended = agent.wait().unwrap();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(ended.success(), "the agent ({ended}): {said}");
    // the shell itself (its `sleep 0.1` children come and go)
    let shells: Vec<u32> = with_marker(&guard.marker)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(b"sh\0"))
        })
        .collect();
    assert_eq!(shells.len(), 1, "one LC command left running: {said}");
    let lc = shells[0];
    let at_exit = lines_of(&log, &guard.marker);
    std::thread::sleep(Duration::from_secs(2));
    let later = lines_of(&log, &guard.marker);
    assert!(
        alive(lc),
        "the LC command {lc} died after the agent's exit ({at_exit} lines written): {said}"
    );
    assert!(
        later > at_exit,
        "the LC command's lines stopped at the agent's exit ({at_exit}, then {later})"
    );
}
