//! The lows hostile passes 14 and 15 left ("Found, not fixed"), each fixed: `[lc] user`
//! naming exactly the LC's user, the port rule asking who made the listening socket, a
//! directory at a lock file's name an operator's error (exit 2), one deadline for `ctl`'s
//! whole exchange, and the directories a start made in hierarchies where its groups were
//! missing removed at exit. Root for the cgroup and other-uid parts (skipped otherwise).

use crate::live;
use live::procs_of;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_agent::publish::control::{self, Request};
use headroom_agent::runtime::AgentError;
use headroom_agent::state::{lock_file_name, GroupLock, StateError, StateLock};
use headroom_control::config::Config;
use headroom_types::control::LockHolder;

/// One agent test at a time (each runs its agent in this process).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The uids that made the listening sockets `pid` holds on `port`.
fn socket_owners(pid: u32, port: u16) -> BTreeSet<u32> {
    headroom_host::pids::listeners(Path::new("/"), port)
        .remove(&pid)
        .unwrap_or_default()
}

/// uid 65534's login name here, if the host has one.
fn nobody() -> Option<String> {
    std::fs::read_to_string("/etc/passwd")
        .ok()?
        .lines()
        .find(|l| l.split(':').nth(2) == Some("65534"))
        .and_then(|l| l.split(':').next().map(String::from))
}

const NAMED: &str = "a_named_lc_user_takes_exactly_that_users_process";

/// An LC found only by its port (its group empty since the start) took the first process
/// found there, whoever ran it (passes 14 and 15, "Found, not fixed"), and a shared user
/// (`nobody`) was learned as "the LC's". With `[lc] user` naming the LC's user, root's own
/// process on the port is not taken (the operator named exactly that user), and said in `ctl
/// status`; that user's process there is moved in.
#[test]
fn a_named_lc_user_takes_exactly_that_users_process() {
    let _serial = serial();
    if !live::is_root() {
        return eprintln!("SKIP {NAMED}: needs root (cgroups, another uid)");
    }
    let Some(name) = nobody() else {
        return eprintln!("SKIP {NAMED}: no user of uid 65534 in /etc/passwd");
    };
    let Some((roots, port)) = live::listener(0, 0, 0) else {
        return eprintln!("SKIP {NAMED}: no python3 to stand in for a listening LC");
    };
    let dir = tempfile::tempdir().unwrap();
    let top = format!("l15-named-{}", std::process::id());
    let run_for = Duration::from_secs(10);
    let _clean = live::RemoveOnDrop::new(&top).wait_for_agent(run_for);
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("listen_port = {port}\nuser = \"{name}\""),
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let runner = match live::start_agent(&text, run_for) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {NAMED}: {e}"),
    };
    let lc = format!("{top}/lc");
    let taken = live::eventually(Duration::from_secs(3), || {
        procs_of(&lc).contains(&roots.pid(0))
    });
    let said = live::followed(&dir.path().join("ctl.sock"));
    assert!(
        !taken,
        "root's process on the LC's port {port} was moved into {lc} though lc.user = {name:?}"
    );
    assert!(
        said.iter().any(|r| r.contains("not lc.user")),
        "ctl status says it: {said:?}"
    );
    drop(roots);
    let (theirs, _) = live::listener(65534, 65534, port).expect("uid 65534 on the port");
    assert!(
        live::eventually(Duration::from_secs(4), || procs_of(&lc)
            .contains(&theirs.pid(0))),
        "lc.user {name:?}'s process on {port} was not moved in"
    );
    runner.join().unwrap().expect("the agent ran and restored");
}

const NAMED_SOCKET: &str = "with_a_named_lc_user_the_socket_is_that_users_or_roots";

/// With `[lc] user`, the port rule asks who made the listening socket as well: that user's
/// process holding another user's socket (uid 1000's) is not taken, and said; one holding a
/// socket root made before it became that user (as `memcached -u` does) is.
#[test]
fn with_a_named_lc_user_the_socket_is_that_users_or_roots() {
    let _serial = serial();
    if !live::is_root() {
        return eprintln!("SKIP {NAMED_SOCKET}: needs root (cgroups, other uids)");
    }
    let Some(name) = nobody() else {
        return eprintln!("SKIP {NAMED_SOCKET}: no user of uid 65534 in /etc/passwd");
    };
    let Some((strangers, port)) = live::listener(65534, 1000, 0) else {
        return eprintln!("SKIP {NAMED_SOCKET}: no python3 to stand in for a listening LC");
    };
    assert_eq!(
        socket_owners(strangers.pid(0), port),
        BTreeSet::from([1000])
    );
    let dir = tempfile::tempdir().unwrap();
    let top = format!("l15-nsock-{}", std::process::id());
    let run_for = Duration::from_secs(10);
    let _clean = live::RemoveOnDrop::new(&top).wait_for_agent(run_for);
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("listen_port = {port}\nuser = 65534"),
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let runner = match live::start_agent(&text, run_for) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {NAMED_SOCKET}: {e}"),
    };
    let lc = format!("{top}/lc");
    let taken = live::eventually(Duration::from_secs(3), || {
        procs_of(&lc).contains(&strangers.pid(0))
    });
    let said = live::followed(&dir.path().join("ctl.sock"));
    assert!(
        !taken,
        "{name}'s process holding uid 1000's socket on {port} was moved into {lc}"
    );
    assert!(
        said.iter().any(|r| r.contains("made by uid 1000")),
        "ctl status says it: {said:?}"
    );
    drop(strangers);
    let (daemon, _) = live::listener(65534, 0, port).expect("a daemon that binds as root");
    assert!(
        live::eventually(Duration::from_secs(4), || procs_of(&lc)
            .contains(&daemon.pid(0))),
        "{name}'s process holding a socket root made on {port} was not moved in"
    );
    runner.join().unwrap().expect("the agent ran and restored");
}

/// `lc.user` is checked with the file (its form: every error at once, keyed) and at start (a
/// name this host does not know: exit 2, naming the key), before anything is touched.
#[test]
fn an_lc_user_is_checked_with_the_config_and_at_start() {
    let base = "[lc]\nname = \"lc\"\ncgroup = \"l15u/lc\"\nlisten_port = 11211\nUSER\n[[be]]\nname = \"be\"\ncgroup = \"l15u/be\"\n[policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n";
    let with = |user: &str| base.replace("USER", &format!("user = {user}"));
    for good in ["\"memcache\"", "999", "\"999\"", "0"] {
        Config::from_toml_str(&with(good)).unwrap_or_else(|e| panic!("user = {good}: {e}"));
    }
    for bad in ["\"\"", "\"a b\"", "\"-x\"", "-1", "4294967295"] {
        let msg = match Config::from_toml_str(&with(bad)) {
            Ok(_) => panic!("user = {bad} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            msg.contains("lc.user") && (msg.contains("login name") || msg.contains("uid")),
            "user = {bad}: {msg}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}[safety]\nstate_file = \"{}\"\n[api]\nsocket = \"{}\"\nmetrics = \"\"\n",
        with("\"l15-no-such-user\""),
        dir.path().join("state.json").display(),
        dir.path().join("ctl.sock").display()
    );
    let mut o = live::options(&text, Duration::from_secs(1));
    o.root = PathBuf::from("/");
    match headroom_agent::runtime::Agent::start(o) {
        Ok(_) => panic!("an agent started with lc.user naming no user of this host"),
        Err(e) => {
            let msg = e.to_string();
            assert!(e.is_usage(), "not a usage error (exit 2): {msg}");
            assert!(
                msg.contains("lc.user") && msg.contains("l15-no-such-user"),
                "{msg}"
            );
        }
    }
}

const SOCKET: &str = "a_root_process_holding_another_users_listening_socket_is_not_taken";

/// The port rule asked who runs the process holding the LC's listening socket, not who made
/// the socket (pass 15, "Found, not fixed"): uid 65534's socket held by root's process (a
/// descriptor passed to it) made root's process "the LC". The socket's owner
/// (`/proc/net/tcp`'s uid column) must be the LC's user too; refused and said.
#[test]
fn a_root_process_holding_another_users_listening_socket_is_not_taken() {
    let _serial = serial();
    if !live::is_root() {
        return eprintln!("SKIP {SOCKET}: needs root (cgroups, another uid)");
    }
    let Some((mut first, port)) = live::listener(0, 0, 0) else {
        return eprintln!("SKIP {SOCKET}: no python3 to stand in for a listening LC");
    };
    let dir = tempfile::tempdir().unwrap();
    let top = format!("l15-socket-{}", std::process::id());
    let run_for = Duration::from_secs(10);
    let _clean = live::RemoveOnDrop::new(&top).wait_for_agent(run_for);
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("pids = [{}]\nlisten_port = {port}", first.pid(0)),
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let runner = match live::start_agent(&text, run_for) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {SOCKET}: {e}"),
    };
    let lc = format!("{top}/lc");
    assert!(live::eventually(Duration::from_secs(4), || procs_of(&lc)
        .contains(&first.pid(0))));
    // the agent has seen the LC (root) in its group (it looks once a second)
    std::thread::sleep(Duration::from_millis(1500));
    let _ = first.0[0].kill();
    let _ = first.0[0].wait();
    let (sneaky, _) = live::listener(0, 65534, port).expect("root holding uid 65534's socket");
    assert_eq!(
        socket_owners(sneaky.pid(0), port),
        BTreeSet::from([65534]),
        "the socket's owner"
    );
    let taken = live::eventually(Duration::from_secs(3), || {
        procs_of(&lc).contains(&sneaky.pid(0))
    });
    let said = live::followed(&dir.path().join("ctl.sock"));
    assert!(
        !taken,
        "root's process holding uid 65534's listening socket on {port} was moved into {lc}"
    );
    assert!(
        said.iter().any(|r| r.contains("made by uid 65534")),
        "ctl status says it: {said:?}"
    );
    runner.join().unwrap().expect("the agent ran and restored");
}

/// A directory at a lock file's name (a group lock's or the state lock's) exited 1 and said
/// "opening the group lock state file" (pass 14, "Found, not fixed"): an operator's error,
/// exit 2 (`is_usage`), naming the path and what is there.
#[test]
fn a_directory_at_a_lock_files_name_is_an_operators_error() {
    let d = tempfile::tempdir().unwrap();
    let group = PathBuf::from("/sys/fs/cgroup/cpu/l15-lock/be");
    let at = d.path().join(lock_file_name(&group));
    std::fs::create_dir(&at).unwrap();
    let group_lock = GroupLock::acquire(d.path(), &[group], LockHolder::default()).map(|_| ());
    let state = d.path().join("state.json");
    std::fs::create_dir(d.path().join("state.json.lock")).unwrap();
    let state_lock = StateLock::acquire(&state).map(|_| ());
    for (what, path, got) in [
        ("group lock", at, group_lock),
        ("state lock", d.path().join("state.json.lock"), state_lock),
    ] {
        let e: StateError = got.expect_err(what);
        let msg = e.to_string();
        assert!(
            AgentError::State(e).is_usage(),
            "{what}: a directory at {} is not a usage error (exit 2): {msg}",
            path.display()
        );
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains("directory"),
            "{what}: {msg}"
        );
    }
}

/// `ctl` at a server that trickles its answer a byte a second waited as long as the server
/// liked: its 15 s bound was per read (pass 14, "Found, not fixed"). One deadline covers the
/// request and the whole answer; the error says so. The server trickles for 40 s at most; the
/// client must have given up within 25 s (a hang bound, not a timing claim).
#[test]
fn ctl_gives_up_on_a_trickling_server_at_one_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trickle.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let server = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().expect("accept");
        let mut b = [0u8; 256];
        let _ = c.read(&mut b);
        for _ in 0..40 {
            if c.write_all(b" ").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let _ = tx.send(control::request(&p, &Request::Status).map(|_| ()));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(25))
        .expect("ctl still waiting on a server trickling a byte a second after 25 s");
    let msg = got.expect_err("a trickle is no answer").to_string();
    assert!(
        msg.contains("no answer within 15 s") && msg.contains("one deadline"),
        "{msg}"
    );
    server.join().expect("server thread");
}

const MADE: &str = "directories_the_start_made_are_removed_at_exit";

/// An operator made the LC and BE groups in the `cpu` hierarchy only; the agent made them in
/// the others (blkio, memory, freezer...) and left those, empty, at `restore` (pass 14, "Found,
/// not fixed"). What this start made is removed at exit; the operator's own stay.
#[test]
fn directories_the_start_made_are_removed_at_exit() {
    let _serial = serial();
    if !live::is_root() {
        return eprintln!("SKIP {MADE}: needs root (cgroups)");
    }
    let cpu = Path::new("/sys/fs/cgroup/cpu");
    if !cpu.join("cgroup.procs").exists() {
        return eprintln!("SKIP {MADE}: no v1 cpu hierarchy at {}", cpu.display());
    }
    let top = format!("l15-made-{}", std::process::id());
    let run_for = Duration::from_secs(3);
    let _clean = live::RemoveOnDrop::new(&top).wait_for_agent(run_for);
    for g in ["lc", "be"] {
        std::fs::create_dir_all(cpu.join(&top).join(g)).unwrap();
    }
    let lc_proc = live::Children::sleepers(1);
    let dir = tempfile::tempdir().unwrap();
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("pids = [{}]", lc_proc.pid(0)),
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let runner = match live::start_agent(&text, run_for) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {MADE}: {e}"),
    };
    runner.join().unwrap().expect("the agent ran and restored");
    let operators = std::fs::canonicalize(cpu.join(&top)).unwrap();
    let left: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|e| e.path().join(&top))
        .filter(|p| p.is_dir())
        .filter(|p| std::fs::canonicalize(p).ok().as_ref() != Some(&operators))
        .collect();
    assert!(
        left.is_empty(),
        "the agent left the directories it made: {left:?}"
    );
    assert!(
        cpu.join(&top).join("lc").is_dir() && cpu.join(&top).join("be").is_dir(),
        "the operator's own groups (cpu) were removed"
    );
}
