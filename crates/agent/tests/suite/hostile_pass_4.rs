//! The fourth hostile pass (issue 42, docs/safety-hostile-pass-4.md): a BE command that
//! daemonizes, leaving a child behind in its group — `restore` left the child running with the
//! originals back and no agent, and one moved out of the group was never moved back; a restart
//! that fails after it confined BE thawed the earlier agent's BE; a live change of the policy's
//! interval was acknowledged and not applied. Real kernel, root; prints SKIP otherwise. Groups
//! are `hostile4-*`, removed (processes killed first) by a guard, also when a test fails.

use crate::live;

use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_agent::publish::control::{request, Request};
use headroom_agent::runtime::Agent;
use headroom_host::FreezeState;
use headroom_types::GroupPath;

use live::marked::{alive, groups_of, sleeps_with_marker, MarkedGroup as Guard};

/// Root with a writable cgroupfs and a fresh `hostile4-<name>-<pid>` top group, or `None` after a
/// SKIP line. `id` (one per test) makes the marker unique among the tests running together.
fn setup(test: &str, name: &str, id: u32) -> Option<Guard> {
    Guard::setup(test, "hostile4", 4, name, id)
}

/// A config on `top/{lc,be}`: the LC `lc_pid`, the BE `command` (`restart = false`),
/// static-cores on CPU 0, the given exit action, state and socket in `dir`.
fn config(top: &GroupPath, dir: &Path, lc_pid: u32, command: &str, on_exit: &str) -> String {
    let d = dir.display();
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{lc_pid}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = {command}\nrestart = false\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"{on_exit}\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n"
    )
}

/// A BE command that daemonizes: a `sleep MARKER` in a session of its own, the command
/// itself exiting at once.
fn daemonizing(marker: &str) -> String {
    format!("[\"sh\", \"-c\", \"setsid sleep {marker} </dev/null >/dev/null 2>&1 & exit 0\"]")
}

/// An agent on `guard`'s groups whose BE command daemonizes, running for `run_for` in a thread
/// (the LC a sleeper); `None` (SKIP printed) where the agent does not start here.
fn run_daemonizing_agent(
    test: &str,
    guard: &Guard,
    dir: &Path,
    lc: &live::Children,
    run_for: Duration,
) -> Option<
    std::thread::JoinHandle<
        Result<headroom_agent::runtime::RunSummary, headroom_agent::runtime::AgentError>,
    >,
> {
    let text = config(
        &guard.top,
        dir,
        lc.pid(0),
        &daemonizing(&guard.marker),
        "restore",
    );
    live::start_agent(&text, run_for)
        .map_err(|why| eprintln!("SKIP {test}: {why}"))
        .ok()
}

const DAEMON_RESTORE: &str = "a_daemonized_be_child_is_stopped_by_restore";

/// The BE command exits at once, its daemonized child running on in the BE group. `restore`
/// found no command to stop and left the child there, thawed on every CPU with no agent (and
/// the group, which it kept busy). It is stopped with the rest of the group now.
#[test]
fn a_daemonized_be_child_is_stopped_by_restore() {
    let Some(guard) = setup(DAEMON_RESTORE, "daemon-restore", 1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let Some(runner) = run_daemonizing_agent(
        DAEMON_RESTORE,
        &guard,
        dir.path(),
        &lc,
        Duration::from_millis(1500),
    ) else {
        return;
    };
    let be = format!("/{}/be", guard.top);
    let started = live::eventually(Duration::from_secs(5), || {
        sleeps_with_marker(&guard.marker)
            .first()
            .is_some_and(|&p| groups_of(p).iter().any(|g| g == &be))
    });
    assert!(started, "the daemon runs in {be}");
    let summary = runner.join().unwrap().expect("the agent restored");
    eprintln!("exit action: {}", summary.exit_action);
    let gone = live::eventually(Duration::from_secs(3), || {
        sleeps_with_marker(&guard.marker).is_empty()
    });
    assert!(
        gone,
        "the BE command's daemonized child outlived restore: {:?} in {:?}",
        sleeps_with_marker(&guard.marker),
        sleeps_with_marker(&guard.marker)
            .first()
            .map(|&p| groups_of(p))
            .unwrap_or_default()
    );
    assert!(!guard.cgroups.exists(&guard.top), "the groups were removed");
}

const DAEMON_MOVED: &str = "a_daemonized_be_child_moved_out_is_moved_back";

/// The daemonized child (no longer a descendant of the BE command) moved to the root groups by
/// someone else ran on there, unconfined, and was never moved back; `ctl status` said nothing.
#[test]
fn a_daemonized_be_child_moved_out_is_moved_back() {
    let Some(guard) = setup(DAEMON_MOVED, "daemon-moved", 2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let Some(runner) = run_daemonizing_agent(
        DAEMON_MOVED,
        &guard,
        dir.path(),
        &lc,
        Duration::from_secs(8),
    ) else {
        return;
    };
    let sock = dir.path().join("ctl.sock");
    let be = guard.top.join("be").unwrap();
    // in the BE group of every hierarchy the agent manages
    let in_be = |p: u32| {
        let dirs: Vec<_> = guard
            .cgroups
            .group_dirs(&be)
            .into_iter()
            .filter(|(_, d)| d.is_dir())
            .collect();
        !dirs.is_empty()
            && dirs.iter().all(|(_, d)| {
                std::fs::read_to_string(d.join("cgroup.procs"))
                    .is_ok_and(|t| t.lines().any(|l| l.trim() == p.to_string()))
            })
    };
    let mut daemon = None;
    live::eventually(Duration::from_secs(5), || {
        daemon = sleeps_with_marker(&guard.marker).first().copied();
        daemon.is_some_and(in_be)
    });
    let daemon = daemon.expect("the daemon runs");
    // The follower looks once a second: let it see the daemon in the group once.
    std::thread::sleep(Duration::from_millis(2200));
    // someone else: the daemon moved to each hierarchy's root group
    for (_, d) in guard.cgroups.group_dirs(&be) {
        if !d.is_dir() {
            continue;
        }
        let root = d.ancestors().nth(be.as_str().split('/').count()).unwrap();
        std::fs::write(root.join("cgroup.procs"), daemon.to_string()).unwrap();
    }
    assert!(!in_be(daemon), "moved out: {:?}", groups_of(daemon));
    let back = live::eventually(Duration::from_secs(5), || in_be(daemon));
    let said = live::followed(&sock);
    let _ = runner.join();
    assert!(
        back,
        "the daemon {daemon} was left outside {be}: {:?}",
        groups_of(daemon)
    );
    assert!(
        said.iter().any(|r| r.contains(&daemon.to_string())),
        "ctl status names it: {said:?}"
    );
}

const RESTART_FAILS: &str = "a_restart_that_fails_leaves_the_earlier_agents_be_frozen";

/// An agent exits with `freeze` (BE frozen, its state file kept for the next start). The next
/// agent's start fails after it took the groups over — here the recorded allocation names a CPU
/// the machine no longer has (a VM resized between the two). Undoing the start restored the
/// originals, thawing the first agent's BE onto every CPU with no agent left. A failed restart
/// leaves BE frozen and the state file in place now.
#[test]
fn a_restart_that_fails_leaves_the_earlier_agents_be_frozen() {
    let Some(guard) = setup(RESTART_FAILS, "restart-fails", 3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let command = format!("[\"sleep\", \"{}\"]", guard.marker);
    let text = config(&guard.top, dir.path(), lc.pid(0), &command, "freeze");
    let first = match Agent::start(live::options(&text, Duration::from_millis(800))) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {RESTART_FAILS}: the agent does not start here: {e}"),
    };
    first.run().expect("the first agent froze BE and exited");
    let be = guard.top.join("be").unwrap();
    assert_eq!(
        guard.cgroups.freeze_state(&be).unwrap(),
        FreezeState::Frozen
    );
    let worker = *sleeps_with_marker(&guard.marker)
        .first()
        .expect("the first agent's BE, frozen");
    // The recorded allocation names a CPU this machine does not have.
    let state_path: PathBuf = dir.path().join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    state["last_allocation"]["be_cpus"] = serde_json::json!([4095]);
    std::fs::write(&state_path, state.to_string()).unwrap();

    let second = Agent::start(live::options(&text, Duration::from_millis(800)));
    let err = match second {
        Ok(a) => {
            let _ = a.run();
            panic!("the restart started on a state naming CPU 4095");
        }
        Err(e) => e.to_string(),
    };
    eprintln!("the restart failed as meant: {err}");
    assert!(alive(worker), "the first agent's BE {worker} lives on");
    assert_eq!(
        guard.cgroups.freeze_state(&be).unwrap(),
        FreezeState::Frozen,
        "the failed restart thawed the earlier agent's BE ({err})"
    );
    let want = format!("/{be}");
    assert!(
        groups_of(worker).iter().any(|g| g == &want),
        "BE still in its group: {:?}",
        groups_of(worker)
    );
    assert!(
        state_path.exists(),
        "the state file is kept for the next start"
    );
}

const LIVE_INTERVAL: &str = "a_live_change_of_the_policys_interval_is_applied";

/// `ctl set policy.blind.poll_ms=5` (and `policy.kind` to a faster policy) was acknowledged
/// while the loop kept the interval it started with (1 s here): the policy then ran 200 times
/// slower than set. The loop follows the change now; `ctl status` says its interval.
#[test]
fn a_live_change_of_the_policys_interval_is_applied() {
    let Some(guard) = setup(LIVE_INTERVAL, "live-interval", 4) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let command = format!("[\"sleep\", \"{}\"]", guard.marker);
    let text = config(&guard.top, dir.path(), lc.pid(0), &command, "restore");
    let agent = match Agent::start(live::options(&text, Duration::from_secs(12))) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {LIVE_INTERVAL}: the agent does not start here: {e}"),
    };
    let runner = std::thread::spawn(move || agent.run());
    let sock = dir.path().join("ctl.sock");
    let status = || request(&sock, &Request::Status).ok().and_then(|r| r.status);
    assert!(live::eventually(Duration::from_secs(5), || status().is_some()));
    let set = |key: &str, value: &str| {
        let r = request(
            &sock,
            &Request::Set {
                key: key.into(),
                value: value.into(),
            },
        )
        .unwrap();
        assert!(r.ok, "{key}={value}: {}", r.message);
    };
    // static-cores ticks once a second; blind every poll_ms
    set("policy.blind.poll_ms", "5");
    set("policy.kind", "blind");
    let ticks = status().unwrap().ticks;
    let fast = live::eventually(Duration::from_secs(8), || {
        status().is_some_and(|s| s.ticks >= ticks + 100)
    });
    let st = status().unwrap();
    let _ = runner.join();
    assert_eq!(st.policy, "blind");
    assert_eq!(st.tick_interval_ms, Some(5.0), "{st:?}");
    assert!(
        fast,
        "{} ticks since the change: the loop kept its old interval",
        st.ticks - ticks
    );
}

/// An agent stopped by SIGSTOP (or hung) accepts a `ctl` connection in the kernel and never
/// answers: the client gave up after its 15 s with "reading from ctl.sock: Resource
/// temporarily unavailable (os error 11)". It says what the silence means now.
#[test]
fn a_silent_agent_is_named_as_such_by_ctl() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // accepts (as the kernel does for a stopped agent's backlog) and never answers
    let held = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
    let err = request(&sock, &Request::Status).unwrap_err().to_string();
    drop(held.join());
    assert!(err.contains("no answer within 15 s"), "{err}");
    assert!(err.contains("stopped"), "{err}");
}
