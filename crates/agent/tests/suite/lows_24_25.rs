//! The lows hostile passes 24 and 25 left (issue 42), each through a real agent on this host:
//! a BE kill that timed out counted done by `restore`; a recorded LC with a real-time thread
//! whose move into its group failed the start; a copy of the LC command in its group in some
//! hierarchies only launched again; `restore` leaving the group it made holding the LC it
//! launched; a BE restarted from the control loop starting with another timer slack than the
//! first launch; a relaunch into a BE group already at its `pids.max`.

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_host::{Backend, Cgroups, Controller};
use headroom_types::GroupPath;
use live::marked::MarkedGroup as Guard;

/// Thaws a group the test froze, first thing on drop (before the processes in it are reaped).
struct ThawOnDrop(Cgroups, GroupPath);

impl Drop for ThawOnDrop {
    fn drop(&mut self) {
        let _ = self.0.thaw(&self.1);
    }
}

fn group(top: &GroupPath, name: &str) -> GroupPath {
    GroupPath::new(&format!("{top}/{name}")).unwrap()
}

/// A child-sleeper LC config with the BE `command` (and any further `[[be]]` keys after it),
/// `restore`, the `[safety]` lines `safety`, in a temporary directory.
fn config(guard: &Guard, lc_pid: u32, be: &str, safety: &str, dir: &Path) -> String {
    live::sleeper_lc_config(
        lc_pid,
        guard.top.as_str(),
        be,
        &format!(
            "on_exit = \"restore\"\nstate_file = \"{}\"\n{safety}",
            dir.join("state.json").display()
        ),
        &format!("socket = \"{}\"", dir.join("ctl.sock").display()),
    )
}

const KILL_LEFT: &str = "a_be_kill_that_leaves_a_process_is_not_reported_restored";

/// Pass 25's low: `restore` counted a BE group kill that timed out as done (exit 0, state file
/// removed, the survivors in a group put back to its originals). A process in a subgroup of
/// BE that the test froze itself outlives SIGKILL on cgroup v1 (the parent's thaw does not
/// reach a self-frozen child): the exit must fail, naming the group and the process left, and
/// keep the state file.
#[test]
fn a_be_kill_that_leaves_a_process_is_not_reported_restored() {
    let Some(guard) = Guard::setup(KILL_LEFT, "l26", 6, "kill-left", 1) else {
        return;
    };
    let cg = guard.cgroups.clone();
    if !matches!(cg.backend(Controller::Freezer), Ok(Backend::V1(_))) {
        // (v2: a frozen task takes SIGKILL, and the kill succeeds)
        return eprintln!("SKIP {KILL_LEFT}: needs a cgroup v1 freezer");
    }
    let lc = live::Children::sleepers(1);
    let dir = tempfile::tempdir().unwrap();
    let be_cmd = format!("[\"sleep\", \"{}\"]", guard.marker);
    let text = config(&guard, lc.pid(0), &be_cmd, "", dir.path());
    let agent = match live::start_agent(&text, Duration::from_secs(2)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {KILL_LEFT}: {e}"),
    };
    let (be, stuck) = (group(&guard.top, "be"), group(&guard.top, "be/stuck"));
    cg.create(&stuck).expect("a subgroup of BE");
    let held = live::Children::sleepers(1);
    let held_pid = held.pid(0);
    cg.move_process(&stuck, held_pid as i32)
        .expect("the held process into the subgroup");
    cg.freeze(&stuck).expect("the subgroup frozen by the test");
    let _thaw = ThawOnDrop(cg.clone(), stuck.clone());
    let exit = agent.join().unwrap();
    let state_kept = dir.path().join("state.json").exists();
    let _ = cg.thaw(&stuck);
    let msg = match exit {
        Ok(s) => panic!(
            "restore reported done with {held_pid} left in {stuck}: exit action {:?}",
            s.exit_action
        ),
        Err(e) => e.to_string(),
    };
    assert!(
        msg.contains(be.as_str()) && msg.contains(&held_pid.to_string()),
        "the failure names neither the group {be} nor the process {held_pid} left: {msg}"
    );
    assert!(
        state_kept,
        "the state file was removed after a restore that did not complete"
    );
}

const RT_RECORDED: &str = "a_recorded_lc_with_a_realtime_thread_is_taken_into_its_group";

/// Pass 24's low: the recorded LC (`<state_file>.lc`, out of its group) was moved in with no
/// real-time budget: on a v1 `cpu` group at `cpu.rt_runtime_us` 0 a SCHED_FIFO process is
/// refused (EINVAL), and that failed the whole start. Agent one launches `sleep <marker>`; the
/// test moves it to the root groups and makes it SCHED_FIFO; agent one records it and
/// restores; agent two must start, take it into its group in every hierarchy, and launch none.
#[test]
fn a_recorded_lc_with_a_realtime_thread_is_taken_into_its_group() {
    let Some(guard) = Guard::setup(RT_RECORDED, "l26", 6, "rt-recorded", 2) else {
        return;
    };
    let case = live::lc_command::LcCommand::new(guard);
    let cg = case.guard.cgroups.clone();
    let first = match live::start_agent(&case.text, Duration::from_secs(2)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {RT_RECORDED}: {e}"),
    };
    let budget = cg.rt_runtime_us(&case.lc_group);
    let launched = case.copies();
    assert_eq!(launched.len(), 1, "agent one launched its LC: {launched:?}");
    let pid = launched[0];
    for (backend, _) in cg.group_dirs(&case.lc_group) {
        cg.move_process_to_dir(backend.mount(), pid as i32)
            .expect("the LC to the root group");
    }
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: a plain system call on the test's own child process.
    let fifo = unsafe { libc::sched_setscheduler(pid as i32, libc::SCHED_FIFO, &param) } == 0;
    first.join().unwrap().expect("agent one ran and restored");
    if !matches!(budget, Ok(Some(_))) || !fifo {
        return eprintln!("SKIP {RT_RECORDED}: no RT group scheduling here ({budget:?}), or SCHED_FIFO refused ({fifo})");
    }
    assert_eq!(case.copies(), launched, "after agent one's restore");
    let second = live::start_agent(&case.text, Duration::from_millis(1200)).unwrap_or_else(|e| {
        panic!("the start failed on the recorded LC {pid} with a real-time thread: {e}")
    });
    let text = headroom_host::pids::cgroup_text(Path::new("/"), pid);
    let dirs = cg.process_dirs(&case.lc_group, &text);
    let copies = case.copies();
    second.join().unwrap().expect("agent two ran and restored");
    assert_eq!(copies, launched, "agent two launched the LC command again");
    assert!(
        !dirs.is_empty() && dirs.iter().all(|d| d.ends_with(case.lc_group.as_str())),
        "the recorded LC {pid} was not taken into its group in every hierarchy: {dirs:?}"
    );
}

const HALF_IN: &str = "a_copy_in_the_lc_group_in_one_hierarchy_is_taken_not_doubled";

/// Pass 24's low: a start looked for the LC command left running in the group's first
/// hierarchy only. A copy in the group in another hierarchy only (an operator's `cgexec`, a
/// kill -9 between two writes of a move) was missed, and a second copy launched beside it. It
/// must be taken and moved into the group in every hierarchy.
#[test]
fn a_copy_in_the_lc_group_in_one_hierarchy_is_taken_not_doubled() {
    let Some(guard) = Guard::setup(HALF_IN, "l26", 6, "half-in", 3) else {
        return;
    };
    let case = live::lc_command::LcCommand::new(guard);
    let cg = case.guard.cgroups.clone();
    let dirs = cg.group_dirs(&case.lc_group);
    if dirs.len() < 2 {
        return eprintln!("SKIP {HALF_IN}: one hierarchy here (cgroup v2)");
    }
    cg.create(&case.lc_group).expect("the LC group");
    let mut copy = std::process::Command::new("sleep")
        .arg(&case.guard.marker)
        .spawn()
        .unwrap();
    let pid = copy.id();
    let (_, last) = dirs.last().unwrap();
    cg.move_process_to_dir(last, pid as i32)
        .expect("the copy into the LC group in one hierarchy");
    let agent = match live::start_agent(&case.text, Duration::from_millis(1200)) {
        Ok(a) => a,
        Err(e) => {
            let _ = copy.kill();
            let _ = copy.wait();
            return eprintln!("SKIP {HALF_IN}: {e}");
        }
    };
    let during = case.copies();
    let text = headroom_host::pids::cgroup_text(Path::new("/"), pid);
    let placed = cg.process_dirs(&case.lc_group, &text);
    let exit = agent.join().unwrap();
    let _ = copy.kill();
    let _ = copy.wait();
    exit.expect("the agent ran and restored");
    assert_eq!(
        during,
        vec![pid],
        "a second copy was launched beside the one in the group in {} only",
        last.display()
    );
    assert!(
        placed.iter().all(|d| d.ends_with(case.lc_group.as_str())),
        "the copy was taken but left out of its group: {placed:?}"
    );
}

const MADE_LC: &str = "restore_removes_the_lc_group_it_made_and_leaves_the_lc_running";

/// Passes 23 and 24's low: `restore` left the LC group the agent made holding the LC command
/// it launched, and every later start adopted it as an existing group, never removed. The
/// exit must move the LC out (to where the agent is) and remove the group; the LC runs on.
#[test]
fn restore_removes_the_lc_group_it_made_and_leaves_the_lc_running() {
    let Some(guard) = Guard::setup(MADE_LC, "l26", 6, "made-lc", 4) else {
        return;
    };
    let case = live::lc_command::LcCommand::new(guard);
    let cg = case.guard.cgroups.clone();
    let agent = match live::start_agent(&case.text, Duration::from_millis(1200)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {MADE_LC}: {e}"),
    };
    let launched = case.copies();
    agent.join().unwrap().expect("the agent ran and restored");
    assert_eq!(launched.len(), 1, "the agent launched its LC: {launched:?}");
    assert_eq!(
        case.copies(),
        launched,
        "the LC command runs on after restore"
    );
    let left: Vec<_> = cg
        .group_dirs(&case.lc_group)
        .into_iter()
        .map(|(_, d)| d)
        .filter(|d| d.is_dir())
        .collect();
    assert!(
        left.is_empty(),
        "restore left the LC group it made, holding the LC: {left:?}"
    );
}

const SLACK: &str = "a_be_restarted_from_the_control_loop_gets_the_first_launchs_timer_slack";

/// Pass 25's low: the first launch (the start's thread) gave the BE a timer slack of 50 µs, a
/// restart (the control loop's thread: 1 µs, or none as SCHED_FIFO) 0. The BE writes its
/// slack at every launch; every line must be the first's.
#[test]
fn a_be_restarted_from_the_control_loop_gets_the_first_launchs_timer_slack() {
    let Some(guard) = Guard::setup(SLACK, "l26", 6, "slack", 5) else {
        return;
    };
    let lc = live::Children::sleepers(1);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("slack");
    let script = format!("cat /proc/self/timerslack_ns >> {}", out.display());
    let be_cmd = format!(
        "[\"sh\", \"-c\", {script:?}]\nrestart_backoff_ms = 100\nrestart_backoff_max_ms = 200"
    );
    let text = config(&guard, lc.pid(0), &be_cmd, "", dir.path());
    // (the control loop looks at its BE commands about once a second)
    let agent = match live::start_agent(&text, Duration::from_millis(3500)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {SLACK}: {e}"),
    };
    agent.join().unwrap().expect("the agent ran and restored");
    let lines: Vec<String> = std::fs::read_to_string(&out)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        lines.len() >= 2,
        "the BE ran {} time(s): no restart to compare",
        lines.len()
    );
    // (the first launch's: the gate's value, `headroom_host::spawn::COMMAND_TIMER_SLACK_NS`)
    assert!(
        lines.iter().all(|l| *l == lines[0]) && lines[0] != "0",
        "the BE's timer slack at each launch (first, then restarts): {lines:?}"
    );
}

const PIDS_FULL: &str = "a_be_is_not_relaunched_into_a_group_at_its_pids_max";

/// Issue 42's low: a launch moves a process into the BE group, which `pids.max` does not
/// refuse, so a relaunch into a group at its limit took it one past `be_pids_max`. The BE
/// (`be_pids_max = 16`) first runs `sleep 2`; meanwhile the test moves 16 sleepers into its
/// group. When it ends the group holds 16: for 3 s after the agent reaped it (the relaunch is
/// due within about a second) it must not be relaunched (its second run is `sleep <marker>`),
/// and once the test frees a task it must be.
#[test]
fn a_be_is_not_relaunched_into_a_group_at_its_pids_max() {
    let Some(guard) = Guard::setup(PIDS_FULL, "l26", 6, "pids-full", 6) else {
        return;
    };
    let cg = guard.cgroups.clone();
    let be = group(&guard.top, "be");
    let lc = live::Children::sleepers(1);
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("once");
    let script = format!(
        "if [ -e {f} ]; then exec sleep {m}; fi; : > {f}; exec sleep 2",
        f = flag.display(),
        m = guard.marker
    );
    let be_cmd = format!(
        "[\"sh\", \"-c\", {script:?}]\nrestart_backoff_ms = 100\nrestart_backoff_max_ms = 200"
    );
    let text = config(&guard, lc.pid(0), &be_cmd, "be_pids_max = 16", dir.path());
    let agent = match live::start_agent(&text, Duration::from_secs(12)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {PIDS_FULL}: {e}"),
    };
    // (written by the first tick, with the confining writes)
    if !live::eventually(Duration::from_secs(3), || {
        cg.pids_max(&be).ok() == Some(Some(16))
    }) {
        let _ = agent.join();
        return eprintln!("SKIP {PIDS_FULL}: no pids controller here");
    }
    let first = cg.procs(&be).unwrap_or_default();
    assert!(!first.is_empty(), "the BE's first run is not in its group");
    let mut fill = live::Children::sleepers(16);
    for c in &fill.0 {
        cg.move_process(&be, c.id() as i32)
            .expect("a sleeper into BE");
    }
    // Reaped by the agent (`ctl status` says how it ended): its relaunch is due after the
    // 100 ms backoff, at the agent's next look at its commands (about once a second).
    let socket = dir.path().join("ctl.sock");
    let ended = live::eventually(Duration::from_secs(6), || {
        use headroom_agent::publish::control::{request, Request};
        request(&socket, &Request::Status)
            .ok()
            .and_then(|r| r.status)
            .and_then(|s| s.be_commands.first().cloned())
            .is_some_and(|c| c.last_exit.is_some())
    });
    let mut most = 0;
    let mut relaunched_full = false;
    live::eventually(Duration::from_secs(3), || {
        most = most.max(cg.pids_current(&be).unwrap_or(0));
        relaunched_full |= !live::marked::sleeps_with_marker(&guard.marker).is_empty();
        false
    });
    // One task freed: now the relaunch fits.
    let mut freed = fill.0.remove(0);
    let _ = freed.kill();
    let _ = freed.wait();
    let relaunched = live::eventually(Duration::from_secs(3), || {
        !live::marked::sleeps_with_marker(&guard.marker).is_empty()
    });
    agent.join().unwrap().expect("the agent ran and restored");
    assert!(ended, "the BE's first run ({first:?}) never ended");
    assert!(
        !relaunched_full && most <= 16,
        "the BE was relaunched into its group at pids.max 16 (at most {most} tasks seen)"
    );
    assert!(
        relaunched,
        "the BE was never relaunched once a task was freed"
    );
}
