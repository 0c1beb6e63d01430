//! What the CLI tests share: running `headroom`, and for the real-kernel agent tests a guard
//! that stops their processes and removes their cgroups (also when a test fails), the agent's
//! start, readiness and exit, the config's `[safety]`/`[api]` ending, and the checks on a
//! forking BE command's processes.
#![allow(dead_code)] // each test file uses a part

#[cfg(feature = "kube")]
pub mod kube_live;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use headroom_agent::publish::control::{request, Request};
use headroom_host::{Cgroups, Controller, LinuxHost};
use headroom_types::GroupPath;

pub const BIN: &str = env!("CARGO_BIN_EXE_headroom");

/// Root and cgroups with every one of `controllers`, or `None` after a `SKIP test: why` line.
pub fn root_cgroups(test: &str, controllers: &[Controller]) -> Option<Cgroups> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP {test}: not root");
        return None;
    }
    let cgroups = match LinuxHost::system().cgroups() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIP {test}: no cgroups: {e}");
            return None;
        }
    };
    for &c in controllers {
        if let Err(e) = cgroups.backend(c) {
            eprintln!("SKIP {test}: no {c} controller: {e}");
            return None;
        }
    }
    Some(cgroups)
}

/// A test's top group, scratch directory and child processes. On drop: the children are
/// killed, then every process left in the groups below `top`, then the groups are removed.
pub struct Guard {
    pub cgroups: Cgroups,
    pub top: GroupPath,
    pub children: Vec<Child>,
    pub dir: tempfile::TempDir,
}

impl Guard {
    pub fn new(cgroups: &Cgroups, top: GroupPath) -> Guard {
        Guard {
            cgroups: cgroups.clone(),
            top,
            children: Vec::new(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// A guard for a fresh top group `<prefix>-<pid>` (asserted absent).
    pub fn fresh(cgroups: &Cgroups, prefix: &str) -> Guard {
        let top = GroupPath::new(&format!("{prefix}-{}", std::process::id())).unwrap();
        assert!(!cgroups.exists(&top), "{top} exists already");
        Guard::new(cgroups, top)
    }

    /// Starts `headroom agent --config config`, its stderr in `log` in the scratch directory;
    /// the index of its child.
    pub fn spawn_agent(&mut self, config: &Path, log: &str) -> usize {
        let child = spawn_agent(config, &self.dir.path().join(log), &[]);
        self.children.push(child);
        self.children.len() - 1
    }

    /// [`Guard::spawn_agent`], then [`wait_up`] on its control socket `ctl.sock` in the scratch
    /// directory.
    pub fn start_agent(&mut self, config: &Path, log: &str) -> usize {
        let idx = self.spawn_agent(config, log);
        wait_up(&self.dir.path().join("ctl.sock"), self.dir.path(), log);
        idx
    }

    /// The log file `name` in the scratch directory ("" while there is none).
    pub fn log(&self, name: &str) -> String {
        read_log(self.dir.path(), name)
    }

    /// A `sleep 60` child (an idle stand-in for an LC service); its pid.
    pub fn sleeper(&mut self) -> u32 {
        let c = sleep_60();
        let pid = c.id();
        self.children.push(c);
        pid
    }

    /// Kills and reaps every child (first, so no agent restarts a BE during the cleanup).
    pub fn stop_children(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop_children();
        // thaws what is frozen and kills until the groups below `top` are empty
        let _ = self.cgroups.kill_all(&self.top);
        if let Err(e) = self.cgroups.remove(&self.top) {
            eprintln!("cleanup: removing {}: {e}", self.top);
        }
    }
}

/// A `sleep 60` process, its output discarded: an idle stand-in for a service.
pub fn sleep_60() -> Child {
    Command::new("sleep")
        .arg("60")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// `headroom agent --config config` with `extra` arguments, logging at `info` to `stderr_to`.
pub fn spawn_agent(config: &Path, stderr_to: &Path, extra: &[&str]) -> Child {
    let stderr = std::fs::File::create(stderr_to).unwrap();
    Command::new(BIN)
        .args(["agent", "--config"])
        .arg(config)
        .args(extra)
        .env("HEADROOM_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start the agent")
}

/// `headroom ctl --json status` of the agent on `dir/ctl.sock`: its `status` object, `None`
/// while it does not answer.
pub fn status_json(dir: &Path) -> Option<serde_json::Value> {
    let out = Command::new(BIN)
        .args(["ctl", "--socket"])
        .arg(dir.join("ctl.sock"))
        .args(["--json", "status"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(v["status"].clone())
}

/// Calls `f` every `every` until it holds (true) or `timeout` passes (false).
pub fn within(timeout: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(every);
    }
    false
}

/// `headroom agent --config config --replay log`: it reproduces every decision of `log`.
pub fn assert_replays_exactly(config: &Path, log: &Path) {
    let out = Command::new(BIN)
        .args(["agent", "--config"])
        .arg(config)
        .arg("--replay")
        .arg(log)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("reproduced exactly"),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The file `name` in `dir` ("" while there is none): an agent's log.
pub fn read_log(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// Writes `dir/file`: `head` (the `[lc]`, `[[be]]` and `[policy]` sections) and what ends every
/// test agent's config: the exit action, the state file in `dir`, the control socket and the
/// metrics address ("" for none).
pub fn write_config(
    dir: &Path,
    file: &str,
    head: &str,
    on_exit: &str,
    socket: &Path,
    metrics: &str,
) -> PathBuf {
    let text = format!(
        "{head}\n[safety]\non_exit = \"{on_exit}\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{s}\"\nmetrics = \"{metrics}\"\n",
        d = dir.display(),
        s = socket.display(),
    );
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    path
}

/// A BE group `top/be` whose command forks (a background `sleep MARKER` and a foreground one,
/// restarted 50 ms after it dies) under `static-cores` with one core: the kill -9 tests' BE.
pub fn forking_be(top: &GroupPath, marker: &str) -> String {
    format!(
        r#"
[[be]]
name = "forker"
cgroup = "{top}/be"
command = ["sh", "-c", "sleep {marker} & exec sleep {marker}"]
restart_backoff_ms = 50

[policy]
kind = "static-cores"
[policy.static-cores]
cores = 1
"#
    )
}

/// The installed `memcached`, or `None` after a `SKIP test: …` line.
pub fn find_memcached(test: &str) -> Option<&'static str> {
    let found = ["/usr/bin/memcached", "/usr/local/bin/memcached"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    if found.is_none() {
        eprintln!("SKIP {test}: memcached is not installed");
    }
    found
}

/// `path` (a memcached) on a free loopback port, one thread, no UDP; ready when *our*
/// memcached answers `stats` with its pid, not when the port accepts.
pub fn start_memcached(test: &str, path: &str) -> (Child, std::net::SocketAddr) {
    headroom_load::readiness::spawn_memcache_server(
        |port| {
            let mut c = Command::new(path);
            c.args([
                "-l",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "0",
                "-t",
                "1",
            ])
            .args(["-u", "root"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
            c
        },
        5,
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| panic!("{test}: memcached did not start: {e}"))
}

/// Deterministic "random" moments (ms) to kill an agent at, one a round: a linear congruential
/// sequence from `seed`, below `max_ms`, every fourth inside the first 20 ms of start-up.
pub fn kill_moments(seed: u64, rounds: usize, max_ms: u64) -> Vec<u64> {
    let mut x = seed;
    (0..rounds)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % if i % 4 == 0 { 20 } else { max_ms }
        })
        .collect()
}

/// Calls `f` every 10 ms until it holds (how long that took) or `timeout` passes (`None`, after
/// a line naming `what`).
pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("timed out after {timeout:?} waiting for {what}");
    None
}

/// Waits (20 s at most) until the agent on `socket` answers a status request; panics with its
/// log (`log` in `dir`) if it does not. The socket is bound before the host is touched; an
/// answer comes once start-up is done.
pub fn wait_up(socket: &Path, dir: &Path, log: &str) {
    let up = wait_for("the agent's first status", Duration::from_secs(20), || {
        request(socket, &Request::Status).is_ok_and(|r| r.ok)
    });
    assert!(
        up.is_some(),
        "agent did not come up; its log:\n{}",
        read_log(dir, log)
    );
}

/// `headroom ARGS`, run to its end.
pub fn headroom(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// A finished command's stdout and stderr, in that order.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `headroom ctl --socket dir/ctl.sock ARGS`: success and stdout + stderr.
pub fn ctl(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["ctl", "--socket"])
        .arg(dir.join("ctl.sock"))
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), text(&out))
}

/// Sends `sig` to a child of ours.
pub fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig);
}

/// Reaps `child`, waiting 20 s at most.
pub fn wait_exit(child: &mut Child) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "agent did not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGTERM to `child`, then its exit status.
pub fn sigterm_and_wait(child: &mut Child) -> ExitStatus {
    signal(child, nix::sys::signal::Signal::SIGTERM);
    wait_exit(child)
}

/// `/proc/PID/cgroup` ("" once the process is gone).
pub fn proc_cgroup(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
}

/// Processes whose command line holds `marker` (a forking BE's `sleep MARKER`s; not the
/// `sh -c` that names it; zombies have an empty command line).
pub fn procs_with(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(marker) && !cmd.starts_with("sh ") {
            out.push(pid);
        }
    }
    out
}

/// Every process carrying `marker` is inside `be` in the hierarchies the agent manages (cpu,
/// cpuset, freezer; the unified line only where those are on cgroup v2): never unconfined.
pub fn assert_be_confined(marker: &str, be: &GroupPath, v2: bool, when: &str) {
    for pid in procs_with(marker) {
        // "" when it exited meanwhile: no lines
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, ctrls, path) = (
                parts.next(),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            let managed = (ctrls.is_empty() && v2)
                || ["cpuset", "cpu", "freezer"]
                    .iter()
                    .any(|c| ctrls.split(',').any(|x| x == *c));
            if managed {
                assert!(
                    path.trim_start_matches('/').starts_with(be.as_str()),
                    "{when}: BE process {pid} outside {be}: {line}"
                );
            }
        }
    }
}
