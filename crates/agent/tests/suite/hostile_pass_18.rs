//! Eighteenth hostile pass (docs/safety-hostile-pass-18.md).
//!
//! The terminal: a BE or LC command run as a user
//! (`[[be]] user`, `[lc] user`) stayed in the agent's session, with the agent's terminal as its
//! controlling terminal and on its fds 1 and 2. Run as nobody beside an agent started from root's
//! shell, the BE pushed `id > …` into the terminal's input (`TIOCSTI`), and root's shell ran it
//! once the agent ended. Now each command starts in a session of its own, with no controlling
//! terminal (the kernel refuses `TIOCSTI` on a terminal that is not the caller's).
//!
//! The lock files: the state file's lock and the group locks were 0644, so any user could open
//! one and `flock` it (a lock needs only a file open for reading). uid 65534 holding the state
//! lock or a group lock an agent left at a kill -9 kept every later start out (exit 2,
//! "managed by another agent, pid <the dead agent's>"). Now they are 0600, and one found
//! readable by others is made so when taken.
//!
//! The terminal test runs its own binary again as a helper on a new pseudo-terminal (its controlling
//! terminal, on its fd 2), which launches a BE command (`launch_gated`) and an LC command
//! (`launch_in_group`) as nobody and reports their terminal (`tty_nr`), session, and whether
//! their fd 2 is still the pty (nineteenth hostile pass, docs/safety-hostile-pass-19.md: with no
//! controlling terminal, a command holding the pty read what root typed there; now a terminal on
//! a user-run command's fds 1 and 2 is replaced by `/dev/null`).

use crate::live;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use headroom_agent::state::{lock_file_name, GroupLock, StateLock};
use headroom_agent::supervisor::{launch_gated, launch_in_group};
use headroom_host::spawn::RunAs;
use headroom_host::LinuxHost;
use headroom_types::control::LockHolder;
use headroom_types::{GroupPath, UserSpec};

use live::marked::MarkedGroup as Guard;

const TTY: &str = "a_command_run_as_a_user_has_no_controlling_terminal";
/// Set in the helper's environment: the top group, the marker and the file it reports to.
const HELPER: &str = "HEADROOM_HP18_TTY_HELPER";

/// `/proc/<pid>/stat`'s session and `tty_nr` (fields 6 and 7).
fn session_and_tty(pid: u32) -> Option<(i64, i64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut f = s[s.rfind(')')? + 1..].split_whitespace().skip(3);
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

/// A new pseudo-terminal: its master fd and the path of its slave.
fn pty() -> (libc::c_int, String) {
    // SAFETY: plain libc calls on the fd posix_openpt returns, the name into a live buffer.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(master >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(master), 0, "grantpt");
        assert_eq!(libc::unlockpt(master), 0, "unlockpt");
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(
            libc::ptsname_r(master, name.as_mut_ptr(), name.len()),
            0,
            "ptsname_r"
        );
        let name = std::ffi::CStr::from_ptr(name.as_ptr());
        (master, name.to_string_lossy().into_owned())
    }
}

/// The helper (this binary run again): launches both commands as nobody in `<top>/be` and
/// `<top>/lc` and writes `<who> <pid> <session> <tty_nr>` lines, its own first.
fn helper(spec: &str) {
    let mut parts = spec.splitn(3, ' ');
    let (top, marker, out) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let cgroups = LinuxHost::system().cgroups().expect("cgroups");
    let top = GroupPath::new(top).unwrap();
    let (be, lc) = (top.join("be").unwrap(), top.join("lc").unwrap());
    cgroups.create(&be).expect("the BE group");
    cgroups.create(&lc).expect("the LC group");
    let who = RunAs::resolve(&UserSpec::name("nobody").unwrap())
        .unwrap()
        .expect("nobody");
    let command = vec!["sleep".to_string(), marker.to_string()];
    let line = |who: &str, pid: u32| {
        let (sid, tty) = session_and_tty(pid).unwrap_or((-1, -1));
        // 1 where its fd 2 is the helper's pty (pass 19: it could read what was typed there)
        let on_pty = std::fs::read_link(format!("/proc/{pid}/fd/2"))
            .is_ok_and(|p| p.starts_with("/dev/pts"));
        format!("{who} {pid} {sid} {tty} {}\n", u8::from(on_pty))
    };
    let mut report = line("helper", std::process::id());
    let be_pid = launch_gated(&cgroups, "batch", &command, &be, Some(&who)).expect("BE launch");
    report += &line("be", be_pid);
    let mut lc_child =
        launch_in_group(&cgroups, "lc", &command, &lc, Some(&who)).expect("LC launch");
    report += &line("lc", lc_child.id());
    std::fs::write(out, report).unwrap();
    // The BE's `sleep` goes with the test's guard (its marker); the LC's is reaped here.
    let _ = lc_child.kill();
    let _ = lc_child.wait();
}

/// A BE command (launched behind its gate) and an LC command, both as nobody, from a process
/// whose controlling terminal is a pty: each leads a session of its own and has no terminal
/// (`tty_nr` 0). Before, both had the helper's session and its terminal: as nobody, the BE
/// could `TIOCSTI` into root's shell.
#[test]
fn a_command_run_as_a_user_has_no_controlling_terminal() {
    if let Ok(spec) = std::env::var(HELPER) {
        return helper(&spec);
    }
    let Some(guard) = Guard::setup(TTY, "hp18", 8, "tty", 1) else {
        return;
    };
    if live::nobody(TTY).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let (master, slave) = pty();
    let slave = std::ffi::CString::new(slave).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    // By its name alone, not `--exact`: in the suite binary the test is `hostile_pass_18::…`.
    cmd.args([TTY, "--nocapture", "--test-threads=1"])
        .env(
            HELPER,
            format!("{} {} {}", guard.top, guard.marker, out.display()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: between fork and exec only setsid, open, ioctl, dup2 and close, on a path made
    // before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::open(slave.as_ptr(), libc::O_RDWR);
            if fd < 0 || libc::ioctl(fd, libc::TIOCSCTTY, 0) != 0 || libc::dup2(fd, 2) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            Ok(())
        })
    };
    let status = cmd.status().expect("the helper");
    // SAFETY: the master fd made above, closed once.
    unsafe { libc::close(master) };
    let report = std::fs::read_to_string(&out).unwrap_or_default();
    let rows: Vec<Vec<i64>> = report
        .lines()
        .map(|l| l.split(' ').skip(1).map(|x| x.parse().unwrap()).collect())
        .collect();
    assert!(
        status.success() && rows.len() == 3,
        "the helper ran ({status}): {report:?}"
    );
    assert_ne!(rows[0][2], 0, "the helper has a terminal: {report:?}");
    assert_eq!(rows[0][3], 1, "the helper's fd 2 is the pty: {report:?}");
    for (who, row) in ["BE", "LC"].iter().zip(&rows[1..]) {
        assert_eq!(
            (row[1], row[2]),
            (row[0], 0),
            "the {who} command (as nobody) leads its own session, with no terminal: {report:?}"
        );
        // Nineteenth hostile pass: with no controlling terminal, a command still holding the
        // pty on its fd 2 read what root typed there (uid 65534, 13:54:14).
        assert_eq!(
            row[3], 0,
            "the {who} command (as nobody) has not the agent's terminal on its fd 2: {report:?}"
        );
    }
}

const LOCKS: &str = "another_user_cannot_open_the_agents_lock_files";

/// The state lock (found there 0644, as an older agent left it) and a group lock, taken by
/// this process: each is 0600 and uid 65534 cannot open it (so cannot `flock` it). Before,
/// both were 0644 and uid 65534 read them: live, its `flock` on either kept the next start out.
#[test]
fn another_user_cannot_open_the_agents_lock_files() {
    if !live::is_root() {
        return eprintln!("SKIP {LOCKS}: needs root (a file another user cannot open)");
    }
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state_lock = d.path().join("state.json.lock");
    std::fs::write(&state_lock, "1\n").unwrap();
    std::fs::set_permissions(&state_lock, std::fs::Permissions::from_mode(0o644)).unwrap();
    let state = StateLock::acquire(&d.path().join("state.json")).expect("the state lock");
    let locks = d.path().join("run/headroom/locks");
    let group = PathBuf::from("/sys/fs/cgroup/cpu/hp18/be");
    let held = GroupLock::acquire(&locks, std::slice::from_ref(&group), LockHolder::default())
        .expect("the group lock");
    let group_lock = locks.join(lock_file_name(&group));
    let opens_as_65534 = |p: &Path| {
        Command::new("cat")
            .arg(p)
            .uid(65534)
            .gid(65534)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o7777);
    let seen = [&state_lock, &group_lock].map(|p| (mode(p).ok(), opens_as_65534(p)));
    drop(held);
    drop(state);
    assert_eq!(
        seen,
        [(Some(0o600), false), (Some(0o600), false)],
        "(mode, uid 65534 opened it) of the state lock and the group lock"
    );
}
