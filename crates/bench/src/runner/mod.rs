//! The record step's hands: runs the `headroom` binary's subcommands as subprocesses (docs/architecture.md,
//! contract 8) with CPU placement, and reads their JSON outputs (contracts 5–7).
//!
//! Every process is owned by a [`Proc`] guard that stops it on drop, so a failing experiment never
//! leaves a server or a spinner behind.

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use headroom_host::process::{send_signal, Signal};
use headroom_host::spawn::StartIn;

use crate::error::{BenchError, Result};
use crate::validity::Connections;

mod decisions;
mod host_stats;
mod load;
mod placement;
pub use decisions::*;
pub use host_stats::*;
pub use load::LOADGEN_FIFO_PRIORITY;
pub use placement::*;

/// Where a feed socket the agent binds goes: short (a Unix socket path holds 108 bytes), so
/// under the temp dir, but in a directory of this process's own (0700): the agent refuses a
/// socket in a directory others can write, as `/tmp` itself.
pub fn feed_socket_path(name: &str) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    remove_dirs_of_gone_processes(FEED_DIR_PREFIX);
    let dir = std::env::temp_dir().join(format!("{FEED_DIR_PREFIX}{}", std::process::id()));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        // (one a stranger made first is refused by the agent's start, naming it)
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(BenchError::io("creating", &dir, e)),
    }
    Ok(dir.join(name))
}

/// The feed sockets' directory under the temp dir: this prefix and the bench's pid.
const FEED_DIR_PREFIX: &str = "headroom-feeds-";

/// Removes the temp dir's `<prefix><pid>` directories of this user whose process is gone: a
/// bench's scratch directories are its own while it runs, and nothing removed them after it
/// (one per bench run was left, more per test run).
pub fn remove_dirs_of_gone_processes(prefix: &str) {
    use std::os::unix::fs::MetadataExt;
    let tmp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&tmp) else {
        return;
    };
    let uid = headroom_host::process::effective_uid();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // Only a real directory of ours (never through a link someone planted).
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if pid > 0 && meta.is_dir() && meta.uid() == uid && !headroom_host::process::exists(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Quotes an argument for display in a copy-pasteable command line.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

pub fn command_line(program: &str, args: &[String]) -> String {
    std::iter::once(shell_quote(program))
        .chain(args.iter().map(|a| shell_quote(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// "0,2,3" for a CPU list.
pub fn cpu_arg(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses "0-2,5" / "1" into CPU numbers.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>> {
    // The one CPU-list rule set (headroom_types' CpuSet); an empty list places nothing.
    let set: headroom_types::CpuSet = s
        .parse()
        .map_err(|e| BenchError::Input(format!("bad CPU list {s:?}: {e}")))?;
    if set.is_empty() {
        return Err(BenchError::Input(format!("empty CPU list {s:?}")));
    }
    Ok(set.iter().map(|c| c as usize).collect())
}

/// A running subprocess, stopped (SIGTERM, then SIGKILL after a grace period) when dropped.
pub struct Proc {
    pub label: String,
    pub command: String,
    child: Option<Child>,
    grace: Duration,
    /// The log this process appends to, and its length when the process started.
    log: Option<(PathBuf, u64)>,
}

impl Proc {
    /// The last `n` characters this process wrote to its log (logs are shared by every process
    /// of the same label in a run, so an error must not quote an earlier one's).
    pub fn log_tail(&self, n: usize) -> String {
        let Some((path, start)) = &self.log else {
            return String::new();
        };
        let bytes = std::fs::read(path).unwrap_or_default();
        let own = bytes.get(*start as usize..).unwrap_or_default();
        tail(&String::from_utf8_lossy(own), n)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// `Some(status)` when the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(st)) => Some(st.to_string()),
            _ => None,
        }
    }

    /// Stops the process now and waits for it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        // The child has not been reaped yet (try_wait above returned None), so the pid still
        // names it.
        let _ = send_signal(child.id() as i32, Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < self.grace {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `headroom` binary and the placement its subprocesses get.
#[derive(Debug, Clone)]
pub struct Runner {
    pub bin: PathBuf,
    pub placement: Placement,
    /// Directory for subprocess stdout/stderr logs.
    pub log_dir: PathBuf,
    /// Use `taskset` to pin (false when it is missing: the report says so).
    pub pin: bool,
    /// Wrapper before every `headroom load` (e.g. `chrt -f 10`: see [`Runner::realtime_loadgen`]).
    pub loadgen_prefix: Vec<String>,
    /// Connections per load-generator thread: the default, or what a correction raised it to.
    pub connections: Connections,
    /// Requests in flight per connection.
    pub depth: usize,
    /// The fewest load-generator threads a run gets (raised by a correction).
    pub min_threads: usize,
}

/// How to start `headroom serve`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServeSpec {
    pub threads: usize,
    pub dispatch: Option<String>,
    pub pin: bool,
    pub extra: Vec<String>,
    /// Wrapper before the command (e.g. `chrt -f 50`).
    pub prefix: Vec<String>,
}

/// How to start `headroom antagonist`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BeSpec {
    pub kind: String,
    pub args: Vec<String>,
    pub threads: usize,
    /// Wrapper before the command (e.g. `chrt -i 0`, `nice -n 19`).
    pub prefix: Vec<String>,
}

impl BeSpec {
    /// The antagonist's argument list (after the binary), with its progress file.
    pub fn args(&self, progress: &Path) -> Vec<String> {
        let mut a = vec!["antagonist".to_string(), self.kind.clone()];
        a.extend(self.args.iter().cloned());
        a.push("--threads".into());
        a.push(self.threads.max(1).to_string());
        a.push("--progress".into());
        a.push(progress.display().to_string());
        a
    }

    /// A label for the BE: `spin`, `llc-0.5`.
    pub fn label(&self) -> String {
        let mut l = self.kind.clone();
        if let Some(i) = self.args.iter().position(|a| a == "--fraction") {
            if let Some(f) = self.args.get(i + 1) {
                l = format!("{l}-{f}");
            }
        }
        l
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A free loopback TCP port (bound then released; a race with another process is unlikely and
/// shows as a clear serve start error).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BenchError::io("binding", "127.0.0.1:0", e))?;
    Ok(l.local_addr()
        .map_err(|e| BenchError::io("reading local address of", "127.0.0.1:0", e))?
        .port())
}

impl Runner {
    pub fn new(bin: PathBuf, placement: Placement, log_dir: PathBuf) -> Runner {
        Runner {
            bin,
            placement,
            log_dir,
            pin: which("taskset").is_some(),
            loadgen_prefix: Vec::new(),
            connections: crate::validity::DEFAULT_CONNECTIONS,
            depth: crate::validity::DEFAULT_DEPTH,
            min_threads: 1,
        }
    }

    /// The full argv (wrappers, taskset, binary, args) for a headroom subcommand on `cpus`.
    pub fn argv(&self, cpus: &[usize], prefix: &[String], args: &[String]) -> Vec<String> {
        let mut v = Vec::new();
        if self.pin && !cpus.is_empty() {
            v.push("taskset".to_string());
            v.push("-c".to_string());
            v.push(cpu_arg(cpus));
        }
        v.extend(prefix.iter().cloned());
        v.push(self.bin.display().to_string());
        v.extend(args.iter().cloned());
        v
    }

    /// Starts a long-running subprocess with its output going to `<log_dir>/<label>.log`.
    pub fn spawn(&self, label: &str, argv: &[String]) -> Result<Proc> {
        self.spawn_in(label, argv, &StartIn::parent())
    }

    /// As [`Runner::spawn`], the process started where `start` says (a cgroup, without a
    /// capability) before it executes `argv`.
    pub fn spawn_in(&self, label: &str, argv: &[String], start: &StartIn) -> Result<Proc> {
        let command = command_line(&argv[0], &argv[1..]);
        std::fs::create_dir_all(&self.log_dir)
            .map_err(|e| BenchError::io("creating", &self.log_dir, e))?;
        let log_path = self
            .log_dir
            .join(format!("{}.log", headroom_report::store::file_safe(label)));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| BenchError::io("opening", &log_path, e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| BenchError::io("duplicating", &log_path, e))?;
        let log_start = log.metadata().map_or(0, |m| m.len());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        start.apply(&mut cmd)?;
        let child = cmd.spawn().map_err(|source| {
            BenchError::Report(headroom_report::ReportError::Spawn {
                command: command.clone(),
                source,
            })
        })?;
        Ok(Proc {
            label: label.to_string(),
            command,
            child: Some(child),
            grace: Duration::from_secs(5),
            log: Some((log_path, log_start)),
        })
    }

    /// Runs a subprocess to completion within `limit`; returns (stdout, stderr).
    pub fn run_to_end(&self, argv: &[String], limit: Duration) -> Result<(String, String)> {
        let command = command_line(&argv[0], &argv[1..]);
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| {
                BenchError::Report(headroom_report::ReportError::Spawn {
                    command: command.clone(),
                    source,
                })
            })?;
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let t_out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let t_err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if start.elapsed() > limit => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(BenchError::Report(headroom_report::ReportError::Command {
                        command,
                        status: format!("killed after {limit:?}"),
                        stderr: String::new(),
                    }));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => {
                    return Err(BenchError::Report(headroom_report::ReportError::Spawn {
                        command,
                        source: e,
                    }))
                }
            }
        };
        let stdout = t_out.join().unwrap_or_default();
        let stderr = t_err.join().unwrap_or_default();
        if !status.success() {
            return Err(BenchError::Report(headroom_report::ReportError::Command {
                command,
                status: status.to_string(),
                stderr: tail(&stderr, 1500),
            }));
        }
        Ok((stdout, stderr))
    }

    /// Starts `headroom serve` on the server CPUs and waits until *it* answers: `stats` on its
    /// port must report its pid (a port that only accepts may be another process's server).
    /// A port taken between our pick and serve's bind is tried again on a new one.
    pub fn start_serve(&self, spec: &ServeSpec) -> Result<(Proc, SocketAddr)> {
        let mut clashes = 0;
        loop {
            let port = free_port()?;
            let mut args = vec![
                "serve".to_string(),
                "--port".into(),
                port.to_string(),
                "--threads".into(),
                spec.threads.max(1).to_string(),
            ];
            if let Some(d) = &spec.dispatch {
                args.push("--dispatch".into());
                args.push(d.clone());
            }
            if spec.pin {
                args.push("--pin".into());
            }
            args.extend(spec.extra.iter().cloned());
            let argv = self.argv(&self.placement.server, &spec.prefix, &args);
            let mut proc = self.spawn("serve", &argv)?;
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let start = Instant::now();
            loop {
                let last = match headroom_load::readiness::stats_pid(addr) {
                    Ok(pid) if pid == proc.pid() => return Ok((proc, addr)),
                    Ok(other) => format!("{addr} is answered by pid {other}, not ours"),
                    Err(e) => e.to_string(),
                };
                if let Some(st) = proc.exited() {
                    // serve exits when its port is taken; another port, a few times.
                    clashes += 1;
                    if clashes < 5 && proc.log_tail(1500).contains("in use") {
                        break;
                    }
                    return Err(BenchError::Report(headroom_report::ReportError::Command {
                        command: proc.command.clone(),
                        status: st,
                        stderr: proc.log_tail(1500),
                    }));
                }
                if start.elapsed() > Duration::from_secs(10) {
                    return Err(BenchError::Unavailable(format!(
                        "`{}` did not answer `stats` with its pid on {addr} within 10 s ({last})",
                        proc.command
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Starts an antagonist on the server CPUs.
    pub fn start_antagonist(&self, spec: &BeSpec, progress: &Path) -> Result<Proc> {
        let argv = self.argv(self.placement.be_cpus(), &spec.prefix, &spec.args(progress));
        self.spawn(&format!("antagonist-{}", spec.label()), &argv)
    }

    /// Starts `headroom agent` on the load generator's CPUs (kept off the experiment's CPUs).
    pub fn start_agent(&self, config: &Path, log: &Path, dry_run: bool) -> Result<Proc> {
        let mut args = vec![
            "agent".to_string(),
            "--config".into(),
            config.display().to_string(),
            "--log".into(),
            log.display().to_string(),
        ];
        if dry_run {
            args.push("--dry-run".into());
        }
        // The agent shares the load generator's CPUs: at nice 19 it runs when the instrument
        // sleeps rather than preempting it at every 1 ms tick (with the agent at nice 0 beside
        // it, the load generator's p99 send lag was 60-720 µs against 28 µs with the LC alone,
        // in one isolation run). The BE it launches inherits the nice value, which does not
        // matter against the LC: they are in different cgroups, and CPU time is shared between
        // groups by their weights.
        let nice = strs(&["nice", "-n", "19"]);
        let argv = self.argv(&self.placement.loadgen, &nice, &args);
        let mut p = self.spawn("agent", &argv)?;
        std::thread::sleep(Duration::from_millis(1500));
        if let Some(st) = p.exited() {
            return Err(BenchError::Report(headroom_report::ReportError::Command {
                command: p.command.clone(),
                status: st,
                stderr: p.log_tail(1500),
            }));
        }
        Ok(p)
    }

    /// `headroom doctor --json`, or why it failed.
    pub fn doctor(&self) -> Result<Value> {
        let argv = vec![
            self.bin.display().to_string(),
            "doctor".into(),
            "--json".into(),
        ];
        let (out, _) = self.run_to_end(&argv, Duration::from_secs(30))?;
        serde_json::from_str(&out).map_err(|e| {
            BenchError::Unavailable(format!(
                "`headroom doctor --json` printed invalid JSON: {e}"
            ))
        })
    }
}

/// Lets `proc` run for `seconds`; a process that dies before then is an error carrying its exit
/// status and the end of its log, returned at once rather than after the wait.
pub fn run_for(proc: &mut Proc, seconds: f64) -> Result<()> {
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    loop {
        if let Some(st) = proc.exited() {
            return Err(BenchError::Report(headroom_report::ReportError::Command {
                command: proc.command.clone(),
                status: st,
                stderr: proc.log_tail(1500),
            }));
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// The last `n` characters of a subprocess log, without terminal colour codes.
fn tail(s: &str, n: usize) -> String {
    let plain = strip_ansi(s);
    let chars: Vec<char> = plain.chars().collect();
    chars[chars.len().saturating_sub(n)..].iter().collect()
}

/// Removes ANSI escape sequences (`ESC [ ... letter`) that coloured logs carry.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Owned copies of string literals (argv pieces, option lists).
pub(crate) fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    /// The feed sockets' directory of a bench that is gone was never removed: one per bench
    /// run stayed in the temp dir. A bench removes those of gone processes when it makes its
    /// own; a plain file or another prefix is left alone.
    #[test]
    fn a_gone_benchs_feed_directory_is_removed_by_the_next() {
        let tmp = std::env::temp_dir();
        // pid far above pid_max's default: no such process
        let gone = tmp.join(format!("{}999999998", super::FEED_DIR_PREFIX));
        let not_a_dir = tmp.join(format!("{}999999997", super::FEED_DIR_PREFIX));
        std::fs::create_dir_all(&gone).unwrap();
        std::fs::write(gone.join("old.sock"), b"").unwrap();
        std::fs::write(&not_a_dir, b"").unwrap();
        let path = super::feed_socket_path("a.sock").unwrap();
        let gone_left = gone.exists();
        let file_left = not_a_dir.exists();
        let _ = std::fs::remove_dir_all(&gone);
        let _ = std::fs::remove_file(&not_a_dir);
        assert!(!gone_left, "{} left behind", gone.display());
        assert!(file_left, "a file named like the directory was removed");
        assert!(path.parent().unwrap().is_dir(), "{}", path.display());
    }
}
