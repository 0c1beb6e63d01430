//! Starting a child process inside cgroups, without a capability, on one CPU or at a nice
//! value, with no shell or helper binary in between: a [`StartIn`] gives a
//! `std::process::Command` a `pre_exec` step that runs in the child between fork and exec. The
//! child joins each group by writing `0` (the writer itself) to the group's `cgroup.procs` (v1
//! and v2 alike), drops the capabilities from its bounding and inheritable sets, so whatever it
//! executes (even as root) never regains them, then pins itself and sets its nice value (its
//! threads inherit both).
//!
//! Between fork and exec only async-signal-safe calls are allowed: everything the step needs
//! (the paths as C strings, the capability numbers) is prepared before the fork, and the step
//! itself is `setsid`, `open`/`write`/`close`, `prctl`, `capget`/`capset`,
//! `sched_setaffinity` and `setpriority`, with no allocation.
//!
//! A child that must be placed by its parent while it waits (a frozen group cannot be joined
//! from inside `pre_exec` without blocking the spawn) is forked behind a gate: [`Gated`].

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{HostError, Result};

mod gate;
pub mod journal;
pub mod relay;
pub mod scope;
mod standing;
mod user;
pub use gate::{Gated, COMMAND_TIMER_SLACK_NS};
pub use scope::ProcessScope;
pub use user::{passed_on, RunAs, NO_ENTRY_GID};

/// A capability a child can be started without (`linux/capability.h` numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// `CAP_SYS_NICE`: raising priority, real-time scheduling policies, others' affinity.
    SysNice = 23,
}

/// Where and with what a child starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartIn {
    group_dirs: Vec<PathBuf>,
    without: Vec<Capability>,
    cpu: Option<usize>,
    nice: Option<i32>,
    user: Option<RunAs>,
    own_session: bool,
}

impl StartIn {
    /// As the parent: its groups, its capabilities.
    pub fn parent() -> StartIn {
        StartIn::default()
    }

    /// In the cgroup directory `dir` (a v1 hierarchy's group or a v2 group, on the host); called
    /// again, in that one too (one group per v1 hierarchy), joined in the order given.
    pub fn in_group(mut self, dir: &Path) -> StartIn {
        if !self.group_dirs.iter().any(|d| d == dir) {
            self.group_dirs.push(dir.to_path_buf());
        }
        self
    }

    /// Pinned to `cpu` (its threads inherit the affinity).
    pub fn on_cpu(mut self, cpu: usize) -> StartIn {
        self.cpu = Some(cpu);
        self
    }

    /// At nice value `nice` (-20..=19; the kernel clamps what lies beyond).
    pub fn at_nice(mut self, nice: i32) -> StartIn {
        self.nice = Some(nice);
        self
    }

    /// In a session of its own (`setsid`, first): it leads it and its process group (of its
    /// pid), with no controlling terminal. A command run as another user must: one left in
    /// the agent's session could push input into the terminal the agent runs on (`TIOCSTI`),
    /// which root's shell then reads (eighteenth hostile pass). Not with
    /// `Command::process_group`, which makes it a group leader first (setsid then fails).
    pub fn in_own_session(mut self) -> StartIn {
        self.own_session = true;
        self
    }

    /// As `user` (set last, after the groups, capabilities, CPU and nice value, which need
    /// the parent's privileges): see [`RunAs`].
    pub fn as_user(mut self, user: RunAs) -> StartIn {
        self.user = Some(user);
        self
    }

    /// Without `cap`, in the bounding and inheritable sets.
    pub fn without(mut self, cap: Capability) -> StartIn {
        if !self.without.contains(&cap) {
            self.without.push(cap);
        }
        self
    }

    /// The group directories the child joins, in order.
    pub fn group_dirs(&self) -> &[PathBuf] {
        &self.group_dirs
    }

    /// The capabilities the child starts without.
    pub fn dropped(&self) -> &[Capability] {
        &self.without
    }

    /// Whether the child starts as the parent would (nothing to do before exec).
    pub fn is_parent(&self) -> bool {
        *self == StartIn::default()
    }

    /// Installs the step on `cmd` (nothing where [`Self::is_parent`]). A failure in the child
    /// makes `cmd`'s spawn fail with the errno of the step that failed. Refused here (before any
    /// fork) only for a group directory that holds a NUL byte.
    pub fn apply(&self, cmd: &mut Command) -> Result<()> {
        if self.is_parent() {
            return Ok(());
        }
        let procs: Vec<CString> = self
            .group_dirs
            .iter()
            .map(|dir| {
                let path = dir.join("cgroup.procs");
                CString::new(path.as_os_str().as_bytes()).map_err(|_| HostError::Invalid {
                    what: "cgroup directory",
                    value: dir.display().to_string(),
                    reason: "holds a NUL byte".to_owned(),
                })
            })
            .collect::<Result<_>>()?;
        if self.user.is_some() {
            // Of the agent's environment only what `user::passed_on` allows, then what the
            // caller set on `cmd` (the user's `HOME`, `USER`, `LOGNAME`).
            let set: Vec<_> = cmd
                .get_envs()
                .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
                .collect();
            cmd.env_clear();
            for (k, v) in std::env::vars_os() {
                if user::passed_on(k.as_encoded_bytes()) {
                    cmd.env(k, v);
                }
            }
            for (k, v) in set {
                match v {
                    Some(v) => cmd.env(k, v),
                    None => cmd.env_remove(k),
                };
            }
        }
        let caps: Vec<u32> = self.without.iter().map(|&c| c as u32).collect();
        let (cpu, nice) = (self.cpu, self.nice);
        let user = self.user.clone();
        let own_session = self.own_session;
        let devnull = CString::new("/dev/null").expect("no NUL");
        let step = move || -> io::Result<()> {
            // SAFETY: setsid of the calling (forked) process.
            if own_session && unsafe { libc::setsid() } < 0 {
                return Err(io::Error::last_os_error());
            }
            for procs in &procs {
                join_group(procs)?;
            }
            for &cap in &caps {
                drop_capability(cap)?;
            }
            if let Some(cpu) = cpu {
                crate::sched::pin_this_thread(cpu)?;
            }
            if let Some(nice) = nice {
                // SAFETY: setpriority of the calling process with integer arguments.
                if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(user) = &user {
                // Not the agent's terminal on its fds 1 and 2 (nineteenth hostile pass), nor
                // its input (twentieth: fd 0 is still what the command was given, the
                // agent's when inherited, so it is compared first and then made /dev/null),
                // nor any fd past them the agent was given (twentieth: a file of root's).
                gate::off_the_terminal(devnull.as_ptr());
                // SAFETY: open, dup2 and close of this (forked) process's fds.
                unsafe {
                    let null = libc::open(devnull.as_ptr(), libc::O_RDONLY);
                    if null < 0 || libc::dup2(null, 0) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    if null > 2 {
                        libc::close(null);
                    }
                }
                gate::no_fd_past_stdio_on_exec();
                user.become_it()?;
            }
            gate::default_signals();
            Ok(())
        };
        // SAFETY: the step makes only async-signal-safe calls (setsid, isatty, fstat, open, dup2, write, close, fcntl, close_range,
        // prctl, capget, capset, sched_setaffinity, setpriority, setgroups, setgid, setuid,
        // rt_sigaction, sigprocmask)
        // on data prepared before the fork, and allocates nothing.
        unsafe { cmd.pre_exec(step) };
        Ok(())
    }
}

/// The calling process joins the group whose `cgroup.procs` is `procs` ("0": the writer).
fn join_group(procs: &CString) -> io::Result<()> {
    // SAFETY: a NUL-terminated path; the fd is closed below on every path.
    let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: one byte from a static buffer to the fd just opened.
    let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    let error = io::Error::last_os_error();
    // SAFETY: the fd opened above, closed once.
    unsafe { libc::close(fd) };
    if written != 1 {
        return Err(error);
    }
    Ok(())
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Removes `cap` from the calling process's bounding set, then from its inheritable set.
fn drop_capability(cap: u32) -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and two data words, as version 3 requires.
    if unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    data[(cap / 32) as usize].inheritable &= !(1 << (cap % 32));
    // SAFETY: as above; the kernel only reads them.
    if unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::Controller;

    #[test]
    fn a_start_says_where_and_without_what() {
        let s = StartIn::parent();
        assert!(s.is_parent());
        let s = s
            .in_group(Path::new("/sys/fs/cgroup/cpu/x"))
            .without(Capability::SysNice)
            .without(Capability::SysNice);
        assert_eq!(s.group_dirs(), &[PathBuf::from("/sys/fs/cgroup/cpu/x")]);
        assert_eq!(s.dropped(), &[Capability::SysNice]);
        assert!(!s.is_parent());
        let s = s
            .in_group(Path::new("/sys/fs/cgroup/memory/x"))
            .in_group(Path::new("/sys/fs/cgroup/cpu/x"));
        assert_eq!(
            s.group_dirs(),
            &[
                PathBuf::from("/sys/fs/cgroup/cpu/x"),
                PathBuf::from("/sys/fs/cgroup/memory/x")
            ]
        );
        assert!(!StartIn::parent().on_cpu(0).is_parent());
        assert!(!StartIn::parent().at_nice(19).is_parent());
    }

    /// The child runs on the CPU and at the nice value it was given (no root needed).
    #[test]
    fn the_child_starts_on_its_cpu_at_its_nice_value() {
        let cpu = crate::sched::affinity(0)
            .expect("own affinity")
            .iter()
            .last()
            .expect("a CPU") as usize;
        let start = StartIn::parent().on_cpu(cpu).at_nice(19);
        let text = output(
            &start,
            &["sh", "-c", "cat /proc/self/status /proc/self/stat"],
        )
        .expect("spawn");
        let allowed = text
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list")
            .trim();
        assert_eq!(allowed, cpu.to_string(), "{text}");
        // /proc/<pid>/stat field 19 is the nice value (after the `)` of the command name).
        let stat = text.lines().last().expect("the stat line");
        let after = &stat[stat.rfind(')').expect("comm") + 1..];
        let nice = after.split_whitespace().nth(19 - 3).expect("field 19");
        assert_eq!(nice, "19", "{stat}");
    }

    /// Removes the test's group when the test ends, also on failure.
    struct Group(PathBuf);

    impl Drop for Group {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }

    fn output(start: &StartIn, argv: &[&str]) -> std::io::Result<String> {
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..]);
        start.apply(&mut cmd).unwrap();
        let out = cmd.output()?;
        assert!(out.status.success(), "{argv:?}: {:?}", out);
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Twentieth hostile pass: the LC command, run as uid 102, read root's 0600 file through
    /// an fd the agent was given by its parent (`3<file`, a lock `flock(1)` holds). A command
    /// run as a user holds no fd past 2 of its parent's, and its fd 0 is /dev/null.
    #[test]
    fn a_command_run_as_a_user_holds_no_fd_of_the_parents() {
        const TEST: &str = "a_command_run_as_a_user_holds_no_fd_of_the_parents";
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP {TEST}: needs root");
            return;
        }
        let spec = headroom_types::UserSpec::uid(65534).unwrap();
        let Ok(Some(nobody)) = RunAs::resolve(&spec) else {
            eprintln!("SKIP {TEST}: uid 65534 does not resolve here");
            return;
        };
        let path = CString::new("/proc/self/status").unwrap();
        // SAFETY: an fd opened without O_CLOEXEC, as a parent's shell leaves one.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
        assert!(fd > 2);
        let start = StartIn::parent().in_own_session().as_user(nobody);
        let script = format!(
            "if test -e /proc/self/fd/{fd}; then echo held; else echo none; fi; readlink /proc/self/fd/0"
        );
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &script])
            .stdin(std::process::Stdio::inherit());
        start.apply(&mut cmd).unwrap();
        let out = cmd.output();
        // SAFETY: the fd opened above, closed once.
        unsafe { libc::close(fd) };
        let out = out.expect("spawn");
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text, "none\n/dev/null\n", "{out:?}");
    }

    /// Live (root): the child is a member of the group from its first instruction, and
    /// CAP_SYS_NICE is gone from its bounding set after exec.
    #[test]
    fn the_child_starts_in_the_group_without_the_capability() {
        const TEST: &str = "the_child_starts_in_the_group_without_the_capability";
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP {TEST}: needs root");
            return;
        }
        let Ok(layout) = crate::LinuxHost::system().cgroup_layout() else {
            eprintln!("SKIP {TEST}: no cgroup mount found");
            return;
        };
        let Some(mount) = layout.v1.get(&Controller::Cpu).or(layout.v2.as_ref()) else {
            eprintln!("SKIP {TEST}: no v1 cpu hierarchy nor cgroup2 mount");
            return;
        };
        let name = "headroom-test-house41-spawn";
        let group = Group(mount.join(name));
        std::fs::create_dir_all(&group.0).unwrap();

        let start = StartIn::parent()
            .in_group(&group.0)
            .without(Capability::SysNice);
        let text = output(
            &start,
            &["sh", "-c", "cat /proc/self/cgroup /proc/self/status"],
        )
        .expect("spawn");
        assert!(
            text.lines().any(|l| l.ends_with(&format!(":/{name}"))),
            "{text}"
        );
        let bound = |text: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix("CapBnd:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                .expect("CapBnd")
        };
        let me = std::fs::read_to_string("/proc/self/status").unwrap();
        if bound(&me) & (1 << 23) == 0 {
            eprintln!("SKIP {TEST} (capability part): this process has no CAP_SYS_NICE to drop");
        } else {
            assert_eq!(bound(&text) & (1 << 23), 0, "{text}");
        }

        // A group that does not exist: the spawn fails, naming the errno.
        let gone = StartIn::parent().in_group(&mount.join("headroom-test-house41-none"));
        let mut cmd = Command::new("true");
        gone.apply(&mut cmd).unwrap();
        let err = cmd.status().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    }
}
