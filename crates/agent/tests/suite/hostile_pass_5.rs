//! The fifth hostile pass (issue 42, docs/safety-hostile-pass-5.md): the LC follower took one
//! of BE's own processes as the LC (a stale pid file whose pid BE reused, a BE job listening on
//! the LC's port) and moved it into the LC group, out of BE's freeze and cpuset; a control
//! socket path naming a file that is not a socket deleted that file. Live tests need root
//! (cgroups) and print SKIP otherwise; their groups are `hp5-*`, removed (processes killed
//! first) by a guard, also when a test fails.

use crate::live;

use std::time::Duration;

use headroom_agent::publish::control::{request, Request};
use headroom_host::LinuxHost;
use headroom_types::GroupPath;

use live::marked::{groups_of, with_marker, MarkedGroup as Guard};

/// Root with a writable cgroupfs and a fresh `hp5-<name>-<pid>` top group, or `None` after a
/// SKIP line. `id` (one per test) makes the marker unique among the tests running together.
fn setup(test: &str, name: &str, id: u32) -> Option<Guard> {
    Guard::setup(test, "hp5", 5, name, id)
}

const PID_FILE_NAMES_BE: &str = "a_be_process_named_by_the_lcs_pid_file_is_left_in_be";

/// The LC dies and its pid file, never cleaned up, now names one of BE's processes (BE reused
/// the pid; a BE job listening on the LC's port is the same case). The follower moved that BE
/// process into the LC group — out of BE's freeze and cpuset — every second (the BE follower
/// moved it back, the LC follower out again). It is left in BE now, and said once.
#[test]
fn a_be_process_named_by_the_lcs_pid_file_is_left_in_be() {
    let Some(guard) = setup(PID_FILE_NAMES_BE, "pidfile-be", 1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let mut lc = live::Children::sleepers(1);
    let pid_file = dir.path().join("lc.pid");
    std::fs::write(&pid_file, format!("{}\n", lc.pid(0))).unwrap();
    let top = &guard.top;
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{}]\npid_file = \"{}\"\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"{}\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        lc.pid(0),
        pid_file.display(),
        guard.marker
    );
    let runner = match live::start_agent(&text, Duration::from_secs(8)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {PID_FILE_NAMES_BE}: {why}"),
    };
    let be_group = format!("/{top}/be");
    let lc_group = format!("/{top}/lc");
    let mut be = None;
    live::eventually(Duration::from_secs(5), || {
        be = with_marker(&guard.marker).first().copied();
        be.is_some_and(|p| groups_of(p).contains(&be_group))
    });
    let be = be.expect("BE runs in its group");
    // The LC dies; its pid file now names BE's process.
    let _ = lc.0[0].kill();
    let _ = lc.0[0].wait();
    std::fs::write(&pid_file, format!("{be}\n")).unwrap();
    // Three follower looks: BE must never be seen in the LC group.
    let mut taken = Vec::new();
    live::eventually(Duration::from_secs(3), || {
        let now = groups_of(be);
        if now.contains(&lc_group) {
            taken = now;
        }
        false
    });
    let said = live::followed(&dir.path().join("ctl.sock"));
    let _ = runner.join();
    assert!(
        taken.is_empty(),
        "BE's process {be} was moved into the LC group {lc_group}: {taken:?}"
    );
    assert!(
        said.iter()
            .any(|r| r.contains(&be.to_string()) && r.contains("BE")),
        "ctl status says it: {said:?}"
    );
}

/// `api.socket` naming a file that is not a socket (a typo: the config file, another agent's
/// state file) — the agent removed it to bind its socket there. Refused now, the file kept.
#[test]
fn a_control_socket_path_naming_another_file_never_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("headroom.toml");
    std::fs::write(&path, "[lc]\nname = \"kept\"\n").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let served = headroom_agent::publish::control::serve(&path, stop.clone());
    let err = match served {
        Ok((_, thread)) => {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = std::os::unix::net::UnixStream::connect(&path);
            let _ = thread.join();
            String::from("served")
        }
        Err(e) => e.to_string(),
    };
    assert_eq!(
        std::fs::read_to_string(&path).ok().as_deref(),
        Some("[lc]\nname = \"kept\"\n"),
        "the file at the socket path was replaced ({err})"
    );
    assert!(err.contains("not a socket"), "{err}");
    // a stale socket (an agent killed with -9) is still replaced
    let sock = dir.path().join("ctl.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let (_, thread) = headroom_agent::publish::control::serve(&sock, stop.clone())
        .expect("a stale socket is replaced");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = std::os::unix::net::UnixStream::connect(&sock);
    let _ = thread.join();
}

const ON_HOST: &str = "a_config_naming_what_this_host_lacks_is_refused_before_anything_is_made";

/// `[lc] pids` naming no running process passed the checks, and the start failed after it had
/// made the groups (exit 1); a BE command whose program is not there started, and "died" with
/// status 127 at every restart. Both are config errors now, named at once (exit 2), with
/// nothing made.
#[test]
fn a_config_naming_what_this_host_lacks_is_refused_before_anything_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // a pid that ran and is gone
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let top = format!("hp5-on-host-{}", std::process::id());
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{dead}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"hp5-no-such-program\", \"1\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n"
    );
    let err = match headroom_agent::runtime::Agent::start(live::options(
        &text,
        Duration::from_millis(500),
    )) {
        Ok(agent) => {
            let _ = agent.run();
            panic!("{ON_HOST}: the agent started on pid {dead} (gone) and a missing program");
        }
        Err(e) => e,
    };
    let msg = err.to_string();
    eprintln!("{msg}");
    let made = LinuxHost::system().cgroups().is_ok_and(|cg| {
        cg.group_dirs(&GroupPath::new(&top).unwrap())
            .iter()
            .any(|(_, d)| d.is_dir())
    });
    if made {
        if let Ok(cg) = LinuxHost::system().cgroups() {
            let _ = cg.remove(&GroupPath::new(&top).unwrap());
        }
    }
    assert!(err.is_usage(), "a usage error (exit 2): {msg}");
    assert!(msg.contains("lc.pids"), "{msg}");
    assert!(msg.contains("be[0].command"), "{msg}");
    assert!(!made, "nothing made: {top} exists");
    assert!(!dir.path().join("state.json").exists());
}

const RUN_FOR: &str = "a_run_too_long_for_the_clock_is_refused_at_start";

/// `headroom agent --duration 1e19` started the agent, which panicked on its first deadline
/// (an Instant overflow): BE left frozen, the groups and the state file, no exit action.
/// Refused at start now, as a usage error, with nothing made.
#[test]
fn a_run_too_long_for_the_clock_is_refused_at_start() {
    let Some(guard) = setup(RUN_FOR, "run-for", 2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let lc = live::Children::sleepers(1);
    let top = &guard.top;
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"{}\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        lc.pid(0),
        guard.marker
    );
    let options = live::options(&text, Duration::from_secs(10_000_000_000_000_000_000));
    match headroom_agent::runtime::Agent::start(options) {
        Ok(agent) => {
            let ran = std::thread::spawn(move || agent.run()).join();
            panic!(
                "{RUN_FOR}: started on a 1e19 s run (the run {})",
                if ran.is_err() { "panicked" } else { "ended" }
            );
        }
        Err(e) => {
            assert!(e.is_usage(), "a usage error (exit 2): {e}");
            assert!(e.to_string().contains("--duration"), "{e}");
        }
    }
    assert!(!guard.cgroups.exists(&guard.top.join("be").unwrap()));
}

const SUBGROUP: &str = "a_be_process_in_a_group_below_bes_is_left_there";

/// A BE job that puts its workers in a group of its own below BE's (a batch system's per-job
/// group) was "moved by someone else" in the follower's eyes: moved back up into BE's group
/// every second, each move logged and listed as a stray. It is inside BE (frozen and narrowed
/// with it): left there now.
#[test]
fn a_be_process_in_a_group_below_bes_is_left_there() {
    let Some(guard) = setup(SUBGROUP, "subgroup", 3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let lc = live::Children::sleepers(1);
    let top = &guard.top;
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\n\
         command = [\"sh\", \"-c\", \"sleep {} & wait\"]\nrestart = false\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        lc.pid(0),
        guard.marker
    );
    let runner = match live::start_agent(&text, Duration::from_secs(7)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {SUBGROUP}: {why}"),
    };
    let be_group = format!("/{top}/be");
    let mut worker = None;
    live::eventually(Duration::from_secs(5), || {
        worker = with_marker(&guard.marker).into_iter().find(|p| {
            std::fs::read(format!("/proc/{p}/comm")).is_ok_and(|c| c.starts_with(b"sleep"))
        });
        worker.is_some_and(|p| groups_of(p).contains(&be_group))
    });
    let worker = worker.expect("the BE worker runs in its group");
    // the job's own group below BE's, the worker moved into it
    let job = guard.top.join("be").unwrap().join("job").unwrap();
    guard.cgroups.create(&job).unwrap();
    guard.cgroups.move_process(&job, worker as i32).unwrap();
    let job_group = format!("/{job}");
    let mut moved_up = Vec::new();
    live::eventually(Duration::from_millis(2500), || {
        let now = groups_of(worker);
        if now.contains(&be_group) {
            moved_up = now;
        }
        false
    });
    let said = live::followed(&dir.path().join("ctl.sock"));
    let _ = runner.join();
    assert!(
        moved_up.is_empty(),
        "the worker {worker} in {job_group} was moved back up: {moved_up:?} ({said:?})"
    );
    assert!(
        !said.iter().any(|r| r.contains(&worker.to_string())),
        "listed as a stray: {said:?}"
    );
}

const IO_DEVICE: &str = "an_io_limit_on_a_disk_this_host_lacks_is_refused_at_start_and_live";

/// `safety.be_io_limits` naming a device this host lacks (or a partition: the kernel throttles
/// whole disks) passed; each tick's throttle write was refused (ENODEV), and a refused write
/// that confines BE freezes it until it goes through — for good. Refused at start and on a
/// live `set` now, with the key.
#[test]
fn an_io_limit_on_a_disk_this_host_lacks_is_refused_at_start_and_live() {
    let Some(guard) = setup(IO_DEVICE, "io-device", 4) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let lc = live::Children::sleepers(1);
    let top = &guard.top;
    let text = |io: &str| {
        format!(
            "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{}]\n\n\
             [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"{}\"]\n\n\
             [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
             [sensors]\nidle_sensing = \"poll\"\n\n\
             [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n{io}\n\n\
             [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
            lc.pid(0),
            guard.marker
        )
    };
    // a device number no host has
    let missing = "4095:1048575";
    let bad = text(&format!(
        "[[safety.be_io_limits]]\ndevice = \"{missing}\"\nread_bps = 1048576"
    ));
    match headroom_agent::runtime::Agent::start(live::options(&bad, Duration::from_secs(2))) {
        Ok(agent) => {
            let _ = agent.run();
            panic!("{IO_DEVICE}: started with an io limit on {missing}");
        }
        Err(e) => {
            assert!(e.is_usage(), "a usage error (exit 2): {e}");
            assert!(e.to_string().contains("be_io_limits[0].device"), "{e}");
        }
    }
    let runner = match live::start_agent(&text(""), Duration::from_secs(4)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {IO_DEVICE}: {why}"),
    };
    let sock = dir.path().join("ctl.sock");
    live::eventually(Duration::from_secs(5), || {
        request(&sock, &Request::Status).is_ok()
    });
    let r = request(
        &sock,
        &Request::Set {
            key: "safety.be_io_limits".into(),
            value: format!("[{{device = \"{missing}\", read_bps = 1048576}}]"),
        },
    )
    .unwrap();
    let _ = runner.join();
    assert!(
        !r.ok,
        "a live io limit on {missing} was accepted: {}",
        r.message
    );
    assert!(
        r.message.contains("be_io_limits[0].device"),
        "{}",
        r.message
    );
}
