//! The runtime's parts that need no cgroups: the shipped example configs parse and validate,
//! the state file round-trips atomically, the control socket is 0600 and answers, the live
//! feed turns pushed histograms into a window percentile, and the metrics endpoint serves.

use headroom_types::CpuSet;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_agent::publish::control::{self, Request, Response};

use crate::servers;
use headroom_agent::sensors::lc_signal::SignalCell;
use headroom_agent::state::OriginalValue;
use headroom_agent::state::{self, AgentState, STATE_VERSION};
use headroom_control::actuation::{CgroupKnob, Knob, KnobValue};
use headroom_control::config::Config;
use headroom_types::allocation::Allocation;

fn repo_file(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The agent config inside a DaemonSet manifest's ConfigMap.
fn configmap_body(manifest: &str) -> String {
    let manifest = repo_file(manifest);
    let start = manifest.find("headroom.toml: |").unwrap();
    manifest[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("    ") || l.trim().is_empty())
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect()
}

#[test]
fn shipped_configs_are_valid() {
    Config::from_toml_str(&repo_file("deploy/headroom.toml")).unwrap();
    // The single-LC variant: its LC pod is selected at start.
    let single = Config::from_toml_str(&configmap_body(
        "deploy/kubernetes/headroom-daemonset-single-lc.yaml",
    ))
    .unwrap();
    assert!(!single.kubernetes.discover);
    // The shipped manifest: the LCs are the node's annotated pods (no [lc] table); the config
    // runs as it is, the holder service standing first until pods are found.
    let body = configmap_body("deploy/kubernetes/headroom-daemonset.yaml");
    let tables = |name: &str| {
        body.lines()
            .any(|l| l.trim_start().trim_start_matches('[').starts_with(name))
    };
    assert!(!tables("lc]") && !tables("lc."), "LCs come from discovery");
    let cfg = Config::from_toml_str(&body).unwrap();
    assert!(cfg.kubernetes.discover);
    assert!(cfg.static_lcs().is_empty());
    assert_eq!(cfg.policy.kind.as_str(), "multi");
    assert_eq!(cfg.be[0].cgroup, "kubepods/besteffort");
}

/// The group locks must be the host's: with `/run/headroom` an emptyDir, each pod locked in
/// a directory of its own, and a second agent (another DaemonSet, a test pod) took groups
/// the first held (fifth hostile pass, issue 42).
#[test]
fn the_daemonsets_keep_the_group_locks_on_the_host() {
    let locks = state::lock_dir(std::path::Path::new("/"));
    let locks = locks.display().to_string();
    for manifest in [
        "deploy/kubernetes/headroom-daemonset.yaml",
        "deploy/kubernetes/headroom-daemonset-single-lc.yaml",
    ] {
        let yaml = repo_file(manifest);
        // the agent container's mount of the lock directory, and its volume
        let mount = format!("mountPath: {locks}}}");
        let volume = yaml
            .lines()
            .find(|l| l.contains(&mount))
            .and_then(|l| l.split("name: ").nth(1))
            .and_then(|r| r.split(',').next())
            .unwrap_or_else(|| panic!("{manifest}: nothing mounted at {locks}"));
        let declared = yaml
            .lines()
            .skip_while(|l| l.trim() != format!("- name: {volume}"))
            .nth(1)
            .unwrap_or_else(|| panic!("{manifest}: no volume {volume}"));
        assert!(
            declared.contains(&format!("hostPath: {{path: {locks},")),
            "{manifest}: the volume {volume} at {locks} is not the host's directory: {declared}"
        );
    }
}

/// The control socket's directory must not be an emptyDir (mode 0777): the agent refuses a
/// socket in a directory others can write (ninth hostile pass low), so it would not start.
#[test]
fn the_daemonsets_control_socket_directory_is_no_emptydir() {
    for manifest in [
        "deploy/kubernetes/headroom-daemonset.yaml",
        "deploy/kubernetes/headroom-daemonset-single-lc.yaml",
    ] {
        let yaml = repo_file(manifest);
        assert!(
            yaml.contains("socket = \"/run/headroom/headroom.sock\""),
            "{manifest}"
        );
        let mounted = yaml
            .lines()
            .find(|l| l.contains("mountPath: /run/headroom}"))
            .and_then(|l| l.split("name: ").nth(1))
            .and_then(|r| r.split(',').next());
        let Some(volume) = mounted else { continue };
        let declared = yaml
            .lines()
            .skip_while(|l| l.trim() != format!("- name: {volume}"))
            .nth(1)
            .unwrap_or_default();
        assert!(
            !declared.contains("emptyDir"),
            "{manifest}: /run/headroom is an emptyDir (0777): the agent refuses its socket there"
        );
    }
}

#[test]
fn state_file_round_trips_and_leaves_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/state.json");
    assert!(state::load(&path).unwrap().is_none());
    let be = headroom_types::GroupPath::new("hr/be").unwrap();
    let st = AgentState {
        version: STATE_VERSION,
        pid: 42,
        written_unix_ms: 1,
        originals: vec![
            OriginalValue {
                knob: Knob::cgroup(&be, CgroupKnob::CpusetCpus),
                value: KnobValue::Cpus([0, 1].into()),
            },
            OriginalValue {
                knob: Knob::MaxFreq { cpu: 1 },
                value: KnobValue::Khz(3_000_000),
            },
        ],
        original: Default::default(),
        last_allocation: Some(Allocation::default().disabled()),
        owned_pids: [("spin".to_string(), 7)].into(),
        be_found: [("spin".to_string(), vec![8, 9])].into(),
        lc_threads: Default::default(),
        created_groups: vec!["hr".parse().unwrap(), "hr/be".parse().unwrap()],
        lc_origins: [(9, vec!["/sys/fs/cgroup/cpu/system.slice".to_string()])].into(),
        lc_groups: vec!["hr/lc".parse().unwrap()],
        be_groups: [(
            "spin".to_string(),
            state::RecordedBe {
                group: be.clone(),
                command: true,
                argv: Some(vec!["spin".to_string()]),
            },
        )]
        .into(),
        relay_pipes: [(7, headroom_host::spawn::relay::PipeId { dev: 12, ino: 34 })].into(),
    };
    state::store(&path, &st).unwrap();
    assert_eq!(state::load(&path).unwrap().unwrap(), st);
    assert!(!dir.path().join("sub/state.json.tmp").exists());
    // A version-1 file (cgroup originals by group) is read and converted.
    std::fs::write(
        &path,
        r#"{"version": 1, "pid": 1, "written_unix_ms": 1, "last_allocation": null,
            "original": {"hr/be": {"values": {"cpu_weight": {"weight": 512}}}}}"#,
    )
    .unwrap();
    let old = state::load(&path).unwrap().unwrap();
    assert_eq!(
        old.original_map()
            .get(&Knob::cgroup(&be, CgroupKnob::CpuWeight)),
        Some(&KnobValue::Weight(512))
    );
    std::fs::write(&path, "{\"version\": 99}").unwrap();
    let err = state::load(&path).unwrap_err().to_string();
    assert!(err.contains("state.json"), "{err}");
}

#[test]
fn control_socket_is_private_and_answers() {
    let (_dir, sock, stop, rx, handle) = servers::control();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // A stand-in for the agent loop.
    let server = std::thread::spawn(move || {
        let (req, reply) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let resp = match req {
            Request::Set { key, value } => Response::ok(format!("{key} = {value}")),
            other => Response::error(format!("unexpected {other:?}")),
        };
        reply.send(resp).unwrap();
    });
    let resp = control::request(
        &sock,
        &Request::Set {
            key: "policy.blind.buffer_cores".into(),
            value: "2".into(),
        },
    )
    .unwrap();
    assert!(resp.ok, "{resp:?}");
    assert_eq!(resp.message, "policy.blind.buffer_cores = 2");
    server.join().unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    handle.join().unwrap();
    let err = control::request(&sock, &Request::Status)
        .unwrap_err()
        .to_string();
    assert!(err.contains("ctl.sock"), "names the socket: {err}");
}

#[test]
fn feed_lines_become_a_window_percentile() {
    use headroom_load::stats::LatencyHist;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("feed.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let cells = headroom_agent::sensors::feed::FeedCells {
        latency: SignalCell::new(),
        qps: SignalCell::new(),
    };
    // A 2 s window: the agent's second 0 starts at spawn; a line stamped before it counts as
    // second 0, a line stamped now as the current second.
    let before_spawn = headroom_load::clock::unix_ms().saturating_sub(1000);
    let spawned = Instant::now();
    let handle = headroom_agent::sensors::feed::spawn(
        &sock,
        99.0,
        2.0,
        headroom_load::stats::min_samples_for(99.0),
        cells.clone(),
        stop.clone(),
    )
    .unwrap();
    let line_of = |from: u64, to: u64, qps: f64, t_unix_ms: u64| {
        let mut hist = LatencyHist::new();
        for i in from..=to {
            hist.record_ns(i * 1_000); // 1 µs each
        }
        serde_json::json!({
            "version": 1, "t_unix_ms": t_unix_ms,
            "interval_s": 1.0, "qps": qps, "hist": hist.to_base64()})
    };
    let wait_qps = |qps: f64| {
        let start = Instant::now();
        while cells.qps.latest().is_none_or(|r| r.value != qps)
            && start.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(cells.qps.latest().unwrap().value, qps);
    };
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    use std::io::Write;
    // 100 samples are too few for a p99: the rate is published, the latency is not.
    writeln!(s, "{}", line_of(1, 100, 1234.0, before_spawn)).unwrap();
    wait_qps(1234.0);
    assert!(
        cells.latency.latest().is_none(),
        "a p99 of 100 samples was published"
    );
    // 1000 samples, all in second 0: enough for a p99, but the window has not been full yet.
    writeln!(s, "{}", line_of(101, 1000, 2345.0, before_spawn)).unwrap();
    wait_qps(2345.0);
    assert!(
        cells.latency.latest().is_none(),
        "a p99 was published before the window had filled"
    );
    // Second 1: the 2 s window is full, and holds 1..1000 µs plus one 1000 µs: p99 ≈ 990 µs.
    std::thread::sleep(Duration::from_millis(1200).saturating_sub(spawned.elapsed()));
    writeln!(
        s,
        "{}",
        line_of(1000, 1000, 3456.0, headroom_load::clock::unix_ms())
    )
    .unwrap();
    let start = Instant::now();
    while cells.latency.latest().is_none() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let p99 = cells.latency.latest().expect("published").value;
    assert!((p99 - 990.0).abs() < 15.0, "p99 {p99}");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(s);
    handle.join().unwrap();
}

#[test]
fn metrics_endpoint_serves_the_exposition() {
    let (addr, stop, handle, m) = servers::scrape();
    let obs = headroom_types::observation::Observation {
        lc_latency_us: Some(250.0),
        ..Default::default()
    };
    let alloc = Allocation {
        be_cpus: Some(CpuSet::from([1, 2])),
        ..Allocation::default()
    };
    m.observe(&obs, &alloc, 500.0, "blind:idle=buffer:steady");
    let body =
        headroom_agent::sensors::scrape::http_get(&format!("http://{addr}/metrics")).unwrap();
    assert!(body.contains("headroom_lc_latency_us 250.0"), "{body}");
    assert!(body.contains("headroom_lc_slack 0.5"), "{body}");
    assert!(body.contains("headroom_be_cpus 2.0"), "{body}");
    assert!(
        body.contains("headroom_decisions_total{reason=\"blind:idle=buffer:steady\"} 1"),
        "{body}"
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    handle.join().unwrap();
}

/// Defect 11: idle clients cannot hold up a scrape (each is served in its own thread).
#[test]
fn idle_clients_do_not_delay_a_scrape() {
    let (addr, stop, handle, _m) = servers::scrape();
    let idle: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let body =
        headroom_agent::sensors::scrape::http_get(&format!("http://{addr}/metrics")).unwrap();
    // not served behind the idle clients (serially it took 20 s, one read timeout each); the
    // bound is a generous hang detector, far below that, not a timing
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert!(body.contains("headroom_writes_total"));
    drop(idle);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    handle.join().unwrap();
}

/// Defect 11: a request line longer than the cap is refused, not read whole or echoed back;
/// an idle client does not hold up the next one.
#[test]
fn the_control_socket_bounds_requests_and_serves_clients_concurrently() {
    use std::io::{BufRead, Write};
    let (_dir, sock, stop, rx, handle) = servers::control();
    let loop_ = std::thread::spawn(move || {
        while let Ok((_, reply)) = rx.recv_timeout(Duration::from_secs(3)) {
            let _ = reply.send(Response::ok("status"));
        }
    });
    // served beside idle clients, not after them: served one after another, the four would
    // hold it for four whole-request deadlines (8 s); the bound is a generous hang detector
    let _idle: Vec<_> = (0..4)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
        .collect();
    let t = Instant::now();
    let resp = control::request(&sock, &Request::Status).unwrap();
    assert!(
        resp.ok && t.elapsed() < Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
    let mut big = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let chunk = vec![b'x'; 1 << 16];
    for _ in 0..4 {
        if big.write_all(&chunk).is_err() {
            break; // the agent closed it already
        }
    }
    let _ = big.shutdown(std::net::Shutdown::Write);
    let mut answer = String::new();
    std::io::BufReader::new(&big)
        .read_line(&mut answer)
        .unwrap();
    assert!(answer.contains("longer than 65536 bytes"), "{answer:.200}");
    assert!(
        answer.len() < 1000,
        "the request was echoed back: {} bytes",
        answer.len()
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    handle.join().unwrap();
    loop_.join().unwrap();
}
