//! `headroom bench multi-lc`: issue 29's evidence on this host — two LC services with their own
//! SLOs and loads on opposite schedules, one BE, under `none`, the single-LC agent protecting
//! only the first (`hybrid` with one `[lc]`), and `multi` with both.
//!
//! - LC `a`: memcached (`-t 1`), or a second `headroom serve` where memcached is missing (said);
//!   LC `b`: `headroom serve --threads 1`; both on the server CPUs, as BE (`antagonist spin`).
//! - Each LC's capacity alone (valid probes only; an invalid one counts as not held, as in
//!   `bench colocation`'s baselines) and its SLO (p99 alone at its peak load × `--slo-factor`).
//! - Per policy, the same schedule: `a` falls from `--hi-pct` to `--lo-pct` of its capacity and
//!   back while `b` rises (so `b` peaks where `a` is at its trough: an agent watching only `a`
//!   grows BE exactly when `b` is most fragile). Each window runs one `headroom load` per LC at
//!   once (each its own load generator, under SCHED_FIFO; `--sleep-only` keeps either from
//!   busy-polling, at the cost of the interarrival self-check); a run failing its self-checks
//!   makes the window invalid for that LC, not ok.
//! - Under `hybrid`, `b` sits in a cpu group of its own (made here), outside BE's.

mod config;
mod plan;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use super::error::{Context, Result, ToolError};
use super::flag_values::positive_f64;
use crate::record::be_spec;
use crate::runner::{self, free_port, read_progress, Placement, Proc, Runner, ServeSpec};
use crate::stats;
use crate::validity::{self, LoadShape};
pub use config::Latency;
use headroom_report::model::LoadMetrics;
pub use plan::{
    schedules, summarize, summary_table, LcWindow, PolicySummary, Verdict, WindowRecord,
};

const TOOL: &str = "headroom bench multi-lc";

#[derive(clap::Parser, Debug)]
#[command(name = "headroom bench multi-lc", no_binary_name = true)]
pub struct Flags {
    /// 6 windows per policy, 2 s probes: about 5 minutes on a 2-CPU host (4 min 53 s in one trial)
    #[arg(long)]
    quick: bool,
    /// Seconds per window (also the agent's latency window)
    #[arg(long, default_value_t = 10.0, value_parser = positive_f64)]
    window_s: f64,
    /// Windows per policy (default 18; 6 with --quick)
    #[arg(long)]
    windows: Option<usize>,
    /// Policies, comma-separated: none, hybrid (the single-LC agent, given LC a only), multi
    #[arg(long, value_delimiter = ',', default_value = "none,hybrid,multi")]
    policies: Vec<String>,
    /// Each LC's lowest load, % of its capacity alone
    #[arg(long, default_value_t = 10.0, value_parser = positive_f64)]
    lo_pct: f64,
    /// Each LC's highest load, % of its capacity alone (lo + hi is the LCs' work on the shared
    /// server CPUs in every window)
    #[arg(long, default_value_t = 60.0, value_parser = positive_f64)]
    hi_pct: f64,
    /// LC a's capacity alone, QPS (default: probed)
    #[arg(long)]
    capacity_a_qps: Option<f64>,
    /// LC b's capacity alone, QPS (default: probed)
    #[arg(long)]
    capacity_b_qps: Option<f64>,
    /// LC a's SLO, p99 µs (default: its p99 alone at its peak load × --slo-factor)
    #[arg(long)]
    slo_a_us: Option<f64>,
    /// LC b's SLO, p99 µs
    #[arg(long)]
    slo_b_us: Option<f64>,
    /// SLO = this × the LC's p99 alone at its peak load
    #[arg(long, default_value_t = 3.0, value_parser = positive_f64)]
    slo_factor: f64,
    /// memcached binary for LC a (default: `memcached` on PATH; a second `headroom serve` if none)
    #[arg(long, value_name = "PATH")]
    memcached: Option<PathBuf>,
    /// Where the agent takes each LC's latency from
    #[arg(long, value_enum, default_value = "feed")]
    latency: Latency,
    /// The load generators never busy-poll (`headroom load --sleep-only`): off by default, as
    /// the timer's late wake-ups then fail the interarrival self-check (every window invalid in
    /// a trial on the 2-CPU VM); on, neither busy-polls the other off their shared CPU
    #[arg(long)]
    sleep_only: bool,
    /// BE workload (antagonist kind: spin, llc:0.5, dram, ...)
    #[arg(long, default_value = "spin")]
    be: String,
}

impl Flags {
    fn windows(&self) -> usize {
        self.windows
            .unwrap_or(if self.quick { 6 } else { 18 })
            .max(1)
    }
    fn probe_s(&self) -> f64 {
        if self.quick {
            2.0
        } else {
            3.0
        }
    }
    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ToolError::Measurement(m));
        if self.lo_pct >= self.hi_pct {
            return bad(format!(
                "--lo-pct {} must be below --hi-pct {}",
                self.lo_pct, self.hi_pct
            ));
        }
        if self.hi_pct > 100.0 {
            return bad(format!("--hi-pct {} is above 100", self.hi_pct));
        }
        for p in &self.policies {
            if !["none", "hybrid", "multi"].contains(&p.as_str()) {
                return bad(format!(
                    "--policies: unknown policy {p:?} (none, hybrid, multi)"
                ));
            }
        }
        for (name, v) in [
            ("--capacity-a-qps", self.capacity_a_qps),
            ("--capacity-b-qps", self.capacity_b_qps),
            ("--slo-a-us", self.slo_a_us),
            ("--slo-b-us", self.slo_b_us),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return bad(format!("{name} {v} must be a positive number"));
                }
            }
        }
        Ok(())
    }
}

/// One LC service as measured alone.
#[derive(Debug, Clone, Serialize)]
pub struct LcBase {
    pub name: String,
    /// `memcached` or `headroom serve`.
    pub server: String,
    pub command: String,
    pub capacity_qps: f64,
    pub capacity_source: String,
    pub slo_us: f64,
    pub slo_source: String,
    #[serde(skip)]
    addr: SocketAddr,
    #[serde(skip)]
    pid: u32,
}

/// A running LC and what it is.
struct Lc {
    proc: Proc,
    base: LcBase,
}

fn memcached_path(flag: &Option<PathBuf>) -> Option<PathBuf> {
    if let Some(p) = flag {
        return Some(p.clone());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("memcached"))
        .find(|p| p.is_file())
}

/// Starts memcached on the server CPUs and waits until it answers `stats` with its own pid.
fn start_memcached(runner: &Runner, bin: &Path) -> Result<(Proc, SocketAddr)> {
    let port = free_port()?;
    let mut argv = Vec::new();
    if runner.pin {
        argv.extend([
            "taskset".into(),
            "-c".into(),
            runner::cpu_arg(&runner.placement.server),
        ]);
    }
    argv.push(bin.display().to_string());
    argv.extend(
        [
            "-t",
            "1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-c",
            "4096",
        ]
        .map(String::from),
    );
    if headroom_host::process::is_root() {
        // memcached refuses to run as root without naming the user.
        argv.extend(["-u".into(), "root".into()]);
    }
    let mut proc = runner.spawn("memcached", &argv)?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let start = std::time::Instant::now();
    loop {
        let last = match headroom_load::readiness::stats_pid(addr) {
            Ok(pid) if pid == proc.pid() => return Ok((proc, addr)),
            Ok(other) => format!("{addr} is answered by pid {other}, not ours"),
            Err(e) => e.to_string(),
        };
        if let Some(st) = proc.exited() {
            return Err(ToolError::Command {
                command: proc.command.clone(),
                stderr: format!("exited ({st}): {}", proc.log_tail(1500)),
            });
        }
        if start.elapsed() > Duration::from_secs(10) {
            return Err(ToolError::Measurement(format!(
                "`{}` did not answer `stats` with its pid within 10 s ({last})",
                proc.command
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One fixed-rate load run at `qps` for `shape.seconds` against `addr`, never busy-polling
/// (the two load generators share their CPU), optionally feeding the agent.
fn load_once(
    runner: &Runner,
    addr: SocketAddr,
    qps: f64,
    shape: &LoadShape,
    json: &Path,
    feed: Option<&Path>,
    sleep_only: bool,
) -> crate::Result<LoadMetrics> {
    let mut argv = runner.load_argv_shaped(addr, qps, shape, json);
    if sleep_only {
        argv.push("--sleep-only".into());
    }
    if let Some(f) = feed {
        argv.push("--feed".into());
        argv.push(f.display().to_string());
    }
    let _ = std::fs::remove_file(json);
    runner.run_to_end(&argv, Duration::from_secs_f64(shape.seconds + 60.0))?;
    let text =
        std::fs::read_to_string(json).map_err(|e| crate::BenchError::io("reading", json, e))?;
    let raw: serde_json::Value = serde_json::from_str(&text).map_err(|source| {
        crate::BenchError::Report(headroom_report::ReportError::Json {
            path: json.to_path_buf(),
            source,
        })
    })?;
    Ok(LoadMetrics::from_value(&raw))
}

/// A measurement at `qps` with the load generator's corrections until valid: the valid run's
/// metrics, or `None` (printed) when no run was valid.
fn valid_probe(
    runner: &Runner,
    dir: &Path,
    name: &str,
    addr: SocketAddr,
    qps: f64,
    seconds: f64,
) -> Result<Option<LoadMetrics>> {
    Ok(probe_outcome(runner, dir, name, addr, qps, seconds)?.ok())
}

/// [`valid_probe`] with why there is no valid run: `Err(None)` where the failure was the LC's
/// (beyond its capacity: [`validity::server_limited`]), `Err(Some(reason))` where the instrument
/// could not measure the rate validly here (unknown, not slow).
fn probe_outcome(
    runner: &Runner,
    dir: &Path,
    name: &str,
    addr: SocketAddr,
    qps: f64,
    seconds: f64,
) -> Result<std::result::Result<LoadMetrics, Option<String>>> {
    let json = dir.join(format!("probe-{name}.json"));
    let shape = runner.shape_for(qps, seconds);
    let m = validity::measure_valid(shape, runner.placement.loadgen_threads(), |s| {
        load_once(runner, addr, qps, s, &json, None, false)
    })?;
    let line = |m: &LoadMetrics| {
        format!(
            "  {name} probe {qps:>8.0} QPS: achieved {:>8.0}, p99 {} µs",
            m.achieved_qps,
            m.percentile_us(99.0)
                .map_or("–".into(), |v| format!("{v:.0}"))
        )
    };
    match m.valid() {
        Some(a) => {
            println!("{}", line(&a.metrics));
            Ok(Ok(a.metrics.clone()))
        }
        None => {
            let why = validity::short_reason(&m.last().metrics);
            println!("{}  INVALID: {why} (not used)", line(&m.last().metrics));
            if validity::server_limited(&m.last().metrics) {
                Ok(Err(None))
            } else {
                Ok(Err(Some(format!(
                    "{qps:.0} QPS: no valid run here ({why})"
                ))))
            }
        }
    }
}

/// Capacity alone: the highest rate (doubling from 5000 QPS, then bisected) a valid run holds
/// with p99 within the knee (10 × the low-load p99, at least 1 ms). An invalid run is not held
/// where the failure was the LC's; where it was the instrument's the rate is unknown here and
/// the search stops there (the capacity is then a lower bound, said so).
fn capacity(
    runner: &Runner,
    dir: &Path,
    name: &str,
    addr: SocketAddr,
    flags: &Flags,
) -> Result<f64> {
    let s = flags.probe_s();
    let low = valid_probe(runner, dir, name, addr, 2000.0, s)?
        .and_then(|m| m.percentile_us(99.0))
        .unwrap_or(100.0);
    let knee = (10.0 * low).max(1000.0);
    let holds = |q: f64| -> Result<crate::record::Outcome> {
        Ok(match probe_outcome(runner, dir, name, addr, q, s)? {
            Ok(m) => m.holds(q, 99.0, knee).into(),
            Err(None) => crate::record::Outcome::NotHeld,
            Err(Some(why)) => crate::record::Outcome::Unknown(why),
        })
    };
    let search = crate::record::capacity_search(5000.0, 8, if flags.quick { 2 } else { 4 }, holds)?;
    if search.qps <= 0.0 {
        return Err(ToolError::Measurement(match &search.unknown {
            Some((_, why)) => format!(
                "LC {name} alone: capacity unknown here ({why}): give --capacity-{name}-qps"
            ),
            None => format!(
                "LC {name} alone did not hold 5000 QPS validly within p99 ≤ {knee:.0} µs: give --capacity-{name}-qps"
            ),
        }));
    }
    if let Some((q, why)) = &search.unknown {
        println!(
            "  {name}: capacity at least {:.0} QPS, unknown here from {q:.0} QPS ({why})",
            search.qps
        );
    }
    Ok(search.qps.round())
}

/// The SLO: the p99 alone at the peak load × the factor (median of the valid probes).
fn slo(
    runner: &Runner,
    dir: &Path,
    name: &str,
    addr: SocketAddr,
    peak_qps: f64,
    flags: &Flags,
) -> Result<(f64, String)> {
    let mut tails = Vec::new();
    for _ in 0..if flags.quick { 1 } else { 3 } {
        if let Some(m) = valid_probe(runner, dir, name, addr, peak_qps, flags.probe_s() * 2.0)? {
            tails.extend(m.percentile_us(99.0));
        }
    }
    let med = stats::median(&tails).ok_or_else(|| {
        ToolError::Measurement(format!(
            "LC {name} alone at its peak {peak_qps:.0} QPS: no valid probe; give --slo-{name}-us"
        ))
    })?;
    Ok((
        (flags.slo_factor * med).round(),
        format!(
            "{} × its p99 alone at its peak {peak_qps:.0} QPS ({med:.0} µs)",
            flags.slo_factor
        ),
    ))
}

/// BE alone on its CPUs: ops/s (the EMU denominator), as `bench colocation`'s solo baseline.
fn be_alone(runner: &Runner, dir: &Path, be: &runner::BeSpec, seconds: f64) -> Result<f64> {
    let progress = dir.join("be-alone.progress.jsonl");
    let _ = std::fs::remove_file(&progress);
    let mut p = runner.start_antagonist(be, &progress)?;
    let ran = runner::run_for(&mut p, seconds);
    p.stop();
    ran?;
    let samples = read_progress(&progress);
    let rate = samples
        .first()
        .zip(samples.last())
        .and_then(|(a, z)| stats::counter_rate(&samples, a.0, z.0))
        .filter(|r| *r > 0.0)
        .ok_or_else(|| {
            ToolError::Measurement(format!(
                "`{}` wrote no usable progress to {} in {seconds} s",
                p.command,
                progress.display()
            ))
        })?;
    let per_cpu = runner::progress_cpu_span(&progress).and_then(|(a, z)| {
        let cpu = z.1 - a.1;
        (cpu > 0.05).then(|| (z.0 - a.0) / cpu)
    });
    Ok(per_cpu.map_or(rate, |p| (p * be.threads.max(1) as f64).max(rate)))
}

mod run;

pub fn run(out: Option<PathBuf>, flags: Flags) -> Result<()> {
    flags.validate()?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        return Err(ToolError::Needs {
            tool: TOOL,
            need: format!("2 CPUs (the load generators' and the services'); this host has {cpus}"),
        });
    }
    let dir = match &out {
        Some(d) => d.clone(),
        None => {
            std::env::temp_dir().join(format!("headroom-bench-multi-lc-{}", std::process::id()))
        }
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bin = std::env::current_exe().context("locating the headroom binary")?;
    let placement = Placement::default_for(cpus);
    // The load generators stay normal tasks, as in every bench: a real-time client that polls
    // most of a second is throttled by the kernel's real-time budget (docs/bench.md).
    let runner = Runner::new(bin, placement.clone(), dir.join("logs"));
    println!("{TOOL}: {}", placement.describe());
    println!("load generators: normal scheduler, one per LC");
    let mut notes = Vec::new();
    if placement.loadgen.len() < 2 {
        // measured on the 2-vCPU VM: every window of both services failed its self-checks
        let why = format!(
            "{cpus} CPUs: the two load generators share CPU {}; expect windows that fail their \
             self-checks (4 or more CPUs give each its own)",
            runner::cpu_arg(&placement.loadgen)
        );
        println!("note: {why}");
        notes.push(why);
    }
    notes.push("load generators under the normal scheduler (as in every bench)".to_string());
    // The services.
    let (a_proc, a_addr, a_server) = match memcached_path(&flags.memcached) {
        Some(m) => {
            let (p, addr) = start_memcached(&runner, &m)?;
            (p, addr, "memcached".to_string())
        }
        None => {
            let why =
                "memcached not found on PATH (or --memcached): LC a is a second `headroom serve`";
            println!("note: {why}");
            notes.push(why.to_string());
            let (p, addr) = runner.start_serve(&ServeSpec {
                threads: 1,
                ..Default::default()
            })?;
            (p, addr, "headroom serve".to_string())
        }
    };
    let (b_proc, b_addr) = runner.start_serve(&ServeSpec {
        threads: 1,
        ..Default::default()
    })?;
    runner.preload(a_addr)?;
    runner.preload(b_addr)?;
    let mut lcs = Vec::new();
    for (name, proc, addr, server, cap, slo_flag) in [
        (
            "a",
            a_proc,
            a_addr,
            a_server,
            flags.capacity_a_qps,
            flags.slo_a_us,
        ),
        (
            "b",
            b_proc,
            b_addr,
            "headroom serve".to_string(),
            flags.capacity_b_qps,
            flags.slo_b_us,
        ),
    ] {
        let (capacity_qps, capacity_source) = match cap {
            Some(c) => (c, format!("set with --capacity-{name}-qps")),
            None => {
                println!("LC {name} ({server}) alone: capacity ...");
                (
                    capacity(&runner, &dir, name, addr, &flags)?,
                    "highest rate a valid run held with p99 ≤ max(10 × low-load p99, 1 ms)".into(),
                )
            }
        };
        let peak = capacity_qps * flags.hi_pct / 100.0;
        let (slo_us, slo_source) = match slo_flag {
            Some(s) => (s, format!("set with --slo-{name}-us")),
            None => slo(&runner, &dir, name, addr, peak, &flags)?,
        };
        println!(
            "LC {name} ({server}): capacity {capacity_qps:.0} QPS, SLO p99 ≤ {slo_us:.0} µs ({slo_source})"
        );
        let base = LcBase {
            name: name.into(),
            server,
            command: proc.command.clone(),
            capacity_qps,
            capacity_source,
            slo_us,
            slo_source,
            addr,
            pid: proc.pid(),
        };
        lcs.push(Lc { proc, base });
    }
    let n = flags.windows();
    let (sa, sb) = schedules(n, flags.lo_pct / 100.0, flags.hi_pct / 100.0);
    let be = be_spec(&flags.be, placement.server.len().max(1));
    let mut ctx = run::Ctx {
        runner: &runner,
        dir: &dir,
        flags: &flags,
        lcs: &mut lcs,
        schedule: vec![sa, sb],
        be,
        notes: &mut notes,
    };
    let mut summaries = Vec::new();
    let mut all_windows = Vec::new();
    for policy in flags.policies.clone() {
        let windows = ctx.policy_run(&policy)?;
        summaries.push(summarize(&policy, &windows));
        all_windows.extend(windows);
    }
    for lc in lcs.iter_mut() {
        lc.proc.stop();
    }
    println!("\n{}", summary_table(&summaries));
    let report = json!({
        "tool": TOOL,
        "window_s": flags.window_s,
        "windows_per_policy": n,
        "schedule": format!("a: {hi}% -> {lo}% -> {hi}% of its capacity, b: {lo}% -> {hi}% -> {lo}% (half sine, opposite)", lo = flags.lo_pct, hi = flags.hi_pct),
        "latency_source": flags.latency,
        "placement": placement.describe(),
        "lcs": lcs.iter().map(|l| &l.base).collect::<Vec<_>>(),
        "be": flags.be,
        "summary": summaries,
        "windows": all_windows,
        "notes": notes,
        "invalid_windows": "a window whose load run failed its self-checks (or did not run) is invalid for that LC: counted apart, never as ok",
    });
    let path = dir.join("bench-multi-lc.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&report).context("encoding the figures")?,
    )
    .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}
