//! One agent per group (issue 42): a second agent naming a group another live agent manages is
//! refused before it touches anything — as a usage error (exit 2) naming the holder's pid,
//! config and socket — and the first agent's BE and settings stay as they were. Two agents
//! started together: exactly one runs. A lock left by a dead holder is taken over. Needs root
//! (cgroups); prints SKIP otherwise.

use crate::live;

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_agent::publish::control::{request, Request};
use headroom_agent::runtime::{Agent, AgentError, AgentOptions, RunSummary};

fn config(top: &str, dir: &Path, tag: &str, lc_pid: u32) -> String {
    config_on(&format!("{top}/lc"), &format!("{top}/be"), dir, tag, lc_pid)
}

/// A config on the LC group `lc` and the BE group `be` (each a full group path).
fn config_on(lc: &str, be: &str, dir: &Path, tag: &str, lc_pid: u32) -> String {
    live::agent_config(
        lc,
        be,
        &format!("pids = [{lc_pid}]"),
        &dir.join(format!("{tag}-state.json")),
        &dir.join(format!("{tag}.sock")),
    )
}

fn options(text: &str, config_path: &Path, run_for: Duration) -> AgentOptions {
    let mut o = live::options(text, run_for);
    o.config_path = Some(config_path.to_path_buf());
    o
}

fn be_pid(socket: &Path) -> Option<u32> {
    let s = request(socket, &Request::Status).ok()?.status?;
    s.be_commands.first().and_then(|c| c.pid)
}

const SECOND: &str = "a_second_agent_on_held_groups_is_refused_and_changes_nothing";

#[test]
fn a_second_agent_on_held_groups_is_refused_and_changes_nothing() {
    if !live::is_root() {
        return eprintln!("SKIP {SECOND}: needs root (cgroups)");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top = format!("headroom-one-agent-{}", std::process::id());
    let a_cfg = dir.path().join("a.toml");
    let first = match Agent::start(options(
        &config(&top, dir.path(), "a", lc.pid(0)),
        &a_cfg,
        Duration::from_secs(4),
    )) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {SECOND}: the agent does not start here: {e}"),
    };
    let runner = std::thread::spawn(move || first.run());
    let a_sock = dir.path().join("a.sock");
    std::thread::sleep(Duration::from_millis(300));
    let before = request(&a_sock, &Request::Status).unwrap().status.unwrap();
    let be_before = be_pid(&a_sock).expect("the first agent's BE runs");
    assert_eq!(
        before.lock.as_ref().map(|l| l.pid),
        Some(std::process::id()),
        "ctl status names the lock holder"
    );

    // Same groups, its own state file and socket.
    let t0 = Instant::now();
    let refused = Agent::start(options(
        &config(&top, dir.path(), "b", lc.pid(0)),
        &dir.path().join("b.toml"),
        Duration::from_secs(1),
    ));
    let took = t0.elapsed();
    let err = match refused {
        Ok(_) => panic!("a second agent on the same groups started"),
        Err(e) => e,
    };
    assert!(err.is_usage(), "refused as a usage error (exit 2): {err}");
    let msg = err.to_string();
    for part in [
        format!("pid {}", std::process::id()),
        a_cfg.display().to_string(),
        a_sock.display().to_string(),
    ] {
        assert!(msg.contains(&part), "the refusal names {part}: {msg}");
    }
    assert!(took < Duration::from_secs(1), "refused in {took:?}");
    // Nothing of the second agent's was created; the first's BE was not killed.
    assert!(!dir.path().join("b-state.json").exists());
    assert!(!dir.path().join("b.sock").exists());
    std::thread::sleep(Duration::from_millis(300));
    let after = request(&a_sock, &Request::Status).unwrap().status.unwrap();
    assert_eq!(
        after.be_commands[0].pid,
        Some(be_before),
        "the first agent's BE untouched"
    );
    assert_eq!(after.be_commands[0].restarts, 0);
    assert_eq!(
        after.write_errors, before.write_errors,
        "no failed reconciliation in the first agent"
    );
    let _ = runner.join();
}

const RACE: &str = "two_agents_started_together_exactly_one_runs";

#[test]
fn two_agents_started_together_exactly_one_runs() {
    if !live::is_root() {
        return eprintln!("SKIP {RACE}: needs root (cgroups)");
    }
    let lc = live::Children::sleepers(1);
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let top = format!("headroom-agent-race-{}-{round}", std::process::id());
        let texts: Vec<(String, PathBuf)> = ["a", "b"]
            .iter()
            .map(|t| (config(&top, dir.path(), t, lc.pid(0)), dir.path().join(t)))
            .collect();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let handles: Vec<_> = texts
            .into_iter()
            .map(|(text, path)| {
                let b = barrier.clone();
                std::thread::spawn(move || {
                    let o = options(&text, &path, Duration::from_millis(600));
                    b.wait();
                    Agent::start(o).map(|a| a.run())
                })
            })
            .collect();
        let results: Vec<Result<_, AgentError>> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        let started = results.iter().filter(|r| r.is_ok()).count();
        if started == 0 {
            let e = results.into_iter().find_map(|r| r.err()).unwrap();
            if !e.is_usage() {
                return eprintln!("SKIP {RACE}: the agent does not start here: {e}");
            }
            panic!("round {round}: both agents refused: {e}");
        }
        assert_eq!(started, 1, "round {round}: exactly one agent runs");
        let refused = results.into_iter().find_map(|r| r.err()).unwrap();
        assert!(refused.is_usage(), "round {round}: {refused}");
        assert!(refused.to_string().contains("another agent"), "{refused}");
    }
}

#[test]
fn a_lock_left_by_a_dead_holder_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let group = PathBuf::from("/sys/fs/cgroup/cpu/some/group");
    let lock_file = dir
        .path()
        .join(headroom_agent::state::lock_file_name(&group));
    // A holder in another process, killed with SIGKILL while holding it.
    let mut holder = match std::process::Command::new("flock")
        .args(["-x", "-o"])
        .arg(&lock_file)
        .args(["sleep", "60"])
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return eprintln!("SKIP a_lock_left_by_a_dead_holder_is_taken_over: no flock(1): {e}")
        }
    };
    // Watched in /proc/locks, not by taking it: a lock taken and released here removes its
    // file, and flock(1) (no agent) would then hold a file no path names.
    let deadline = Instant::now() + Duration::from_secs(3);
    while headroom_agent::state::held_locks(dir.path()).is_empty() {
        assert!(Instant::now() < deadline, "flock(1) never took its lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    let who = headroom_types::control::LockHolder::default();
    let r = headroom_agent::state::GroupLock::acquire(
        dir.path(),
        std::slice::from_ref(&group),
        who.clone(),
    );
    assert!(
        matches!(r, Err(headroom_agent::state::StateError::Held { .. })),
        "the live holder's lock was not seen: {r:?}"
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
    // flock(1) forks its command before the child closes the lock's descriptor: for a moment
    // after the holder's death that child may still hold it. The target: taken over in ≤ 2 s.
    let t0 = Instant::now();
    let taken = loop {
        let r = headroom_agent::state::GroupLock::acquire(
            dir.path(),
            std::slice::from_ref(&group),
            who.clone(),
        );
        match r {
            Err(headroom_agent::state::StateError::Held { .. })
                if t0.elapsed() < Duration::from_secs(2) =>
            {
                std::thread::sleep(Duration::from_millis(10))
            }
            other => break other,
        }
    };
    assert!(taken.is_ok(), "{taken:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));
}

type Runner = JoinHandle<Result<RunSummary, AgentError>>;

/// The first agent, on `top/a/{lc,be}` with `lc_pid` as its LC, for 3 s in a thread, once
/// its BE runs: the thread, its socket and its BE's pid.
fn first_agent(top: &str, dir: &Path, lc_pid: u32) -> Result<(Runner, PathBuf, u32), String> {
    let first = Agent::start(options(
        &config(&format!("{top}/a"), dir, "a", lc_pid),
        &dir.join("a.toml"),
        Duration::from_secs(3),
    ))
    .map_err(|e| format!("the agent does not start here: {e}"))?;
    let runner = std::thread::spawn(move || first.run());
    let a_sock = dir.join("a.sock");
    std::thread::sleep(Duration::from_millis(300));
    let be = be_pid(&a_sock).expect("the first agent's BE runs");
    Ok((runner, a_sock, be))
}

const NESTED: &str = "an_agent_on_a_group_containing_another_agents_groups_is_refused";

/// The second hostile pass: an agent whose BE group was an ancestor of another agent's groups
/// started, SIGKILLed that agent's LC and BE as "unrecorded processes left in the BE group"
/// and froze what was left. Nesting either way is refused now, and the first agent's LC and
/// BE live on.
#[test]
fn an_agent_on_a_group_containing_another_agents_groups_is_refused() {
    if !live::is_root() {
        return eprintln!("SKIP {NESTED}: needs root (cgroups)");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(2);
    let top = format!("headroom-hostile-2-nest-{}", std::process::id());
    let _cleanup = live::RemoveOnDrop::new(&top);
    // The first agent on top/a/{lc,be}.
    let (runner, a_sock, be_before) = match first_agent(&top, dir.path(), lc.pid(0)) {
        Ok(first) => first,
        Err(e) => return eprintln!("SKIP {NESTED}: {e}"),
    };
    // Above: BE = top/a, which holds the first agent's LC and BE groups.
    // Below: groups inside the first agent's BE group.
    let tries = [
        ("above", format!("{top}/blc"), format!("{top}/a")),
        ("below", format!("{top}/a/be/lc"), format!("{top}/a/be/be")),
    ];
    for (tag, lc_group, be_group) in tries {
        let refused = Agent::start(options(
            &config_on(&lc_group, &be_group, dir.path(), tag, lc.pid(1)),
            &dir.path().join(format!("{tag}.toml")),
            Duration::from_secs(1),
        ));
        let err = match refused {
            Ok(_) => panic!("{tag}: an agent on groups nested with another agent's started"),
            Err(e) => e,
        };
        assert!(err.is_usage(), "{tag}: refused as a usage error: {err}");
        let msg = err.to_string();
        assert!(msg.contains("another agent"), "{tag}: {msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{tag}: the refusal names the holder: {msg}"
        );
        assert!(!dir.path().join(format!("{tag}-state.json")).exists());
    }
    // The first agent's LC and BE were neither killed nor restarted.
    assert!(
        std::fs::read_to_string(format!("/proc/{}/cgroup", lc.pid(0)))
            .is_ok_and(|t| t.contains(&format!("{top}/a/lc"))),
        "the first agent's LC lives on in its group"
    );
    let after = request(&a_sock, &Request::Status).unwrap().status.unwrap();
    assert_eq!(after.be_commands[0].pid, Some(be_before));
    assert_eq!(after.be_commands[0].restarts, 0);
    let _ = runner.join();
}

const EXISTING: &str = "processes_already_in_an_existing_be_group_are_confined_not_killed";

/// The second hostile pass: on a first start (no state file) the agent SIGKILLed every process
/// already in an existing BE group, logging them as "left by an earlier agent". No agent
/// launched them: they are confined as BE, and live on.
#[test]
fn processes_already_in_an_existing_be_group_are_confined_not_killed() {
    if !live::is_root() {
        return eprintln!("SKIP {EXISTING}: needs root (cgroups)");
    }
    let cg = match headroom_host::LinuxHost::system().cgroups() {
        Ok(c) => c,
        Err(e) => return eprintln!("SKIP {EXISTING}: no cgroups: {e}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let procs = live::Children::sleepers(2);
    let top = format!("headroom-hostile-2-existing-{}", std::process::id());
    let _cleanup = live::RemoveOnDrop::new(&top);
    let be = headroom_types::GroupPath::new(&format!("{top}/be")).unwrap();
    if let Err(e) = cg.create(&be) {
        return eprintln!("SKIP {EXISTING}: cgroupfs not writable: {e}");
    }
    let worker = procs.pid(1);
    cg.move_process(&be, worker as i32).unwrap();
    let agent = match Agent::start(options(
        &config(&top, dir.path(), "a", procs.pid(0)),
        &dir.path().join("a.toml"),
        Duration::from_secs(1),
    )) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {EXISTING}: the agent does not start here: {e}"),
    };
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        std::fs::read_to_string(format!("/proc/{worker}/cgroup"))
            .is_ok_and(|t| t.contains(&format!("{top}/be"))),
        "the process already in the BE group lives on, in the group"
    );
    // Third hostile pass: `on_exit = "restore"` then SIGKILLed it with the agent's own BE.
    let _ = agent.run();
    let state = std::fs::read_to_string(format!("/proc/{worker}/stat")).unwrap_or_default();
    let alive = state
        .rfind(')')
        .and_then(|i| state[i + 1..].split_whitespace().next())
        .is_some_and(|st| st != "Z" && st != "X");
    assert!(
        alive,
        "the process found in the BE group outlives the agent's restore: {state}"
    );
}

const FOREIGN: &str = "an_lc_pid_in_another_agents_groups_is_refused_and_left_there";

/// Third hostile pass: a second agent on groups of its own whose `[lc] pids` named a process
/// of the first agent's BE group moved it into its LC group, out of the first agent's freeze
/// (its BE ran on, unfrozen, while the first agent reported BE disabled); one naming the
/// first agent's LC took that LC from it. Both refused now, the process left where it is.
#[test]
fn an_lc_pid_in_another_agents_groups_is_refused_and_left_there() {
    if !live::is_root() {
        return eprintln!("SKIP {FOREIGN}: needs root (cgroups)");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top = format!("headroom-hostile3-foreign-{}", std::process::id());
    let _cleanup = live::RemoveOnDrop::new(&top);
    let (runner, _, be) = match first_agent(&top, dir.path(), lc.pid(0)) {
        Ok(first) => first,
        Err(e) => return eprintln!("SKIP {FOREIGN}: {e}"),
    };
    for (tag, pid, group) in [("be", be, "a/be"), ("lc", lc.pid(0), "a/lc")] {
        let refused = Agent::start(options(
            &config_on(
                &format!("{top}/b{tag}/lc"),
                &format!("{top}/b{tag}/be"),
                dir.path(),
                tag,
                pid,
            ),
            &dir.path().join(format!("{tag}.toml")),
            Duration::from_secs(1),
        ));
        let err = match refused {
            Ok(_) => panic!("{tag}: an agent naming another agent's process as its LC started"),
            Err(e) => e,
        };
        assert!(err.is_usage(), "{tag}: refused as a usage error: {err}");
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())) && msg.contains("another agent"),
            "{tag}: the refusal names the holder: {msg}"
        );
        assert!(
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|t| t.contains(&format!("{top}/{group}"))),
            "{tag}: the process stays in the first agent's group"
        );
    }
    let _ = runner.join();
}
