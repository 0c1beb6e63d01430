//! scripts/many-core-check.sh leaves no cgroup behind (third hostile pass, issue 42: an empty
//! `hr-check` group was left after each run, the agent's groups with `on_exit = "freeze"`).
//! Run with short windows, no validity runs and no demo, under a group name of its own, the
//! real memcached and stress-ng, and this build's `headroom`. Needs root, v1 cpuacct or v2
//! cgroups, memcached and stress-ng; prints SKIP otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_headroom");
const TEST: &str = "many_core_check_removes_its_groups_on_exit";

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Every directory of the group `g` in any hierarchy.
fn group_dirs(g: &str) -> Vec<PathBuf> {
    let mut out = vec![Path::new("/sys/fs/cgroup").join(g)];
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        out.extend(entries.flatten().map(|e| e.path().join(g)));
    }
    out.into_iter().filter(|d| d.is_dir()).collect()
}

/// Removes what a failed run left (processes first), deepest first.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for g in [
            format!("{}/be", self.0),
            format!("{}/lc", self.0),
            self.0.clone(),
            format!("{}-none", self.0),
        ] {
            for d in group_dirs(&g) {
                let _ = std::fs::write(d.join("freezer.state"), "THAWED");
                if let Ok(pids) = std::fs::read_to_string(d.join("cgroup.procs")) {
                    for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                        // SAFETY: kill(2) on a process in this test's own group.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
                for _ in 0..25 {
                    if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn many_core_check_removes_its_groups_on_exit() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIP {TEST}: not root");
    }
    for tool in ["memcached", "stress-ng", "setpriv", "taskset"] {
        if !have(tool) {
            return eprintln!("SKIP {TEST}: no {tool}");
        }
    }
    if !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        && !Path::new("/sys/fs/cgroup/cpuacct").is_dir()
    {
        return eprintln!("SKIP {TEST}: neither v2 nor v1 cpuacct cgroups");
    }
    let group = format!("hr-check-hostile3-{}", std::process::id());
    let _cleanup = Cleanup(group.clone());
    let out = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/many-core-check.sh");
    let mut child = Command::new("bash")
        .arg(&script)
        .arg(out.path())
        .env("HEADROOM", BIN)
        .env("GROUP", &group)
        .env("PORT", free_port().to_string())
        .env("METRICS_PORT", free_port().to_string())
        .env("LOAD_RATES", "")
        .env("LOAD_S", "1")
        .env("WIN_S", "1")
        .env("DEMO", "0")
        .env("ADVERTISE_S", "0")
        .env("PEAK_QPS", "20000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A hang detector: the run takes about half a minute.
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("many-core-check.sh still running after 300 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let started =
        std::fs::read_to_string(out.path().join("ctl-status-start.txt")).unwrap_or_default();
    let log = std::fs::read_to_string(out.path().join("agent.log")).unwrap_or_default();
    assert!(
        started.contains("agent pid"),
        "the agent never answered (exit {status}): {started}; its log:\n{log}"
    );
    let left: Vec<PathBuf> = [
        format!("{group}/be"),
        format!("{group}/lc"),
        group.clone(),
        format!("{group}-none"),
    ]
    .iter()
    .flat_map(|g| group_dirs(g))
    .collect();
    assert!(left.is_empty(), "groups left behind: {left:?}");
}
