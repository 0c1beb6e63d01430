//! Hostile pass 28 (issue 42): the LC command's processes after a restart.
//!
//! - An `[lc] command` that execs another program (`sh -c "exec memcached …"`, a wrapper
//!   script that ends in `exec`) runs another command line than the config's: no start found
//!   it again, neither in its group (a kill -9, `on_exit = "freeze"`) nor by the record
//!   `restore` leaves, and every restart launched a second copy beside it.
//! - `restore` moves every process of an LC group the agent made out of it (pass 27's low),
//!   the command with what it forked, but the next start took only the command back in: what
//!   it forked ran outside the LC group for the whole next run.
//! - A restart wrote its own state file, naming no BE command yet, before it adopted the
//!   earlier agent's: a kill -9 then, or a restart that failed there, left the next start a
//!   file without them, and it killed the BE it would have adopted.

use crate::live;

use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_types::GroupPath;
use live::marked::MarkedGroup as Guard;

struct Case {
    guard: Guard,
    dir: tempfile::TempDir,
    text: String,
    lc_group: GroupPath,
}

impl Case {
    /// The LC command `sh -c <script>`, `{m}` in `script` replaced by the test's marker.
    fn new(test: &str, name: &str, id: u32, script: &str) -> Option<Case> {
        let guard = Guard::setup(test, "hp28", 9, name, id)?;
        let dir = tempfile::tempdir().unwrap();
        let top = &guard.top;
        let script = script.replace("{m}", &guard.marker);
        let text = live::agent_config(
            &format!("{top}/lc"),
            &format!("{top}/be"),
            &format!("command = [\"/bin/sh\", \"-c\", \"{script}\"]"),
            &dir.path().join("state.json"),
            &dir.path().join("ctl.sock"),
        );
        Some(Case {
            lc_group: GroupPath::new(&format!("{top}/lc")).unwrap(),
            guard,
            dir,
            text,
        })
    }

    /// The `sleep <marker>` processes, sorted.
    fn sleeps(&self) -> Vec<u32> {
        let command = ["sleep".to_string(), self.guard.marker.clone()];
        let mut s = headroom_host::pids::running(Path::new("/"), &command);
        s.sort_unstable();
        s
    }

    /// Each of `pids` that is out of the LC group in some hierarchy, with those groups.
    fn out_of_group(&self, pids: &[u32]) -> Vec<(u32, Vec<PathBuf>)> {
        let cg = &self.guard.cgroups;
        pids.iter()
            .map(|&p| {
                let text = headroom_host::pids::cgroup_text(Path::new("/"), p);
                let out: Vec<PathBuf> = cg
                    .process_dirs(&self.lc_group, &text)
                    .into_iter()
                    .filter(|d| !d.ends_with(self.lc_group.as_str()))
                    .collect();
                (p, out)
            })
            .filter(|(_, out)| !out.is_empty())
            .collect()
    }

    /// Agent one runs `secs` and stops with `restore`; returns the `sleep`s it left running.
    fn first_run(&self, test: &str, n: usize) -> Option<Vec<u32>> {
        let first = match live::start_agent(&self.text, Duration::from_millis(1500)) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("SKIP {test}: {e}");
                return None;
            }
        };
        let up = live::eventually(Duration::from_secs(10), || self.sleeps().len() == n);
        first.join().unwrap().expect("agent one ran and restored");
        assert!(up, "agent one's LC command: {:?}", self.sleeps());
        let left = self.sleeps();
        assert_eq!(left.len(), n, "they run on after restore: {left:?}");
        Some(left)
    }

    /// Agent two runs; returns the `sleep`s and those out of the LC group while it ran.
    #[allow(clippy::type_complexity)]
    fn second_run(&self, test: &str, left: &[u32]) -> Option<(Vec<u32>, Vec<(u32, Vec<PathBuf>)>)> {
        let second = match live::start_agent(&self.text, Duration::from_millis(1500)) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("SKIP {test}: {e}");
                return None;
            }
        };
        // (the start takes what it takes before the agent's thread begins)
        let out = self.out_of_group(left);
        let during = self.sleeps();
        second.join().unwrap().expect("agent two ran and restored");
        Some((during, out))
    }
}

const FORKED_BACK: &str = "a_restart_after_restore_takes_what_the_lc_command_forked_back_in";

/// The LC command (a shell that stays) forks two `sleep <marker>`s. Agent one stops with
/// `restore`: all three move out of the group it made and run on. Agent two must take the
/// command and what it forked back into the LC group, not the command alone.
#[test]
fn a_restart_after_restore_takes_what_the_lc_command_forked_back_in() {
    let Some(case) = Case::new(FORKED_BACK, "forked-back", 1, "sleep {m} & sleep {m}; true") else {
        return;
    };
    let Some(left) = case.first_run(FORKED_BACK, 2) else {
        return;
    };
    let Some((during, out)) = case.second_run(FORKED_BACK, &left) else {
        return;
    };
    assert_eq!(during, left, "agent two started no second copy");
    assert!(
        out.is_empty(),
        "the restart took the LC command back into its group, not what it forked: {out:?}"
    );
}

const EXEC_RESTORE: &str = "an_lc_command_that_execs_is_taken_after_restore_not_doubled";

/// The LC command execs `sleep <marker>` (its command line is no longer the config's). After
/// agent one's `restore` agent two must take that process back, not launch a second copy.
#[test]
fn an_lc_command_that_execs_is_taken_after_restore_not_doubled() {
    let Some(case) = Case::new(EXEC_RESTORE, "exec-restore", 2, "exec sleep {m}") else {
        return;
    };
    let Some(left) = case.first_run(EXEC_RESTORE, 1) else {
        return;
    };
    let Some((during, out)) = case.second_run(EXEC_RESTORE, &left) else {
        return;
    };
    assert_eq!(
        during, left,
        "the restart launched a second LC command beside the one restore left (it had exec'd)"
    );
    assert!(out.is_empty(), "it was not taken into its group: {out:?}");
}

const EXEC_RECORDED: &str = "an_lc_command_that_execs_is_recorded_while_the_agent_runs";

/// What a kill -9 leaves: the LC command (which exec'd `sleep <marker>`) in its group and no
/// exit to record it. The record beside the state file must name it while the agent runs,
/// as it runs now, and an agent that finds that record takes the process (here agent one
/// stops with `on_exit = "freeze"`, which leaves the LC in its group as a kill -9 does).
#[test]
fn an_lc_command_that_execs_is_recorded_while_the_agent_runs() {
    let Some(mut case) = Case::new(EXEC_RECORDED, "exec-recorded", 3, "exec sleep {m}") else {
        return;
    };
    let record = case.dir.path().join("state.json.lc");
    case.text = case
        .text
        .replace("on_exit = \"restore\"", "on_exit = \"freeze\"");
    // (its exit, 8 s on, records it too: looked for well before that)
    let first = match live::start_agent(&case.text, Duration::from_secs(8)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {EXEC_RECORDED}: {e}"),
    };
    let named = live::eventually(Duration::from_secs(5), || {
        let pids = case.sleeps();
        pids.len() == 1
            && std::fs::read_to_string(&record)
                .is_ok_and(|r| r.contains(&format!("\"pid\": {}", pids[0])))
    });
    let left = case.sleeps();
    let exited_early = first.is_finished();
    first.join().unwrap().expect("agent one ran and froze BE");
    assert!(!exited_early, "agent one ended before its 8 s");
    assert!(
        named,
        "while the agent ran, no record named its LC command {left:?}: {:?}",
        std::fs::read_to_string(&record)
    );
    case.text = case
        .text
        .replace("on_exit = \"freeze\"", "on_exit = \"restore\"");
    let Some((during, out)) = case.second_run(EXEC_RECORDED, &left) else {
        return;
    };
    assert_eq!(
        during, left,
        "the restart launched a second LC command beside the one left in its group (it had exec'd)"
    );
    assert!(out.is_empty(), "it was not taken into its group: {out:?}");
}

const FAILED_RESTART: &str = "a_failed_restart_keeps_the_earlier_agents_be_in_the_state_file";

/// Agent one launches its BE and stops with `on_exit = "freeze"` (BE frozen, the state file
/// kept naming the BE command's pid). A restart whose start-up allocation cannot be written
/// (the recorded BE cpuset a CPU this machine lacks: hostile pass 4's failed restart) fails,
/// leaves BE frozen and keeps the state file for the next start: that file must still name
/// the BE command, or the next start kills it as an unrecorded process instead of adopting it
/// (a kill -9 during a restart's start left the same file: hostile pass 28).
#[test]
fn a_failed_restart_keeps_the_earlier_agents_be_in_the_state_file() {
    let Some(mut case) = Case::new(FAILED_RESTART, "failed-restart", 4, "exec sleep {m}") else {
        return;
    };
    case.text = case
        .text
        .replace("on_exit = \"restore\"", "on_exit = \"freeze\"");
    let state = case.dir.path().join("state.json");
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&state).expect("the state file"))
            .expect("the state file is JSON")
    };
    let first = match live::start_agent(&case.text, Duration::from_millis(1500)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {FAILED_RESTART}: {e}"),
    };
    first.join().unwrap().expect("agent one ran and froze BE");
    let mut recorded = read();
    let be = recorded["owned_pids"]["batch"].clone();
    assert!(be.is_u64(), "agent one recorded its BE command: {be}");
    // A CPU no test host has: the kernel refuses the cpuset write.
    recorded["last_allocation"]["be_cpus"] = serde_json::json!("4095");
    std::fs::write(&state, recorded.to_string()).unwrap();
    match headroom_agent::runtime::Agent::start(live::options(&case.text, Duration::from_secs(1))) {
        Ok(agent) => {
            let _ = agent.run();
            return eprintln!("SKIP {FAILED_RESTART}: this host took CPU 4095 in a cpuset");
        }
        Err(e) => eprintln!("agent two failed as meant: {e}"),
    }
    let kept = read();
    assert_eq!(
        kept["owned_pids"]["batch"], be,
        "the failed restart's state file no longer names agent one's BE command: the next start kills it"
    );
}
