//! `headroom bench prober`: does the agent's latency sensor measure the LC, or itself?
//!
//! The check (#30): with SCHED_FIFO refused to the agent and a CPU hog at equal
//! priority on its CPU, ≥ 95% of the agent's latency windows are accepted, and each window's
//! p99 is within 20% (or 30 µs) of an independent load generator's p99 of the same LC over
//! the same seconds — for the prober and for the kernel sensor, side by side. Per source
//! (`probe`: the agent's prober, timed from kernel transmit to kernel receive stamps;
//! `kernel`: the passive BPF sensor of the LC's own requests, no probes) and case (`hog`: a
//! spinning antagonist, a normal CFS task, on the agent's CPU; `no-hog`: nothing beside it):
//! - `headroom serve --threads 1` on the last CPU (the LC);
//! - `headroom agent --dry-run` (`blind` ticking every 100 ms, writing nothing) on CPU 0 at nice 0 with
//!   `--window-s` windows; with `--no-rt`, started inside a `cpu` group without a real-time
//!   budget (a new cgroup-v1 group has `cpu.rt_runtime_us = 0`), or without CAP_SYS_NICE where
//!   there is no such group, so its SCHED_FIFO is refused (checked before the run);
//! - after 2 s, `headroom load -c 1 -d 16 -q QPS --hdr …` on CPU 0, under `chrt -f 1` where
//!   the bench itself may use it (the reference instrument: it preempts the hog, so its own
//!   wake-ups do not inflate what it reports). It sends on schedule whatever is in flight, as
//!   the prober does, busy-polling only the few microseconds before each send
//!   (`--loadgen-sleep-only` makes it sleep); with kernel transmit stamps a probe it delays
//!   is delayed, not mismeasured;
//! - every agent window lying wholly inside the load run (its end = the decision's wall time −
//!   the latency's age) against the load generator's one-second intervals inside the same
//!   seconds (`windows`), and the slots in which the agent published no window (refused).
//!
//! With `--peer PATH` mutilate runs too, in blocking mode (`-B`), beside `headroom load` at the
//! same rate, CPU and priority; its p99 over the run (the order statistic of its saved samples)
//! is set beside the median of the agent's windows.
//!
//! The kernel sensor times from the request's arrival in the LC's socket to the LC's reply:
//! it leaves out both loopback crossings and the client's own wake-up, which a client-side
//! instrument includes; the 30 µs floor of the bound is what allows for them.

mod case;
mod cost;
mod rt;
pub mod windows;

use std::path::PathBuf;

use super::error::{Context, Result, ToolError};

use super::flag_values::{positive_at_most, positive_f64, seconds_in, FlagValueError};
use crate::runner::{Placement, Runner};
use case::Row;
use rt::AgentRt;
use serde::Serialize;
use windows::{AGREE_FLOOR_US, AGREE_FRACTION};

/// The prober's FIFO priority (`safety.agent_fifo_priority`'s default): the reference load
/// generator runs at the same one.
const PROBER_FIFO_PRIORITY: u8 = 1;
/// Requests in flight the load generators may have on their one connection: enough that none
/// waits for a reply before its scheduled send (the prober's own limit is higher still).
const LOAD_DEPTH: u32 = 16;
/// The load generator runs this much longer than the agent's windows need, so that its warmup
/// and its end lie outside the windows compared.
const LOAD_MARGIN_S: f64 = 5.0;

#[derive(clap::Parser, Debug)]
#[command(name = "headroom bench prober", no_binary_name = true)]
pub struct Flags {
    /// Seconds of each load run (the agent's windows inside it are compared), 5 to 3600
    #[arg(long, default_value_t = 120.0, value_parser = seconds)]
    seconds: f64,
    /// The agent's latency window (`lc.slo.window_s`), seconds, 1 to 3600
    #[arg(long, default_value_t = 10.0, value_parser = window)]
    window_s: f64,
    /// The independent load generator's rate (the LC's only load apart from the prober)
    #[arg(long, default_value_t = 500.0, value_parser = positive_f64)]
    qps: f64,
    /// The independent load generator's connections (one thread), 1 to 256 or `auto` (sized
    /// from the measured round trip, as `headroom load -c auto`): more than 1 for rates of
    /// thousands, where one connection's requests queue behind each other at the LC
    #[arg(long, default_value = "1", value_parser = connection_count)]
    connections: Connections,
    /// Requests in flight per connection (default 16: on schedule whatever is in flight). The
    /// kernel sensor times the first request of a pipelined burst only (it parses no protocol):
    /// at rates of thousands give `--connections N --depth 1`, as RPC clients send
    #[arg(long, default_value_t = LOAD_DEPTH, value_parser = clap::value_parser!(u32).range(1..=1024))]
    depth: u32,
    /// The prober's rate, probes per second (at most 10000)
    #[arg(long, default_value_t = 500.0, value_parser = probe_hz)]
    probe_hz: f64,
    /// The SLO target the agent is given, µs
    #[arg(long, default_value_t = 1000.0, value_parser = positive_f64)]
    slo_us: f64,
    /// The agent's latency sources, comma-separated: probe, kernel
    #[arg(long, value_delimiter = ',', default_value = "probe,kernel")]
    sources: Vec<Source>,
    /// The LC: `serve` (headroom serve, one thread) or `memcached` (one worker thread; from
    /// PATH). Either on the last CPU
    #[arg(long, value_enum, default_value = "serve")]
    lc: Lc,
    /// Runs of each source and case (each with its own LC, agent and load generator)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    runs: u32,
    /// Cases, comma-separated: hog, no-hog
    #[arg(long, value_delimiter = ',', default_value = "hog,no-hog")]
    cases: Vec<Case>,
    /// A mutilate binary: also run it in blocking mode (`-B`) beside `headroom load`, same
    /// rate, same CPU and priority, as a second independent load generator. Not built or
    /// shipped here.
    #[arg(long, value_name = "PATH")]
    peer: Option<PathBuf>,
    /// Make the reference load generator sleep to each send instead of busy-polling the
    /// last microseconds before it (on a 2-vCPU VM its sends then ran ~250 µs late, and its
    /// per-window figures, timed from the scheduled send, carried that lateness)
    #[arg(long)]
    loadgen_sleep_only: bool,
    /// Refuse SCHED_FIFO to the agent as many hosts do: start it in a cpu group without a
    /// real-time budget (cgroup v1 `cpu.rt_runtime_us = 0`) or, with no such group, without
    /// CAP_SYS_NICE. The reference load generator keeps FIFO where the bench may use it
    #[arg(long)]
    no_rt: bool,
    /// Only measure what a probe costs: the prober in this process at `--probe-hz` for this
    /// many seconds against a loopback stand-in LC; prints its share of a CPU and its CPU
    /// time per probe, and runs no case
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    cost: Option<f64>,
}

/// The reference load generator's connections.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Connections {
    /// `-c auto`: sized from the measured round trip and grown where the LC stalls.
    Auto,
    Fixed(u32),
}

impl std::fmt::Display for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connections::Auto => f.write_str("auto"),
            Connections::Fixed(n) => write!(f, "{n}"),
        }
    }
}

fn connection_count(s: &str) -> Result<Connections, FlagValueError> {
    if s == "auto" {
        return Ok(Connections::Auto);
    }
    match s.parse::<u32>() {
        Ok(n @ 1..=256) => Ok(Connections::Fixed(n)),
        _ => Err(FlagValueError::NotACount { value: s.into() }),
    }
}

/// The load run is 5 s to 1 h.
fn seconds(s: &str) -> Result<f64, FlagValueError> {
    seconds_in(s, 5.0, 3600.0)
}

/// The agent takes windows of 1 s to 1 h.
fn window(s: &str) -> Result<f64, FlagValueError> {
    seconds_in(s, 1.0, 3600.0)
}

fn probe_hz(s: &str) -> Result<f64, FlagValueError> {
    positive_at_most(s, 10_000.0, "probes/s (the agent's most)")
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Source {
    /// The agent's prober (`[lc.latency] source = "probe"`)
    Probe,
    /// The passive in-kernel sensor of the LC's own requests (`source = "kernel"`), alone
    Kernel,
}

/// The LC the sensors measure.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Lc {
    /// `headroom serve --threads 1`
    Serve,
    /// memcached `-t 1` from PATH
    Memcached,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Case {
    /// A spinning antagonist (normal CFS task) on the agent's CPU
    Hog,
    /// Nothing else on the agent's CPU
    NoHog,
}

/// A run's name (`probe/hog`): static, for the error that names it.
fn run_name(source: Source, case: Case) -> &'static str {
    match (source, case) {
        (Source::Probe, Case::Hog) => "probe/hog",
        (Source::Probe, Case::NoHog) => "probe/no-hog",
        (Source::Kernel, Case::Hog) => "kernel/hog",
        (Source::Kernel, Case::NoHog) => "kernel/no-hog",
    }
}

pub fn run(out: Option<PathBuf>, flags: Flags) -> Result<()> {
    if let Some(s) = flags.cost {
        return cost::run(s, flags.probe_hz);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        return Err(ToolError::Needs {
            tool: "headroom bench prober",
            need: format!("2 CPUs (the agent's and the LC's); this host has {cpus}"),
        });
    }
    if !headroom_host::process::is_root() {
        return Err(ToolError::Needs {
            tool: "headroom bench prober",
            need: "root (the kernel sensor's BPF, the instruments' FIFO class)".into(),
        });
    }
    if flags.peer.is_some() && flags.connections == Connections::Auto {
        return Err(ToolError::Measurement(
            "--peer runs mutilate with the same connections: give --connections a number (mutilate has no auto)".into(),
        ));
    }
    if flags.seconds < 2.0 * flags.window_s + LOAD_MARGIN_S {
        return Err(ToolError::Measurement(format!(
            "--seconds {} holds no whole --window-s {} window after the load generator's warmup: give at least {} s",
            flags.seconds,
            flags.window_s,
            2.0 * flags.window_s + LOAD_MARGIN_S
        )));
    }
    let dir = match &out {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("headroom-bench-prober-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bin = std::env::current_exe().context("locating the headroom binary")?;
    let placement = Placement {
        loadgen: vec![0],
        server: vec![cpus - 1],
        be: vec![],
    };
    let runner = Runner::new(bin, placement, dir.join("logs"));
    let agent_rt = if flags.no_rt {
        AgentRt::refuse()?
    } else {
        AgentRt::Allowed
    };
    let instruments_fifo = rt::fifo_allowed_here();
    println!(
        "headroom bench prober: LC ({}, 1 thread) on CPU {}; on CPU 0 the agent (a window of the last {} s published every second, SCHED_FIFO {}) and the reference load generator ({} QPS, {}); {} s per run, {} run(s) each",
        match flags.lc {
            Lc::Serve => "headroom serve",
            Lc::Memcached => "memcached",
        },
        cpus - 1,
        flags.window_s,
        agent_rt.describe(),
        flags.qps,
        if instruments_fifo {
            format!("FIFO {PROBER_FIFO_PRIORITY}")
        } else {
            "SCHED_OTHER: FIFO refused to the bench itself, so the hog can delay its reads".into()
        },
        flags.seconds,
        flags.runs,
    );
    let mut rows = Vec::new();
    let mut result = Ok(());
    'runs: for &source in &flags.sources {
        for &case in &flags.cases {
            let name = run_name(source, case);
            for run in 1..=flags.runs {
                match case::run(
                    &runner,
                    &dir,
                    &flags,
                    (source, case, run),
                    &agent_rt,
                    instruments_fifo,
                ) {
                    Ok(row) => {
                        print_row(name, &row);
                        rows.push(row);
                    }
                    Err(e) => {
                        result = Err(ToolError::Case {
                            case: name,
                            source: Box::new(e),
                        });
                        break 'runs;
                    }
                }
            }
            if flags.runs > 1 {
                print_tally(name, rows.iter().filter(|r| r.is(source, case)));
            }
        }
    }
    agent_rt.remove();
    result?;
    let report = serde_json::json!({
        "lc": flags.lc,
        "runs": flags.runs,
        "seconds": flags.seconds,
        "window_s": flags.window_s,
        "qps": flags.qps,
        "probe_hz": flags.probe_hz,
        "slo_us": flags.slo_us,
        "agent_sched_fifo": agent_rt.describe(),
        "reference_fifo": instruments_fifo,
        "bound": format!("|agent − load generator| ≤ max({:.0}% of the load generator's p99, {AGREE_FLOOR_US} µs), per window", AGREE_FRACTION * 100.0),
        "target": "≥ 95% of the agent's once-a-second windows inside the run published (not refused) and ≥ 95% of them within the bound",
        "rows": rows,
    });
    let path = dir.join("bench-prober.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&report).context("encoding the figures")?,
    )
    .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    if out.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// Over the runs of one source and case: how many load runs passed their self-checks, how many
/// runs met the window target and how many agreed over the whole run.
fn print_tally<'a>(name: &str, rows: impl Iterator<Item = &'a case::Row>) {
    let (mut n, mut valid, mut met, mut agreed) = (0, 0, 0, 0);
    for r in rows {
        n += 1;
        valid += usize::from(r.loadgen_valid);
        met += usize::from(r.windows.meets_target());
        agreed += usize::from(r.run_level.within_bound);
    }
    println!(
        "{name:<13} over {n} runs: load generator valid in {valid}, window target met in {met}, whole-run p99 within bound in {agreed}"
    );
}

fn print_row(name: &str, r: &Row) {
    let w = &r.windows;
    println!(
        "{name:<13} windows published {}/{} ({:.0}%), within bound {}/{} ({:.0}%) → {} | agent p99 median {} µs, load generator {} µs, |difference| median {} max {} µs | sources {:?}",
        w.accepted,
        w.slots,
        w.accepted_pct,
        w.within_bound,
        w.compared,
        w.within_pct,
        if w.meets_target() { "target met" } else { "target NOT met" },
        us(w.agent_p99_median_us),
        us(w.loadgen_p99_median_us),
        us(w.difference_median_us),
        us(w.difference_max_us),
        w.sources,
    );
    let [lo, hi] = r.loadgen_p99_ci_us;
    println!(
        "{:<13} load generator over its run: p99 {:.1} µs from actual send (95% CI {lo:.0}–{hi:.0}), {:.1} µs from scheduled send, send lag p99 {:.1} µs, {} samples, {}",
        "",
        r.loadgen_p99_us,
        r.loadgen_scheduled_p99_us,
        r.loadgen_send_lag_p99_us,
        r.loadgen_count,
        if r.loadgen_valid {
            "self-checks passed".to_string()
        } else {
            format!("self-checks FAILED: {}", r.loadgen_failed_checks.join("; "))
        },
    );
    let run = &r.run_level;
    println!(
        "{:<13} over the whole run: agent p99 median {} µs vs load generator {:.1} µs from actual send → {}",
        "",
        us(run.agent_p99_median_us),
        run.loadgen_p99_actual_send_us,
        if run.within_bound { "within bound" } else { "OUTSIDE bound" },
    );
    if let Some(m) = &r.mutilate {
        println!(
            "{:<13} mutilate -B p99 {:.1} µs ({} samples) vs agent p99 median → {}",
            "",
            m.p99_us,
            m.samples,
            if m.within_bound {
                "within bound"
            } else {
                "OUTSIDE bound"
            },
        );
    }
}
