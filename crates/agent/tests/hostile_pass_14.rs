//! The fourteenth hostile pass (issue 42): the group lock directory (`/run/headroom/locks`)
//! is another place root writes where another user may have put something. Temp directories
//! only (no cgroups); root for the other user's part (skipped otherwise). Then what the
//! agent takes as the LC when it restarts: another user's process on the LC's port.

#[path = "suite/live/mod.rs"]
mod live;
use live::procs_of;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use headroom_agent::state::{lock_file_name, GroupLock, StateError};
use headroom_types::control::LockHolder;

/// One test at a time: the umask test's `umask 0` is the process's, and would change the
/// modes of what the others make meanwhile.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn group(name: &str) -> PathBuf {
    PathBuf::from("/sys/fs/cgroup/cpu/hp14").join(name)
}

/// A lock directory others can write (the agent made it so itself under `umask 0`, live
/// 06:15): another user's link at a lock file's name, planted again and again, had root open
/// the link's target, truncate it and write the holder into it (live 06:15: a root file of
/// mode 0600 became the holder's JSON). Every acquire must leave the target as it was: the
/// directory is refused.
#[test]
fn a_link_in_a_lock_directory_others_can_write_is_never_followed() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("locks");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, "SECRET\n").unwrap();
    let link = dir.join(lock_file_name(&group("be")));
    let stop = Arc::new(AtomicBool::new(false));
    let planter = {
        let (stop, victim, link) = (stop.clone(), victim.clone(), link.clone());
        std::thread::spawn(move || {
            // Bounded: 30 s at most, whatever happens.
            let end = std::time::Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::SeqCst) && std::time::Instant::now() < end {
                let _ = std::os::unix::fs::symlink(&victim, &link);
            }
        })
    };
    let mut refusals = 0;
    for _ in 0..200 {
        let got = GroupLock::acquire(&dir, &[group("be")], LockHolder::default());
        if got.is_err() {
            refusals += 1;
        }
        drop(got);
        if std::fs::read_to_string(&victim).unwrap() != "SECRET\n" {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    planter.join().unwrap();
    let now = std::fs::read_to_string(&victim).unwrap();
    assert_eq!(
        now, "SECRET\n",
        "a link planted in a lock directory others can write was followed: its target now holds {now:?}"
    );
    assert_eq!(
        refusals, 200,
        "a lock directory of mode 0777 must be refused"
    );
    let refusal = GroupLock::acquire(&dir, &[group("be")], LockHolder::default()).unwrap_err();
    let text = refusal.to_string();
    assert!(
        text.contains(&dir.display().to_string()) && text.contains("0777"),
        "the refusal names the directory and its mode: {text}"
    );
}

/// A FIFO ending in `.lock` anywhere in the lock directory hung every start in open(2)
/// (the stale-file cleaner opened it to lock it; live 06:16, `wait_for_partner`), before
/// anything was confined. Even in a directory only root writes, what is not a regular file is
/// never opened to wait: a lock is taken beside it, and one at a lock's own name is refused.
#[test]
fn a_fifo_in_the_lock_directory_never_hangs_a_lock() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    nix::unistd::mkfifo(&dir.join("zz-other.lock"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    nix::unistd::mkfifo(
        &dir.join(lock_file_name(&group("fifo"))),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let d2 = dir.clone();
    std::thread::spawn(move || {
        let beside = GroupLock::acquire(&d2, &[group("be")], LockHolder::default()).map(|_| ());
        let at = GroupLock::acquire(&d2, &[group("fifo")], LockHolder::default()).map(|_| ());
        let _ = tx.send((beside, at));
    });
    let (beside, at) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("taking a lock blocked on a FIFO in the lock directory");
    assert!(beside.is_ok(), "a lock beside a FIFO: {beside:?}");
    // (refused as what it is since the lows of passes 14-15: an operator's error, exit 2)
    match at {
        Err(StateError::NotALockFile { what, .. }) => assert_eq!(what, "FIFO"),
        other => panic!("a FIFO at the lock's own name must be refused: {other:?}"),
    }
}

/// Under `umask 0` the lock directory (and `/run/headroom` above it) was made 0777 and the
/// lock files 0666 (live 06:15): one such start left a directory every later start trusted.
/// The agent makes them 0755 and 0600 whatever the umask (0644 until pass 18: another user
/// could open a lock file and `flock` it).
#[test]
fn the_lock_directory_and_its_files_are_never_made_writable_by_others() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("run/headroom/locks");
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    let got = GroupLock::acquire(&dir, &[group("be")], LockHolder::default());
    nix::sys::stat::umask(old);
    let lock = got.expect("a lock in a directory the agent makes");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let file = dir.join(lock_file_name(&group("be")));
    assert_eq!(
        (
            mode(&d.path().join("run/headroom")),
            mode(&dir),
            mode(&file)
        ),
        (0o755, 0o755, 0o600),
        "modes of /run/headroom, its locks and a lock file made under umask 0"
    );
    drop(lock);
}

/// A config file another user owns (or any user may write) was read and run: its `[[be]]
/// command` ran as root (live 06:18, a config owned by uid 65534: `id` said uid=0). Refused,
/// naming the owner or mode; root's own file still reads.
#[test]
fn a_config_another_user_could_write_is_refused() {
    let _serial = serial();
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP a_config_another_user_could_write_is_refused: needs root (chown)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let text = "[lc]\nname = \"lc\"\ncgroup = \"hp14/lc\"\n\n[[be]]\nname = \"be\"\ncgroup = \"hp14/be\"\ncommand = [\"id\"]\n\n[policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n";
    let mine = d.path().join("mine.toml");
    std::fs::write(&mine, text).unwrap();
    let read = |p: &std::path::Path| headroom_agent::config_file::read_config(p).map(|_| ());
    assert!(read(&mine).is_ok(), "root's own config: {:?}", read(&mine));
    let theirs = d.path().join("theirs.toml");
    std::fs::write(&theirs, text).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let open = d.path().join("open.toml");
    std::fs::write(&open, text).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o666)).unwrap();
    for (p, want) in [(&theirs, "owned by uid 65534"), (&open, "mode 0666")] {
        match read(p) {
            Err(e) => assert!(e.to_string().contains(want), "{}: {e}", p.display()),
            Ok(()) => panic!(
                "{}: a config another user could write was read",
                p.display()
            ),
        }
    }
}

/// A FIFO named as the config blocked the start for ever in open(2); `/dev/zero` (or a 1 GB
/// file) was read whole: +0.95 GB in 4 s (live 06:17). Both refused at once, within a
/// bound that a reader of the whole file would pass.
#[test]
fn a_fifo_or_a_device_or_a_huge_file_as_the_config_is_refused_at_once() {
    let _serial = serial();
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let big = d.path().join("big.toml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(1 << 30).unwrap();
    drop(f);
    let (tx, rx) = std::sync::mpsc::channel();
    let paths = vec![fifo, PathBuf::from("/dev/zero"), big];
    let p2 = paths.clone();
    std::thread::spawn(move || {
        for p in p2 {
            let got = headroom_agent::config_file::read_config(&p).map(|_| ());
            let _ = tx.send(got.map_err(|e| e.to_string()));
        }
    });
    for p in &paths {
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("reading {} as the config did not return", p.display()));
        match got {
            Err(e) => assert!(
                e.contains("not a regular file") || e.contains("bytes"),
                "{}: {e}",
                p.display()
            ),
            Ok(()) => panic!("{} read as a config", p.display()),
        }
    }
}

const STRANGER: &str = "another_users_process_on_the_lcs_port_is_not_taken_as_the_lc";

/// While the LC (root's, here) restarted, any local user could listen on its `listen_port`
/// and have root move that process into the LC group and make its threads SCHED_FIFO
/// (`[lc.threads] fifo_priority`; live 06:29, uid 65534's python: `SCHED_FIFO 10`, in
/// `p14t/lc`). A process of another user is left where it is, and said; the LC's own user
/// (root) listening there again is still taken.
#[test]
fn another_users_process_on_the_lcs_port_is_not_taken_as_the_lc() {
    let _serial = serial();
    if !live::is_root() {
        return eprintln!("SKIP {STRANGER}: needs root (cgroups, another uid)");
    }
    let Some((mut first, port)) = live::listener(0, 0, 0) else {
        return eprintln!("SKIP {STRANGER}: no python3 to stand in for a listening LC");
    };
    let dir = tempfile::tempdir().unwrap();
    let top = format!("hp14-stranger-{}", std::process::id());
    let run_for = Duration::from_secs(12);
    let _clean = live::RemoveOnDrop::new(&top).wait_for_agent(run_for);
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!(
            "pids = [{}]\nlisten_port = {port}\n\n[lc.threads]\nfifo_priority = 10",
            first.pid(0)
        ),
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let runner = match live::start_agent(&text, run_for) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {STRANGER}: {e}"),
    };
    let lc = format!("{top}/lc");
    assert!(live::eventually(Duration::from_secs(4), || procs_of(&lc)
        .contains(&first.pid(0))));
    // the agent has seen the LC in its group (it looks once a second)
    std::thread::sleep(Duration::from_millis(1500));
    let _ = first.0[0].kill();
    let _ = first.0[0].wait();
    let (stranger, _) = live::listener(65534, 65534, port).expect("uid 65534 on the port");
    let taken = live::eventually(Duration::from_secs(3), || {
        procs_of(&lc).contains(&stranger.pid(0))
    });
    let said = live::followed(&dir.path().join("ctl.sock"));
    assert!(
        !taken,
        "uid 65534's process on the LC's port {port} was moved into the LC group {lc}"
    );
    assert!(
        said.iter().any(|r| r.contains("runs as uid 65534")),
        "ctl status says it: {said:?}"
    );
    drop(stranger);
    // the LC's own user there again: taken, as before
    let (again, _) = live::listener(0, 0, port).expect("root on the port again");
    assert!(
        live::eventually(Duration::from_secs(4), || procs_of(&lc)
            .contains(&again.pid(0))),
        "the LC (root) listening on {port} again was not moved in"
    );
    runner.join().unwrap().expect("the agent ran and restored");
}
