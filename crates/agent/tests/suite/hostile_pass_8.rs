//! The eighth hostile pass's defects and the seventh's lows it fixed (issue 42,
//! docs/safety-hostile-pass-8-host.md). Live tests need root (cgroups) and print SKIP
//! otherwise; their groups are `hp8a-*`, removed (processes killed first) by a guard, also when
//! a test fails.

use crate::live;

use std::os::unix::fs::symlink;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use headroom_agent::runtime::{Agent, AgentError, AgentOptions};
use headroom_agent::sensors::feed::{self, FeedCells};
use headroom_agent::sensors::lc_signal::SignalCell;
use headroom_agent::state::StateLock;
use headroom_control::config::Config;
use headroom_types::GroupPath;

use live::marked::MarkedGroup as Guard;

/// A config whose LC is this test's own process (pid 1 would be refused elsewhere; a dry run
/// moves nothing), one BE `sleep`, static cores, and the given `[safety]` / `[api]` lines.
fn dry_config(lc: u32, group: &str, safety: &str, api: &str) -> String {
    live::sleeper_lc_config(lc, group, "[\"sleep\", \"5\"]", safety, api)
}

/// The names in `dir`, sorted (what a refused start must not have changed).
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A start on `text` (a dry run: on the code before, the refused pair started and wrote) that
/// must be refused as a usage error naming `keys`.
fn refused_start(text: &str, log: Option<&Path>, keys: &[&str]) {
    let mut options = AgentOptions::new(Config::from_toml_str(text).expect("the test's config"));
    options.dry_run = true;
    options.handle_signals = false;
    options.run_for = Some(Duration::from_millis(200));
    options.decision_log = log.map(Path::to_path_buf);
    match Agent::start(options) {
        Ok(agent) => {
            let _ = agent.run();
            panic!("the start was not refused: {text}");
        }
        Err(e) => {
            assert!(e.is_usage(), "a usage error (exit 2): {e}");
            let msg = e.to_string();
            for k in keys {
                assert!(msg.contains(k), "{k} not named: {msg}");
            }
        }
    }
}

/// Seventh pass's low: `api.decision_log` naming the state file through a directory link
/// (the config's check compares spellings) lost the log and put log lines into the state file
/// between writes. Also a socket on the log, and the `--log` override on the state file's
/// temporary file. Refused at start, before anything is made.
#[test]
fn two_paths_naming_one_file_through_a_link_refuse_the_start() {
    let lc = live::Children::sleepers(1);
    let d = tempfile::tempdir().unwrap();
    let real = d.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = d.path().join("link");
    symlink(&real, &link).unwrap();
    let (r, l) = (real.display(), link.display());
    let group = "hp8a-dry/x";
    let state = format!("state_file = \"{r}/state.json\"");

    // The log on the state file, which does not exist yet.
    let text = dry_config(
        lc.pid(0),
        group,
        &state,
        &format!("socket = \"{r}/ctl.sock\"\ndecision_log = \"{l}/state.json\""),
    );
    refused_start(&text, None, &["api.decision_log", "safety.state_file"]);
    assert_eq!(listing(&real), Vec::<String>::new(), "nothing made");

    // The same with the state file there (an earlier run's): left as it was.
    std::fs::write(real.join("state.json"), b"{}").unwrap();
    refused_start(&text, None, &["api.decision_log", "safety.state_file"]);
    assert_eq!(listing(&real), vec!["state.json".to_string()]);
    assert_eq!(std::fs::read(real.join("state.json")).unwrap(), b"{}");

    // The control socket on the log through the link.
    let text = dry_config(
        lc.pid(0),
        group,
        &state,
        &format!("socket = \"{l}/d.jsonl\"\ndecision_log = \"{r}/d.jsonl\""),
    );
    refused_start(&text, None, &["api.decision_log", "api.socket"]);

    // `--log` on the state file's temporary file, through a link to the file itself.
    let tmp_link = d.path().join("tmp-link");
    symlink(real.join("state.json.tmp"), &tmp_link).unwrap();
    let text = dry_config(
        lc.pid(0),
        group,
        &state,
        &format!("socket = \"{r}/ctl.sock\""),
    );
    refused_start(&text, Some(&tmp_link), &["--log", "safety.state_file"]);
    assert_eq!(listing(&real), vec!["state.json".to_string()]);
}

fn cells() -> FeedCells {
    FeedCells {
        latency: SignalCell::new(),
        qps: SignalCell::new(),
    }
}

/// The feed socket (`lc.latency.socket`) deleted whatever its path named to bind there: a
/// regular file (the config, by a typo) was gone; a live socket (the agent's own control
/// socket, so `ctl off` reached the feed) was replaced; and at the end the feed removed
/// whatever was at its path then. Only a stale socket is replaced now, only its own removed.
#[test]
fn a_feed_socket_path_naming_another_file_never_deletes_it() {
    let d = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let spawn = |p: &Path| feed::spawn(p, 99.0, 1.0, 1, cells(), stop.clone());

    let file = d.path().join("headroom.toml");
    std::fs::write(&file, b"[lc]\n").unwrap();
    let r = spawn(&file);
    assert!(r.is_err(), "a regular file was replaced by the feed socket");
    assert_eq!(std::fs::read(&file).unwrap(), b"[lc]\n");
    // A path the user gave that is not the agent's to replace is a usage error (exit 2, as
    // for `api.socket`), not a failure of the host (exit 1: host-lows' note).
    let refused = AgentError::from(r.err().unwrap());
    assert!(
        matches!(refused, AgentError::Feed(feed::FeedError::Refused { .. })) && refused.is_usage(),
        "{refused:?}"
    );

    let live_path = d.path().join("ctl.sock");
    let live = UnixListener::bind(&live_path).unwrap();
    let r = spawn(&live_path);
    assert!(r.is_err(), "a live socket was replaced by the feed socket");
    assert!(
        UnixStream::connect(&live_path).is_ok(),
        "the live socket still answers"
    );
    drop(live);

    // A stale socket is replaced (the feed's own, left by a kill -9).
    let t = spawn(&live_path).expect("a stale socket is replaced");
    // Someone puts another file at the path while the feed runs: the feed's end leaves it.
    std::fs::remove_file(&live_path).unwrap();
    std::fs::write(&live_path, b"theirs").unwrap();
    stop.store(true, Ordering::SeqCst);
    t.join().unwrap();
    assert_eq!(
        std::fs::read(&live_path).ok().as_deref(),
        Some(&b"theirs"[..]),
        "the feed removed a file it had not made"
    );
}

/// Seventh pass's low: `<state>.lock` was left after a clean exit that removed the state file.
/// It goes now; a taker that opened the old file before it went takes the path's new file.
#[test]
fn the_state_lock_file_goes_and_a_new_taker_locks_the_path_anew() {
    let d = tempfile::tempdir().unwrap();
    let state = d.path().join("state.json");
    let lock_path = d.path().join("state.json.lock");
    let first = StateLock::acquire(&state).unwrap();
    assert!(
        StateLock::acquire(&state).is_err(),
        "held: a second taker is refused"
    );
    // A taker that opened the file before the holder removed it (kept open across the removal).
    let early = std::fs::File::open(&lock_path).unwrap();
    first.remove();
    assert!(!lock_path.exists(), "the lock file was removed");
    let second = StateLock::acquire(&state).unwrap();
    assert!(lock_path.exists(), "a new lock file");
    assert!(
        StateLock::acquire(&state).is_err(),
        "the new file is the one held"
    );
    drop(early);
    drop(second);
}

const LOCK_GONE: &str = "a_clean_restore_exit_leaves_no_state_lock_file";

/// A live `restore` run: after its clean exit neither the state file nor its lock is left.
#[test]
fn a_clean_restore_exit_leaves_no_state_lock_file() {
    let Some(guard) = Guard::setup(LOCK_GONE, "hp8a", 8, "lock", 1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top: &GroupPath = &guard.top;
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("pids = [{}]", lc.pid(0)),
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let agent = match Agent::start(live::options(&text, Duration::from_millis(800))) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {LOCK_GONE}: the agent does not start here: {e}"),
    };
    assert!(
        dir.path().join("state.json.lock").exists(),
        "held while running"
    );
    agent.run().expect("a clean run");
    assert_eq!(listing(dir.path()), Vec::<String>::new(), "nothing left");
}

const SPOOF: &str = "ctl_refuses_a_socket_served_by_another_user";

/// `api.socket` in a directory others can write (`/tmp`): after a cleanup removed the socket,
/// `nobody` bound its path and root's `ctl off` printed the stranger's "off: original settings
/// restored" while the agent went on (live 21:00). `ctl` now refuses a server that is neither
/// root nor its own user, sending nothing.
#[test]
fn ctl_refuses_a_socket_served_by_another_user() {
    if !live::is_root() {
        return eprintln!("SKIP {SPOOF}: needs root (to serve as nobody)");
    }
    // Root's 1777 directory: nobody's server is a stranger. Nobody's own directory: an agent
    // run as nobody, answered.
    for own_dir in [false, true] {
        // An agent's own directory counts only under directories no one else may write (not
        // under /tmp: ninth pass).
        let d = match own_dir {
            true => match tempfile::Builder::new().prefix("hp8a-").tempdir_in("/run") {
                Ok(d) => d,
                Err(e) => return eprintln!("SKIP {SPOOF}: no directory in /run: {e}"),
            },
            false => tempfile::tempdir().unwrap(),
        };
        std::fs::set_permissions(
            d.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o1777),
        )
        .unwrap();
        if own_dir {
            std::os::unix::fs::chown(d.path(), Some(65534), Some(65534)).unwrap();
        }
        let path = d.path().join("ctl.sock");
        let mut child = match live::fake_agent_as(65534, &path) {
            Ok(c) => c,
            Err(e) => return eprintln!("SKIP {SPOOF}: no python3 to serve as nobody: {e}"),
        };
        if !live::eventually(Duration::from_secs(10), || path.exists()) {
            return eprintln!("SKIP {SPOOF}: nobody's server did not bind");
        }
        let answer = headroom_agent::publish::control::request(
            &path,
            &headroom_types::control::Request::Off,
        );
        let _ = child.0[0].kill();
        match (own_dir, answer) {
            (false, Ok(r)) => panic!("ctl believed a stranger's answer: {r:?}"),
            (false, Err(e)) => assert!(e.to_string().contains("uid 65534"), "{e}"),
            (true, answer) => assert!(answer.is_ok(), "an agent in its own directory: {answer:?}"),
        }
    }
}
