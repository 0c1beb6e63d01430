//! `headroom bench advertise`: issue 40's side-by-side target on this host. memcached runs as a
//! Burstable pod the agent discovers through the stand-in API server (no real one can be
//! installed here), a BestEffort pod bound to the node requests `--committed-millicpu` of
//! `headroom.io/be-cpu` (a spinner in its group), and the agent decides with `multi` (which
//! discovery requires; with one LC it runs hybrid unchanged) and advertises. `headroom load` drives memcached at `--low-pct` then `--high-pct` of
//! `--peak-qps`, half the run each; every `--sample-s` a row: time, the load, the LC's p99, the
//! BE CPUs hybrid granted, the advertised value, its floor and reason, what the Node's
//! allocatable holds. At the end: the least value advertised, the changes per damping period
//! while each load held (from the decision log), whether the targets held, and the log's
//! replay (which recomputes every advertised change).
//!
//! Root, writable cpu and cpuset cgroups and no `kubepods` group (a real kubelet's is not ours
//! to touch) are needed; every group and process it made is removed on the way out.

mod config;
pub mod summary;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use headroom_control::advertise::{granted_millicpu, RESOURCE};
use headroom_control::decision::{CtlEvent, LogLine};
use headroom_host::process::{send_signal, Signal};
use headroom_host::{Cgroups, Controller, LinuxHost};
use headroom_kube::stand_in::{pod, with_be_cpu, StandIn};
use headroom_types::control::AgentStatus;
use headroom_types::load_result::LoadResult;
use headroom_types::GroupPath;
use serde_json::json;

use super::error::{Result, ToolError};
use super::flag_values::positive_f64;
use super::memcached::{start_memcached, Memcached};
use summary::{Change, PhaseSpan, Row};

const TOOL: &str = "headroom bench advertise";
const NODE: &str = "bench-node";
const LC_NAME: &str = "memcached";
/// The pods' UIDs (their groups are `pod<uid>` under kubelet's QoS parents).
const LC_UID: &str = "0a0a0a0a-4000-4000-8000-00000000ad01";
const BE_UID: &str = "0b0b0b0b-4000-4000-8000-00000000ad02";

#[derive(clap::Parser, Debug)]
#[command(name = "headroom bench advertise", no_binary_name = true)]
pub struct Flags {
    /// The whole run, s (each load half of it); the target's figure is 300
    #[arg(long, default_value_t = 300.0, value_parser = positive_f64)]
    seconds: f64,
    /// The first load, % of --peak-qps
    #[arg(long, default_value_t = 20.0, value_parser = positive_f64)]
    low_pct: f64,
    /// The second load, % of --peak-qps
    #[arg(long, default_value_t = 80.0, value_parser = positive_f64)]
    high_pct: f64,
    /// memcached's (-t 1) capacity on this host, QPS (100% load)
    #[arg(long, default_value_t = 50_000.0, value_parser = positive_f64)]
    peak_qps: f64,
    /// memcached's SLO (its pod's headroom.io/slo-p99-us), µs
    #[arg(long, default_value_t = 1000.0, value_parser = positive_f64)]
    slo_us: f64,
    /// headroom.io/be-cpu the BestEffort pod bound to the node requests, milli-CPUs
    #[arg(long, default_value_t = 1500)]
    committed_millicpu: u64,
    /// Threads of the BE pod's spinner
    #[arg(long, default_value_t = 2)]
    be_threads: usize,
    /// The SLO window of the discovered LC, s
    #[arg(long, default_value_t = 2.0, value_parser = positive_f64)]
    pub(crate) window_s: f64,
    /// [kubernetes] advertise_damping_s
    #[arg(long, default_value_t = 30.0, value_parser = positive_f64)]
    pub(crate) damping_s: f64,
    /// [safety] violation_cooldown_s and [policy.heracles] cooldown_s (hybrid's): the agent's
    /// default (Heracles' 5 minutes) would hold BE off for the whole of a 5-minute run after
    /// one violation, leaving nothing to follow
    #[arg(long, default_value_t = 30.0, value_parser = positive_f64)]
    pub(crate) cooldown_s: f64,
    /// [kubernetes] advertise_horizon_s (at least 60)
    #[arg(long, default_value_t = 120.0, value_parser = positive_f64)]
    pub(crate) horizon_s: f64,
    /// [kubernetes] advertise_min_history_s
    #[arg(long, default_value_t = 20.0, value_parser = positive_f64)]
    pub(crate) min_history_s: f64,
    /// [kubernetes] advertise_percentile
    #[arg(long, default_value_t = 10.0, value_parser = positive_f64)]
    pub(crate) percentile: f64,
    /// [kubernetes] advertise_margin_millicpu
    #[arg(long, default_value_t = 200)]
    pub(crate) margin_millicpu: u64,
    /// Seconds between rows
    #[arg(long, default_value_t = 10.0, value_parser = positive_f64)]
    sample_s: f64,
    /// After each change of load, seconds not held against "≤ 1 change per damping period"
    /// (the value follows the new load: a fall, or a rise after the damping)
    #[arg(long, default_value_t = 20.0)]
    settle_s: f64,
}

/// What the run made: removed (processes killed, groups thawed and removed deepest first) on
/// drop, also when it fails part-way.
struct Live {
    cgroups: Cgroups,
    groups: Vec<GroupPath>,
    children: Vec<Child>,
    memcached: Option<Memcached>,
    /// The same removal of the groups if the bench is stopped by a signal (crate::stop_on_signal).
    on_signal: Option<u64>,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(id) = self.on_signal.take() {
            crate::stop_on_signal::cancel(id);
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        drop(self.memcached.take());
        remove_groups(&self.cgroups, &self.groups);
    }
}

/// Thaws and removes `groups`, deepest (last made) first.
fn remove_groups(cgroups: &Cgroups, groups: &[GroupPath]) {
    for g in groups.iter().rev() {
        if cgroups.exists(g) {
            let _ = cgroups.thaw(g);
        }
        for _ in 0..50 {
            if !cgroups.exists(g) || cgroups.remove(g).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn needs(need: &str) -> ToolError {
    ToolError::Needs {
        tool: TOOL,
        need: need.to_string(),
    }
}

fn system(what: String) -> impl FnOnce(std::io::Error) -> ToolError {
    move |source| ToolError::System { what, source }
}

fn exe() -> PathBuf {
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("headroom"))
}

/// The agent's `ctl status`, typed.
fn status(dir: &Path) -> Option<AgentStatus> {
    #[derive(serde::Deserialize)]
    struct Reply {
        status: AgentStatus,
    }
    let out = Command::new(exe())
        .args(["ctl", "--socket"])
        .arg(dir.join("ctl.sock"))
        .args(["--json", "status"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice::<Reply>(&out.stdout)
        .ok()
        .map(|r| r.status)
}

fn lc_name() -> String {
    format!("shop/{LC_NAME}")
}

/// One row from a status and the stand-in's Node.
fn row(st: &AgentStatus, stand_in: &StandIn, t_s: f64, phase: &str, qps: f64) -> Row {
    let lc = st.lcs.iter().find(|l| l.name == lc_name());
    let ad = st.advertise.as_ref().and_then(|a| a.advertisement.as_ref());
    Row {
        t_s,
        phase: phase.to_string(),
        offered_qps: qps,
        lc_p99_us: lc.and_then(|l| l.latency_us),
        slo_us: lc.map(|l| l.slo_us),
        granted_millicpu: st
            .allocation
            .as_ref()
            .map(|a| granted_millicpu(a, st.machine_cpus.len() as u32)),
        advertised_millicpu: ad.map(|a| a.value_millicpu),
        floor_millicpu: ad.map(|a| a.floor_millicpu),
        reason: ad.map(|a| a.reason.as_str().to_string()),
        api_allocatable: stand_in.node_resource(NODE, RESOURCE).1,
    }
}

fn spawn(argv: &[String], stderr_to: &Path) -> Result<Child> {
    let stderr = std::fs::File::create(stderr_to)
        .map_err(system(format!("creating {}", stderr_to.display())))?;
    Command::new(exe())
        .args(argv)
        .env("HEADROOM_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .map_err(system(format!("starting headroom {}", argv.join(" "))))
}

/// Waits up to `limit` for `child` to exit; false if it did not.
fn wait_exit(child: &mut Child, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Runs the benchmark; with `out`, its files go there (else a directory under /tmp).
pub fn run(out: Option<PathBuf>, f: Flags) -> Result<()> {
    if !headroom_host::process::is_root() {
        return Err(needs("root (it makes kubelet-style cgroups for the pods)"));
    }
    let cgroups = LinuxHost::system().cgroups()?;
    if cgroups.backend(Controller::Cpu).is_err() || cgroups.backend(Controller::Cpuset).is_err() {
        return Err(needs("writable cpu and cpuset cgroups"));
    }
    let group = |s: &str| GroupPath::new(s);
    if cgroups.exists(&group("kubepods")?) {
        return Err(needs(
            "no kubepods group (one exists: a real kubelet's is not ours to touch)",
        ));
    }
    let dir = out.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("headroom-bench-advertise-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).map_err(system(format!("creating {}", dir.display())))?;
    let mut live = Live {
        cgroups: cgroups.clone(),
        groups: Vec::new(),
        children: Vec::new(),
        memcached: None,
        on_signal: None,
    };
    let lc_group = group(&format!("kubepods/burstable/pod{LC_UID}"))?;
    let be_group = group(&format!("{}/pod{BE_UID}", config::BESTEFFORT))?;
    for g in [
        group("kubepods")?,
        group("kubepods/burstable")?,
        lc_group.clone(),
        group(config::BESTEFFORT)?,
        be_group.clone(),
    ] {
        cgroups.create(&g)?;
        live.groups.push(g);
    }
    let (c, made) = (cgroups.clone(), live.groups.clone());
    live.on_signal = Some(crate::stop_on_signal::on_stop(move || {
        remove_groups(&c, &made)
    }));
    let memcached = start_memcached(None)?;
    let port = memcached.port;
    cgroups.move_process(&lc_group, memcached.pid() as i32)?;
    live.memcached = Some(memcached);
    let spin = [
        "antagonist".to_string(),
        "spin".into(),
        "--threads".into(),
        f.be_threads.to_string(),
        "--duration".into(),
        (f.seconds + 300.0).round().to_string(),
    ];
    let spinner = spawn(&spin, &dir.join("be-spinner.log"))?;
    cgroups.move_process(&be_group, spinner.id() as i32)?;
    live.children.push(spinner);

    let annotations = json!({
        "headroom.io/slo-p99-us": f.slo_us.to_string(),
        "headroom.io/latency-port": port.to_string(),
    });
    let lc_pod = pod(
        LC_NAME,
        LC_UID,
        NODE,
        "Running",
        "Burstable",
        annotations,
        3,
    );
    let be_pod = with_be_cpu(
        pod("batch", BE_UID, NODE, "Running", "BestEffort", json!({}), 4),
        &f.committed_millicpu.to_string(),
    );
    let stand_in = StandIn::listing(vec![lc_pod, be_pod])
        .map_err(system("starting the stand-in API server".into()))?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    stand_in.add_node(NODE, cpus);
    let kubeconfig = stand_in
        .kubeconfig(&dir)
        .map_err(system(format!("writing a kubeconfig in {}", dir.display())))?;
    let cfg = config::write(&dir, &kubeconfig, NODE, &f)?;
    let log = dir.join("decisions.jsonl");
    let _ = std::fs::remove_file(&log);
    let agent_argv = [
        "agent".to_string(),
        "--config".into(),
        cfg.display().to_string(),
        "--log".into(),
        log.display().to_string(),
    ];
    let agent_log = dir.join("agent.log");
    live.children.push(spawn(&agent_argv, &agent_log)?);
    let agent = live.children.len() - 1;

    // The agent up, the LC discovered and a first value advertised.
    let ready = (0..600).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        status(&dir).is_some_and(|st| {
            st.lcs.iter().any(|l| l.name == lc_name())
                && st
                    .advertise
                    .as_ref()
                    .is_some_and(|a| a.advertisement.is_some())
        })
    });
    if !ready {
        return Err(ToolError::Measurement(format!(
            "the agent did not discover {} and advertise within 60 s; its log ({}):\n{}",
            lc_name(),
            agent_log.display(),
            tail(&agent_log)
        )));
    }
    println!(
        "{TOOL}: memcached on 127.0.0.1:{port} as pod shop/{LC_NAME} (SLO p99 {} µs), a BestEffort pod committed at {}m, multi (hybrid with one LC), damping {} s, violation cooldown {} s; files in {}",
        f.slo_us,
        f.committed_millicpu,
        f.damping_s,
        f.cooldown_s,
        dir.display()
    );
    println!("{}", summary::header());

    let phase_s = f.seconds / 2.0;
    let start = Instant::now();
    let mut rows = Vec::new();
    let mut spans: Vec<PhaseSpan> = Vec::new();
    let mut loads = Vec::new();
    for pct in [f.low_pct, f.high_pct] {
        let name = format!("{pct:.0}%");
        let qps = f.peak_qps * pct / 100.0;
        let agent_ms = status(&dir).map_or(0, |s| (s.uptime_s * 1000.0) as u64);
        if let Some(prev) = spans.last_mut() {
            prev.to_ms = agent_ms;
        }
        spans.push(PhaseSpan {
            name: name.clone(),
            held_from_ms: agent_ms + (f.settle_s * 1000.0) as u64,
            to_ms: u64::MAX,
        });
        let json_path = dir.join(format!("load-{pct:.0}.json"));
        let _ = std::fs::remove_file(&json_path);
        let load_argv = [
            "load".to_string(),
            "-s".into(),
            std::net::SocketAddr::from(([127, 0, 0, 1], port)).to_string(),
            "-T".into(),
            "1".into(),
            // Connections sized from the measured round trip (a fixed -c 4 was too few at 16k
            // QPS here: a third of the sends waited at the depth cap and the run was refused).
            "--connections".into(),
            "auto".into(),
            "--depth".into(),
            "1".into(),
            "-q".into(),
            qps.round().to_string(),
            "-t".into(),
            phase_s.round().to_string(),
            "--quiet".into(),
            "--invalid-exit-code".into(),
            "0".into(),
            "--json".into(),
            json_path.display().to_string(),
        ];
        let mut load = spawn(&load_argv, &dir.join(format!("load-{pct:.0}.log")))?;
        let phase_start = Instant::now();
        let mut next = Duration::from_secs_f64(f.sample_s);
        // Bounded: the phase, then at most a minute for the load generator to finish.
        while phase_start.elapsed() < Duration::from_secs_f64(phase_s + 60.0) {
            if matches!(load.try_wait(), Ok(Some(_))) {
                break;
            }
            if phase_start.elapsed() >= next {
                next += Duration::from_secs_f64(f.sample_s);
                if let Some(st) = status(&dir) {
                    let r = row(&st, &stand_in, start.elapsed().as_secs_f64(), &name, qps);
                    println!("{}", summary::row_line(&r));
                    rows.push(r);
                }
            }
            if matches!(live.children[agent].try_wait(), Ok(Some(_))) {
                let _ = load.kill();
                let _ = load.wait();
                return Err(ToolError::Measurement(format!(
                    "the agent exited during the {name} phase; its log ({}):\n{}",
                    agent_log.display(),
                    tail(&agent_log)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = load.kill();
        let _ = load.wait();
        match std::fs::read_to_string(&json_path)
            .ok()
            .and_then(|t| serde_json::from_str::<LoadResult>(&t).ok())
        {
            Some(r) => {
                println!(
                    "load {name}: asked {qps:.0} QPS, achieved {:.0}, p99 {:.0} µs (load generator's view), valid {}",
                    r.achieved_qps, r.read.p99_us, r.valid
                );
                loads.push(r);
            }
            None => println!(
                "load {name}: no result in {} (see load-{pct:.0}.log)",
                json_path.display()
            ),
        }
    }
    if let Some(last) = spans.last_mut() {
        last.to_ms = status(&dir).map_or(u64::MAX, |s| (s.uptime_s * 1000.0) as u64 + 1);
    }

    // SIGTERM: the agent restores and writes its log's last run.
    let child = &mut live.children[agent];
    let _ = send_signal(child.id() as i32, Signal::SIGTERM);
    if !wait_exit(child, Duration::from_secs(20)) {
        println!("the agent did not stop within 20 s of SIGTERM: killed");
    }
    let text =
        std::fs::read_to_string(&log).map_err(system(format!("reading {}", log.display())))?;
    let parsed = headroom_types::decision::parse_log(&text)
        .map_err(|e| ToolError::Measurement(format!("the decision log {}: {e}", log.display())))?;
    let changes: Vec<Change> = parsed
        .lines
        .iter()
        .filter_map(|l| match l {
            LogLine::Event(CtlEvent::Advertise {
                t_ms, to_millicpu, ..
            }) => Some(Change {
                t_ms: *t_ms,
                to_millicpu: *to_millicpu,
            }),
            _ => None,
        })
        .collect();
    let s = summary::summarize(&rows, &changes, &spans, f.committed_millicpu, f.damping_s);
    for line in summary::summary_lines(&s) {
        println!("{line}");
    }
    let replay = Command::new(exe())
        .args(["agent", "--config"])
        .arg(&cfg)
        .arg("--replay")
        .arg(&log)
        .output()
        .map_err(system("running headroom agent --replay".into()))?;
    let replay_line = String::from_utf8_lossy(&replay.stdout).trim().to_string();
    println!("decision log {}: {replay_line}", log.display());
    let result = json!({
        "rows": rows, "changes": changes, "summary": s, "loads": loads,
        "replay": {"exact": replay.status.success(), "line": replay_line},
    });
    let path = dir.join("advertise.json");
    std::fs::write(&path, result.to_string())
        .map_err(system(format!("writing {}", path.display())))?;
    Ok(())
}
