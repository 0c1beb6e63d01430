//! Processes and the machine as /proc tells them (through `procfs`): a process's or thread's
//! CPU time, its run state, the kernel's release and load average — what benchmarks and the
//! workloads print beside their figures, and the flocks held now (/proc/locks). And the calls a
//! tool makes on processes: a signal, whether one exists, whether we are root, our thread id.

use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;
use nix::unistd::Pid;
use procfs::process::Process;
use procfs::Current;

pub use nix::sys::signal::Signal;

use crate::error::{HostError, IoOp, Result};

/// `/proc/<pid>` as the path an error names.
fn proc_path(pid: i32, leaf: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{leaf}"))
}

fn read_error(path: PathBuf, e: procfs::ProcError) -> HostError {
    HostError::io(IoOp::Read, path, None, std::io::Error::other(e.to_string()))
}

/// The running kernel's release (`uname -r`), or `None` where /proc does not say.
pub fn kernel_release() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string())
}

/// The 1, 5 and 15 minute load averages, or `None` where /proc does not say.
pub fn load_average() -> Option<[f32; 3]> {
    procfs::LoadAverage::current()
        .ok()
        .map(|l| [l.one, l.five, l.fifteen])
}

/// The load averages as "0.52 0.61 0.70" ("?" where unknown), for a report's header line.
pub fn load_average_text() -> String {
    load_average().map_or_else(
        || "?".to_string(),
        |l| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2]),
    )
}

/// Time every thread of `pid` has run on a CPU so far (schedstat, ns resolution).
pub fn process_run_time(pid: i32) -> Result<Duration> {
    let process = Process::new(pid).map_err(|e| read_error(proc_path(pid, ""), e))?;
    let tasks = process
        .tasks()
        .map_err(|e| read_error(proc_path(pid, "task"), e))?;
    let mut total = 0u64;
    for task in tasks {
        // A thread that exits while it is listed has nothing more to add.
        let Ok(task) = task else { continue };
        if let Ok(s) = task.schedstat() {
            total += s.sum_exec_runtime;
        }
    }
    Ok(Duration::from_nanos(total))
}

/// Time this process's thread named `name` has run on a CPU so far (schedstat, ns).
pub fn own_thread_run_time(name: &str) -> Result<Duration> {
    let me = Process::myself().map_err(|e| read_error(PathBuf::from("/proc/self"), e))?;
    let tasks = me
        .tasks()
        .map_err(|e| read_error(PathBuf::from("/proc/self/task"), e))?;
    for task in tasks.flatten() {
        let Ok(stat) = task.stat() else { continue };
        if stat.comm != name {
            continue;
        }
        let path = PathBuf::from(format!("/proc/self/task/{}/schedstat", task.tid));
        let s = task.schedstat().map_err(|e| read_error(path, e))?;
        return Ok(Duration::from_nanos(s.sum_exec_runtime));
    }
    Err(HostError::io(
        IoOp::Read,
        PathBuf::from("/proc/self/task"),
        None,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no thread named {name:?}"),
        ),
    ))
}

/// User + system CPU time of `pid` (clock-tick resolution), from its stat.
pub fn process_cpu_time(pid: i32) -> Result<Duration> {
    let stat = Process::new(pid)
        .and_then(|p| p.stat())
        .map_err(|e| read_error(proc_path(pid, "stat"), e))?;
    let hz = procfs::ticks_per_second().max(1);
    Ok(Duration::from_nanos(
        (stat.utime + stat.stime) * 1_000_000_000 / hz,
    ))
}

/// The run state letter of `pid` ('R' running, 'S' sleeping, 'T' stopped, …), or `None` when
/// it is gone.
pub fn process_state(pid: i32) -> Option<char> {
    Process::new(pid)
        .and_then(|p| p.stat())
        .ok()
        .map(|s| s.state)
}

/// Sends `sig` to process `pid` (a negative `pid`: to that process group, as kill(2)). The
/// error names the pid and the signal (ESRCH: it is gone).
pub fn send_signal(pid: i32, sig: Signal) -> Result<()> {
    nix::sys::signal::kill(Pid::from_raw(pid), sig).map_err(|errno| HostError::Syscall {
        call: "kill",
        target: format!("pid {pid}"),
        value: sig.as_str().to_owned(),
        source: std::io::Error::from_raw_os_error(errno as i32),
    })
}

/// This process's soft limit on open files (`RLIMIT_NOFILE`); `None` when unlimited or unknown.
pub fn open_files_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) if soft != RLIM_INFINITY => Some(soft),
        _ => None,
    }
}

/// How many files this process holds open now (`/proc/self/fd`'s entries, less the one its
/// own listing opens); `None` when it cannot be listed.
pub fn open_files_count() -> Option<u64> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    Some((entries.count() as u64).saturating_sub(1))
}

/// This process's effective uid.
pub fn effective_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The uid of the login name `name` in this host's `/etc/passwd` (read directly, not through
/// NSS: see [`crate::accounts`]); `Ok(None)` when it lists no such user.
pub fn uid_of_user(name: &str) -> std::io::Result<Option<u32>> {
    Ok(crate::accounts::Accounts::system()
        .user_by_name(name)?
        .map(|e| e.uid))
}

/// How a child of this process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildEnd {
    Exited(i32),
    Signaled(Signal),
    /// waitpid(2) itself failed (ECHILD: not this process's child, or reaped already).
    WaitFailed(Errno),
}

impl std::fmt::Display for ChildEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildEnd::Exited(code) => write!(f, "exit status: {code}"),
            ChildEnd::Signaled(sig) => write!(f, "signal: {sig}"),
            ChildEnd::WaitFailed(e) => write!(f, "wait failed: {e}"),
        }
    }
}

/// Reaps child `pid` if it has ended (`None` while it runs or is only stopped); with `block`,
/// waits for it to end.
pub fn reap(pid: i32, block: bool) -> Option<ChildEnd> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let flags = (!block).then_some(WaitPidFlag::WNOHANG);
    match waitpid(Pid::from_raw(pid), flags) {
        Ok(WaitStatus::Exited(_, code)) => Some(ChildEnd::Exited(code)),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some(ChildEnd::Signaled(sig)),
        Ok(_) => None,
        Err(e) => Some(ChildEnd::WaitFailed(e)),
    }
}

/// Whether process `pid` exists (signal 0: only ESRCH says it does not; EPERM is someone
/// else's process).
pub fn exists(pid: i32) -> bool {
    !matches!(
        nix::sys::signal::kill(Pid::from_raw(pid), None),
        Err(Errno::ESRCH)
    )
}

/// Restores SIGPIPE's default (the process ends on a write to a closed pipe, as Unix tools do;
/// Rust starts with it ignored). Called before any thread starts.
pub fn die_on_closed_pipe() {
    // SAFETY: the default disposition installs no handler; nothing else sets this signal's.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The calling thread's id (`gettid`).
pub fn thread_id() -> i32 {
    nix::unistd::gettid().as_raw()
}

/// User and system CPU seconds kept apart: whether a cost is a program's own code or the
/// kernel's work on its behalf (on loopback TCP the latter includes the peer's receive path).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSplit {
    pub user_s: f64,
    pub sys_s: f64,
}

impl CpuSplit {
    pub fn total_s(self) -> f64 {
        self.user_s + self.sys_s
    }
}

impl std::ops::Sub for CpuSplit {
    type Output = CpuSplit;
    fn sub(self, earlier: CpuSplit) -> CpuSplit {
        CpuSplit {
            user_s: self.user_s - earlier.user_s,
            sys_s: self.sys_s - earlier.sys_s,
        }
    }
}

/// Whose CPU time [`cpu_split`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// This process (`RUSAGE_SELF`).
    Process,
    /// Its waited-for children (`RUSAGE_CHILDREN`).
    Children,
    /// The calling thread (`RUSAGE_THREAD`).
    Thread,
}

/// CPU time used so far by `who`, user and system apart (`getrusage`, which refuses none of
/// these three).
pub fn cpu_split(who: Usage) -> CpuSplit {
    let who = match who {
        Usage::Process => libc::RUSAGE_SELF,
        Usage::Children => libc::RUSAGE_CHILDREN,
        Usage::Thread => libc::RUSAGE_THREAD,
    };
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    CpuSplit {
        user_s: tv(ru.ru_utime),
        sys_s: tv(ru.ru_stime),
    }
}

/// How [`try_flock`] locks a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flock {
    Exclusive,
    Shared,
}

/// `flock(how | LOCK_NB)` on `file`: `Ok(false)` when another open file holds it.
pub fn try_flock(file: &std::fs::File, how: Flock) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let how = match how {
        Flock::Exclusive => libc::LOCK_EX,
        Flock::Shared => libc::LOCK_SH,
    };
    // SAFETY: flock on an fd the caller owns for the call's duration.
    let rc = unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(err)
}

/// A file's key in /proc/locks, as [`flocks_held`] lists them: its device's major and minor
/// numbers and its inode.
pub fn flock_key(meta: &std::fs::Metadata) -> (u64, u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let dev = meta.dev();
    (
        u64::from(libc::major(dev)),
        u64::from(libc::minor(dev)),
        meta.ino(),
    )
}

/// The (device major, minor, inode) of every flock held now; `exclusive`: only those.
pub fn flocks_held(exclusive: bool) -> std::collections::BTreeSet<(u64, u64, u64)> {
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    parse_flocks(&locks, exclusive)
}

fn parse_flocks(locks: &str, exclusive: bool) -> std::collections::BTreeSet<(u64, u64, u64)> {
    // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF": the device (hex major:minor) and inode.
    locks
        .lines()
        .filter(|l| l.contains("FLOCK") && (!exclusive || l.contains(" WRITE ")))
        .filter_map(|l| {
            let id = l.split_whitespace().find(|w| w.matches(':').count() == 2)?;
            let mut it = id.split(':');
            let major = u64::from_str_radix(it.next()?, 16).ok()?;
            let minor = u64::from_str_radix(it.next()?, 16).ok()?;
            let ino = it.next()?.parse().ok()?;
            Some((major, minor, ino))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_split_subtracts_field_by_field() {
        let later = CpuSplit {
            user_s: 3.5,
            sys_s: 10.25,
        };
        let earlier = CpuSplit {
            user_s: 1.0,
            sys_s: 0.25,
        };
        assert_eq!(
            later - earlier,
            CpuSplit {
                user_s: 2.5,
                sys_s: 10.0
            }
        );
        assert_eq!((later - earlier).total_s(), 12.5);
    }

    #[test]
    fn a_threads_user_work_counts_as_its_user_time_and_its_process() {
        let before = cpu_split(Usage::Thread);
        let process_before = cpu_split(Usage::Process);
        let start = std::time::Instant::now();
        let mut x = 0u64;
        // Spin until the thread has run 30 ms of CPU (bounded at 5 s of wall time).
        while (cpu_split(Usage::Thread) - before).total_s() < 0.03 && start.elapsed().as_secs() < 5
        {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        let spent = cpu_split(Usage::Thread) - before;
        assert!(spent.total_s() >= 0.03, "{spent:?}");
        assert!(
            spent.user_s > 0.0,
            "a user-space loop shows as user time: {spent:?}"
        );
        assert!((cpu_split(Usage::Process) - process_before).total_s() >= spent.total_s() * 0.9);
    }

    #[test]
    fn a_flock_is_seen_in_proc_locks_and_refused_to_a_second_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let a = std::fs::File::create(&path).unwrap();
        let b = std::fs::File::open(&path).unwrap();
        assert!(try_flock(&a, Flock::Exclusive).unwrap());
        assert!(
            !try_flock(&b, Flock::Shared).unwrap(),
            "held exclusively by a"
        );
        let key = flock_key(&a.metadata().unwrap());
        let listed = flocks_held(true).contains(&key);
        drop(a);
        assert!(
            try_flock(&b, Flock::Shared).unwrap(),
            "a's lock went with it"
        );
        if !listed {
            eprintln!(
                "SKIP a_flock_is_seen_in_proc_locks (the /proc/locks part): this file system's \
                 device there is not the one stat gives (overlayfs?)"
            );
            return;
        }
        assert!(!flocks_held(true).contains(&key), "only shared now");
        assert!(flocks_held(false).contains(&key));
    }

    #[test]
    fn a_signal_reaches_a_child_and_a_reaped_one_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id() as i32;
        assert!(exists(pid));
        send_signal(pid, Signal::SIGKILL).expect("kill our own child");
        let status = child.wait().expect("wait");
        assert!(!status.success());
        assert!(!exists(pid));
        let e = send_signal(pid, Signal::SIGTERM).unwrap_err().to_string();
        assert!(
            e.contains(&format!("pid {pid}")) && e.contains("SIGTERM") && e.contains("ESRCH"),
            "{e}"
        );
        assert!(thread_id() > 0);
        // SAFETY: geteuid has no preconditions.
        assert_eq!(is_root(), unsafe { libc::geteuid() } == 0);
    }

    #[test]
    fn this_process_runs_and_its_times_grow_with_work() {
        let me = std::process::id() as i32;
        let before = process_run_time(me).unwrap();
        let cpu_before = process_cpu_time(me).unwrap();
        // Spin until this thread has run 100 ms on a CPU (by its own CPU clock, the same
        // accounting schedstat sums): both figures must see it however busy the machine is.
        let thread_cpu = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes into the timespec we own.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
        };
        let start = thread_cpu();
        let hang = std::time::Instant::now();
        let mut x = 0u64;
        while thread_cpu() < start + Duration::from_millis(100) {
            assert!(hang.elapsed() < Duration::from_secs(60), "no CPU in 60 s");
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        let after = process_run_time(me).unwrap();
        assert!(
            after >= before + Duration::from_millis(40),
            "{before:?} -> {after:?}"
        );
        assert!(process_cpu_time(me).unwrap() > cpu_before);
        assert!(process_state(me).is_some());
    }

    #[test]
    fn a_stopped_child_reads_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let hang = std::time::Instant::now();
        while process_state(pid) != Some('T') && hang.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let state = process_state(pid);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(state, Some('T'));
    }

    #[test]
    fn a_named_thread_is_found_and_a_missing_one_is_an_error_naming_it() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel::<()>();
        let h = std::thread::Builder::new()
            .name("hr-proc-test".into())
            .spawn(move || {
                // Named by now (the new thread names itself before it runs this).
                let _ = ready_tx.send(());
                let _ = rx.recv();
            })
            .unwrap();
        ready.recv().unwrap();
        assert!(own_thread_run_time("hr-proc-test").is_ok());
        let err = own_thread_run_time("no-such-thread")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no-such-thread"), "{err}");
        drop(tx);
        h.join().unwrap();
    }

    #[test]
    fn machine_facts_read() {
        assert!(kernel_release().is_some_and(|r| !r.is_empty()));
        let l = load_average().unwrap();
        assert!(l.iter().all(|v| *v >= 0.0));
        assert_eq!(load_average_text().split(' ').count(), 3);
        assert!(process_state(i32::MAX).is_none());
        assert!(process_run_time(i32::MAX).is_err());
    }

    #[test]
    fn flocks_are_read_from_proc_locks_lines() {
        let text = "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF\n2: FLOCK  ADVISORY  READ  99 fd:00:42 0 EOF\n3: POSIX  ADVISORY  WRITE 7 08:01:9 0 EOF\n";
        let all = parse_flocks(text, false);
        assert_eq!(all.len(), 2);
        assert!(all.contains(&(8, 1, 5678)) && all.contains(&(0xfd, 0, 42)));
        assert_eq!(
            parse_flocks(text, true).into_iter().collect::<Vec<_>>(),
            vec![(8, 1, 5678)]
        );
    }

    #[test]
    fn a_child_is_reaped_with_how_it_ended() {
        let spawn = |script: &str| {
            std::process::Command::new("sh")
                .args(["-c", script])
                .spawn()
                .unwrap()
                .id() as i32
        };
        assert_eq!(reap(spawn("exit 3"), true), Some(ChildEnd::Exited(3)));
        let sleeper = spawn("exec sleep 30");
        assert_eq!(reap(sleeper, false), None, "still running");
        send_signal(sleeper, Signal::SIGKILL).unwrap();
        let end = reap(sleeper, true);
        assert_eq!(end, Some(ChildEnd::Signaled(Signal::SIGKILL)));
        assert_eq!(end.unwrap().to_string(), "signal: SIGKILL");
        assert!(matches!(
            reap(sleeper, false),
            Some(ChildEnd::WaitFailed(Errno::ECHILD))
        ));
    }
}
