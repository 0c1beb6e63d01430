//! The agent with `[kubernetes] advertise = true` (the binary: its edge is headroom-kube's
//! publisher on its own thread) against the stand-in API server on 127.0.0.1 (no real API
//! server can be installed here). A `sleep` stands in for the LC, its latency pushed on the
//! agent's feed socket by the test; a pod bound to the node requests 500 of
//! `headroom.io/be-cpu` and 256 MiB of `headroom.io/be-memory`. Checked: the values land in the
//! Node's capacity and allocatable by `PATCH nodes/node-a/status` (both in every patch), never
//! below the bound pod's 500 and 256 MiB; the first two patches are
//! refused (403), said once in the log and retried; a violation brings it down at once, and the
//! rise after it waits the damping period (every rise in the decision log ≥ damping after the
//! change before it); `ctl status` shows the value, floor, horizon and last change; with the
//! API gone the node keeps the last value and the agent goes on; SIGTERM leaves the value; the
//! decision log with its `advertise` lines replays exactly. Root and writable v1 cpu/cpuset
//! cgroups needed (SKIP otherwise).
#![cfg(feature = "kube")]

use headroom_kube::stand_in;

use crate::support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_host::{Controller, LinuxHost};
use headroom_load::stats::LatencyHist;
use serde_json::{json, Value};
use stand_in::{pod, with_be_cpu, with_be_memory, StandIn};
use support::status_json as status;

use support::BIN;
const TEST: &str = "the_wired_agent_advertises_through_the_api_and_keeps_its_value_when_it_goes";
const NODE: &str = "node-a";
const BE_CPU: &str = "headroom.io/be-cpu";
const BE_MEMORY: &str = "headroom.io/be-memory";
/// The bound pod's be-memory, bytes.
const POD_MEMORY: u64 = 256 << 20;
const DAMPING_MS: u64 = 3000;

/// Children killed on drop (a failed test leaves no agent or sleeper behind).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Pushes one feed line every 200 ms (300 samples at `latency_us`, stamped now) to the agent's
/// feed socket until stopped; bounded to 3 minutes.
fn feeder(sock: PathBuf, latency_us: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let end = Instant::now() + Duration::from_secs(180);
    let mut conn = None;
    while !stop.load(Ordering::SeqCst) && Instant::now() < end {
        if conn.is_none() {
            conn = std::os::unix::net::UnixStream::connect(&sock).ok();
        }
        if let Some(s) = conn.as_mut() {
            let mut hist = LatencyHist::new();
            let us = latency_us.load(Ordering::SeqCst);
            for i in 0..300u64 {
                hist.record_ns(us * 1000 + i * 100);
            }
            let t_unix_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            let line = json!({"version": 1, "t_unix_ms": t_unix_ms, "interval_s": 0.2,
                              "qps": 100.0, "hist": hist.to_base64()});
            if writeln!(s, "{line}").is_err() {
                conn = None;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn wait_for(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    support::within(timeout, Duration::from_millis(100), f)
}

/// The advertised value and its reason in a `ctl status`.
fn advertised(st: &Value) -> Option<(u64, String)> {
    let ad = &st["advertise"]["advertisement"];
    Some((
        ad["value_millicpu"].as_u64()?,
        ad["reason"].as_str()?.to_string(),
    ))
}

fn write_config(d: &Path, top: &str, kubeconfig: &Path, lc_pid: u32) -> PathBuf {
    let cfg = d.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[lc]
name = "shop"
cgroup = "{top}/lc"
pids = [{lc_pid}]
[lc.slo]
target_us = 500.0
window_s = 1.0
min_samples = 100
[lc.latency]
source = "feed"
socket = "{d}/feed.sock"
[lc.load]
source = "feed"
peak_qps = 1000.0

[[be]]
name = "batch"
cgroup = "{top}/be"

[policy]
kind = "static-cores"
[policy.static-cores]
cores = 1

[kubernetes]
advertise = true
node_name = "{NODE}"
kubeconfig = "{kc}"
advertise_horizon_s = 60.0
advertise_percentile = 50.0
advertise_margin_millicpu = 0
advertise_min_history_s = 1.0
advertise_damping_s = {damping}

[safety]
violation_cooldown_s = 1.0
on_exit = "restore"
state_file = "{d}/state.json"

[api]
socket = "{d}/ctl.sock"
metrics = ""
"#,
            kc = kubeconfig.display(),
            d = d.display(),
            damping = DAMPING_MS as f64 / 1000.0,
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn the_wired_agent_advertises_through_the_api_and_keeps_its_value_when_it_goes() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIP {TEST}: not root");
    }
    match LinuxHost::system().cgroups() {
        Ok(c) if c.backend(Controller::Cpu).is_ok() && c.backend(Controller::Cpuset).is_ok() => {}
        _ => return eprintln!("SKIP {TEST}: no writable cpu/cpuset cgroups"),
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        return eprintln!("SKIP {TEST}: one CPU: static-cores has none to give BE");
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let top = format!("headroom-advertise-{}", std::process::id());
    // A pod bound to the node requesting 500 and 256 MiB; a finished one's 4000 counts nothing.
    let bound = with_be_memory(
        with_be_cpu(
            pod("batch-0", "b0", NODE, "Running", "BestEffort", json!({}), 3),
            "500",
        ),
        "256Mi",
    );
    let done = with_be_cpu(
        pod(
            "batch-1",
            "b1",
            NODE,
            "Succeeded",
            "BestEffort",
            json!({}),
            4,
        ),
        "4000",
    );
    let server = StandIn::listing(vec![bound, done]).unwrap();
    server.add_node(NODE, cpus as u32);
    server.nodes.lock().unwrap().forbid = 2;
    let nodes = server.nodes.clone();
    let node_value = || {
        nodes.lock().unwrap().objects[NODE]["status"]["allocatable"][BE_CPU]
            .as_str()
            .map(str::to_string)
    };

    let mut children = Children(Vec::new());
    children.0.push(
        Command::new("sleep")
            .arg("120")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let cfg = write_config(d, &top, &server.kubeconfig(d).unwrap(), children.0[0].id());
    let log_path = d.join("decisions.jsonl");
    let stderr = std::fs::File::create(d.join("agent.log")).unwrap();
    children.0.push(
        Command::new(BIN)
            .args(["agent", "--config"])
            .arg(&cfg)
            .arg("--log")
            .arg(&log_path)
            .env("HEADROOM_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start the agent"),
    );
    let log = || std::fs::read_to_string(d.join("agent.log")).unwrap_or_default();
    let latency_us = Arc::new(AtomicU64::new(100));
    let stop = Arc::new(AtomicBool::new(false));
    let feed = {
        let (sock, l, s) = (d.join("feed.sock"), latency_us.clone(), stop.clone());
        std::thread::spawn(move || feeder(sock, l, s))
    };

    // The floor first (the LC's latency not yet trusted), after two refusals.
    let mut st = Value::Null;
    let first = wait_for(Duration::from_secs(30), || node_value().is_some());
    assert!(first, "nothing reached the node; log:\n{}", log());
    let said_403 = log().matches("forbidden (403)").count();
    assert_eq!(said_403, 1, "the 403 said once; log:\n{}", log());
    assert!(log().contains("nodes/status"), "{}", log());

    // The LC holds its SLO: the value rises to what static-cores grants (one CPU), through
    // capacity and allocatable.
    let rose = wait_for(Duration::from_secs(60), || {
        st = status(d).unwrap_or(Value::Null);
        advertised(&st) == Some((1000, "slo".into())) && node_value().as_deref() == Some("1000")
    });
    assert!(rose, "the value rose to 1000; status {st}\nlog:\n{}", log());
    let capacity = nodes.lock().unwrap().objects[NODE]["status"]["capacity"][BE_CPU].clone();
    assert_eq!(capacity, "1000");
    let a = &st["advertise"];
    assert_eq!(a["advertisement"]["floor_millicpu"], 500, "{st}");
    assert_eq!(a["edge"]["errors"], 2, "two 403s: {st}");
    assert_eq!(a["edge"]["published_millicpu"], 1000, "{st}");
    assert!(
        a["advertisement"]["horizon"]["buckets"].as_u64() > Some(0),
        "{st}"
    );
    assert_eq!(a["advertisement"]["last_change"]["to_millicpu"], 1000);
    // be-memory beside it: the floor the pod's 256Mi, the value never below it.
    assert_eq!(a["memory"]["floor"], POD_MEMORY, "{st}");
    assert_eq!(a["edge"]["floor_memory_bytes"], POD_MEMORY, "{st}");
    assert!(a["memory"]["value"].as_u64() >= Some(POD_MEMORY), "{st}");
    let memory = |m: &str| {
        nodes.lock().unwrap().objects[NODE]["status"][m][BE_MEMORY]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert!(memory("capacity") >= Some(POD_MEMORY), "{st}");
    assert_eq!(memory("capacity"), memory("allocatable"));
    let text = Command::new(BIN)
        .args(["ctl", "--socket"])
        .arg(d.join("ctl.sock"))
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    for want in [
        "advertise headroom.io/be-cpu: 1000m (slo",
        "floor 500m",
        "horizon:",
        "last change:",
        "published 1000m",
        "advertise headroom.io/be-memory: ",
        "floor 268435456 B (0.25 GiB)",
        "node memory ",
    ] {
        assert!(text.contains(want), "ctl status says {want:?}:\n{text}");
    }

    // A violation: down to the floor at once; back within its SLO, up again only after the
    // damping period.
    latency_us.store(2000, Ordering::SeqCst);
    let fell = wait_for(Duration::from_secs(30), || {
        st = status(d).unwrap_or(Value::Null);
        advertised(&st).is_some_and(|(v, _)| v == 500) && node_value().as_deref() == Some("500")
    });
    assert!(fell, "fell to the floor; status {st}\nlog:\n{}", log());
    let detail = st["advertise"]["advertisement"]["detail"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(detail.contains("violates"), "{st}");
    latency_us.store(100, Ordering::SeqCst);
    let again = wait_for(Duration::from_secs(60), || {
        node_value().as_deref() == Some("1000")
    });
    assert!(again, "rose again; status {:?}\nlog:\n{}", status(d), log());

    // Never below the bound pod's requests: every patch the API took, both resources in each.
    for (_, p) in nodes.lock().unwrap().patches.iter() {
        let v = |r: &str| -> u64 {
            p["status"]["allocatable"][r]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        };
        assert!(v(BE_CPU) >= 500, "a patch below the floor: {p}");
        assert!(
            v(BE_MEMORY) >= POD_MEMORY,
            "a patch below the memory floor: {p}"
        );
    }

    // The API goes: the node keeps its value, the agent goes on and says it once.
    drop(server);
    latency_us.store(2000, Ordering::SeqCst);
    let refused = wait_for(Duration::from_secs(30), || {
        st = status(d).unwrap_or(Value::Null);
        st["advertise"]["edge"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("unreachable"))
            && advertised(&st).is_some_and(|(v, _)| v == 500)
    });
    assert!(refused, "the patch fails; status {st}\nlog:\n{}", log());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        node_value().as_deref(),
        Some("1000"),
        "the last value stays"
    );
    st = status(d).expect("the agent still answers");
    assert_eq!(st["advertise"]["edge"]["published_millicpu"], 1000, "{st}");
    assert_eq!(
        log().matches("API unreachable").count(),
        1,
        "said once; log:\n{}",
        log()
    );

    // SIGTERM: the agent exits cleanly and removes nothing from the node.
    stop.store(true, Ordering::SeqCst);
    let agent = &mut children.0[1];
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) }, 0);
    let mut exit = None;
    assert!(wait_for(Duration::from_secs(20), || {
        exit = agent.try_wait().unwrap();
        exit.is_some()
    }));
    assert!(exit.unwrap().success(), "agent exit; log:\n{}", log());
    feed.join().unwrap();
    assert_eq!(node_value().as_deref(), Some("1000"));

    // The decision log: one `advertise` line per change, every rise at least the damping
    // period after the change before it, none below the floor; it replays exactly.
    let text = std::fs::read_to_string(&log_path).unwrap();
    let changes: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "advertise")
        .collect();
    assert!(changes.len() >= 4, "{changes:#?}");
    assert_eq!(changes[0]["from_millicpu"], Value::Null);
    for w in changes.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        assert_eq!(a["to_millicpu"], b["from_millicpu"], "{changes:#?}");
        assert!(b["to_millicpu"].as_u64() >= Some(500), "{changes:#?}");
        if b["to_millicpu"].as_u64() > a["to_millicpu"].as_u64() {
            let gap = b["t_ms"].as_u64().unwrap() - a["t_ms"].as_u64().unwrap();
            assert!(
                gap >= DAMPING_MS,
                "a rise {gap} ms after the last change: {changes:#?}"
            );
        }
    }
    // One `advertise_memory` line per be-memory change, none below its floor.
    let memory_changes: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == "advertise_memory")
        .collect();
    assert!(!memory_changes.is_empty(), "no be-memory line");
    assert_eq!(memory_changes[0]["from_bytes"], Value::Null);
    for c in &memory_changes {
        assert!(
            c["to_bytes"].as_u64() >= Some(POD_MEMORY),
            "{memory_changes:#?}"
        );
        assert_eq!(c["floor_bytes"], POD_MEMORY, "{memory_changes:#?}");
    }
    support::assert_replays_exactly(&cfg, &log_path);
}
