//! The ninth hostile pass's lows, on the host side (issue 42, docs/safety-hostile-pass-9.md
//! "Found, not fixed"): a refused start leaves nothing behind, a socket in a directory another
//! user can write is refused at start, and `ctl set` refuses a BE memory limit below what BE
//! uses. The starts that take the state lock and the live agent need root (group locks,
//! cgroups) and print SKIP otherwise.

use crate::live;

use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_agent::runtime::{Agent, AgentOptions};
use headroom_control::config::Config;

/// A config whose LC is this test's own process, one BE `command`, static cores, and the
/// given `[safety]` / `[api]` lines.
fn config(lc: u32, group: &str, be_command: &str, safety: &str, api: &str) -> String {
    live::sleeper_lc_config(
        lc,
        group,
        be_command,
        &format!("on_exit = \"restore\"\n{safety}"),
        api,
    )
}

fn options(text: &str, dry_run: bool) -> AgentOptions {
    let mut o = AgentOptions::new(Config::from_toml_str(text).expect("the test's config"));
    o.dry_run = dry_run;
    o.handle_signals = false;
    o.run_for = Some(Duration::from_millis(300));
    o
}

/// What is in `dir` now, sorted (what a start may have left there).
fn listing(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

const LEFT: &str = "a_refused_start_leaves_no_lock_file_nor_directory";

/// A start refused after the state lock was taken left `<state>.lock` and the directories the
/// lock made (ninth pass, 21:23): the state file's content check refused
/// `<d>/nope/../s.txt` (a file of another kind) after the lock had made `nope/`; the decision
/// log failed to open after the lock (and the control socket's directory) were made. Each
/// start now undoes what it made.
#[test]
fn a_refused_start_leaves_no_lock_file_nor_directory() {
    let lc = live::Children::sleepers(1);
    if !live::is_root() {
        return eprintln!("SKIP {LEFT}: needs root (group locks, cgroups)");
    }
    let group = format!("hl9-left-{}", std::process::id());
    let _groups = live::EmptyGroupsRemoved(group.clone());
    let d = tempfile::tempdir().unwrap();
    let r = d.path().display();
    std::fs::write(d.path().join("s.txt"), "not a state file\n").unwrap();
    let before = listing(d.path());
    let sleep = "[\"sleep\", \"5\"]";

    // 1. The state file's content check, after the lock made `nope/` and `s.txt.lock`.
    let text = config(
        lc.pid(0),
        &group,
        sleep,
        &format!("state_file = \"{r}/nope/../s.txt\""),
        &format!("socket = \"{r}/ctl.sock\""),
    );
    match Agent::start(options(&text, false)) {
        Ok(agent) => {
            let _ = agent.run();
            panic!("the start on a state file of another kind was not refused");
        }
        Err(e) => assert!(e.to_string().contains("s.txt"), "{e}"),
    }
    assert_eq!(listing(d.path()), before, "the refused start left files");
    assert_eq!(
        std::fs::read_to_string(d.path().join("s.txt")).unwrap(),
        "not a state file\n"
    );

    // 2. The decision log's directory is missing: it fails to open after the lock made
    //    `st/` and the control socket's directory `sock/` was made.
    let text = config(
        lc.pid(0),
        &group,
        sleep,
        &format!("state_file = \"{r}/st/state.json\""),
        &format!("socket = \"{r}/sock/ctl.sock\"\ndecision_log = \"{r}/gone/agent.log\""),
    );
    match Agent::start(options(&text, false)) {
        Ok(agent) => {
            let _ = agent.run();
            panic!("the start with a decision log that cannot open was not refused");
        }
        Err(e) => assert!(e.to_string().contains("agent.log"), "{e}"),
    }
    assert_eq!(listing(d.path()), before, "the failed start left files");
}

const DIRS: &str = "a_socket_in_a_directory_others_can_write_is_refused_at_start";

/// `api.socket` (and a feed socket) in a directory another user made or can write was
/// accepted: that user could remove the agent's socket, so `ctl` no longer reached the agent
/// (ninth pass, "Found, not fixed"). Refused at start now (exit 2), naming the key, the
/// directory's owner and mode, and the fix; `ctl`'s rule for believing a server decides.
#[test]
fn a_socket_in_a_directory_others_can_write_is_refused_at_start() {
    let lc = live::Children::sleepers(1);
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let open = d.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let mine = d.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (o, m) = (open.display(), mine.display());
    let state = format!("state_file = \"{m}/state.json\"");
    let sleep = "[\"sleep\", \"5\"]";

    let refused = |text: &str, key: &str, dir: &str| {
        let socket_dirs_before = listing(d.path());
        match Agent::start(options(text, true)) {
            Ok(agent) => {
                let _ = agent.run();
                panic!("{key} in {dir} was not refused");
            }
            Err(e) => {
                assert!(e.is_usage(), "a usage error (exit 2): {e}");
                let msg = e.to_string();
                for part in [key, dir, "/run/headroom"] {
                    assert!(msg.contains(part), "{part} not named: {msg}");
                }
                assert_eq!(listing(d.path()), socket_dirs_before, "nothing made");
            }
        }
    };
    // The control socket in a directory everyone can write (sticky, as /tmp).
    let text = config(
        lc.pid(0),
        "hl9-dirs/x",
        sleep,
        &state,
        &format!("socket = \"{o}/ctl.sock\""),
    );
    refused(&text, "api.socket", &format!("{o} is owned by uid"));
    assert!(
        !open.join("ctl.sock").exists(),
        "no socket bound in the open directory"
    );
    // Below a directory not made yet, under that one: the same.
    let text = config(
        lc.pid(0),
        "hl9-dirs/x",
        sleep,
        &state,
        &format!("socket = \"{o}/sub/ctl.sock\""),
    );
    refused(&text, "api.socket", "mode 1777");
    assert!(!open.join("sub").exists(), "no directory made");
    // A feed socket there.
    let text = format!(
        "{}\n[lc.latency]\nsource = \"feed\"\nsocket = \"{o}/feed.sock\"\n",
        config(
            lc.pid(0),
            "hl9-dirs/x",
            sleep,
            &state,
            &format!("socket = \"{m}/ctl.sock\""),
        )
    );
    refused(&text, "lc.latency.socket", "mode 1777");
    // A directory another user owns (not writable by others): that user could still remove
    // the socket.
    if live::is_root() {
        let theirs = d.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let text = config(
            lc.pid(0),
            "hl9-dirs/x",
            sleep,
            &state,
            &format!("socket = \"{}/ctl.sock\"", theirs.display()),
        );
        refused(&text, "api.socket", "uid 65534");
    } else {
        eprintln!("SKIP {DIRS} (another user's directory): needs root to chown");
    }
    // The agent's own private directory (a tempdir of this user's, even under /tmp) starts.
    let text = config(
        lc.pid(0),
        "hl9-dirs/x",
        sleep,
        &state,
        &format!("socket = \"{m}/ctl.sock\""),
    );
    let agent = Agent::start(options(&text, true)).expect("a socket in a private directory");
    agent.run().expect("the dry run");
}

const MEM: &str = "ctl_set_refuses_a_memory_limit_below_what_be_uses";

/// `ctl set safety.be_memory_limit_bytes=4194304` under a BE holding 64 MiB was answered "ok"
/// and the kernel refused the write at every tick (cgroup v1, EBUSY; eighth pass 21:06).
/// Refused by `ctl set` now, naming what BE uses; a limit above that is still taken.
#[test]
fn ctl_set_refuses_a_memory_limit_below_what_be_uses() {
    let lc = live::Children::sleepers(1);
    use headroom_agent::publish::control::{request, Request};
    if !live::is_root() {
        return eprintln!("SKIP {MEM}: needs root (cgroups)");
    }
    let group = format!("hl9-mem-{}", std::process::id());
    let _groups = live::EmptyGroupsRemoved(group.clone());
    let d = tempfile::tempdir().unwrap();
    let r = d.path().display();
    // 64 MiB written (touched pages count; a zeroed bytearray might not).
    let hold = "[\"python3\", \"-c\", \"import time; b = b'x' * (64 << 20); time.sleep(30)\"]";
    let text = config(
        lc.pid(0),
        &group,
        hold,
        // (a limit from the start: the memory controller is managed)
        &format!(
            "state_file = \"{r}/state.json\"\nbe_memory_limit_bytes = {}",
            64u64 << 30
        ),
        &format!("socket = \"{r}/ctl.sock\""),
    );
    let mut o = options(&text, false);
    o.run_for = Some(Duration::from_secs(20));
    let agent = match Agent::start(o) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {MEM}: the agent does not start here: {e}"),
    };
    let runner = std::thread::spawn(move || agent.run());
    let usage = |g: &str| -> u64 {
        ["memory/{}/memory.usage_in_bytes", "{}/memory.current"]
            .iter()
            .filter_map(|f| {
                let p = format!("/sys/fs/cgroup/{}", f.replace("{}", g));
                std::fs::read_to_string(p).ok()?.trim().parse().ok()
            })
            .next()
            .unwrap_or(0)
    };
    let be = format!("{group}/be");
    if !live::eventually(Duration::from_secs(15), || usage(&be) > 32 << 20) {
        let _ = runner.join();
        return eprintln!("SKIP {MEM}: BE did not come to hold 32 MiB (python3 missing?)");
    }
    let socket = d.path().join("ctl.sock");
    let set = |value: &str| {
        request(
            &socket,
            &Request::Set {
                key: "safety.be_memory_limit_bytes".into(),
                value: value.into(),
            },
        )
        .expect("ctl set")
    };
    let low = set("4194304");
    let high = set(&(32u64 << 30).to_string());
    let status = request(&socket, &Request::Off).expect("ctl off");
    let _ = runner.join();
    assert!(!low.ok, "a limit below BE's use accepted: {}", low.message);
    for part in ["safety.be_memory_limit_bytes", "uses now", &be] {
        assert!(
            low.message.contains(part),
            "{part} not named: {}",
            low.message
        );
    }
    assert!(high.ok, "a limit above BE's use refused: {}", high.message);
    assert!(status.ok, "{}", status.message);
}
