//! Hostile pass 33's open row (issue 42): this VM's PID 1 was found in an agent's LC group.
//! A number written to `cgroup.procs` that names a *thread* moves that thread's whole process,
//! and `/proc/<tid>` exists for a thread as for a process: an `[lc] pids` entry (or a pid read
//! from a pid file, or recorded) that named, or after pid numbers wrapped came to name, a
//! thread of another process moved that process. A thread id is refused at the config (exit 2,
//! naming its process) and at the host's one move path; so are init and kernel threads.

use crate::live;

use std::time::Duration;

use headroom_host::LinuxHost;
use headroom_types::GroupPath;

/// A thread of this test process that runs until `stop` is sent: its id.
fn a_live_thread() -> (
    u32,
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        tx.send(headroom_host::process::thread_id() as u32).unwrap();
        let _ = stopped.recv();
    });
    (rx.recv().unwrap(), stop, t)
}

/// `[lc] pids` naming a thread of this test process, pid 1 and kernel thread 2: refused at
/// start as a usage error naming each (and the thread's process), nothing made. On the code
/// before, the thread's whole process (here, the test itself) was moved into the LC group, and
/// pid 1 was moved too.
#[test]
fn lc_pids_naming_a_thread_init_or_a_kernel_thread_are_refused() {
    let (tid, stop, t) = a_live_thread();
    let me = std::process::id();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let top = format!("tid-pids-{me}");
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{tid}, 1, 2]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"60\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n"
    );
    let started =
        headroom_agent::runtime::Agent::start(live::options(&text, Duration::from_millis(300)));
    let outcome = match started {
        Ok(agent) => {
            let _ = agent.run();
            Err(())
        }
        Err(e) => Ok(e),
    };
    stop.send(()).unwrap();
    t.join().unwrap();
    let made = LinuxHost::system().cgroups().is_ok_and(|cg| {
        let g = GroupPath::new(&top).unwrap();
        let made = cg.group_dirs(&g).iter().any(|(_, d)| d.is_dir());
        if made {
            // the old code moved this process and init in: out again before the removal
            for (_, root) in cg.group_dirs(&GroupPath::root()) {
                let _ = std::fs::write(root.join("cgroup.procs"), me.to_string());
                let _ = std::fs::write(root.join("cgroup.procs"), "1");
            }
            let _ = cg.remove(&g);
        }
        made
    });
    let Ok(err) = outcome else {
        panic!("the agent started with a thread id {tid} of {me}, pid 1 and pid 2 as the LC");
    };
    let msg = err.to_string();
    assert!(err.is_usage(), "a usage error (exit 2): {msg}");
    assert!(
        msg.contains(&format!("thread of process {me}")),
        "the thread {tid} not named as {me}'s: {msg}"
    );
    assert!(msg.contains("init (pid 1)"), "pid 1 not named: {msg}");
    assert!(msg.contains("kernel thread"), "pid 2 not named: {msg}");
    assert!(!made, "nothing made: {top} exists");
}

/// The host's move path refuses a thread id: a recorded or discovered number that names a
/// thread never moves its process. On the code before, this test process was moved.
#[test]
fn the_host_never_moves_a_process_by_one_of_its_threads() {
    let test = "the_host_never_moves_a_process_by_one_of_its_threads";
    if !live::is_root() {
        eprintln!("SKIP {test}: needs root (cgroups)");
        return;
    }
    let Ok(cg) = LinuxHost::system().cgroups() else {
        eprintln!("SKIP {test}: no cgroups here");
        return;
    };
    let me = std::process::id();
    let group = GroupPath::new(&format!("tid-move-{me}")).unwrap();
    cg.create(&group).unwrap();
    let (tid, stop, t) = a_live_thread();
    let moved = cg.move_process(&group, tid as i32);
    let inside = cg.procs(&group).unwrap_or_default().contains(&(me as i32));
    stop.send(()).unwrap();
    t.join().unwrap();
    for (_, root) in cg.group_dirs(&GroupPath::root()) {
        let _ = std::fs::write(root.join("cgroup.procs"), me.to_string());
    }
    let _ = cg.remove(&group);
    let err = moved.expect_err("a thread id moved");
    assert!(
        err.to_string().contains(&format!("thread of process {me}")),
        "{err}"
    );
    assert!(
        !inside,
        "this process was moved into {group} by thread {tid}"
    );
}
