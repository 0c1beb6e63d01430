//! Hostile pass 37 (issue 42, docs/safety-hostile-pass-37.md): `[lc.threads]` keeps each LC
//! thread's settings from before its first change, to put them back on `ctl off` and exit. A
//! thread starts with its creator's affinity and policy, so a thread the LC created after the
//! agent pinned its creator was recorded with the agent's pin as its "original", and kept the
//! pin after `ctl off` and `restore` (seen on a real LC restarted under a new pid, found by its
//! pid file). Such a thread's original is now its creator's, and `restore` also puts back the
//! threads created since the agent's last pass.

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_agent::publish::control::{request, Request};
use headroom_host::sched::{self, SchedPolicy};
use headroom_types::CpuSet;
use live::marked::MarkedGroup as Guard;

const LATER: &str = "threads_an_lc_starts_after_its_pin_are_put_back_by_off_and_restore";

/// An LC of one thread that starts a thread when `<dir>/one` appears and another when
/// `<dir>/two` appears (saying so in `<name>-started`); `marker` on its command line.
fn python_lc(dir: &Path, marker: &str) -> Option<std::process::Child> {
    let script = "import os,sys,threading,time\n\
         d=sys.argv[1]\n\
         def wait_for(n):\n    \
             for _ in range(1500):\n        \
                 if os.path.exists(os.path.join(d,n)): return\n        \
                 time.sleep(0.02)\n\
         for n in ('one','two'):\n    \
             wait_for(n)\n    \
             threading.Thread(target=time.sleep,args=(60,),daemon=True).start()\n    \
             open(os.path.join(d,n+'-started'),'w').close()\n\
         time.sleep(60)\n";
    std::process::Command::new(live::python())
        .args(["-c", script])
        .arg(dir)
        .arg(marker)
        .stdin(std::process::Stdio::null())
        .spawn()
        .ok()
}

/// The threads of `pid` whose affinity is not `want`, with theirs.
fn not_on(pid: u32, want: &CpuSet) -> Vec<(i32, Option<CpuSet>)> {
    sched::threads(Path::new("/"), pid as i32)
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t, sched::affinity(t).ok()))
        .filter(|(_, c)| c.as_ref() != Some(want))
        .collect()
}

/// The threads of `pid` that run SCHED_FIFO.
fn fifo_threads(pid: u32) -> Vec<i32> {
    sched::threads(Path::new("/"), pid as i32)
        .unwrap_or_default()
        .into_iter()
        .filter(|&t| {
            sched::sched(t).is_ok_and(|a| matches!(a.policy(), Some(SchedPolicy::Fifo { .. })))
        })
        .collect()
}

fn kill(child: &mut std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// LC L1 found by its pid file is pinned onto CPU 1 and made SCHED_FIFO; it is restarted as
/// L2 (the pid file rewritten), whose only thread the agent treats; L2 then starts a thread,
/// the agent runs a while, L2 starts another, and `ctl off` comes at once. Each time (the
/// `off`, and the agent's `restore` at its end) every L2 thread must be back on L2's CPUs from
/// before the agent, none SCHED_FIFO (where this host gave FIFO at all). On the code before,
/// the threads started after the pin stayed on CPU 1.
#[test]
fn threads_an_lc_starts_after_its_pin_are_put_back_by_off_and_restore() {
    let Some(guard) = Guard::setup(LATER, "hp37", 3, "later-threads", 37) else {
        return;
    };
    let all = sched::affinity(0).unwrap_or_default();
    if !(all.contains(0) && all.contains(1)) {
        return eprintln!("SKIP {LATER}: needs CPUs 0 and 1 (has {all})");
    }
    let dir = tempfile::tempdir().unwrap();
    let (go1, go2) = (dir.path().join("go1"), dir.path().join("go2"));
    std::fs::create_dir_all(&go1).unwrap();
    std::fs::create_dir_all(&go2).unwrap();
    let Some(mut l1) = python_lc(&go1, &guard.marker) else {
        return eprintln!("SKIP {LATER}: no python3 to stand in for a threaded LC");
    };
    let d = dir.path().display();
    let pid_file = dir.path().join("lc.pid");
    std::fs::write(&pid_file, format!("{}\n", l1.id())).unwrap();
    let top = &guard.top;
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npid_file = \"{}\"\n\
         [lc.threads]\npin = true\ncpus = \"1\"\nfifo_priority = 1\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"{}\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        pid_file.display(),
        guard.marker
    );
    let runner = match live::start_agent(&text, Duration::from_secs(10)) {
        Ok(r) => r,
        Err(why) => {
            kill(&mut l1);
            return eprintln!("SKIP {LATER}: {why}");
        }
    };
    let one = CpuSet::from([1]);
    let l1_pinned = live::eventually(Duration::from_secs(4), || not_on(l1.id(), &one).is_empty());
    kill(&mut l1);
    let mut l2 = python_lc(&go2, &guard.marker).expect("python3 ran once");
    let before = sched::affinity(l2.id() as i32).unwrap();
    std::fs::write(&pid_file, format!("{}\n", l2.id())).unwrap();
    let l2_pinned = live::eventually(Duration::from_secs(5), || not_on(l2.id(), &one).is_empty());
    let l2_seen = (live::marked::groups_of(l2.id()), not_on(l2.id(), &one));
    let l2_fifo = !fifo_threads(l2.id()).is_empty();
    // A thread the agent sees (it runs a second or so after it), then one it cannot have seen.
    std::fs::write(go2.join("one"), "").unwrap();
    let first = live::eventually(Duration::from_secs(5), || go2.join("one-started").exists());
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(go2.join("two"), "").unwrap();
    let second = live::eventually(Duration::from_secs(5), || go2.join("two-started").exists());
    let off = request(&dir.path().join("ctl.sock"), &Request::Off);
    let threads = sched::threads(Path::new("/"), l2.id() as i32).unwrap_or_default();
    let after_off = (not_on(l2.id(), &before), fifo_threads(l2.id()));
    let _ = runner.join();
    let after_restore = (not_on(l2.id(), &before), fifo_threads(l2.id()));
    kill(&mut l2);
    assert!(l1_pinned, "L1's thread pinned onto CPU 1 by [lc.threads]");
    assert!(
        l2_pinned,
        "L2 followed by its pid file and pinned onto CPU 1: {l2_seen:?}"
    );
    assert!(first && second, "L2 started its two threads");
    assert_eq!(threads.len(), 3, "L2's threads: {threads:?}");
    assert!(
        off.as_ref().is_ok_and(|r| r.ok),
        "ctl off answered: {off:?}"
    );
    if !l2_fifo {
        eprintln!("{LATER}: no SCHED_FIFO given to L2 here; its affinity checked alone");
    }
    assert!(
        after_off.0.is_empty() && after_off.1.is_empty(),
        "after `ctl off`, L2's threads not on its CPUs from before ({before}), and those \
         SCHED_FIFO: {after_off:?}"
    );
    assert!(
        after_restore.0.is_empty() && after_restore.1.is_empty(),
        "after `restore`, L2's threads not on its CPUs from before ({before}), and those \
         SCHED_FIFO: {after_restore:?}"
    );
}

const SAME_NUMBER: &str = "an_lc_restarted_under_its_old_number_is_pinned_again";

/// LC sleeper A (by `pids`) is pinned onto CPU 1; A dies and sleeper B gets A's number (pid
/// numbers wrap) and is started in the LC group, as a supervisor's restart in the service's
/// own group would be. B must be pinned too, and put back on its own CPUs by `restore`. On the
/// code before, the agent kept "thread A's number: treated" and never pinned B (first seen
/// when this file's first test got its L1's number back from a test beside it).
#[test]
fn an_lc_restarted_under_its_old_number_is_pinned_again() {
    let Some(guard) = Guard::setup(SAME_NUMBER, "hp37", 3, "same-number", 38) else {
        return;
    };
    let all = sched::affinity(0).unwrap_or_default();
    if !(all.contains(0) && all.contains(1)) {
        return eprintln!("SKIP {SAME_NUMBER}: needs CPUs 0 and 1 (has {all})");
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
    let runner = match live::start_agent(&text, Duration::from_secs(8)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {SAME_NUMBER}: {why}"),
    };
    let one = CpuSet::from([1]);
    let a_pinned = live::eventually(Duration::from_secs(4), || not_on(a, &one).is_empty());
    let _ = lc.0[0].kill();
    let _ = lc.0[0].wait();
    let b = live::sleeper_with_pid(a);
    let lc_group = headroom_types::GroupPath::new(&format!("{top}/lc")).unwrap();
    let b_pinned = b.as_ref().is_some_and(|b| {
        guard.cgroups.move_process(&lc_group, b.id() as i32).is_ok()
            && live::eventually(Duration::from_secs(4), || not_on(b.id(), &one).is_empty())
    });
    let _ = runner.join();
    let Some(mut b) = b else {
        return eprintln!("SKIP {SAME_NUMBER}: pid {a} did not come round in 200 forks");
    };
    let b_after = not_on(b.id(), &all);
    kill(&mut b);
    assert!(a_pinned, "LC A ({a}) pinned onto CPU 1 by [lc.threads]");
    assert!(
        b_pinned,
        "B ({a}, A's number) in the LC group was never pinned"
    );
    assert!(
        b_after.is_empty(),
        "B not back on its own CPUs ({all}) after restore: {b_after:?}"
    );
}

const CHURN: &str = "records_of_exited_lc_threads_are_dropped";

/// An LC that runs a thread per request: batches of five short threads, one batch a second.
/// The agent treats each thread it sees and keeps its original; once the churn stops the
/// state file must hold a handful of records, not one per thread ever seen. On the code
/// before, every exited thread's record stayed (growing the state file without end).
#[test]
fn records_of_exited_lc_threads_are_dropped() {
    let Some(guard) = Guard::setup(CHURN, "hp37", 3, "churn", 39) else {
        return;
    };
    let all = sched::affinity(0).unwrap_or_default();
    if !all.contains(1) {
        return eprintln!("SKIP {CHURN}: needs CPU 1 (has {all})");
    }
    let script = "import sys,threading,time\n\
         for _ in range(5):\n    \
             for _ in range(5): threading.Thread(target=time.sleep,args=(0.9,)).start()\n    \
             time.sleep(1)\n\
         time.sleep(60)\n";
    let Ok(mut lc) = std::process::Command::new(live::python())
        .args(["-c", script, &guard.marker])
        .stdin(std::process::Stdio::null())
        .spawn()
    else {
        return eprintln!("SKIP {CHURN}: no python3 to stand in for a threaded LC");
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let top = &guard.top;
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{}]\n\
         [lc.threads]\npin = true\ncpus = \"1\"\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"{}\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        lc.id(),
        guard.marker
    );
    let runner = match live::start_agent(&text, Duration::from_secs(10)) {
        Ok(r) => r,
        Err(why) => {
            kill(&mut lc);
            return eprintln!("SKIP {CHURN}: {why}");
        }
    };
    let records = || -> Option<usize> {
        let text = std::fs::read_to_string(dir.path().join("state.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        Some(v["lc_threads"]["originals"].as_object()?.len())
    };
    // The churn runs ~5 s from the LC's start; the most records seen while it runs, then
    // what is left 3 s after it stopped (a state file is written within a second or two).
    let mut most = 0;
    for _ in 0..50 {
        most = most.max(records().unwrap_or(0));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    let left = records();
    let threads = sched::threads(Path::new("/"), lc.id() as i32).unwrap_or_default();
    let _ = runner.join();
    kill(&mut lc);
    assert_eq!(threads.len(), 1, "the churn over: {threads:?}");
    assert!(
        most >= 3,
        "the agent recorded the churning threads (most {most})"
    );
    assert!(
        left.is_some_and(|n| n <= 2),
        "records of LC threads after the churn stopped: {left:?} (at most {most} while it ran)"
    );
}
