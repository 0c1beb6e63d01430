//! Commands the agent launches in their groups (`[[be]] command`, `[lc] command`), restarted
//! with exponential backoff when they die.
//!
//! A BE command is forked behind a gate ([`launch_gated`]): the agent moves the child into
//! every hierarchy of its group — a frozen freezer included — while it waits, and only then lets
//! it exec, so no BE instruction runs outside its groups, and a child whose agent dies before
//! opening the gate exits without running. The LC command ([`launch_in_group`]) instead
//! joins its group's v1 hierarchies (all but the freezer) in `pre_exec`, before it runs
//! a single instruction of the command; the freezer (and a v2 group, where freezing is part of
//! the one hierarchy) is joined right after spawn — joining a frozen group inside `pre_exec`
//! would block the spawn until BE is thawed.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use headroom_host::spawn::StartIn;
use headroom_host::{Backend, Cgroups, Controller};
use headroom_types::GroupPath;

/// Errors launching a command.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{name}: empty command")]
    Empty { name: String },
    #[error("{name}: starting {command:?} in {group}: {source}")]
    Spawn {
        name: String,
        command: Vec<String>,
        group: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name}: preparing its start in {group}: {source}")]
    Prepare {
        name: String,
        group: String,
        #[source]
        source: Box<headroom_host::HostError>,
    },
    #[error("{name}: moving pid {pid} into {group}: {source}")]
    Move {
        name: String,
        pid: u32,
        group: String,
        #[source]
        source: Box<headroom_host::HostError>,
    },
}

/// One supervised command.
#[derive(Debug)]
pub struct Supervised {
    pub name: String,
    pub command: Vec<String>,
    pub group: GroupPath,
    pub restart: bool,
    backoff_initial: Duration,
    backoff_max: Duration,
    backoff: Duration,
    /// A BE command this agent launched (reaped with waitpid).
    child: Option<i32>,
    /// A process started by an earlier agent (from the state file): watched, not reaped.
    adopted: Option<u32>,
    started: Option<Instant>,
    restart_at: Option<Instant>,
    pub restarts: u64,
    /// How the command last ended and after how long (`ctl status`).
    pub last_exit: Option<String>,
    /// Processes found in the group at a first start, launched by no agent: confined as BE,
    /// never killed (stopping the command spares them).
    pub spared: std::collections::BTreeSet<i32>,
}

impl Supervised {
    pub fn new(
        name: &str,
        command: &[String],
        group: GroupPath,
        restart: bool,
        backoff_ms: u64,
        backoff_max_ms: u64,
    ) -> Supervised {
        Supervised {
            name: name.to_string(),
            command: command.to_vec(),
            group,
            restart,
            backoff_initial: Duration::from_millis(backoff_ms),
            backoff_max: Duration::from_millis(backoff_max_ms),
            backoff: Duration::from_millis(backoff_ms),
            child: None,
            adopted: None,
            started: None,
            restart_at: None,
            restarts: 0,
            last_exit: None,
            spared: Default::default(),
        }
    }

    /// The running process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.map(|p| p as u32).or(self.adopted)
    }

    /// Whether the running command was launched by this agent (not adopted).
    pub fn launched(&self) -> bool {
        self.child.is_some()
    }

    /// Watches a process an earlier agent started (if it is still alive and in the group).
    pub fn adopt(&mut self, cgroups: &Cgroups, pid: u32) -> bool {
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
        let in_group = cgroups
            .procs(&self.group)
            .is_ok_and(|p| p.contains(&(pid as i32)));
        if alive && in_group {
            self.adopted = Some(pid);
            self.started = Some(Instant::now());
            tracing::info!(name = %self.name, pid, "adopted a BE command from the previous agent");
        }
        self.adopted.is_some()
    }

    /// Starts the command in its group.
    pub fn start(&mut self, cgroups: &Cgroups) -> Result<u32, LaunchError> {
        let pid = launch_gated(cgroups, &self.name, &self.command, &self.group)?;
        let child = pid as i32;
        tracing::info!(name = %self.name, pid, group = %self.group, command = ?self.command, "started");
        self.child = Some(child);
        self.adopted = None;
        self.started = Some(Instant::now());
        self.restart_at = None;
        Ok(pid)
    }

    /// Reaps a dead command and restarts it when its backoff has passed.
    pub fn check(&mut self, cgroups: &Cgroups, now: Instant) {
        let died = match (&mut self.child, self.adopted) {
            (Some(pid), _) => reap(*pid),
            (None, Some(pid)) => {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None)
                    .is_err()
                    .then(|| "adopted process is gone".to_string())
            }
            (None, None) => None,
        };
        if let Some(how) = died {
            let ran = self.started.map_or(Duration::ZERO, |s| now - s);
            // A command that ran for a while before dying starts over at the initial backoff.
            if ran >= self.backoff_max {
                self.backoff = self.backoff_initial;
            }
            self.child = None;
            self.adopted = None;
            self.last_exit = Some(format!("{how} after {:.1} s", ran.as_secs_f64()));
            // A command that daemonizes ends at once and leaves its work behind: confined in
            // the group and stopped with it, but worth saying (a restart adds another).
            let left = cgroups
                .procs(&self.group)
                .map_or(0, |p| p.iter().filter(|p| !self.spared.contains(p)).count());
            if left > 0 {
                tracing::warn!(name = %self.name, processes = left, restart = self.restart,
                    "the BE command ended but left processes in its group (it daemonizes?): they stay confined there and are stopped with it; run the command in the foreground");
            }
            if self.restart {
                self.restart_at = Some(now + self.backoff);
                tracing::warn!(name = %self.name, status = %how, ran_ms = ran.as_millis() as u64,
                    restart_in_ms = self.backoff.as_millis() as u64, "BE command died");
                self.backoff = (self.backoff * 2).min(self.backoff_max);
            } else {
                tracing::warn!(name = %self.name, status = %how, "command died (restart = false)");
            }
        }
        if let Some(at) = self.restart_at {
            if now >= at {
                self.restarts += 1;
                if let Err(e) = self.start(cgroups) {
                    tracing::error!(error = %e, "restart failed");
                    self.restart_at = Some(now + self.backoff);
                    self.backoff = (self.backoff * 2).min(self.backoff_max);
                }
            }
        }
    }

    /// Stops the command and everything it started — launched by this agent or adopted from
    /// an earlier one: SIGTERM to its process group (the command leads its own), then, after
    /// `grace`, SIGKILL to every process left in its group and the groups below (`cgroup.kill`
    /// on v2). A BE group with a `command` is the agent's own, so a process someone else put
    /// there goes too. With the command itself gone (exited, or waiting for its restart), what
    /// it forked may still run in the group — a daemon, a double fork — and goes the same way
    /// (fourth hostile pass: such a child outlived `restore`, unconfined, with no agent).
    /// Processes in `spared` are left. Returns how many processes had to be killed.
    pub fn stop(&mut self, cgroups: &Cgroups, grace: Duration) -> usize {
        use nix::sys::signal::{kill, killpg, Signal};
        self.restart_at = None;
        let pid = self.pid();
        let ours = |cgroups: &Cgroups| -> Vec<i32> {
            cgroups
                .procs(&self.group)
                .unwrap_or_default()
                .into_iter()
                .filter(|p| !self.spared.contains(p))
                .collect()
        };
        if pid.is_none() && ours(cgroups).is_empty() && !self.has_subgroups(cgroups) {
            return 0;
        }
        // A frozen process takes no signal until it is thawed.
        if cgroups
            .freeze_state(&self.group)
            .is_ok_and(|st| st != headroom_host::FreezeState::Thawed)
        {
            let _ = cgroups.thaw(&self.group);
        }
        let leader = pid.map(|p| nix::unistd::Pid::from_raw(p as i32));
        match leader {
            Some(leader) => {
                if killpg(leader, Signal::SIGTERM).is_err() {
                    let _ = kill(leader, Signal::SIGTERM);
                }
            }
            None => {
                for p in ours(cgroups) {
                    let _ = kill(nix::unistd::Pid::from_raw(p), Signal::SIGTERM);
                }
            }
        }
        let end = Instant::now() + grace;
        while Instant::now() < end {
            let gone = match (self.child, leader) {
                (Some(pid), _) => reap(pid).is_some(),
                (None, Some(leader)) => kill(leader, None).is_err(),
                (None, None) => true,
            };
            if gone && ours(cgroups).is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let killed = kill_group_except(cgroups, &self.group, &self.spared);
        if let Some(pid) = self.child.take() {
            let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        }
        self.adopted = None;
        tracing::info!(name = %self.name, pid = ?pid, killed, "stopped");
        killed
    }

    /// Whether the group has groups below it (their processes are stopped with it).
    fn has_subgroups(&self, cgroups: &Cgroups) -> bool {
        cgroups.children(&self.group).is_ok_and(|c| !c.is_empty())
    }
}

/// Kills every process of `group` and below (see [`Cgroups::kill_all`]); returns how many.
pub fn kill_group(cgroups: &Cgroups, group: &GroupPath) -> usize {
    kill_group_except(cgroups, group, &std::collections::BTreeSet::new())
}

/// [`kill_group`] sparing `keep`.
pub fn kill_group_except(
    cgroups: &Cgroups,
    group: &GroupPath,
    keep: &std::collections::BTreeSet<i32>,
) -> usize {
    match cgroups.kill_all_except(group, keep) {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(group = %group, error = %e, "killing the processes of a BE group");
            0
        }
    }
}

/// Spawns `command` so that it runs inside `group` from its first instruction (see module doc).
pub fn launch_in_group(
    cgroups: &Cgroups,
    name: &str,
    command: &[String],
    group: &GroupPath,
) -> Result<Child, LaunchError> {
    let Some((program, args)) = command.split_first() else {
        return Err(LaunchError::Empty {
            name: name.to_string(),
        });
    };
    let freezer_mount = cgroups
        .backend(Controller::Freezer)
        .ok()
        .map(|b| b.mount().to_path_buf());
    let early = cgroups
        .group_dirs(group)
        .into_iter()
        .filter(|(b, _)| matches!(b, Backend::V1(_)))
        .filter(|(b, _)| Some(b.mount().to_path_buf()) != freezer_mount)
        .fold(StartIn::parent(), |start, (_, dir)| start.in_group(&dir));
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).process_group(0);
    early
        .apply(&mut cmd)
        .map_err(|source| LaunchError::Prepare {
            name: name.to_string(),
            group: group.to_string(),
            source: Box::new(source),
        })?;
    let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
        name: name.to_string(),
        command: command.to_vec(),
        group: group.to_string(),
        source,
    })?;
    if let Err(source) = cgroups.move_process(group, child.id() as i32) {
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
        return Err(LaunchError::Move {
            name: name.to_string(),
            pid: child.id(),
            group: group.to_string(),
            source: Box::new(source),
        });
    }
    Ok(child)
}

/// How a launched child ended, if it has (reaped); `None` while it runs.
fn reap(pid: i32) -> Option<String> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    match waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::StillAlive) => None,
        Ok(WaitStatus::Exited(_, code)) => Some(format!("exit status: {code}")),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some(format!("signal: {sig}")),
        Ok(_) => None,
        Err(e) => Some(format!("wait failed: {e}")),
    }
}

/// Forks `command` behind a gate: the child leads its own process group, drops every fd it
/// inherited, says so, and waits on the gate (one end of a socket pair); the parent waits for
/// that word, moves it into every hierarchy of `group` (a frozen group freezes it where it
/// waits) and then opens the gate, and the child execs. Moving it only once it has dropped its
/// fds matters: a child frozen before it had would hold the agent's state lock for as long as
/// it stays frozen (a kill -9 of the agent mid-launch then kept the next agent out). If the
/// parent dies first, the gate closes empty and the child exits without running the command.
/// Returns the child's pid.
pub fn launch_gated(
    cgroups: &Cgroups,
    name: &str,
    command: &[String],
    group: &GroupPath,
) -> Result<u32, LaunchError> {
    let spawn_err = |source: std::io::Error| LaunchError::Spawn {
        name: name.to_string(),
        command: command.to_vec(),
        group: group.to_string(),
        source,
    };
    if command.is_empty() {
        return Err(LaunchError::Empty {
            name: name.to_string(),
        });
    }
    let args: Vec<CString> = command
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|e| spawn_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let devnull = CString::new("/dev/null").expect("no NUL");
    let mut fds = [0; 2];
    // SAFETY: socketpair fills two fds.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    // the child's end and the agent's end of the gate
    let (gate_r, gate_w) = (fds[0], fds[1]);
    // SAFETY: the child only calls async-signal-safe functions (setpgid, read, open, dup2,
    // close, execvp, _exit) on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing the two fds made above.
        unsafe {
            libc::close(gate_r);
            libc::close(gate_w);
        }
        return Err(spawn_err(e));
    }
    if pid == 0 {
        // SAFETY: see above; nothing here allocates or takes a lock.
        unsafe {
            libc::setpgid(0, 0);
            libc::close(gate_w);
            // Drop every fd inherited from the agent but the gate: a child that the agent left
            // frozen behind the gate (killed mid-launch) must not keep the state lock, the
            // control socket or the metrics port, or the next agent could not start.
            close_inherited_fds(gate_r);
            if libc::write(gate_r, b"r".as_ptr().cast(), 1) != 1 {
                libc::_exit(1);
            }
            let mut byte = 0u8;
            let n = libc::read(gate_r, (&mut byte as *mut u8).cast(), 1);
            if n != 1 {
                libc::_exit(1); // the agent died before placing us: do not run
            }
            let null = libc::open(devnull.as_ptr(), libc::O_RDWR);
            if null >= 0 {
                libc::dup2(null, 0);
            }
            libc::execvp(argv[0], argv.as_ptr());
            libc::_exit(127);
        }
    }
    // SAFETY: the parent's copy of the read end is not used.
    unsafe { libc::close(gate_r) };
    let close_gate = |open: bool| {
        // SAFETY: one byte from a live buffer, then closing the fd this function owns.
        unsafe {
            if open {
                libc::write(gate_w, b"g".as_ptr().cast(), 1);
            }
            libc::close(gate_w);
        }
    };
    // Wait (bounded) for the child to have dropped the agent's fds before it can be frozen.
    let mut poll = libc::pollfd {
        fd: gate_w,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut word = 0u8;
    // SAFETY: one pollfd and a one-byte read into a live buffer, on the fd this function owns.
    let ready = unsafe {
        libc::poll(&mut poll, 1, 5_000) == 1
            && libc::read(gate_w, (&mut word as *mut u8).cast(), 1) == 1
            && word == b'r'
    };
    if !ready {
        let e = std::io::Error::other("the gated child did not get ready within 5 s");
        close_gate(false);
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(spawn_err(e));
    }
    if let Err(source) = cgroups.move_process(group, pid) {
        close_gate(false);
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(LaunchError::Move {
            name: name.to_string(),
            pid: pid as u32,
            group: group.to_string(),
            source: Box::new(source),
        });
    }
    close_gate(true);
    Ok(pid as u32)
}

/// Closes every fd from 3 up except `keep` (async-signal-safe: raw `close_range(2)`, with a
/// bounded `close` loop where the kernel predates it, 5.9).
fn close_inherited_fds(keep: libc::c_int) {
    let range = |first: libc::c_uint, last: libc::c_uint| {
        // SAFETY: close_range only closes fds of this (forked) process.
        let rc = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
        if rc != 0 {
            for fd in first..=last.min(4095) {
                // SAFETY: as above.
                unsafe { libc::close(fd as libc::c_int) };
            }
        }
    };
    let keep = keep as libc::c_uint;
    if keep > 3 {
        range(3, keep - 1);
    }
    range(keep.max(2) + 1, libc::c_uint::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gated child must not hold the agent's fds (its state lock above all) while it waits.
    #[test]
    fn a_gated_child_keeps_only_its_gate_fd() {
        let lock = std::fs::File::open("/proc/self/stat").expect("open");
        let held = std::os::fd::AsRawFd::as_raw_fd(&lock);
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two fds.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the child only calls close/fcntl/_exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            close_inherited_fds(fds[0]);
            // SAFETY: fcntl on fd numbers; EBADF is the expected answer for closed ones.
            let code = unsafe {
                let gate_open = libc::fcntl(fds[0], libc::F_GETFD) >= 0;
                let lock_closed = libc::fcntl(held, libc::F_GETFD) < 0;
                let other_closed = libc::fcntl(fds[1], libc::F_GETFD) < 0;
                let stdio_open = libc::fcntl(2, libc::F_GETFD) >= 0;
                u8::from(gate_open)
                    | u8::from(lock_closed) << 1
                    | u8::from(other_closed) << 2
                    | u8::from(stdio_open) << 3
            };
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(code as libc::c_int) };
        }
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).expect("wait");
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0b1111),
            "bits: gate open, lock closed, other fd closed, stdio open"
        );
        // SAFETY: closing the test's own pipe.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
