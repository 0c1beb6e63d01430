//! Hostile pass 39 (issue 42, docs/safety-hostile-pass-39.md): `[lc.threads]` takes a thread's
//! original from its creator when the thread holds what the agent gave the creator (it
//! inherited it). In one pass the agent pinned the LC's main thread, then read a thread that
//! the LC had pinned ITSELF onto that same CPU before the agent ran, took it as inheriting,
//! and `ctl off` and `restore` moved it off the CPU the LC chose.

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_agent::publish::control::{request, Request};
use headroom_host::sched;
use headroom_types::CpuSet;
use live::marked::MarkedGroup as Guard;

const OWN_PIN: &str = "a_thread_the_lc_pinned_itself_before_the_agent_keeps_its_pin";

/// An LC whose second thread pins itself onto CPU 1 (saying so in `<dir>/pinned`); `marker`
/// on its command line.
fn python_lc(dir: &Path, marker: &str) -> Option<std::process::Child> {
    let script = "import os,sys,threading,time\n\
         d=sys.argv[1]\n\
         def w():\n    \
             os.sched_setaffinity(0,{1})\n    \
             open(os.path.join(d,'pinned'),'w').close()\n    \
             time.sleep(60)\n\
         threading.Thread(target=w,daemon=True).start()\n\
         time.sleep(60)\n";
    std::process::Command::new(live::python())
        .args(["-c", script])
        .arg(dir)
        .arg(marker)
        .stdin(std::process::Stdio::null())
        .spawn()
        .ok()
}

/// Each thread of `pid` with its affinity.
fn affinities(pid: u32) -> Vec<(i32, Option<CpuSet>)> {
    sched::threads(Path::new("/"), pid as i32)
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t, sched::affinity(t).ok()))
        .collect()
}

/// LC on CPUs 0-1 whose second thread pinned itself onto CPU 1; the agent pins both onto
/// CPU 1 (`[lc.threads] cpus = "1"`). After `ctl off`, and after the agent's `restore`, the
/// main thread must be back on 0-1 and the second thread on CPU 1, as the LC left them. On the
/// code before, the second thread was moved onto 0-1.
#[test]
fn a_thread_the_lc_pinned_itself_before_the_agent_keeps_its_pin() {
    let Some(guard) = Guard::setup(OWN_PIN, "hp39", 3, "own-pin", 39) else {
        return;
    };
    let all = sched::affinity(0).unwrap_or_default();
    if !(all.contains(0) && all.contains(1)) {
        return eprintln!("SKIP {OWN_PIN}: needs CPUs 0 and 1 (has {all})");
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(mut lc) = python_lc(dir.path(), &guard.marker) else {
        return eprintln!("SKIP {OWN_PIN}: no python3 to stand in for a threaded LC");
    };
    let ready = live::eventually(Duration::from_secs(5), || {
        dir.path().join("pinned").exists()
    });
    let before = affinities(lc.id());
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
    let runner = match live::start_agent(&text, Duration::from_secs(5)) {
        Ok(r) => r,
        Err(why) => {
            let _ = lc.kill();
            let _ = lc.wait();
            return eprintln!("SKIP {OWN_PIN}: {why}");
        }
    };
    let one = CpuSet::from([1]);
    let pinned = live::eventually(Duration::from_secs(4), || {
        affinities(lc.id())
            .iter()
            .all(|(_, c)| c.as_ref() == Some(&one))
    });
    let off = request(&dir.path().join("ctl.sock"), &Request::Off);
    let after_off = affinities(lc.id());
    let _ = runner.join();
    let after_restore = affinities(lc.id());
    let _ = lc.kill();
    let _ = lc.wait();
    assert!(ready, "the LC's second thread pinned itself");
    let both = CpuSet::from([0, 1]);
    assert_eq!(before.len(), 2, "the LC's threads: {before:?}");
    assert_eq!(before[0].1.as_ref(), Some(&both), "main thread: {before:?}");
    assert_eq!(
        before[1].1.as_ref(),
        Some(&one),
        "second thread: {before:?}"
    );
    assert!(pinned, "both threads pinned onto CPU 1 by [lc.threads]");
    assert!(
        off.as_ref().is_ok_and(|r| r.ok),
        "ctl off answered: {off:?}"
    );
    assert_eq!(after_off, before, "after `ctl off`, as the LC left them");
    assert_eq!(
        after_restore, before,
        "after `restore`, as the LC left them"
    );
}

const DURING_RESTORE: &str = "threads_the_lc_creates_while_the_agent_restores_are_put_back";

/// LC whose main thread starts a thread every 2 ms (each lives 1.5 s), up to 4 000 in all;
/// `marker` on its command line.
fn busy_lc(marker: &str) -> Option<std::process::Child> {
    let script = "import threading,time\n\
         for _ in range(4000):\n    \
             threading.Thread(target=time.sleep,args=(1.5,),daemon=True).start()\n    \
             time.sleep(0.002)\n";
    std::process::Command::new(live::python())
        .args(["-c", script])
        .arg(marker)
        .stdin(std::process::Stdio::null())
        .spawn()
        .ok()
}

/// An LC starting threads all the time is pinned onto CPU 1; when the agent ends (`restore`)
/// every thread must be back on CPUs 0-1, those created while it restored included. On the
/// code before, `restore` listed the inheriting threads before it put their creator back, and
/// a thread created in between kept CPU 1 (2 of 5 runs of the pass's script).
#[test]
fn threads_the_lc_creates_while_the_agent_restores_are_put_back() {
    let Some(guard) = Guard::setup(DURING_RESTORE, "hp39", 3, "during-restore", 40) else {
        return;
    };
    let all = sched::affinity(0).unwrap_or_default();
    if !(all.contains(0) && all.contains(1)) {
        return eprintln!("SKIP {DURING_RESTORE}: needs CPUs 0 and 1 (has {all})");
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(mut lc) = busy_lc(&guard.marker) else {
        return eprintln!("SKIP {DURING_RESTORE}: no python3 to stand in for a threaded LC");
    };
    let before = sched::affinity(lc.id() as i32).unwrap();
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
    let runner = match live::start_agent(&text, Duration::from_secs(4)) {
        Ok(r) => r,
        Err(why) => {
            let _ = lc.kill();
            let _ = lc.wait();
            return eprintln!("SKIP {DURING_RESTORE}: {why}");
        }
    };
    let one = CpuSet::from([1]);
    let pinned = live::eventually(Duration::from_secs(3), || {
        sched::affinity(lc.id() as i32).is_ok_and(|c| c == one)
    });
    let _ = runner.join();
    let left: Vec<_> = affinities(lc.id())
        .into_iter()
        .filter(|(_, c)| c.as_ref().is_some_and(|c| *c != before))
        .collect();
    let _ = lc.kill();
    let _ = lc.wait();
    assert!(
        pinned,
        "the LC's main thread pinned onto CPU 1 by [lc.threads]"
    );
    assert!(
        left.is_empty(),
        "after `restore`, LC threads not on its CPUs from before ({before}): {left:?}"
    );
}
