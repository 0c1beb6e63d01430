//! The agent tried as an SRE would (agent issue, "reliability defects"): kill -9 at random
//! moments of start-up and running, restarts, a second agent, a start that fails, stray
//! signals, a closed pipe. After each, no BE process runs outside the groups the agent records,
//! none is left frozen without an agent once it exits, no group leaks, and the LC is back where
//! it was. Real kernel (root, a writable cgroup v1 or v2 with cpuset, cpu and freezer); each
//! test skips with a printed reason elsewhere.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use headroom_agent::publish::control::{request, Request};
use headroom_host::{Controller, FreezeState};
use headroom_types::GroupPath;
use support::{
    forking_be, kill_moments, procs_with, root_cgroups, wait_for, write_config, Guard, BIN,
};

struct Env {
    /// The agents and the LC (children), the scratch directory, the top group.
    guard: Guard,
    /// A unique `sleep` argument: the BE command's processes carry it (and only they do).
    marker: String,
    /// The LC's pid (a child in `guard`).
    lc: u32,
}

impl Drop for Env {
    fn drop(&mut self) {
        // the agents first, so none starts a BE again; `guard` then removes the groups
        self.guard.stop_children();
        for pid in procs_with(&self.marker) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn setup(test: &str) -> Option<Env> {
    let controllers = [Controller::Cpuset, Controller::Cpu, Controller::Freezer];
    let cgroups = root_cgroups(test, &controllers)?;
    let probe = GroupPath::new(&format!("headroom-probe-{}", std::process::id())).unwrap();
    if let Err(e) = cgroups.create(&probe) {
        eprintln!("SKIP {test}: cgroupfs not writable: {e}");
        return None;
    }
    let _ = cgroups.remove(&probe);
    let id = std::process::id() % 100_000;
    let n = test.len() as u32;
    let top = GroupPath::new(&format!("headroom-faults-{id}-{n}")).unwrap();
    let mut guard = Guard::new(&cgroups, top);
    let lc = Command::new("sleep")
        .arg("600")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let lc_pid = lc.id();
    guard.children.push(lc);
    Some(Env {
        guard,
        marker: format!("{}.{:03}{}", 7000 + id % 1000, n, id),
        lc: lc_pid,
    })
}

impl Env {
    fn socket(&self) -> PathBuf {
        self.guard.dir.path().join("ctl.sock")
    }

    fn state(&self) -> PathBuf {
        self.guard.dir.path().join("state.json")
    }

    fn be(&self) -> GroupPath {
        self.guard.top.join("be").unwrap()
    }

    /// A config whose BE command forks: a background `sleep MARKER` and a foreground one.
    fn config(&self, name: &str, on_exit: &str, metrics: &str, socket: &Path) -> PathBuf {
        let head = format!(
            "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{lc}]\n{be}",
            top = self.guard.top,
            lc = self.lc,
            be = forking_be(&self.guard.top, &self.marker),
        );
        write_config(self.guard.dir.path(), name, &head, on_exit, socket, metrics)
    }

    fn spawn(&mut self, config: &Path, log: &str) -> usize {
        self.guard.spawn_agent(config, log)
    }

    fn log(&self, name: &str) -> String {
        self.guard.log(name)
    }

    fn wait_up(&mut self, socket: &Path, log: &str) {
        support::wait_up(socket, self.guard.dir.path(), log);
    }

    fn signal(&mut self, idx: usize, sig: nix::sys::signal::Signal) {
        support::signal(&self.guard.children[idx], sig);
    }

    fn wait_exit(&mut self, idx: usize) -> std::process::ExitStatus {
        support::wait_exit(&mut self.guard.children[idx])
    }

    /// Every BE process is inside the BE group (in every hierarchy): never unconfined.
    fn assert_be_confined(&self, when: &str) {
        let v2 = self
            .guard
            .cgroups
            .backend(Controller::Cpu)
            .is_ok_and(|b| b.is_v2());
        support::assert_be_confined(&self.marker, &self.be(), v2, when);
    }

    /// Within 5 s of a restore no BE process is left.
    fn assert_no_be_left(&self) {
        let gone = wait_for("no BE process", Duration::from_secs(5), || {
            procs_with(&self.marker).is_empty()
        });
        assert!(
            gone.is_some(),
            "BE processes outlived restore: {:?}",
            procs_with(&self.marker)
        );
    }

    fn lc_groups(&self) -> String {
        support::proc_cgroup(self.lc)
    }

    fn leaked(&self) -> Vec<PathBuf> {
        self.guard
            .cgroups
            .group_dirs(&self.guard.top)
            .into_iter()
            .map(|(_, d)| d)
            .filter(|d| d.is_dir())
            .collect()
    }
}

/// The check: kill -9 at random moments (the first 20 ms included) in a loop of 20
/// restarts; after a final SIGTERM with `restore`: no BE process left, none frozen, no group
/// leaked, the LC back in its original groups, no state file.
#[test]
fn kill_9_at_random_moments_leaves_no_be_unconfined_and_restore_cleans_up() {
    let Some(mut env) = setup("kill_9_at_random_moments") else {
        return;
    };
    let lc_before = env.lc_groups();
    let socket = env.socket();
    let cfg = env.config("a.toml", "restore", "", &socket);
    // Deterministic "random" moments: 0..150 ms, several inside the first 20 ms.
    for (i, after_ms) in kill_moments(0x9e37_79b9, 20, 150).into_iter().enumerate() {
        let idx = env.spawn(&cfg, &format!("crash{i}.log"));
        std::thread::sleep(Duration::from_millis(after_ms));
        env.signal(idx, nix::sys::signal::Signal::SIGKILL);
        env.wait_exit(idx);
        env.assert_be_confined(&format!("after kill -9 at {after_ms} ms (round {i})"));
        // at most one BE command's worth of processes (2: the background and the exec'd sleep)
        let n = procs_with(&env.marker).len();
        assert!(
            n <= 2,
            "round {i}: {n} BE processes: a second BE was started"
        );
    }
    let idx = env.spawn(&cfg, "final.log");
    env.wait_up(&socket, "final.log");
    env.assert_be_confined("final agent running");
    env.signal(idx, nix::sys::signal::Signal::SIGTERM);
    let st = env.wait_exit(idx);
    assert!(st.success(), "exit {st}; log:\n{}", env.log("final.log"));
    env.assert_no_be_left();
    assert_eq!(
        env.lc_groups(),
        lc_before,
        "the LC is back in its original groups"
    );
    assert!(env.leaked().is_empty(), "leaked groups: {:?}", env.leaked());
    assert!(
        !env.state().exists(),
        "state file removed after a clean restore"
    );
}

/// Defects 1 and 2: a BE adopted from a killed agent is stopped by `restore`, with everything
/// it forked; no second BE is started on the restart.
#[test]
fn restore_stops_an_adopted_be_and_everything_it_forked() {
    let Some(mut env) = setup("restore_stops_an_adopted_be") else {
        return;
    };
    let socket = env.socket();
    let cfg = env.config("a.toml", "restore", "", &socket);
    let first = env.spawn(&cfg, "first.log");
    env.wait_up(&socket, "first.log");
    assert!(
        wait_for(
            "the BE's two processes",
            Duration::from_secs(10),
            || procs_with(&env.marker).len() == 2
        )
        .is_some(),
        "the BE command and its child run: {:?}",
        procs_with(&env.marker)
    );
    let be_pids = procs_with(&env.marker);
    env.signal(first, nix::sys::signal::Signal::SIGKILL);
    env.wait_exit(first);
    let second = env.spawn(&cfg, "second.log");
    env.wait_up(&socket, "second.log");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        procs_with(&env.marker),
        be_pids,
        "adopted, not started again"
    );
    env.signal(second, nix::sys::signal::Signal::SIGTERM);
    let st = env.wait_exit(second);
    assert!(st.success(), "exit {st}; log:\n{}", env.log("second.log"));
    env.assert_no_be_left();
    assert!(!env.state().exists());
    assert!(env.leaked().is_empty(), "leaked groups: {:?}", env.leaked());
}

/// Defects 3 and 10: a start that fails (the metrics port is taken) launches no BE, creates no
/// group and writes no state file.
#[test]
fn a_start_that_fails_leaves_nothing_behind() {
    let Some(mut env) = setup("a_start_that_fails") else {
        return;
    };
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let socket = env.socket();
    let cfg = env.config("a.toml", "restore", &addr, &socket);
    let idx = env.spawn(&cfg, "fail.log");
    let st = env.wait_exit(idx);
    assert!(!st.success());
    assert!(
        env.log("fail.log").contains("metrics"),
        "{}",
        env.log("fail.log")
    );
    assert!(procs_with(&env.marker).is_empty(), "a BE was launched");
    assert!(env.leaked().is_empty(), "leaked groups: {:?}", env.leaked());
    assert!(!env.state().exists());
}

/// Defect 7: a second agent on the same state file (another socket) is refused, naming the
/// first one; the first keeps running.
#[test]
fn a_second_agent_on_the_same_groups_is_refused() {
    let Some(mut env) = setup("a_second_agent") else {
        return;
    };
    let socket = env.socket();
    let cfg = env.config("a.toml", "restore", "", &socket);
    let first = env.spawn(&cfg, "first.log");
    env.wait_up(&socket, "first.log");
    let other = env.guard.dir.path().join("other.sock");
    let cfg2 = env.config("b.toml", "restore", "", &other);
    let second = env.spawn(&cfg2, "second.log");
    let st = env.wait_exit(second);
    assert!(!st.success());
    let log = env.log("second.log");
    assert!(log.contains("another agent"), "{log}");
    assert!(request(&socket, &Request::Status).is_ok_and(|r| r.ok));
    env.signal(first, nix::sys::signal::Signal::SIGTERM);
    assert!(env.wait_exit(first).success());
    assert!(env.leaked().is_empty());
}

/// Defects 4 and 12: HUP and USR1 do not kill the agent; `ctl status` into a closed pipe does
/// not panic; `ctl off` then SIGTERM still runs the exit action (here `freeze`).
#[test]
fn stray_signals_a_closed_pipe_and_off_then_sigterm() {
    let Some(mut env) = setup("stray_signals") else {
        return;
    };
    let socket = env.socket();
    let cfg = env.config("a.toml", "freeze", "", &socket);
    let idx = env.spawn(&cfg, "a.log");
    env.wait_up(&socket, "a.log");
    env.signal(idx, nix::sys::signal::Signal::SIGHUP);
    env.signal(idx, nix::sys::signal::Signal::SIGUSR1);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        env.guard.children[idx].try_wait().unwrap().is_none(),
        "HUP/USR1 killed the agent"
    );
    assert!(request(&socket, &Request::Status).is_ok_and(|r| r.ok));
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{BIN} ctl --socket {} status | true",
            socket.display()
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    let off = request(&socket, &Request::Off).unwrap();
    assert!(off.ok, "{}", off.message);
    env.signal(idx, nix::sys::signal::Signal::SIGTERM);
    assert!(env.wait_exit(idx).success(), "{}", env.log("a.log"));
    assert_eq!(
        env.guard.cgroups.freeze_state(&env.be()).unwrap(),
        FreezeState::Frozen,
        "after ctl off, SIGTERM still freezes BE; log:\n{}",
        env.log("a.log")
    );
}

/// Defect 8 on a real kernel: a restore the kernel refuses exits non-zero and keeps the state
/// file, and the next start (once the cause is gone) finishes it from the recorded originals.
/// The fault: the BE group's parent loses a CPU while the agent runs, so v1 refuses to give
/// the BE group its original (wider) cpuset back (EINVAL: not a subset of the parent's).
#[test]
fn a_restore_the_kernel_refuses_keeps_the_state_and_the_next_start_finishes_it() {
    let test = "a_restore_the_kernel_refuses";
    let Some(mut env) = setup(test) else {
        return;
    };
    if env
        .guard
        .cgroups
        .backend(Controller::Cpuset)
        .is_ok_and(|b| b.is_v2())
    {
        eprintln!("SKIP {test}: cgroup v2 accepts a cpuset beyond the parent's (it only narrows the effective set): this fault needs v1");
        return;
    }
    let online = env.guard.cgroups.cpuset_cpus(&GroupPath::root()).unwrap();
    if online.len() < 2 {
        eprintln!(
            "SKIP {test}: needs 2 CPUs, this machine has {}",
            online.len()
        );
        return;
    }
    // BE group `top/be/job` exists before the agent, with every CPU: that is its original.
    let parent = env.be();
    let job = parent.join("job").unwrap();
    let mems = env.guard.cgroups.cpuset_mems(&GroupPath::root()).unwrap();
    for g in [&env.guard.top, &parent, &job] {
        env.guard.cgroups.create(g).unwrap();
        env.guard.cgroups.set_cpuset_mems(g, &mems).unwrap();
        env.guard.cgroups.set_cpuset_cpus(g, &online).unwrap();
    }
    let socket = env.socket();
    let cfg = env.config("a.toml", "restore", "", &socket);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace(
            &format!("cgroup = \"{parent}\""),
            &format!("cgroup = \"{job}\""),
        ),
    )
    .unwrap();
    let first = env.spawn(&cfg, "first.log");
    env.wait_up(&socket, "first.log");
    let narrowed = wait_for("BE on one CPU", Duration::from_secs(10), || {
        env.guard
            .cgroups
            .cpuset_cpus(&job)
            .is_ok_and(|c| c.len() == 1)
    });
    assert!(
        narrowed.is_some(),
        "static-cores never gave BE one CPU; log:\n{}",
        env.log("first.log")
    );
    let be_cpu = env.guard.cgroups.cpuset_cpus(&job).unwrap();
    // The fault: the parent shrinks to BE's one CPU while the agent runs.
    env.guard.cgroups.set_cpuset_cpus(&parent, &be_cpu).unwrap();
    env.signal(first, nix::sys::signal::Signal::SIGTERM);
    let st = env.wait_exit(first);
    let log = env.log("first.log");
    assert!(
        !st.success(),
        "a refused restore must exit non-zero; log:\n{log}"
    );
    assert!(
        log.contains("FAILED"),
        "the failure is reported; log:\n{log}"
    );
    assert!(
        env.state().exists(),
        "the state file is kept for the next start"
    );
    assert_eq!(env.guard.cgroups.cpuset_cpus(&job).unwrap(), be_cpu);
    // The cause goes away; the next agent restores from the recorded originals, not from
    // what it finds (the narrowed cpuset).
    env.guard.cgroups.set_cpuset_cpus(&parent, &online).unwrap();
    let second = env.spawn(&cfg, "second.log");
    env.wait_up(&socket, "second.log");
    env.signal(second, nix::sys::signal::Signal::SIGTERM);
    let st = env.wait_exit(second);
    assert!(st.success(), "exit {st}; log:\n{}", env.log("second.log"));
    assert_eq!(
        env.guard.cgroups.cpuset_cpus(&job).unwrap(),
        online,
        "the original cpuset is back"
    );
    assert!(
        !env.state().exists(),
        "state file removed after the restore completed"
    );
    env.assert_no_be_left();
    let _ = env.guard.cgroups.remove(&job);
}
