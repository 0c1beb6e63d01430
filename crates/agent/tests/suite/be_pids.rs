//! Issue 42 (hostile pass 24's medium): nothing bounded how many processes a BE made. The BE
//! group's `pids.max` was `max` and a BE run as `nobody` keeps root's `RLIMIT_NPROC`, so a BE
//! that forks without end could take every pid on the host, and then the LC could neither fork
//! nor start a thread. `safety.be_pids_max` (by default a quarter of the host's tasks shared
//! among the BE groups, at most 32768 each) is now each BE group's `pids.max`, written with the
//! confining writes and put back by `restore`.

use crate::live;

use std::time::Duration;

use headroom_types::GroupPath;
use live::marked::MarkedGroup as Guard;

const BOUNDED: &str = "a_be_that_forks_holds_at_most_be_pids_max_and_restore_puts_it_back";

/// An agent with a BE in its group and `be_pids_max = 64`: the BE (`sh -c`, a subshell starting
/// 200 `sleep`s in the background, then the shell itself `exec`s a `sleep`, so the command never
/// ends and is never launched again: a launch moves a process in, which `pids.max` does not
/// refuse) holds at most 64 tasks, the LC (a child sleeper) keeps running
/// in its group with its own `pids.max` untouched, and `restore` puts back the BE group's
/// original (5000, set by the test on the group it made before the agent started).
#[test]
fn a_be_that_forks_holds_at_most_be_pids_max_and_restore_puts_it_back() {
    let Some(guard) = Guard::setup(BOUNDED, "bp", 3, "be-pids", 42) else {
        return;
    };
    let cg = &guard.cgroups;
    let top = &guard.top;
    let (be, lc) = (
        GroupPath::new(&format!("{top}/be")).unwrap(),
        GroupPath::new(&format!("{top}/lc")).unwrap(),
    );
    cg.create(&be).expect("the test's BE group");
    if cg.set_pids_max(&be, Some(5000)).is_err() {
        return eprintln!("SKIP {BOUNDED}: no pids controller here");
    }
    let mut lc_child = live::Children::sleepers(1);
    let lc_pid = lc_child.pid(0);
    let forks = format!(
        "(i=0; while [ $i -lt 200 ]; do sleep {m} & i=$((i+1)); done); exec sleep {m}",
        m = guard.marker
    );
    let dir = tempfile::tempdir().unwrap();
    let text = live::sleeper_lc_config(
        lc_pid,
        top.as_str(),
        &format!("[\"sh\", \"-c\", {forks:?}]"),
        &format!(
            "on_exit = \"restore\"\nbe_pids_max = 64\nstate_file = \"{}\"",
            dir.path().join("state.json").display()
        ),
        &format!("socket = \"{}\"", dir.path().join("ctl.sock").display()),
    );
    let run_for = Duration::from_secs(5);
    let agent = match live::start_agent(&text, run_for) {
        Ok(a) => a,
        // An agent that does not know the key is the code before: a failure, not a SKIP.
        Err(e) if e.contains("be_pids_max") => panic!("{e}"),
        Err(e) => return eprintln!("SKIP {BOUNDED}: {e}"),
    };
    let tasks = || cg.pids_current(&be).unwrap_or(0);
    // The BE is thawed after the start; it forks until refused (or done).
    let mut most = 0;
    live::eventually(Duration::from_secs(3), || {
        most = most.max(tasks());
        false
    });
    let limit = cg.pids_max(&be).ok();
    // `ctl set` below what BE holds now is taken with a warning naming the count (hostile
    // pass 26's low: it was refused, and a BE pressing its limit holds as many tasks as any
    // limit, so the operator could never tighten it live); the kernel holds BE at it.
    let set = |value: &str| {
        headroom_agent::publish::control::request(
            &dir.path().join("ctl.sock"),
            &headroom_agent::publish::control::Request::Set {
                key: "safety.be_pids_max".into(),
                value: value.into(),
            },
        )
    };
    let held = tasks();
    let below = set("16");
    let tightened = live::eventually(Duration::from_secs(3), || {
        cg.pids_max(&be).ok() == Some(Some(16))
    });
    let above = set("80");
    let limit_after_set = cg.pids_max(&be).ok();
    let lc_limit = cg.pids_max(&lc).ok();
    let lc_in_group = cg.procs(&lc).unwrap_or_default().contains(&(lc_pid as i32));
    let lc_runs = lc_child.0[0].try_wait().is_ok_and(|s| s.is_none());
    agent.join().unwrap().expect("the agent ran and restored");
    let restored = cg.pids_max(&be).ok();
    drop(lc_child);
    assert!(
        most > 1,
        "the BE never ran in its group ({most} tasks seen): nothing was tested"
    );
    assert!(
        most <= 64,
        "the BE made {most} tasks in its group past be_pids_max = 64"
    );
    assert_eq!(
        limit,
        Some(Some(64)),
        "the BE group's pids.max while the agent ran"
    );
    let below = below.expect("ctl set answered");
    assert!(
        below.ok && below.message.contains("WARNING"),
        "be_pids_max = 16 under a BE holding {held} tasks: taken, with a warning: {}",
        below.message
    );
    assert!(
        below.message.contains(&format!("{be} holds ")),
        "the warning names the group and its count: {}",
        below.message
    );
    assert!(tightened, "pids.max 16 written below pids.current");
    let above = above.expect("ctl set answered");
    assert!(above.ok, "{}", above.message);
    assert!(
        matches!(limit_after_set, Some(Some(16 | 80))),
        "{limit_after_set:?}"
    );
    assert_eq!(
        lc_limit,
        Some(None),
        "the LC group's pids.max is never the agent's"
    );
    assert!(
        lc_in_group && lc_runs,
        "the LC {lc_pid} kept running in its group"
    );
    assert_eq!(restored, Some(Some(5000)), "restore puts the original back");
}
