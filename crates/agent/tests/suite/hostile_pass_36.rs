//! Hostile pass 36 (issue 42, docs/safety-hostile-pass-36.md): `[lc.threads]` keeps each LC
//! thread's settings from before its first change, by thread id, to put them back on exit.
//! Once a thread has exited the kernel hands its number out again, and `restore` set the
//! recorded affinity and policy on whoever held it then: an unrelated process changed by the
//! agent. The settings now go back only on the thread they were taken from (its start time).

use crate::live;

use std::time::Duration;

use headroom_host::sched;
use headroom_types::CpuSet;
use live::marked::MarkedGroup as Guard;

const REUSED: &str = "restore_leaves_a_process_that_got_a_treated_lc_threads_number_alone";

/// LC sleeper A (moved in by `pids`) is pinned onto CPU 1 by `[lc.threads]`; A is killed
/// and its number given to sleeper B, which this test pins onto CPU 0 (B's own setting, as
/// any process may have). The agent then stops (`restore`): B must still be on CPU 0 only.
/// On the code before, `restore` put A's original affinity (every CPU) on B.
#[test]
fn restore_leaves_a_process_that_got_a_treated_lc_threads_number_alone() {
    let Some(guard) = Guard::setup(REUSED, "hp36", 3, "tid-reused", 38) else {
        return;
    };
    let all = sched::affinity(0).unwrap_or_default();
    if !(all.contains(0) && all.contains(1)) {
        return eprintln!("SKIP {REUSED}: needs CPUs 0 and 1 (has {all})");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let mut lc = live::Children::sleepers(1);
    let a = lc.pid(0);
    let top = &guard.top;
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{a}]\n\
         [lc.threads]\npin = true\ncpus = \"1\"\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"{}\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        guard.marker
    );
    let runner = match live::start_agent(&text, Duration::from_secs(6)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {REUSED}: {why}"),
    };
    let one = CpuSet::from([1]);
    let pinned = live::eventually(Duration::from_secs(3), || {
        sched::affinity(a as i32).is_ok_and(|c| c == one)
    });
    let _ = lc.0[0].kill();
    let _ = lc.0[0].wait();
    let b = live::sleeper_with_pid(a);
    let zero = CpuSet::from([0]);
    if let Some(b) = &b {
        sched::set_affinity(b.id() as i32, &zero).unwrap();
    }
    let _ = runner.join();
    let Some(mut b) = b else {
        return eprintln!("SKIP {REUSED}: pid {a} did not come round in 200 forks");
    };
    let after = sched::affinity(a as i32);
    let _ = b.kill();
    let _ = b.wait();
    assert!(pinned, "LC A ({a}) pinned onto CPU 1 by [lc.threads]");
    assert_eq!(
        after.ok(),
        Some(zero),
        "B ({a}, A's number, started after A exited) had its affinity changed by restore"
    );
}
