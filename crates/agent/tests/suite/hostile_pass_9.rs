//! The ninth hostile pass's defects (issue 42, docs/safety-hostile-pass-9.md). Dry runs (no
//! group is made) and a ctl client; the one that serves as `nobody` needs root and prints SKIP
//! otherwise.

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_agent::runtime::{Agent, AgentOptions};
use headroom_control::config::Config;

/// A config whose LC is this test's own process (a dry run moves nothing), one BE `sleep`,
/// static cores, and the given `[safety]` / `[api]` lines.
fn dry_config(lc: u32, group: &str, safety: &str, api: &str) -> String {
    live::sleeper_lc_config(lc, group, "[\"sleep\", \"5\"]", safety, api)
}

/// The start check resolved each path to its deepest existing part and gave up on `..` below
/// a missing directory. The state lock makes that directory, so `<d>/nope/../agent.log` then
/// lands in `<d>`: the decision log's machine description (`agent.log.machine.json`, removed
/// and made anew at start) replaced the config file of that name (ninth pass, live 21:23).
/// Refused at start now, before anything is made, and the config file is intact.
#[test]
fn a_path_through_dot_dot_below_a_missing_directory_is_resolved() {
    let lc = live::Children::sleepers(1);
    let d = tempfile::tempdir().unwrap();
    let r = d.path().display();
    let config_path = d.path().join("agent.log.machine.json");
    let text = dry_config(
        lc.pid(0),
        "hp9-dry/x",
        &format!("state_file = \"{r}/nope/state.json\""),
        &format!("socket = \"{r}/ctl.sock\"\ndecision_log = \"{r}/nope/../agent.log\""),
    );
    std::fs::write(&config_path, &text).unwrap();
    let mut options = AgentOptions::new(Config::from_toml_str(&text).expect("the test's config"));
    options.dry_run = true;
    options.handle_signals = false;
    options.run_for = Some(Duration::from_millis(200));
    options.config_path = Some(config_path.clone());
    match Agent::start(options) {
        Ok(agent) => {
            let _ = agent.run();
            panic!(
                "the start was not refused; the config file now begins {:?}",
                first_bytes(&config_path)
            );
        }
        Err(e) => {
            assert!(e.is_usage(), "a usage error (exit 2): {e}");
            let msg = e.to_string();
            for k in ["--config", "api.decision_log"] {
                assert!(msg.contains(k), "{k} not named: {msg}");
            }
        }
    }
    assert_eq!(std::fs::read_to_string(&config_path).unwrap(), text);
    assert!(!d.path().join("nope").exists(), "nothing made");
}

fn first_bytes(p: &Path) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.chars().take(40).collect())
        .unwrap_or_else(|e| format!("<{e}>"))
}

const SQUAT: &str = "ctl_refuses_a_stranger_in_a_directory_a_stranger_could_make";

/// `api.socket = "/tmp/x/ctl.sock"`: `nobody` made `/tmp/x` before the agent started, the agent
/// bound its socket there anyway, and `nobody` (the directory's owner: no sticky bit to stop
/// them) replaced it with a server of their own. Root's `ctl off` believed it through the
/// directory-owner rule, exit 0, while the agent went on (live 21:30). That rule now counts
/// only a directory no one else could have made; an agent run as `nobody` in its own
/// directory under root's `/run` is still answered.
#[test]
fn ctl_refuses_a_stranger_in_a_directory_a_stranger_could_make() {
    if !live::is_root() {
        return eprintln!("SKIP {SQUAT}: needs root (to serve as nobody)");
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let run = match tempfile::Builder::new().prefix("hp9-").tempdir_in("/run") {
        Ok(d) => d,
        Err(e) => return eprintln!("SKIP {SQUAT}: no directory in /run: {e}"),
    };
    std::fs::set_permissions(
        run.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for (under, stranger) in [(tmp.path(), true), (run.path(), false)] {
        let dir = under.join("hp9sq");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let path = dir.join("ctl.sock");
        let mut child = match live::fake_agent_as(65534, &path) {
            Ok(c) => c,
            Err(e) => return eprintln!("SKIP {SQUAT}: no python3 to serve as nobody: {e}"),
        };
        if !live::eventually(Duration::from_secs(10), || path.exists()) {
            return eprintln!("SKIP {SQUAT}: nobody's server did not bind");
        }
        let answer = headroom_agent::publish::control::request(
            &path,
            &headroom_types::control::Request::Off,
        );
        let _ = child.0[0].kill();
        match (stranger, answer) {
            (true, Ok(r)) => panic!("ctl believed a stranger in {}: {r:?}", dir.display()),
            (true, Err(e)) => assert!(e.to_string().contains("uid 65534"), "{e}"),
            (false, answer) => assert!(answer.is_ok(), "an agent in its own directory: {answer:?}"),
        }
    }
}

/// A stream listener at the socket path whose backlog is full and that never accepts (a stopped
/// agent, or a stranger's server in a directory others can write). Making room for the agent's
/// socket connected to it with a blocking connect, and the start hung there for ever, before
/// anything was made and with no word (live 21:33, on `api.socket` and on a feed socket); `ctl`
/// hung the same way. Both are told at once now: the start refuses ("a live socket is there")
/// and `ctl` gives up after its bound, the wait to connect included.
#[test]
fn a_listener_with_a_full_backlog_is_in_use_not_a_hang() {
    use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType};
    use nix::sys::socket::{connect, UnixAddr};
    use std::os::fd::AsRawFd;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("full.sock");
    let addr = UnixAddr::new(&path).unwrap();
    let server = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )
    .unwrap();
    bind(server.as_raw_fd(), &addr).unwrap();
    listen(&server, Backlog::new(0).unwrap()).unwrap();
    // Fill the backlog (bounded: the kernel takes backlog + 1).
    let mut held = Vec::new();
    for _ in 0..64 {
        let c = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK,
            None,
        )
        .unwrap();
        match connect(c.as_raw_fd(), &addr) {
            Ok(()) => held.push(c),
            Err(_) => break,
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let stale = headroom_agent::socket_file::clear_stale(&p);
        let _ = tx.send(format!("{stale:?}"));
        let ctl = headroom_agent::publish::control::request(
            &p,
            &headroom_types::control::Request::Status,
        );
        let _ = tx.send(format!("{ctl:?}"));
    });
    // Hang detectors only (generous): the old code never returned.
    let stale = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("making room for the socket hung on a full backlog");
    assert!(stale.contains("InUse"), "{stale}");
    assert!(path.exists(), "the listener's socket is kept");
    let ctl = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("ctl hung on a full backlog");
    assert!(ctl.contains("Err"), "{ctl}");
    // The wait for room to connect counts against the one deadline: it once came before it,
    // so `ctl` could take twice its bound (~30 s; seventeenth pass's low). A hang detector,
    // not a timing: the old loop waited its own 15 s whatever the deadline left.
    let start = std::time::Instant::now();
    let err = headroom_agent::publish::control::request_by(
        &path,
        &headroom_types::control::Request::Status,
        start + Duration::from_millis(300),
    )
    .expect_err("nothing accepts");
    assert!(err.to_string().contains("no room to connect"), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "waited {:?} for a 300 ms deadline",
        start.elapsed()
    );
    drop(held);
}
