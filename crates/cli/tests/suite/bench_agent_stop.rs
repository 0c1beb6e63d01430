//! `headroom bench agent` stopped from outside (a `timeout`'s SIGTERM, Ctrl-C) removes its
//! groups, its children and its scratch directory, as its own end does; groups and directories
//! a SIGKILLed bench left are removed by the next one.

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use headroom_host::Controller;
use headroom_types::GroupPath;
use support::{root_cgroups, signal, wait_exit, wait_for, BIN};

#[test]
fn a_stopped_bench_agent_removes_its_groups_and_children() {
    let test = "a_stopped_bench_agent_removes_its_groups_and_children";
    let Some(cgroups) = root_cgroups(test, &[Controller::Cpuset, Controller::Freezer]) else {
        return;
    };
    // A group named as a bench whose process is gone (pid far above pid_max's default).
    let stale = GroupPath::new("headroom-bench-agent-999999999").unwrap();
    cgroups.create(&stale.join("be").unwrap()).unwrap();
    // Its scratch directory too (a gone bench's, or one a SIGTERM left before it was removed
    // on a stop: one per run was left).
    let stale_dir = std::env::temp_dir().join("headroom-bench-agent-999999999");
    for sig in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGINT,
    ] {
        std::fs::create_dir_all(&stale_dir).unwrap();
        let mut bench = Command::new(BIN)
            .args(["bench", "agent", "--seconds", "2", "--steps", "5"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let top = GroupPath::new(&format!("headroom-bench-agent-{}", bench.id())).unwrap();
        let scratch = std::env::temp_dir().join(format!("headroom-bench-agent-{}", bench.id()));
        let made = wait_for("the bench's group", Duration::from_secs(120), || {
            cgroups.exists(&top)
        });
        if made.is_none() {
            let _ = bench.kill();
            let _ = cgroups.remove(&top);
            let _ = cgroups.remove(&stale);
            panic!("bench agent made no group {top}");
        }
        // its LC sleeper and first agent are running by now
        std::thread::sleep(Duration::from_millis(1500));
        let children = children_of(bench.id());
        signal(&bench, sig);
        let status = wait_exit(&mut bench);
        let mut err = String::new();
        use std::io::Read;
        let _ = bench.stderr.take().unwrap().read_to_string(&mut err);
        let gone = wait_for("the children to go", Duration::from_secs(5), || {
            children.iter().all(|&p| !alive(p))
        });
        let left = cgroups.exists(&top);
        let _ = cgroups.remove(&top);
        let _ = cgroups.remove(&stale);
        let scratch_left = scratch.exists();
        let _ = std::fs::remove_dir_all(&scratch);
        let stale_dir_left = stale_dir.exists();
        let _ = std::fs::remove_dir_all(&stale_dir);
        assert!(
            !scratch_left,
            "{sig}: {} left behind; stderr: {err}",
            scratch.display()
        );
        assert!(
            !stale_dir_left,
            "{sig}: a gone bench's {} was not removed; stderr: {err}",
            stale_dir.display()
        );
        assert_eq!(status.code(), Some(128 + sig as i32), "{sig}: {err}");
        assert!(!left, "{sig}: {top} left behind; stderr: {err}");
        assert!(
            gone.is_some(),
            "{sig}: children {children:?} outlived the bench"
        );
        assert!(
            !children.is_empty(),
            "the bench had started no child to stop"
        );
        assert!(
            !cgroups.exists(&stale),
            "the stale group of a gone bench was not removed; stderr: {err}"
        );
    }
}

/// Any bench (here `bench loadgen`: memcached and load generators) stopped by a `timeout`'s
/// SIGTERM stops what it started: they ran on as orphans (2026-11-29, `bench advertise`).
#[test]
fn any_bench_stopped_by_sigterm_stops_what_it_started() {
    let test = "any_bench_stopped_by_sigterm_stops_what_it_started";
    if support::find_memcached(test).is_none() {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let mut bench = Command::new(BIN)
        .args(["bench", "loadgen", "--time", "30", "--out"])
        .arg(out.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // memcached first, then a load generator beside it.
    let started = wait_for("the bench's children", Duration::from_secs(60), || {
        children_of(bench.id()).len() >= 2
    });
    let children = children_of(bench.id());
    signal(&bench, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(&mut bench);
    let mut err = String::new();
    use std::io::Read;
    let _ = bench.stderr.take().unwrap().read_to_string(&mut err);
    let gone = wait_for("the children to go", Duration::from_secs(5), || {
        children.iter().all(|&p| !alive(p))
    });
    for &p in &children {
        if alive(p) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    assert!(
        started.is_some(),
        "the bench started fewer than 2 children: {err}"
    );
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(
        gone.is_some(),
        "children {children:?} outlived the bench: {err}"
    );
    assert!(err.contains("stopped by signal 15"), "{err}");
}

/// The pids whose parent is `pid` (from /proc/*/stat).
fn children_of(pid: u32) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // the fields after the command's closing parenthesis: state, ppid, …
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|f| f.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(p);
        }
    }
    out
}

fn alive(pid: i32) -> bool {
    // a zombie is gone for this purpose: it runs nothing and holds no group
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
        .unwrap_or(false)
}
