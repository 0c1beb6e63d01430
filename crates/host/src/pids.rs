//! Finding processes through a /proc tree (`root` is `/` on the live host, a fake tree in
//! tests): every pid, a pid file's live pid, a process group's members, the processes running
//! an exact argv or listening on a TCP port, and the cgroup lines of a pid.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What a pid file holds, as [`read_pid_file`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidFile {
    /// A live pid, and who could have written it.
    Pid(PidFileRead),
    /// No live pid: no file, no number, or a process that is gone.
    Nothing,
    /// Not a regular file (a FIFO, a device, a directory, a socket), so not read: what it is.
    NotRegular(&'static str),
}

/// A pid file's live pid, and the owner, group and mode of the file it was read from (as
/// opened, links followed): who could have written that pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidFileRead {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    /// When the file was last written (its mtime): a process that started after that is not
    /// the one it was written for (see [`started_after_written`]).
    pub written: Option<std::time::SystemTime>,
}

/// The pid file `file` (a path from `/`, read under `root`).
/// Only a regular file, read without waiting and 64 bytes at most: the file is the LC user's
/// to replace, and a FIFO there blocked the agent's loop for good (`ctl` and SIGTERM
/// unanswered), a link to `/dev/zero` grew it without end (thirteenth hostile pass). Anything
/// else is [`PidFile::NotRegular`], so the caller can say why the LC is not followed. A pid
/// comes with the owner, group and mode of the file it was read from (as opened, links
/// followed): who could have written it.
pub fn read_pid_file(root: &Path, file: &str) -> PidFile {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let path = root.join(file.trim_start_matches('/'));
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    else {
        return PidFile::Nothing;
    };
    let Ok(meta) = f.metadata() else {
        return PidFile::Nothing;
    };
    if !meta.file_type().is_file() {
        return PidFile::NotRegular(headroom_types::other_writers::special_file_kind(
            meta.file_type(),
        ));
    }
    let mut text = String::new();
    if f.take(64).read_to_string(&mut text).is_err() {
        return PidFile::Nothing;
    }
    match text.trim().parse::<u32>() {
        Ok(pid) if pid > 0 && root.join(format!("proc/{pid}")).is_dir() => {
            PidFile::Pid(PidFileRead {
                pid,
                uid: meta.uid(),
                gid: meta.gid(),
                mode: meta.mode() & 0o7777,
                written: meta.modified().ok(),
            })
        }
        _ => PidFile::Nothing,
    }
}

/// The live pid in the pid file `file` (a path from `/`, read under `root`), if any: see
/// [`read_pid_file`].
pub fn from_pid_file(root: &Path, file: &str) -> Option<u32> {
    match read_pid_file(root, file) {
        PidFile::Pid(r) => Some(r.pid),
        _ => None,
    }
}

/// `/proc/<pid>/cgroup` as text ("" when the process is gone).
pub fn cgroup_text(root: &Path, pid: u32) -> String {
    std::fs::read_to_string(root.join(format!("proc/{pid}/cgroup"))).unwrap_or_default()
}

/// Every process id under `root/proc`.
pub fn all(root: &Path) -> Vec<u32> {
    std::fs::read_dir(root.join("proc"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Most processes [`descendants`] looks at.
const TREE_MAX: usize = 4096;

/// `pid` and the processes it forked, through `/proc/<p>/task/<t>/children` (the tree only,
/// not every process on the host); with no such files, its process group.
pub fn descendants(root: &Path, pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    let mut seen_children_file = false;
    while i < out.len() && out.len() < TREE_MAX {
        let p = out[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(root.join(format!("proc/{p}/task"))) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            seen_children_file = true;
            out.extend(
                text.split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
    }
    if !seen_children_file {
        return in_process_group(root, pid);
    }
    out.truncate(TREE_MAX);
    out
}

/// The processes whose process group is `pgid` (a BE command leads its own).
pub fn in_process_group(root: &Path, pgid: u32) -> Vec<u32> {
    all(root)
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(root.join(format!("proc/{p}/stat")))
                .ok()
                .and_then(|s| {
                    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
                    let rest = &s[s.rfind(')')? + 1..];
                    rest.split_whitespace().nth(2)?.parse::<u32>().ok()
                })
                == Some(pgid)
        })
        .collect()
}

/// When `pid` started (clock ticks after boot, `/proc/<pid>/stat` field 22): with the pid, it
/// names one process, never a later one that reuses the number. `None` when it is gone.
pub fn start_time(root: &Path, pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(root.join(format!("proc/{pid}/stat"))).ok()?;
    // "pid (comm) state ppid ...": fields from the state (3rd) on follow the last ')'
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// When `pid` started on the wall clock: the boot time (`/proc/stat`'s `btime`, whole seconds,
/// so up to a second early) plus its start in clock ticks. `None` when it is gone.
pub fn started_at(root: &Path, pid: u32) -> Option<std::time::SystemTime> {
    let ticks = start_time(root, pid)?;
    let stat = std::fs::read_to_string(root.join("proc/stat")).ok()?;
    let btime: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime"))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf reads a constant of the system; no memory is handed over.
    let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as u64,
        _ => 100,
    };
    let after_boot = std::time::Duration::from_millis(ticks.saturating_mul(1000) / hz);
    std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(btime) + after_boot)
}

/// How long after its pid file was last written the process it names started, when that is
/// more than a second (see [`started_after`]): the file was written for an earlier process
/// with that number. An LC killed leaves its pid file, and once pid numbers wrap the number
/// names whoever got it next (hostile pass 35: a root process started 2 s after the LC died
/// was moved into the LC group). `None` when the times cannot be read.
pub fn started_after_written(root: &Path, read: &PidFileRead) -> Option<std::time::Duration> {
    started_after(root, read.pid, read.written?)
}

/// How much later than a file's mtime a process must have started for the file to be taken as
/// written for an earlier process with its number. The two clocks differ: a process's start is
/// counted from boot (`btime` + its start ticks), an mtime is the wall clock when it was
/// written, and a step of the wall clock after the write (NTP setting a clock that booted
/// behind) moves every process's start by the step: a 5 s step made a real LC's pid file look
/// stale, and its `[lc] pids` refused (hostile pass 36). A number reused within this long of the
/// file's write (the LC dead at once, and pid numbers wrapped meanwhile) is missed.
pub const STARTED_AFTER_SLACK: std::time::Duration = std::time::Duration::from_secs(60);

/// How long after `written` (a file's mtime) process `pid` started, when that is more than
/// [`STARTED_AFTER_SLACK`]: a file that names it was written before it ran, for an earlier
/// process with its number. `None` when it started before, or the times cannot be read.
pub fn started_after(
    root: &Path,
    pid: u32,
    written: std::time::SystemTime,
) -> Option<std::time::Duration> {
    let later = started_at(root, pid)?.duration_since(written).ok()?;
    (later > STARTED_AFTER_SLACK).then_some(later)
}

/// The real and effective uids of `pid` (`/proc/<pid>/status`'s `Uid:` line). `None` when it
/// is gone.
pub fn uids(root: &Path, pid: u32) -> Option<(u32, u32)> {
    status_ids(root, pid, "Uid:")
}

/// The real and effective gids of `pid` (`/proc/<pid>/status`'s `Gid:` line). `None` when it
/// is gone.
pub fn gids(root: &Path, pid: u32) -> Option<(u32, u32)> {
    status_ids(root, pid, "Gid:")
}

fn status_ids(root: &Path, pid: u32, key: &str) -> Option<(u32, u32)> {
    let s = std::fs::read_to_string(root.join(format!("proc/{pid}/status"))).ok()?;
    let line = s.lines().find_map(|l| l.strip_prefix(key))?;
    let mut ids = line.split_whitespace().map(|x| x.parse::<u32>().ok());
    Some((ids.next()??, ids.next()??))
}

/// Whether `pid` has exited and waits to be reaped (state `Z`): its `/proc/<pid>/cgroup`
/// names the root group, which is no move by anyone.
pub fn is_zombie(root: &Path, pid: u32) -> bool {
    std::fs::read_to_string(root.join(format!("proc/{pid}/stat")))
        .ok()
        .and_then(|s| {
            s[s.rfind(')')? + 1..]
                .split_whitespace()
                .next()
                .map(|st| st == "Z")
        })
        .unwrap_or(false)
}

/// The process a number names (`/proc/<n>/status`'s `Tgid:`): `n` itself for a process, its
/// process for a thread id (`/proc/<tid>` exists though /proc does not list it). `None` when
/// it cannot be read. A thread id written to `cgroup.procs` moves its whole process.
pub fn thread_group(root: &Path, n: u32) -> Option<u32> {
    status_value(root, n, "Tgid:")
}

/// The process that forked `pid` (`/proc/<pid>/status`'s `PPid:`). `None` when it is gone.
pub fn parent(root: &Path, pid: u32) -> Option<u32> {
    status_value(root, pid, "PPid:")
}

/// Whether `pid` is a kernel thread (pid 2, `kthreadd`, or one of its children): no service.
pub fn is_kernel_thread(root: &Path, pid: u32) -> bool {
    pid == 2 || status_value(root, pid, "PPid:") == Some(2)
}

fn status_value(root: &Path, pid: u32, key: &str) -> Option<u32> {
    let s = std::fs::read_to_string(root.join(format!("proc/{pid}/status"))).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .parse()
        .ok()
}

/// Whether `pid` is gone: no `/proc/<pid>` (a stat, which needs no file descriptor), or a
/// zombie. A process whose files cannot be read (the agent out of file descriptors, EMFILE) is
/// not gone: its LC origin was dropped, and `restore` then left it in the LC group.
pub fn is_gone(root: &Path, pid: u32) -> bool {
    match std::fs::symlink_metadata(root.join(format!("proc/{pid}"))) {
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        Ok(_) => is_zombie(root, pid),
    }
}

/// The value of `name` in the environment `pid` started with (`/proc/<pid>/environ`: what it
/// was exec'd with, which a child inherits), if set. `None` when the process is gone or keeps
/// its environment from us.
pub fn environ_var(root: &Path, pid: u32, name: &str) -> Option<String> {
    let env = std::fs::read(root.join(format!("proc/{pid}/environ"))).ok()?;
    env.split(|&b| b == 0).find_map(|entry| {
        let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(value).into_owned())
    })
}

/// The processes whose argv is exactly `command`.
pub fn running(root: &Path, command: &[String]) -> Vec<u32> {
    let want = argv_bytes(command);
    all(root)
        .into_iter()
        .filter(|&p| has_argv(root, p, &want))
        .collect()
}

/// Whether `pid`'s argv is exactly `command`.
pub fn running_command(root: &Path, pid: u32, command: &[String]) -> bool {
    has_argv(root, pid, &argv_bytes(command))
}

/// `pid`'s argv as it is now (`None`: gone, a kernel thread, or an argument not UTF-8).
pub fn command_line(root: &Path, pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(root.join(format!("proc/{pid}/cmdline"))).ok()?;
    let args = raw.strip_suffix(b"\0")?;
    args.split(|&b| b == 0)
        .map(|a| String::from_utf8(a.to_vec()).ok())
        .collect()
}

fn argv_bytes(command: &[String]) -> Vec<u8> {
    command
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect()
}

fn has_argv(root: &Path, pid: u32, want: &[u8]) -> bool {
    std::fs::read(root.join(format!("proc/{pid}/cmdline"))).is_ok_and(|c| c == want)
}

/// The processes holding a TCP socket listening on `port` (v4 or v6).
pub fn listening_on(root: &Path, port: u16) -> Vec<u32> {
    listeners(root, port).into_keys().collect()
}

/// The processes holding a TCP socket listening on `port` (v4 or v6), each with the uids
/// that made the listening sockets it holds (`/proc/net/tcp{,6}`'s `uid` column: the
/// socket's owner, who may be another user than the process holding it: a descriptor is
/// passed over a Unix socket, or kept across a change of uid).
pub fn listeners(root: &Path, port: u16) -> BTreeMap<u32, BTreeSet<u32>> {
    // socket inode -> the uid that made it
    let mut sockets: BTreeMap<String, u32> = BTreeMap::new();
    for table in ["proc/net/tcp", "proc/net/tcp6"] {
        let text = std::fs::read_to_string(root.join(table)).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let local_port = f[1]
                .rsplit(':')
                .next()
                .and_then(|h| u16::from_str_radix(h, 16).ok());
            if local_port == Some(port) {
                if let (Ok(ino), Ok(uid)) = (f[9].parse::<u64>(), f[7].parse::<u32>()) {
                    sockets.insert(format!("socket:[{ino}]"), uid);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    if sockets.is_empty() {
        return out;
    }
    for p in all(root) {
        let Ok(d) = std::fs::read_dir(root.join(format!("proc/{p}/fd"))) else {
            continue;
        };
        let uids: BTreeSet<u32> = d
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|l| sockets.get(l.to_string_lossy().as_ref()).copied())
            .collect();
        if !uids.is_empty() {
            out.insert(p, uids);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /proc with pids 10 (pgrp 10, `memcached -p 11211`, listening on 11211 by socket
    /// inode 777) and 11 (pgrp 10, `sleep 5`), and a pid file naming 10.
    fn fake_proc() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for (pid, comm, pgrp, argv) in [
            (
                10,
                "(mem cached)",
                10,
                ["memcached", "-p", "11211"].as_slice(),
            ),
            (11, "(sleep)", 10, ["sleep", "5"].as_slice()),
        ] {
            let d = r.join(format!("proc/{pid}"));
            std::fs::create_dir_all(d.join("fd")).unwrap();
            std::fs::write(d.join("stat"), format!("{pid} {comm} S 1 {pgrp} {pgrp} 0")).unwrap();
            let cmdline: String = argv.iter().map(|a| format!("{a}\0")).collect();
            std::fs::write(d.join("cmdline"), cmdline).unwrap();
            std::fs::write(d.join("cgroup"), format!("0::/lc-{pid}\n")).unwrap();
        }
        std::os::unix::fs::symlink("socket:[777]", r.join("proc/10/fd/3")).unwrap();
        std::os::unix::fs::symlink("/dev/null", r.join("proc/11/fd/0")).unwrap();
        std::fs::create_dir_all(r.join("proc/net")).unwrap();
        std::fs::write(
            r.join("proc/net/tcp"),
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:2BCB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0\n",
        )
        .unwrap();
        std::fs::create_dir_all(r.join("run")).unwrap();
        std::fs::write(r.join("run/mc.pid"), "10\n").unwrap();
        std::fs::write(r.join("run/gone.pid"), "99\n").unwrap();
        root
    }

    #[test]
    fn an_environment_variable_is_read_by_its_exact_name() {
        let root = fake_proc();
        std::fs::write(
            root.path().join("proc/11/environ"),
            "PATH=/bin\0HEADROOM_BE_OWNERX=no\0HEADROOM_BE_OWNER=hp/be\0",
        )
        .unwrap();
        let r = root.path();
        assert_eq!(
            environ_var(r, 11, "HEADROOM_BE_OWNER").as_deref(),
            Some("hp/be")
        );
        assert_eq!(environ_var(r, 11, "HEADROOM_BE"), None);
        assert_eq!(environ_var(r, 10, "PATH"), None, "no environ file");
        assert_eq!(environ_var(r, 99, "PATH"), None, "no process");
    }

    #[test]
    fn processes_are_found_by_pid_file_group_argv_and_port() {
        let root = fake_proc();
        let r = root.path();
        let mut all = all(r);
        all.sort();
        assert_eq!(all, vec![10, 11]);
        assert_eq!(from_pid_file(r, "/run/mc.pid"), Some(10));
        assert_eq!(from_pid_file(r, "/run/gone.pid"), None, "a dead pid");
        assert_eq!(from_pid_file(r, "/run/missing.pid"), None);
        let mut group = in_process_group(r, 10);
        group.sort();
        assert_eq!(group, vec![10, 11]);
        let argv = ["memcached", "-p", "11211"].map(String::from);
        assert_eq!(running(r, &argv), vec![10]);
        assert!(running(r, &argv[..2]).is_empty(), "argv matched exactly");
        assert_eq!(listening_on(r, 11211), vec![10]);
        assert!(listening_on(r, 11212).is_empty());
        // the socket's owner, the uid column (0 here)
        assert_eq!(
            listeners(r, 11211).into_iter().collect::<Vec<_>>(),
            vec![(10, BTreeSet::from([0]))]
        );
        assert_eq!(cgroup_text(r, 11), "0::/lc-11\n");
        assert_eq!(cgroup_text(r, 99), "");
    }

    #[test]
    fn start_time_is_the_stat_files_22nd_field() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("proc/42");
        std::fs::create_dir_all(&d).unwrap();
        // a comm with a space and a parenthesis
        let mut stat = String::from("42 (a) b) S 1 42 42 0 -1 4194560");
        for f in 10..=21 {
            stat.push_str(&format!(" {f}"));
        }
        stat.push_str(" 987654 1000 2000\n");
        std::fs::write(d.join("stat"), stat).unwrap();
        assert_eq!(start_time(root.path(), 42), Some(987_654));
        assert!(!is_zombie(root.path(), 42));
        std::fs::write(d.join("stat"), "42 (a) Z 1 42").unwrap();
        assert!(is_zombie(root.path(), 42));
        assert_eq!(start_time(root.path(), 43), None);
        assert!(start_time(Path::new("/"), std::process::id()).is_some());
    }

    #[test]
    fn descendants_follow_the_children_files_else_the_process_group() {
        let root = fake_proc();
        let r = root.path();
        // No children files: the process group stands in.
        let mut tree = descendants(r, 10);
        tree.sort();
        assert_eq!(tree, vec![10, 11]);
        // 10 forked 11 (thread 10), 11 forked 12 (thread 13).
        let child = |pid: u32, tid: u32, kids: &str| {
            let d = r.join(format!("proc/{pid}/task/{tid}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("children"), kids).unwrap();
        };
        child(10, 10, "11 ");
        child(11, 13, "12");
        child(12, 12, "");
        assert_eq!(descendants(r, 10), vec![10, 11, 12]);
        assert_eq!(descendants(r, 12), vec![12]);
    }

    /// Pass 18's low: adoption read the uids only; the gids are read too.
    #[test]
    fn uids_and_gids_are_the_status_files_lines() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/7")).unwrap();
        std::fs::write(
            dir.path().join("proc/7/status"),
            "Name:\tjob\nUid:\t65534\t65534\t65534\t65534\nGid:\t0\t4\t4\t4\n",
        )
        .unwrap();
        assert_eq!(uids(dir.path(), 7), Some((65534, 65534)));
        assert_eq!(gids(dir.path(), 7), Some((0, 4)));
        assert_eq!(gids(dir.path(), 8), None);
    }

    /// A pid is gone only when /proc has no such directory, or it is a zombie: a stat file that
    /// cannot be read (what EMFILE does to every read) leaves it there.
    #[test]
    fn a_process_whose_files_cannot_be_read_is_not_gone() {
        let root = fake_proc();
        let r = root.path();
        assert!(!is_gone(r, 10));
        assert!(is_gone(r, 12), "no /proc/12");
        std::fs::create_dir_all(r.join("proc/13/stat")).unwrap();
        assert!(start_time(r, 13).is_none(), "its stat cannot be read");
        assert!(!is_gone(r, 13), "unreadable is not gone");
        std::fs::create_dir_all(r.join("proc/14")).unwrap();
        std::fs::write(r.join("proc/14/stat"), "14 (x) Z 1 14 14 0").unwrap();
        assert!(is_gone(r, 14), "a zombie");
    }

    /// A thread id names its process (`Tgid`), a process itself; a kernel thread is told by
    /// its parent, kthreadd (pid 2).
    #[test]
    fn a_thread_id_names_its_process_and_a_kernel_thread_is_told() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for (n, tgid, ppid) in [(20, 20, 1), (21, 20, 1), (30, 30, 2)] {
            std::fs::create_dir_all(r.join(format!("proc/{n}"))).unwrap();
            let status = format!("Name:\tx\nTgid:\t{tgid}\nPid:\t{n}\nPPid:\t{ppid}\n");
            std::fs::write(r.join(format!("proc/{n}/status")), status).unwrap();
        }
        assert_eq!(thread_group(r, 20), Some(20));
        assert_eq!(thread_group(r, 21), Some(20), "a thread of 20");
        assert_eq!(thread_group(r, 22), None, "gone");
        assert!(is_kernel_thread(r, 30) && is_kernel_thread(r, 2));
        assert!(!is_kernel_thread(r, 20));
        // This process, and one of its own threads, on the real /proc.
        let me = std::process::id();
        assert_eq!(thread_group(Path::new("/"), me), Some(me));
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(crate::process::thread_id()).unwrap();
            let _ = stop_rx.recv();
        });
        let live = rx.recv().unwrap() as u32;
        let named = thread_group(Path::new("/"), live);
        stop_tx.send(()).unwrap();
        t.join().unwrap();
        assert_ne!(live, me);
        assert_eq!(named, Some(me), "thread {live} of {me}");
    }

    /// A file written a few seconds before the process it names started is not stale: a step
    /// of the wall clock after the write moves the process's start by the step (hostile pass
    /// 36: a 5 s step, the real LC refused). One written ten minutes before is.
    #[test]
    fn a_file_a_clock_step_older_than_its_process_is_not_stale() {
        let me = std::process::id();
        let root = Path::new("/");
        let start = started_at(root, me).expect("this process's start");
        let step = std::time::Duration::from_secs(5);
        assert_eq!(started_after(root, me, start - step), None);
        let long_ago = std::time::Duration::from_secs(600);
        assert!(started_after(root, me, start - long_ago).is_some());
        assert_eq!(
            started_after(root, me, start + step),
            None,
            "written after it started"
        );
    }
}
