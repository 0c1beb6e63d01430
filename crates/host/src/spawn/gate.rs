//! A child forked behind a gate: it leads its own session and process group (no controlling
//! terminal: eighteenth hostile pass), drops every fd it inherited
//! but the gate, says so, and waits on the gate (one end of a socket pair) before it execs; the
//! parent, meanwhile, places it (moves it into its groups, a frozen one included) and then opens
//! the gate. So no instruction of the command runs before it is placed, and a child whose parent
//! dies first finds the gate closed empty and exits without running.
//!
//! The fds are dropped before the child says it is ready because a child frozen while it still
//! held them would hold its parent's (the agent's state lock, its control socket) for as long as
//! it stays frozen.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

/// The timer slack every command forked through the gate starts with (ns): the kernel's
/// default for a process, not the forking thread's.
pub const COMMAND_TIMER_SLACK_NS: libc::c_ulong = 50_000;

/// A child waiting behind its gate. Dropped without [`Gated::open`], the gate closes and the
/// child exits without running (unreaped: [`Gated::refuse`] reaps it).
#[derive(Debug)]
pub struct Gated {
    pid: i32,
    /// The parent's end of the gate.
    gate: OwnedFd,
    /// The relay pipe of a command run as a user (its fds 1 and 2).
    output: Option<super::relay::PipeId>,
}

impl Gated {
    /// Forks `argv` (`argv[0]` looked up in `PATH`, stdin from /dev/null) behind a gate.
    /// `InvalidInput` for an empty command or an argument holding a NUL byte.
    pub fn fork(argv: &[String]) -> io::Result<Gated> {
        Gated::fork_with_env(argv, &[])
    }

    /// [`Gated::fork`], the command's environment this process's with `env` set on top (a
    /// variable named there replaces this process's). `InvalidInput` also for a name or
    /// value holding a NUL byte or a name holding `=`.
    pub fn fork_with_env(argv: &[String], env: &[(String, String)]) -> io::Result<Gated> {
        Gated::fork_as(argv, env, None, super::ProcessScope::Any)
    }

    /// [`Gated::fork_with_env`], the command run as `user` when given: the child becomes it
    /// (setgroups, setgid, setuid) once the gate opens, just before it execs, so it is placed
    /// while still the parent's; a child that cannot become it exits with status 126
    /// without running the command.
    ///
    /// With [`ProcessScope::Own`](super::ProcessScope::Own), where the kernel can
    /// ([`super::scope::available`]), the child enters a Landlock domain of its own before it
    /// drops to its user: the command signals and ptraces only what it forks; a child that
    /// cannot enter it exits with status 126 without running the command.
    pub fn fork_as(
        argv: &[String],
        env: &[(String, String)],
        user: Option<&super::RunAs>,
        scope: super::ProcessScope,
    ) -> io::Result<Gated> {
        let scoped = scope == super::ProcessScope::Own && super::scope::available().is_ok();
        let invalid = |e: std::ffi::NulError| io::Error::new(io::ErrorKind::InvalidInput, e);
        if env.iter().any(|(k, _)| k.is_empty() || k.contains('=')) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an environment variable's name is empty or holds '='",
            ));
        }
        // Built before the fork: the child may not allocate.
        // Run as a user, only the variables `super::passed_on` allows (twenty-first hostile
        // pass: root's exported secrets reached the user).
        let envp: Option<Vec<CString>> = if env.is_empty() && user.is_none() {
            None
        } else {
            let mut out = Vec::new();
            for (k, v) in std::env::vars_os() {
                if env
                    .iter()
                    .any(|(name, _)| k.as_encoded_bytes() == name.as_bytes())
                    || (user.is_some() && !super::passed_on(k.as_encoded_bytes()))
                {
                    continue;
                }
                let mut entry = k.into_encoded_bytes();
                entry.push(b'=');
                entry.extend_from_slice(v.as_encoded_bytes());
                out.push(CString::new(entry).map_err(invalid)?);
            }
            for (k, v) in env {
                out.push(CString::new(format!("{k}={v}")).map_err(invalid)?);
            }
            Some(out)
        };
        let mut envp_ptrs: Vec<*const libc::c_char> =
            envp.iter().flatten().map(|e| e.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        if argv.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
        }
        let args: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let devnull = CString::new("/dev/null").expect("no NUL");
        // As a user, its fds 1 and 2 are a pipe the agent logs, never the agent's own (pass
        // 20's low: it wrote into the agent's journal as the agent).
        let output = user.map(|_| super::relay::pipe()).transpose()?;
        let output_id = match &output {
            Some((_, w)) => Some(super::relay::PipeId::of(w)?),
            None => None,
        };
        let out_w = output.as_ref().map_or(-1, |(_, w)| w.as_raw_fd());
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
            return Err(io::Error::last_os_error());
        }
        // the child's end and the parent's end of the gate
        let (gate_r, gate_w) = (fds[0], fds[1]);
        // SAFETY: the child only calls async-signal-safe functions (setsid, isatty, read, open,
        // dup2, close, getpriority, setpriority, write, prctl, landlock_create_ruleset,
        // landlock_restrict_self, setgroups, setgid, setuid, rt_sigaction, sigprocmask, execvp
        // or execvpe, _exit) on data prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let e = io::Error::last_os_error();
            // SAFETY: closing the two fds made above.
            unsafe {
                libc::close(gate_r);
                libc::close(gate_w);
            }
            return Err(e);
        }
        if pid == 0 {
            // SAFETY: see above; nothing here allocates or takes a lock.
            unsafe {
                // Its own session (and process group, of its pid), with no controlling
                // terminal: run as another user, a child still in ours could push input into
                // the terminal the agent runs on (TIOCSTI: root's shell ran it).
                libc::setsid();
                libc::close(gate_w);
                if out_w >= 0 && (libc::dup2(out_w, 1) < 0 || libc::dup2(out_w, 2) < 0) {
                    libc::_exit(1);
                }
                close_inherited_fds(gate_r);
                if user.is_some() {
                    off_the_terminal(devnull.as_ptr());
                }
                if libc::write(gate_r, b"r".as_ptr().cast(), 1) != 1 {
                    libc::_exit(1);
                }
                let mut byte = 0u8;
                let n = libc::read(gate_r, (&mut byte as *mut u8).cast(), 1);
                if n != 1 {
                    libc::_exit(1); // the parent died, or refused, before placing us: do not run
                }
                let null = libc::open(devnull.as_ptr(), libc::O_RDWR);
                if null >= 0 {
                    libc::dup2(null, 0);
                    if null > 2 {
                        libc::close(null); // else the command holds it as fd 3 (pass 20)
                    }
                }
                super::standing::at_most_ordinary();
                // The kernel's default timer slack, whichever of the parent's threads forked
                // it: a BE restarted from the agent's control loop (1 µs, or none as
                // SCHED_FIFO) got 0 where the first launch got 50 µs (pass 25's low).
                libc::prctl(libc::PR_SET_TIMERSLACK, COMMAND_TIMER_SLACK_NS, 0, 0, 0);
                // (while still root: no no_new_privs needed, a setuid program still works)
                if scoped && super::scope::enter_own_scope().is_err() {
                    libc::_exit(126); // never run it less confined than the agent said
                }
                if user.is_some_and(|u| u.become_it().is_err()) {
                    libc::_exit(126); // never run the command as the parent's user instead
                }
                default_signals();
                if envp.is_some() {
                    libc::execvpe(ptrs[0], ptrs.as_ptr(), envp_ptrs.as_ptr());
                } else {
                    libc::execvp(ptrs[0], ptrs.as_ptr());
                }
                libc::_exit(127);
            }
        }
        // SAFETY: the parent's copy of the read end is not used.
        unsafe { libc::close(gate_r) };
        let gated = Gated {
            pid,
            // SAFETY: gate_w is this process's, open, and owned by nothing else.
            gate: unsafe { OwnedFd::from_raw_fd(gate_w) },
            output: output_id,
        };
        if let Some((read, _write)) = output {
            let name = Path::new(&argv[0])
                .file_name()
                .map_or_else(|| argv[0].clone(), |n| n.to_string_lossy().into_owned());
            if let Err(e) = super::relay::start(read, &name, pid) {
                gated.kill();
                return Err(e);
            }
        }
        Ok(gated)
    }

    /// The child's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The relay pipe of the child's fds 1 and 2 (a command run as a user), to be recorded:
    /// a later agent relays an adopted BE's output only from it.
    pub fn output_pipe(&self) -> Option<super::relay::PipeId> {
        self.output
    }

    /// Waits up to `timeout` for the child to say it has dropped its inherited fds (only then
    /// may it be frozen).
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let mut poll = libc::pollfd {
            fd: self.gate.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        let mut word = 0u8;
        // SAFETY: one pollfd and a one-byte read into a live buffer, on the fd this owns.
        unsafe {
            libc::poll(&mut poll, 1, ms) == 1
                && libc::read(poll.fd, (&mut word as *mut u8).cast(), 1) == 1
                && word == b'r'
        }
    }

    /// Opens the gate: the child execs.
    pub fn open(self) {
        // SAFETY: one byte from a static buffer to the fd this owns (closed on drop).
        unsafe { libc::write(self.gate.as_raw_fd(), b"g".as_ptr().cast(), 1) };
    }

    /// Closes the gate unopened and reaps the child, which exits without running.
    pub fn refuse(self) {
        let pid = self.pid;
        drop(self.gate);
        let _ = waitpid(Pid::from_raw(pid), None);
    }

    /// Closes the gate unopened, kills the child and reaps it (one that never got ready).
    pub fn kill(self) {
        let pid = self.pid;
        drop(self.gate);
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        let _ = waitpid(Pid::from_raw(pid), None);
    }
}

/// Points fds 1 and 2 at `/dev/null` where they are a terminal, or the same open file as fd
/// 0 (the agent's input, still in place when this runs): a command run as another user must
/// not read what is typed into the terminal the agent runs on (it could, with no controlling
/// terminal: nineteenth hostile pass, uid 65534 read root's keystrokes from its fd 2) nor
/// write to it; nor read the agent's input through its fds 1 or 2 when the agent was given
/// one socket as input and output (`socat EXEC:`, an inetd-style unit: twentieth hostile
/// pass, uid 65534 read root's line from its fd 1). Async-signal-safe: `isatty` (an ioctl),
/// `fstat`, `open`, `dup2`, `close`.
pub(crate) fn off_the_terminal(devnull: *const libc::c_char) {
    // SAFETY: fstat of fd 0 into a zeroed stat of this (forked) process's stack.
    let input = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(0, &mut st) == 0).then_some((st.st_dev, st.st_ino))
    };
    for fd in [1, 2] {
        // SAFETY: isatty, fstat, open, dup2 and close on fds of this (forked) process and a
        // NUL-terminated path made before the fork.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            let same_as_input =
                libc::fstat(fd, &mut st) == 0 && Some((st.st_dev, st.st_ino)) == input;
            if libc::isatty(fd) == 1 || same_as_input {
                let null = libc::open(devnull, libc::O_RDWR);
                if null >= 0 {
                    libc::dup2(null, fd);
                    if null > 2 {
                        libc::close(null);
                    }
                }
            }
        }
    }
}

/// Marks every fd from 3 up close-on-exec (`close_range(2)` with `CLOSE_RANGE_CLOEXEC`, a
/// bounded `fcntl` loop where the kernel predates it, 5.11): a command run as another user
/// must not inherit an fd the agent was given without it (a lock file `flock(1)` holds, a
/// file root's shell opened: twentieth hostile pass, the LC command as uid 102 read root's
/// 0600 file through its fd 3). Marked rather than closed: `std::process::Command` reports a
/// failed exec through a pipe of its own. Async-signal-safe.
pub(crate) fn no_fd_past_stdio_on_exec() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range only flags fds of this (forked) process.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if rc != 0 {
        for fd in 3..4096 {
            // SAFETY: fcntl on fd numbers of this process; EBADF for closed ones.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}

/// Every signal to its default action and none blocked, as a job started from a login would
/// have them: an ignored disposition and the mask outlive `execve`, and the agent's (SIGPIPE
/// ignored by Rust's runtime; SIGINT and SIGQUIT where a shell's `&` started it) made a BE
/// pipeline (`producer | head`) get EPIPE instead of ending (twenty-first pass's low).
/// The raw `rt_sigaction`, since glibc's `signal` refuses its own 32 and 33, found ignored in a
/// test harness's children. Async-signal-safe: two system calls per signal, no allocation.
pub(crate) fn default_signals() {
    /// The kernel's `struct sigaction` all zero: `SIG_DFL`, no flags, an empty mask (the
    /// layout differs by architecture, zero reads the same in each; the x86-64 one is longest).
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    let default = KernelSigaction {
        handler: 0,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: plain system calls on a local struct and set; SIGKILL and SIGSTOP cannot be
    // changed and are skipped; a number the kernel refuses (EINVAL) is left as it is.
    unsafe {
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &default as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    8usize,
                );
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
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
    use nix::sys::wait::WaitStatus;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn an_opened_gate_runs_the_command() {
        let g = Gated::fork(&argv(&["sh", "-c", "exit 7"])).expect("fork");
        let pid = Pid::from_raw(g.pid());
        assert!(g.wait_ready(Duration::from_secs(5)), "ready within 5 s");
        g.open();
        assert_eq!(waitpid(pid, None).unwrap(), WaitStatus::Exited(pid, 7));
        // Nothing to fork: refused before any fork.
        let e = Gated::fork(&[]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = Gated::fork(&argv(&["a\0b"])).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    /// Twenty-first pass's low: the gated command started with SIGPIPE ignored (this test
    /// process's, Rust's runtime) where a login's job would have it default.
    #[test]
    fn the_command_starts_with_every_signal_default_and_none_blocked() {
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        let ignored = own
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap();
        assert_ne!(
            ignored & (1 << (libc::SIGPIPE - 1)),
            0,
            "this test needs its own process to ignore SIGPIPE (Rust's runtime does)"
        );
        // awk, exec'd by the gate itself: exit 3 if anything is ignored, 4 if blocked.
        let check = r#"/^SigIgn:/ { if ($2 != "0000000000000000") exit 3 }
                       /^SigBlk:/ { if ($2 != "0000000000000000") exit 4 }"#;
        let g = Gated::fork(&argv(&["awk", check, "/proc/self/status"])).expect("fork");
        let pid = Pid::from_raw(g.pid());
        assert!(g.wait_ready(Duration::from_secs(5)));
        g.open();
        assert_eq!(waitpid(pid, None).unwrap(), WaitStatus::Exited(pid, 0));
        // The LC's way (`StartIn`, through std's `Command`, which resets SIGPIPE alone).
        let mut cmd = std::process::Command::new("awk");
        cmd.args([check, "/proc/self/status"]);
        crate::spawn::StartIn::parent()
            .in_own_session()
            .apply(&mut cmd)
            .unwrap();
        assert_eq!(cmd.status().unwrap().code(), Some(0), "StartIn");
    }

    #[test]
    fn the_command_gets_the_environment_given_on_top_of_ours() {
        let env = [("HEADROOM_GATE_TEST".to_string(), "hp6 x".to_string())];
        let g = Gated::fork_with_env(
            &argv(&[
                "sh",
                "-c",
                "test \"$HEADROOM_GATE_TEST\" = 'hp6 x' && test -n \"$PATH\"",
            ]),
            &env,
        )
        .expect("fork");
        let pid = Pid::from_raw(g.pid());
        assert!(g.wait_ready(Duration::from_secs(5)));
        g.open();
        assert_eq!(waitpid(pid, None).unwrap(), WaitStatus::Exited(pid, 0));
        let bad = [("A=B".to_string(), "c".to_string())];
        let e = Gated::fork_with_env(&argv(&["true"]), &bad).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_gate_closed_unopened_ends_the_child_without_running_it() {
        let g = Gated::fork(&argv(&["sh", "-c", "exit 7"])).expect("fork");
        let pid = Pid::from_raw(g.pid());
        assert!(g.wait_ready(Duration::from_secs(5)));
        // Closed unopened (as `refuse` does), reaped here to see how it ended: 1, not 7.
        drop(g);
        assert_eq!(waitpid(pid, None).unwrap(), WaitStatus::Exited(pid, 1));
        // `refuse` reaps it itself: nothing is left to wait for.
        let g = Gated::fork(&argv(&["sh", "-c", "exit 7"])).expect("fork");
        let pid = Pid::from_raw(g.pid());
        assert!(g.wait_ready(Duration::from_secs(5)));
        g.refuse();
        assert!(waitpid(pid, None).is_err(), "already reaped");
    }

    /// Pass 20's low: the `/dev/null` opened for fd 0 stayed open in the command as fd 3.
    #[test]
    fn the_command_holds_no_fd_past_2() {
        let g = Gated::fork(&argv(&[
            "sh",
            "-c",
            "for n in 3 4 5 6 7 8 9; do [ -e /proc/$$/fd/$n ] && exit $n; done; exit 0",
        ]))
        .expect("fork");
        let pid = Pid::from_raw(g.pid());
        assert!(g.wait_ready(Duration::from_secs(5)));
        g.open();
        assert_eq!(
            waitpid(pid, None).unwrap(),
            WaitStatus::Exited(pid, 0),
            "the exit status is the first fd past 2 the command held"
        );
    }

    /// Twentieth hostile pass: the agent's input and output one socket (`socat EXEC:`), a BE
    /// as uid 65534 read root's line from its fd 1. Fd 1, that socket, must become /dev/null;
    /// fd 2, another file (a pipe), is kept.
    #[test]
    fn an_fd_1_that_is_the_agents_input_is_replaced() {
        let mut sock = [0; 2];
        let mut pipe = [0; 2];
        // SAFETY: socketpair and pipe fill two fds each.
        unsafe {
            assert_eq!(
                libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sock.as_mut_ptr()),
                0
            );
            assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
        }
        let devnull = CString::new("/dev/null").unwrap();
        // SAFETY: the child calls only dup2, off_the_terminal, fstat and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: as above, in the forked child.
            unsafe {
                libc::dup2(sock[0], 0);
                libc::dup2(sock[0], 1);
                libc::dup2(pipe[1], 2);
                off_the_terminal(devnull.as_ptr());
                let mut st: libc::stat = std::mem::zeroed();
                let one_null = libc::fstat(1, &mut st) == 0
                    && st.st_mode & libc::S_IFMT == libc::S_IFCHR
                    && st.st_rdev == libc::makedev(1, 3);
                let two_pipe =
                    libc::fstat(2, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO;
                libc::_exit(i32::from(one_null) | i32::from(two_pipe) << 1);
            }
        }
        let status = waitpid(Pid::from_raw(pid), None).expect("wait");
        // SAFETY: closing the test's own fds.
        unsafe {
            for fd in sock.into_iter().chain(pipe) {
                libc::close(fd);
            }
        }
        assert_eq!(
            status,
            WaitStatus::Exited(Pid::from_raw(pid), 0b11),
            "bits: fd 1 /dev/null, fd 2 still the pipe"
        );
    }

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
