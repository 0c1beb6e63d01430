//! The lows hostile passes 16 and 17 left ("Found, not fixed") that the agent crate holds: a
//! restart that gave a frozen BE its original, wide, cpuset for a moment (pass 14's low, left
//! by passes 15-17). Real kernel, root; prints SKIP otherwise. Groups are `l17-*`, removed
//! (processes killed first) by a guard, also when a test fails.

use crate::live;

use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_agent::runtime::Agent;
use headroom_host::FreezeState;
use headroom_types::{CpuSet, GroupPath};

use live::marked::{sleeps_with_marker, MarkedGroup as Guard};

/// One agent test at a time (each runs its agent in this process).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A config on `top/{lc,be}`: the LC `lc_pid`, the BE `command`, static-cores (BE on CPU 0, the
/// LC on the rest), `freeze` on exit, state and socket in `dir`.
fn config(top: &GroupPath, dir: &Path, lc_pid: u32, command: &str) -> String {
    let d = dir.display();
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{lc_pid}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = {command}\nrestart = false\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"freeze\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n"
    )
}

/// The CPUs `group`'s `cpuset.cpus` names (the v1 cpuset hierarchy's or the v2 group's).
fn cpuset_of(guard: &Guard, group: &GroupPath) -> Option<CpuSet> {
    guard
        .cgroups
        .group_dirs(group)
        .into_iter()
        .map(|(_, d)| d.join("cpuset.cpus"))
        .find_map(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| CpuSet::parse_list(t.trim()).ok())
}

const NARROW: &str = "a_restart_never_widens_a_frozen_bes_cpuset";

/// An agent exits with `freeze`: BE frozen on CPU 0 (static cores: BE's CPU), not every CPU. It was
/// killed, say, before its first allocation was recorded: the state file has none. The next
/// agent's start-up allocation is "disabled" with BE's cpuset the original, so the restart
/// wrote the original (every CPU) on the frozen BE until its first tick narrowed it again
/// (hostile pass 14's low; a v2 freeze completes asynchronously, so a BE task slow to freeze
/// ran wide meanwhile). The start must leave BE no wider than it found it.
#[test]
fn a_restart_never_widens_a_frozen_bes_cpuset() {
    let _serial = serial();
    let Some(guard) = Guard::setup(NARROW, "l17", 7, "narrow", 1) else {
        return;
    };
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    if ncpu < 2 {
        return eprintln!("SKIP {NARROW}: one CPU (BE and the LC need one each)");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let command = format!("[\"sleep\", \"{}\"]", guard.marker);
    let text = config(&guard.top, dir.path(), lc.pid(0), &command);
    let first = match Agent::start(live::options(&text, Duration::from_millis(800))) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {NARROW}: the agent does not start here: {e}"),
    };
    first.run().expect("the first agent froze BE and exited");
    let be = guard.top.join("be").unwrap();
    assert_eq!(
        guard.cgroups.freeze_state(&be).unwrap(),
        FreezeState::Frozen
    );
    assert!(
        !sleeps_with_marker(&guard.marker).is_empty(),
        "the first agent's BE, frozen"
    );
    let before = cpuset_of(&guard, &be).expect("BE's cpuset after the first agent");
    assert!(
        before.len() < ncpu,
        "the first agent narrowed BE: {before:?}"
    );

    // As a start killed before it recorded an allocation leaves it.
    let state_path: PathBuf = dir.path().join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    state["last_allocation"] = serde_json::Value::Null;
    std::fs::write(&state_path, state.to_string()).unwrap();

    let second =
        Agent::start(live::options(&text, Duration::from_millis(800))).expect("the restart starts");
    let after = cpuset_of(&guard, &be).expect("BE's cpuset after the restart's start");
    let frozen = guard.cgroups.freeze_state(&be).unwrap();
    second.run().expect("the second agent ran and froze BE");
    assert_eq!(frozen, FreezeState::Frozen, "BE stays frozen at the start");
    assert!(
        after.is_subset(&before),
        "the restart widened the frozen BE's cpuset from {} to {} (its original) before its first tick",
        before.to_list(),
        after.to_list()
    );
    drop(lc);
}

const MEMORY: &str =
    "a_config_memory_limit_below_bes_use_is_refused_at_start_as_ctl_set_refuses_it";

/// `ctl set safety.be_memory_limit_bytes` below what BE uses now is refused, naming the use;
/// the same value in the config file was accepted at start (sixteenth hostile pass: on v1 the
/// write then failed EBUSY at every tick, BE frozen for the agent's life; v2 kills BE). BE
/// already in its group (here a process of 24 MiB the operator put there; an earlier agent's
/// BE is the same) with a 4 MiB limit in the config: the start is refused (a usage error, exit
/// 2), naming the key, the group and the use, before anything is made.
#[test]
fn a_config_memory_limit_below_bes_use_is_refused_at_start_as_ctl_set_refuses_it() {
    let _serial = serial();
    let Some(guard) = Guard::setup(MEMORY, "l17", 7, "mem", 2) else {
        return;
    };
    let be = guard.top.join("be").unwrap();
    if guard.cgroups.create(&be).is_err() || guard.cgroups.memory_usage(&be).is_err() {
        return eprintln!("SKIP {MEMORY}: no memory controller to read BE's use from");
    }
    // 24 MiB touched, in the BE group before the agent starts.
    let script = format!(
        "b=bytearray(24<<20)\nfor i in range(0,len(b),4096): b[i]=1\nprint('ready',flush=True)\nimport time\ntime.sleep(60) # {}\n",
        guard.marker
    );
    let mut child = match std::process::Command::new("python3")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return eprintln!("SKIP {MEMORY}: no python3 to use memory: {e}"),
    };
    guard
        .cgroups
        .move_process(&be, child.id() as i32)
        .expect("moving the worker into BE's group");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let worker = live::Children(vec![child]);
    let used = guard.cgroups.memory_usage(&be).unwrap();
    assert!(used > 8 << 20, "the worker's use is charged to BE: {used}");

    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let command = format!("[\"sleep\", \"{}\"]", guard.marker);
    let text = config(&guard.top, dir.path(), lc.pid(0), &command)
        .replace("[safety]\n", "[safety]\nbe_memory_limit_bytes = 4194304\n")
        .replace("on_exit = \"freeze\"", "on_exit = \"restore\"");
    let err = match Agent::start(live::options(&text, Duration::from_millis(500))) {
        Ok(a) => {
            let _ = a.run();
            panic!(
                "the config's be_memory_limit_bytes = 4194304 was accepted at start with BE using {used} bytes in {be} (ctl set refuses it)"
            );
        }
        Err(e) => e,
    };
    let said = err.to_string();
    assert!(err.is_usage(), "an operator's error (exit 2): {said}");
    for part in ["safety.be_memory_limit_bytes", "uses now", be.as_str()] {
        assert!(said.contains(part), "names {part:?}: {said}");
    }
    assert!(
        !dir.path().join("state.json").exists(),
        "refused before anything is made"
    );
    drop(worker);
}

/// When `ctl`'s one deadline passed, it said "… the request did not arrive whole in time": the
/// server side's words (seventeenth hostile pass), wrong for a client whose answer did not
/// arrive. It says what did not happen by the deadline, the socket and the deadline now.
#[test]
fn ctls_timeout_says_what_timed_out_the_socket_and_the_deadline() {
    use headroom_agent::publish::control::{request, Request};
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // reads the request and never answers (a stopped or hung agent), for at most 40 s
    let server = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().expect("accept");
        let mut b = [0u8; 256];
        let _ = c.read(&mut b);
        c.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
        let _ = c.read(&mut b);
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let p = sock.clone();
    std::thread::spawn(move || {
        let _ = tx.send(request(&p, &Request::Status).map(|_| ()));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("ctl still waiting on a silent server after 30 s");
    let msg = got.expect_err("silence is no answer").to_string();
    assert!(
        !msg.contains("the request did not arrive whole"),
        "the server side's words: {msg}"
    );
    for part in [
        "no answer within 15 s",
        "the answer had not arrived whole",
        &*sock.to_string_lossy(),
        "stopped",
    ] {
        assert!(msg.contains(part), "names {part:?}: {msg}");
    }
    drop(server);
}

/// `/proc/<pid>/status`'s `Gid:` line: real, effective, saved, fs.
fn gids_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Gid:"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A group of `/etc/group` that is neither root's nor nobody's (its name and gid).
fn some_group() -> Option<(String, u32)> {
    std::fs::read_to_string("/etc/group")
        .ok()?
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((f.first()?.to_string(), f.get(2)?.parse::<u32>().ok()?))
        })
        .find(|(n, g)| *g != 0 && *g != 65534 && !n.is_empty())
}

const GROUP: &str = "a_be_group_names_the_group_the_be_command_runs_as";

/// `[[be]] group` (a name or a gid) is the group the BE command runs as; without it, the
/// user's primary group (nobody's, 65534). Before, a BE command ran with its user's primary
/// group only and the key was refused ("unknown field `group`").
#[test]
fn a_be_group_names_the_group_the_be_command_runs_as() {
    let _serial = serial();
    let Some(guard) = Guard::setup(GROUP, "l17", 7, "group", 3) else {
        return;
    };
    let Some((name, gid)) = some_group() else {
        return eprintln!("SKIP {GROUP}: no group other than root's and nobody's here");
    };
    let nobody =
        headroom_host::spawn::RunAs::resolve(&headroom_types::UserSpec::uid(65534).unwrap())
            .ok()
            .flatten();
    let Some(nobody) = nobody else {
        return eprintln!("SKIP {GROUP}: uid 65534 cannot be looked up here");
    };
    let dir = tempfile::tempdir().unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let lc = live::Children::sleepers(1);
    let command = format!("[\"sleep\", \"{}\"]", guard.marker);
    for (group, want) in [
        (format!("group = \"{name}\"\n"), gid),
        (format!("group = {gid}\n"), gid),
        (String::new(), nobody.gid()),
    ] {
        let text = config(&guard.top, dir.path(), lc.pid(0), &command)
            .replace(
                "restart = false\n",
                &format!("restart = false\nuser = 65534\n{group}"),
            )
            .replace("on_exit = \"freeze\"", "on_exit = \"restore\"");
        let runner = live::start_agent(&text, Duration::from_millis(1500))
            .unwrap_or_else(|e| panic!("[[be]] {group:?}: {e}"));
        let mut pid = None;
        live::eventually(Duration::from_secs(3), || {
            pid = sleeps_with_marker(&guard.marker).first().copied();
            pid.is_some()
        });
        let gids = pid.map(gids_of).unwrap_or_default();
        runner.join().unwrap().expect("the agent ran and restored");
        // the next round finds its own BE only
        for p in live::marked::with_marker(&guard.marker) {
            let _ = headroom_host::process::send_signal(
                p as i32,
                headroom_host::process::Signal::SIGKILL,
            );
        }
        live::eventually(Duration::from_secs(3), || {
            sleeps_with_marker(&guard.marker).is_empty()
        });
        let _ = std::fs::remove_file(dir.path().join("state.json"));
        assert!(pid.is_some(), "[[be]] {group:?}: the BE command ran");
        assert!(
            !gids.is_empty() && gids.iter().all(|&g| g == want),
            "[[be]] user = 65534, {group:?}: the BE command runs with gids {gids:?}, not {want}"
        );
    }
}
