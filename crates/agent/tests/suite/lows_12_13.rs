//! The twelfth and thirteenth hostile passes' lows on the agent's side (issue 42,
//! docs/safety-hostile-pass-13.md "Found, not fixed"). The starts need root (cgroups) and print
//! SKIP otherwise.

use crate::live;

use std::time::Duration;

use headroom_agent::runtime::{Agent, AgentOptions};
use headroom_control::config::Config;

/// A config whose LC is this test's own process, BE `sleep 5`, static cores, and the given
/// `[safety]` / `[api]` lines.
fn config(lc: u32, group: &str, safety: &str, api: &str) -> String {
    live::sleeper_lc_config(
        lc,
        group,
        "[\"sleep\", \"5\"]",
        &format!("on_exit = \"restore\"\n{safety}"),
        api,
    )
}

fn options(text: &str) -> AgentOptions {
    let mut o = AgentOptions::new(Config::from_toml_str(text).expect("the test's config"));
    o.handle_signals = false;
    o.run_for = Some(Duration::from_millis(300));
    o
}

/// A decision log refused at start (here a file that is not a decision log) exited 1, where
/// the other config paths naming what the host holds exit 2: it is the operator's path, a
/// usage error now, its message naming the path.
#[test]
fn a_decision_log_refused_at_start_is_a_usage_error() {
    let lc = live::Children::sleepers(1);
    const T: &str = "a_decision_log_refused_at_start_is_a_usage_error";
    if !live::is_root() {
        eprintln!("SKIP {T}: needs root (the state lock and cgroups)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let _groups = live::EmptyGroupsRemoved("l14-dlog".into());
    let not_a_log = d.path().join("notes.txt");
    std::fs::write(&not_a_log, "these are not decision lines\n").unwrap();
    let text = config(
        lc.pid(0),
        "l14-dlog",
        &format!("state_file = \"{}/state.json\"", d.path().display()),
        &format!(
            "socket = \"{}/ctl.sock\"\ndecision_log = \"{}\"",
            d.path().display(),
            not_a_log.display()
        ),
    );
    match Agent::start(options(&text)) {
        Ok(agent) => {
            let _ = agent.run();
            panic!("a decision log that is not one was taken");
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&*not_a_log.to_string_lossy()),
                "the path is named: {msg}"
            );
            assert!(msg.contains("not a decision log"), "{msg}");
            assert!(
                e.is_usage(),
                "a usage error (exit 2), as other config paths: {msg}"
            );
        }
    }
    assert_eq!(
        std::fs::read_to_string(&not_a_log).unwrap(),
        "these are not decision lines\n",
        "the file was left as it was"
    );
}

/// A BE command the kernel OOM-killed at its group's memory limit was said only as "signal:
/// SIGKILL": said now as "OOM-killed (memory limit N bytes)" (the group's `oom_kill` count rose),
/// in `last_exit` (`ctl status`'s "last ended") and the log. A real v1 (or v2) memory group of
/// 32 MiB and a python process growing by 1 MiB each 2 ms to 256 MiB (it ends by itself past
/// that, unkilled); a 20 s hang bound.
#[test]
fn a_be_command_killed_at_its_memory_limit_is_said_as_oom_killed() {
    use headroom_agent::supervisor::Supervised;
    use headroom_host::{Controller, LinuxHost};
    use headroom_types::GroupPath;
    const T: &str = "a_be_command_killed_at_its_memory_limit_is_said_as_oom_killed";
    if !live::is_root() {
        eprintln!("SKIP {T}: needs root (a memory cgroup)");
        return;
    }
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .map_or(true, |s| !s.success())
    {
        eprintln!("SKIP {T}: no python3 to grow memory");
        return;
    }
    let cgroups = match LinuxHost::system().cgroups() {
        Ok(c) if c.has(Controller::Memory) => c,
        Ok(_) => {
            eprintln!("SKIP {T}: no memory controller here");
            return;
        }
        Err(e) => {
            eprintln!("SKIP {T}: {e}");
            return;
        }
    };
    let _groups = live::EmptyGroupsRemoved("l14-oom".into());
    let group = GroupPath::new("l14-oom/be").unwrap();
    cgroups.create(&group).expect("creating l14-oom/be");
    let limit: u64 = 32 << 20;
    cgroups
        .set_memory_max(&group, Some(limit))
        .expect("setting the memory limit");
    let grow = "import time\nb = []\nfor _ in range(256):\n    b.append(bytearray(1 << 20))\n    time.sleep(0.002)\n";
    let command: Vec<String> = ["python3", "-c", grow].map(String::from).to_vec();
    let mut be = Supervised::new("grower", &command, group.clone(), false, 100, 1000);
    be.start(&cgroups).expect("starting the grower");
    let start = std::time::Instant::now();
    while be.pid().is_some() && start.elapsed() < Duration::from_secs(20) {
        be.check(&cgroups, std::time::Instant::now());
        std::thread::sleep(Duration::from_millis(20));
    }
    let ended = be.last_exit.clone();
    let _ = be.stop(&cgroups, Duration::from_secs(2));
    let _ = cgroups.remove(&group);
    let ended = ended.expect("the grower ended within 20 s");
    assert!(
        ended.starts_with(&format!("OOM-killed (memory limit {limit} bytes)")),
        "said as: {ended}"
    );
}

/// A pid file that is not a regular file (a FIFO, a device) was read as "no pid" without a
/// word, so nothing said why a restarted LC was not followed (pass 13). Said once now, naming
/// the path and what it is, in the log and `ctl status`'s followed targets; not every second.
#[test]
fn a_pid_file_that_is_not_a_regular_file_is_said_once() {
    const T: &str = "a_pid_file_that_is_not_a_regular_file_is_said_once";
    if !live::is_root() {
        eprintln!("SKIP {T}: needs root (cgroups)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("lc.pid");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain mkfifo(2) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let lc = live::Children::sleepers(1);
    let top = "l14-pidfifo";
    let _groups = live::RemoveOnDrop::new(top).wait_for_agent(Duration::from_secs(4));
    let sock = dir.path().join("ctl.sock");
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("pids = [{}]\npid_file = \"{}\"", lc.pid(0), fifo.display()),
        &dir.path().join("state.json"),
        &sock,
    );
    let runner = match live::start_agent(&text, Duration::from_secs(4)) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {T}: {e}"),
    };
    // The follow-up runs once a second: three of them at least before this look.
    std::thread::sleep(Duration::from_millis(3200));
    let said: Vec<String> = live::followed(&sock)
        .into_iter()
        .filter(|r| r.contains(&*fifo.to_string_lossy()))
        .collect();
    let summary = runner
        .join()
        .expect("the agent's thread")
        .expect("the agent's run");
    assert!(summary.ticks > 0);
    assert_eq!(said.len(), 1, "said once, not each second: {said:?}");
    assert!(
        said[0].contains("FIFO") && said[0].contains("not a regular file"),
        "{said:?}"
    );
}

const JOINED: &str = "ended_source_threads_of_gone_pods_are_joined";

/// A discovered service's source threads, stopped when its pod goes, are joined once they end
/// (`sensors::join_ended`, between ticks): the threads the agent holds (`ctl status`'s
/// `threads_held`) come back to what they were with no pod, however many pods came and went.
/// Before join_ended, every pod that went left its handles until the agent's exit.
#[test]
fn ended_source_threads_of_gone_pods_are_joined() {
    let _discovery = live::the_discovery_holder();
    use headroom_agent::publish::control::{request, Request};
    use headroom_agent::runtime::LcEvents;
    use live::discovery::send;
    use live::marked::MarkedGroup;

    let Some(guard) = MarkedGroup::setup(JOINED, "l14", 9, "join", 1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let group = guard.top.join("pod").unwrap();
    if let Err(e) = guard.cgroups.create(&group) {
        return eprintln!("SKIP {JOINED}: creating {group}: {e}");
    }
    let text = live::discovery::config(
        &guard.top,
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let sock = dir.path().join("ctl.sock");
    let (tx, rx) = LcEvents::channel();
    let mut opts = live::options(&text, Duration::from_secs(9));
    opts.discovery = Some(rx);
    let agent = match Agent::start(opts) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {JOINED}: the agent does not start here: {e}"),
    };
    let run = std::thread::spawn(move || agent.run().map(|_| ()));
    let held = || {
        request(&sock, &Request::Status)
            .ok()
            .and_then(|r| r.status)
            .and_then(|s| s.threads_held)
    };
    let pod = |i: u64| {
        live::discovery::pod(
            &format!("shop/cache-{i}"),
            &format!("0a0a0a0a-0000-4000-8000-{i:012}"),
            &group,
            Some(31000 + i as u16),
        )
    };
    send(&tx, 1, Vec::new());
    let answered = live::eventually(Duration::from_secs(3), || held().is_some());
    let base = held();
    // Six rounds: a pod with a latency port comes (its sources start), then goes (stopped).
    let mut version = 2;
    for i in 0..6 {
        send(&tx, version, vec![pod(i)]);
        std::thread::sleep(Duration::from_millis(300));
        send(&tx, version + 1, Vec::new());
        std::thread::sleep(Duration::from_millis(300));
        version += 2;
    }
    // The stopped threads end within a tick or two (they are woken); joined at the next take.
    let mut last = None;
    let settled = live::eventually(Duration::from_secs(3), || {
        send(&tx, version, Vec::new());
        version += 1;
        last = held();
        last.is_some() && last <= base
    });
    let result = run.join().expect("the agent's thread");
    if !answered {
        return eprintln!("SKIP {JOINED}: the agent did not answer here ({result:?})");
    }
    assert!(result.is_ok(), "the run: {result:?}");
    assert!(
        settled,
        "threads held {last:?} after six pods came and went, {base:?} with none: ended \
         source threads were not joined"
    );
}
