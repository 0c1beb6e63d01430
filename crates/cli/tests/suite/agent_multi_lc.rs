//! Several `[[lc]]` services on the real kernel (root + writable cgroups; skips otherwise): two
//! idle processes stand in for two LC services, each in its own group. The agent creates and
//! fills both groups, `ctl status` lists both, the metrics carry both `lc` labels, and
//! `on_exit = "restore"` moves both back and removes both groups. A second service whose pid
//! is gone fails the start, and the first service's start is undone with it.

use crate::support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use headroom_host::Controller;
use support::{
    assert_be_confined, ctl, forking_be, kill_moments, proc_cgroup, procs_with, read_log,
    root_cgroups, signal, wait_exit, wait_for, write_config, Guard,
};

/// The agents here take turns (each test's groups are its own, but two agents at once would
/// only compete for the 2-core machine's attention).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The cgroups to test on, or why not (printed as a SKIP).
fn setup(test: &str, prefix: &str) -> Option<(Guard, std::sync::MutexGuard<'static, ()>)> {
    let cgroups = root_cgroups(test, &[Controller::Cpu, Controller::Cpuset])?;
    let lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    Some((Guard::fresh(&cgroups, prefix), lock))
}

/// A free loopback port for the metrics endpoint.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn two_lcs(guard: &Guard, a_pid: u32, b_pid: u32, policy: &str, port: u16) -> PathBuf {
    let (top, dir) = (&guard.top, guard.dir.path());
    let text = format!(
        r#"
[[lc]]
name = "alpha"
cgroup = "{top}/a"
pids = [{a_pid}]
priority = 10
[lc.slo]
target_us = 500

[[lc]]
name = "beta"
cgroup = "{top}/b"
pids = [{b_pid}]
[lc.slo]
percentile = 95.0
target_us = 2000

[[be]]
name = "batch"
cgroup = "{top}/be"

[policy]
kind = "{policy}"
"#
    );
    let metrics = format!("127.0.0.1:{port}");
    write_config(
        dir,
        "two.toml",
        &text,
        "restore",
        &dir.join("ctl.sock"),
        &metrics,
    )
}

fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn two_lc_services_run_publish_and_are_restored() {
    let test = "two_lc_services_run_publish_and_are_restored";
    let Some((mut guard, _lock)) = setup(test, "headroom-2lc") else {
        return;
    };
    let (a_pid, b_pid) = (guard.sleeper(), guard.sleeper());
    let (a_before, b_before) = (proc_cgroup(a_pid), proc_cgroup(b_pid));
    let port = free_port();
    let cfg = two_lcs(&guard, a_pid, b_pid, "none", port);
    let dir = guard.dir.path().to_path_buf();
    let agent = guard.start_agent(&cfg, "agent.log");
    let log = || read_log(&dir, "agent.log");

    // Both groups made, each holding its own service.
    let (a, b) = (guard.top.join("a").unwrap(), guard.top.join("b").unwrap());
    let cg = guard.cgroups.clone();
    assert!(cg.procs(&a).unwrap().contains(&(a_pid as i32)), "{}", log());
    assert!(cg.procs(&b).unwrap().contains(&(b_pid as i32)), "{}", log());

    // `ctl status` lists both, in the config's order, with their SLOs and priorities.
    let (ok, json) = ctl(&dir, &["--json", "status"]);
    assert!(ok, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).expect(&json);
    let lcs = v["status"]["lcs"].as_array().expect("status.lcs");
    assert_eq!(lcs.len(), 2, "{json}");
    assert_eq!(lcs[0]["name"], "alpha");
    assert_eq!(lcs[0]["priority"], 10);
    assert_eq!(lcs[0]["group"], format!("{}/a", guard.top));
    assert_eq!(lcs[0]["slo_us"], 500.0);
    assert_eq!(lcs[1]["name"], "beta");
    assert_eq!(lcs[1]["group"], format!("{}/b", guard.top));
    assert_eq!(lcs[1]["slo_us"], 2000.0);
    assert_eq!(lcs[1]["percentile"], 95.0);
    assert_eq!(
        v["status"]["lc"]["name"], "alpha",
        "lc is the first service"
    );
    let (ok, text) = ctl(&dir, &["status"]);
    assert!(ok, "{text}");
    assert!(text.contains("LC services: 2"), "{text}");
    assert!(
        text.contains("LC alpha (priority 10)") && text.contains("LC beta (priority 0)"),
        "{text}"
    );

    // The metrics carry both services by label, the unlabelled series the first's.
    let mut metrics = String::new();
    let labelled = wait_for("both services' metrics", Duration::from_secs(10), || {
        metrics = scrape(port);
        metrics.contains("headroom_lc_service_slo_us{lc=\"alpha\"} 500")
            && metrics.contains("headroom_lc_service_slo_us{lc=\"beta\"} 2000")
    });
    assert!(labelled.is_some(), "{metrics}");
    assert!(
        metrics.contains("\nheadroom_lc_slo_us 500"),
        "the unlabelled series is the first service's:\n{metrics}"
    );

    // Restore: both back where they came from, both groups gone.
    let st = support::sigterm_and_wait(&mut guard.children[agent]);
    assert!(st.success(), "agent exit {st}; log:\n{}", log());
    assert_eq!(proc_cgroup(a_pid), a_before, "alpha back in its own groups");
    assert_eq!(proc_cgroup(b_pid), b_before, "beta back in its own groups");
    assert!(
        !cg.exists(&a) && !cg.exists(&b),
        "both LC groups removed; log:\n{}",
        log()
    );
    assert!(!dir.join("state.json").exists(), "state file removed");
}

#[test]
fn a_second_service_that_fails_undoes_the_first() {
    let test = "a_second_service_that_fails_undoes_the_first";
    let Some((mut guard, _lock)) = setup(test, "headroom-2lcfail") else {
        return;
    };
    let a_pid = guard.sleeper();
    let a_before = proc_cgroup(a_pid);
    // A pid that is gone: a child that has exited and been reaped.
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let cfg = two_lcs(&guard, a_pid, gone_pid, "none", free_port());
    let agent = guard.spawn_agent(&cfg, "fail.log");
    let st = wait_exit(&mut guard.children[agent]);
    let log = guard.log("fail.log");
    assert!(!st.success(), "the start fails; log:\n{log}");
    assert!(
        log.contains(&gone_pid.to_string()),
        "the error names the pid:\n{log}"
    );
    assert_eq!(
        proc_cgroup(a_pid),
        a_before,
        "the first service moved back; log:\n{log}"
    );
    let cg = guard.cgroups.clone();
    for g in ["a", "b", "be"] {
        let g = guard.top.join(g).unwrap();
        assert!(!cg.exists(&g), "{g} removed; log:\n{log}");
    }
    assert!(
        !guard.dir.path().join("state.json").exists(),
        "no state file left; log:\n{log}"
    );
}

/// agent_faults' kill -9 check with two `[[lc]]` services: killed at deterministic "random"
/// moments of start-up and running, the agent never leaves a BE process outside the BE group
/// nor starts a second BE; a final agent's `restore` puts both services back, stops BE and
/// removes every group.
#[test]
fn kill_9_with_two_lc_services_leaves_be_confined() {
    let test = "kill_9_with_two_lc_services_leaves_be_confined";
    let Some((mut guard, _lock)) = setup(test, "headroom-2lckill") else {
        return;
    };
    if guard.cgroups.backend(Controller::Freezer).is_err() {
        eprintln!("SKIP {test}: no freezer controller");
        return;
    }
    let (a_pid, b_pid) = (guard.sleeper(), guard.sleeper());
    let (a_before, b_before) = (proc_cgroup(a_pid), proc_cgroup(b_pid));
    let marker = format!(
        "{}.{:05}",
        8000 + std::process::id() % 1000,
        std::process::id() % 100_000
    );
    let (top, dir) = (guard.top.clone(), guard.dir.path().to_path_buf());
    let text = format!(
        r#"
[[lc]]
name = "alpha"
cgroup = "{top}/a"
pids = [{a_pid}]

[[lc]]
name = "beta"
cgroup = "{top}/b"
pids = [{b_pid}]
{be}"#,
        be = forking_be(&top, &marker)
    );
    let cfg = write_config(
        &dir,
        "kill.toml",
        &text,
        "restore",
        &dir.join("ctl.sock"),
        "",
    );
    let be = top.join("be").unwrap();
    let v2 = guard
        .cgroups
        .backend(Controller::Cpu)
        .is_ok_and(|b| b.is_v2());
    let kill_be = || {
        for pid in procs_with(&marker) {
            // SAFETY: kill(2) on a pid whose command line carries this test's marker.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    };
    for (i, after_ms) in kill_moments(0x2545_f491, 12, 200).into_iter().enumerate() {
        let idx = guard.spawn_agent(&cfg, &format!("crash{i}.log"));
        std::thread::sleep(Duration::from_millis(after_ms));
        signal(&guard.children[idx], nix::sys::signal::Signal::SIGKILL);
        wait_exit(&mut guard.children[idx]);
        assert_be_confined(
            &marker,
            &be,
            v2,
            &format!("after kill -9 at {after_ms} ms (round {i})"),
        );
        let n = procs_with(&marker).len();
        if n > 2 {
            kill_be();
            panic!("round {i}: {n} BE processes: a second BE was started");
        }
    }
    let idx = guard.start_agent(&cfg, "final.log");
    let log = || read_log(&dir, "final.log");
    let running = wait_for("the BE's two processes", Duration::from_secs(10), || {
        procs_with(&marker).len() == 2
    });
    assert!(
        running.is_some(),
        "the BE command and its child run: {:?}; log:\n{}",
        procs_with(&marker),
        log()
    );
    assert_be_confined(&marker, &be, v2, "final agent running");
    let st = support::sigterm_and_wait(&mut guard.children[idx]);
    assert!(st.success(), "agent exit {st}; log:\n{}", log());
    let gone = wait_for("no BE process", Duration::from_secs(5), || {
        procs_with(&marker).is_empty()
    });
    let left = procs_with(&marker);
    kill_be();
    assert!(gone.is_some(), "BE processes outlived restore: {left:?}");
    assert_eq!(proc_cgroup(a_pid), a_before, "alpha back; log:\n{}", log());
    assert_eq!(proc_cgroup(b_pid), b_before, "beta back; log:\n{}", log());
    let cg = guard.cgroups.clone();
    for g in ["a", "b", "be"] {
        let g = top.join(g).unwrap();
        assert!(!cg.exists(&g), "{g} removed; log:\n{}", log());
    }
    assert!(!dir.join("state.json").exists(), "state file removed");
}
