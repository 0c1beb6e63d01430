//! The tenth hostile pass's lows and the earlier passes' lows still standing, on the host side
//! (issue 42, docs/safety-hostile-pass-10-host.md "Found, not fixed"): another user's socket
//! is never removed, a state file in a directory others can write is refused at start.
//! Each test fails on the code before (recorded in the pass doc).

use crate::live;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Runs `f` in a thread of its own with the effective uid `uid` when this test runs as root
/// (the raw `setresuid` is per thread: the rest of the test keeps root), as itself otherwise.
/// The thread ends with `f`, so nothing has to be given back.
fn as_user<T: Send + 'static>(uid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        if live::is_root() {
            // SAFETY: a raw syscall changing this thread's ids only; no memory is passed.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_setresuid,
                    -1 as libc::c_long,
                    uid as libc::c_long,
                    -1 as libc::c_long,
                )
            };
            assert_eq!(r, 0, "setresuid: {}", std::io::Error::last_os_error());
        }
        f()
    })
    .join()
    .expect("the thread of the other user")
}

/// A live socket this user may not connect to (mode 0: for a non-root test its owner is
/// refused too; as root the check runs as uid 65534), in a directory anyone may write: the
/// agent removed it, taking it for stale (any connect error but "would block" and "wrong
/// type" counted as stale).
#[test]
fn a_socket_this_user_may_not_connect_to_is_never_removed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join("theirs.sock");
    let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
    let p = path.clone();
    let verdict = as_user(65534, move || {
        headroom_agent::socket_file::clear_stale(&p).map_err(|r| r.to_string())
    });
    assert!(
        path.exists(),
        "another user's live socket was removed ({verdict:?})"
    );
    let why = verdict.expect_err("a socket this user may not connect to was taken for stale");
    assert!(why.contains("may not connect"), "{why}");
    assert!(why.contains("mode 0000"), "{why}");
    drop(live);
}

/// The same through the start: `api.socket` naming such a socket is refused with exit 2,
/// naming the path, its owner and the fix (only where the test runs as a non-root user: root
/// may connect to any socket).
#[test]
fn a_start_on_a_socket_this_user_may_not_connect_to_is_a_usage_error() {
    if live::is_root() {
        eprintln!(
            "SKIP a_start_on_a_socket_this_user_may_not_connect_to_is_a_usage_error: root \
             connects to any socket (the unit above runs the check as uid 65534)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ctl.sock");
    let _live = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
    let Err(err) = headroom_agent::publish::control::serve(&path, Default::default()) else {
        panic!("served on a socket this user may not connect to");
    };
    let text = err.to_string();
    assert!(text.contains("may not connect"), "{text}");
    assert!(text.contains("a path of its own"), "{text}");
    assert!(Path::new(&path).exists());
}

const GONE: &str = "a_be_knob_file_that_is_gone_is_said_gone_in_status";

/// A BE knob file taken away under the agent (on v2 a controller disabled above BE; here, on
/// whatever hierarchy holds BE's `cpuset.cpus`, the group's directory removed there) is shown
/// in `ctl status` as gone, not as the last value read: the status said `cpus 0` until the
/// agent's next look (within a second; for as long as it could not make the file again). The
/// agent makes the group again within about a second, so each round removes it anew; the old
/// code never says "gone" in any round.
#[test]
fn a_be_knob_file_that_is_gone_is_said_gone_in_status() {
    use headroom_agent::publish::control::{request, Request};
    if !live::is_root() {
        return eprintln!("SKIP {GONE}: needs root (cgroups)");
    }
    let top = format!("host-lows-gone-{}", std::process::id());
    let run_for = std::time::Duration::from_secs(20);
    let _groups = live::RemoveOnDrop::new(&top).wait_for_agent(run_for);
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let sock = dir.path().join("ctl.sock");
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{}\"\n\n\
         [api]\nsocket = \"{}\"\nmetrics = \"\"\n",
        lc.pid(0),
        dir.path().join("state.json").display(),
        sock.display()
    );
    let runner = match live::start_agent(&text, run_for) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {GONE}: {e}"),
    };
    let held = || -> Vec<(String, String)> {
        request(&sock, &Request::Status)
            .ok()
            .and_then(|r| r.status)
            .map(|s| s.actuators.be_held.into_iter().collect())
            .unwrap_or_default()
    };
    // The file BE's cpuset is read from, once the agent holds it.
    let mut file = None;
    live::eventually(std::time::Duration::from_secs(10), || {
        file = held()
            .into_iter()
            .find(|(f, _)| f.ends_with("cpuset.cpus"))
            .map(|(f, _)| std::path::PathBuf::from(f));
        file.is_some()
    });
    let Some(file) = file else {
        return eprintln!("SKIP {GONE}: the agent holds no BE cpuset.cpus here");
    };
    let group_dir = file.parent().unwrap().to_path_buf();
    let mut seen = Vec::new();
    let mut said_gone = false;
    for _ in 0..20 {
        // (made again by the agent; a hang bound only)
        live::eventually(std::time::Duration::from_secs(10), || group_dir.is_dir());
        if std::fs::remove_dir(&group_dir).is_err() {
            continue;
        }
        let shown = held()
            .into_iter()
            .find(|(f, _)| Path::new(f) == file)
            .map(|(_, v)| v);
        if shown.as_deref().is_some_and(|v| v.starts_with("gone")) {
            said_gone = true;
            break;
        }
        seen.push(shown);
    }
    let _ = runner.join();
    assert!(
        said_gone,
        "a removed {} was never said gone; status showed {seen:?}",
        file.display()
    );
}

/// A state file whose directory, or a directory above it, another user can write (not
/// sticky) is refused at start, naming that directory, its owner and mode, and the fix: the
/// owner check and the open look at the path twice, and that user could swap the file or a
/// directory above between them (tenth hostile pass, low). A directory only root or this
/// user can write is accepted, under a sticky `/tmp` too.
#[test]
fn a_state_file_in_a_directory_others_can_write_is_refused_at_start() {
    use headroom_agent::state::check_path;
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let below = open.join("own");
    std::fs::create_dir(&below).unwrap();
    std::fs::set_permissions(&below, std::fs::Permissions::from_mode(0o755)).unwrap();
    for state in [
        open.join("state.json"),
        below.join("state.json"),
        // not made yet: the deepest directory that exists is looked at
        below.join("later/state.json"),
    ] {
        match check_path(&state) {
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains(&format!("{}", open.display())), "{text}");
                assert!(text.contains("mode 0777"), "{text}");
                assert!(text.contains("only root or uid"), "{text}");
            }
            other => panic!(
                "a state file under {} (0777) was accepted: {other:?}",
                open.display()
            ),
        }
    }
    // A directory of its own, in /tmp (sticky), is fine.
    check_path(&dir.path().join("state.json")).unwrap();
}
