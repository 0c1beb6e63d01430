//! `headroom bench prober`: does the agent's latency prober measure the LC, or itself?
//!
//! The issue's check: with a CPU hog sharing the prober's CPU and an idle LC, the prober's p99
//! must stay within 20% (or 30 µs) of an independent load generator's p99 of the same server at
//! the same time. Per case (`hog`: a spinning antagonist, a normal CFS task, on the prober's CPU;
//! `no-hog`: nothing beside it):
//! - `headroom serve --threads 1` on the last CPU (the LC, idle apart from the two instruments);
//! - `headroom agent --dry-run` (`policy none`, so it changes nothing) on CPU 0 with the prober
//!   at `--probe-hz` and an SLO window of `--seconds`;
//! - after 2 s, `headroom load -c 1 -d 16 -q QPS -t SECONDS+10 --sleep-only` on CPU 0 under
//!   `chrt -f` at the prober's own FIFO priority (neither instrument preempts the other; both
//!   preempt the hog). Like the prober it sends on schedule whatever is in flight (`-d 16`),
//!   and it does not busy-poll (a busy-polling FIFO thread holds the CPU the prober's due send
//!   waits for; `--loadgen-busy-poll` lets it);
//! - the prober's window that ended last at least 1 s before the load run did (its end = the
//!   decision's wall time − the latency's age), so that it lies wholly inside the load run —
//!   a window reaching back before the load generator started would hold seconds it never saw
//!   (the hog's and the agent's start) — against the load generator's p99 over its run, timed
//!   like the prober's from each request's actual send (`read_uncorrected`), with its
//!   scheduled-send p99 and 95% interval beside.
//!
//! With `--peer PATH` mutilate runs too, in blocking mode (`-B`, the issue's reference), beside
//! `headroom load` at the same rate, CPU and priority; its p99 is the order statistic of its
//! saved samples.
//!
//! A load generator p99 needs ≥ 1000 independent samples to be trusted: at 500 QPS on this VM
//! that is ~240 s, hence the default. Needs root for the FIFO classes; the agent writes nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{Context, Result, ToolError};

use super::host::positive_f64;
use crate::runner::{free_port, now_unix_ms, Placement, Proc, Runner, ServeSpec};
use headroom_types::decision::DecisionRecord;
use headroom_types::load_result::LoadResult;
use serde::Serialize;

/// The prober's FIFO priority (`safety.agent_fifo_priority`'s default): the load generator runs
/// at the same one.
const PROBER_FIFO_PRIORITY: u8 = 1;
/// Requests in flight the load generators may have on their one connection: enough that none
/// waits for a reply before its scheduled send (the prober's own limit is higher still).
const LOAD_DEPTH: u32 = 16;
/// The issue's agreement bound: 20% of the load generator's p99, or 30 µs, whichever is larger.
const AGREE_FRACTION: f64 = 0.20;
const AGREE_FLOOR_US: f64 = 30.0;
/// The load generator runs this much longer than the prober's window, so that a window can lie
/// wholly inside its run.
const LOAD_MARGIN_S: f64 = 10.0;

#[derive(clap::Parser, Debug)]
#[command(name = "headroom bench prober", no_binary_name = true)]
pub struct Flags {
    /// Seconds of the load generator's run (and of the prober's window), 5 to 3600
    #[arg(long, default_value_t = 240.0, value_parser = seconds)]
    seconds: f64,
    /// The independent load generator's rate (an idle LC)
    #[arg(long, default_value_t = 500.0, value_parser = positive_f64)]
    qps: f64,
    /// The prober's rate, probes per second (at most 10000)
    #[arg(long, default_value_t = 500.0, value_parser = probe_hz)]
    probe_hz: f64,
    /// The SLO target the agent is given, µs (its prober refuses windows whose own send lag p99
    /// exceeds 20% of it, at least 100 µs)
    #[arg(long, default_value_t = 1000.0, value_parser = positive_f64)]
    slo_us: f64,
    /// Cases, comma-separated: hog, no-hog
    #[arg(long, value_delimiter = ',', default_value = "hog,no-hog")]
    cases: Vec<Case>,
    /// A mutilate binary: also run it in blocking mode (`-B`, the issue's reference: its
    /// latency runs from its send to its thread's read) beside `headroom load`, same rate, same
    /// CPU and FIFO priority, as a second independent load generator. Not built or shipped here.
    #[arg(long, value_name = "PATH")]
    peer: Option<PathBuf>,
    /// Let `headroom load` busy-poll before its sends (its default elsewhere). Off here: on the
    /// prober's CPU at the prober's FIFO priority, a busy-polling load generator holds the CPU
    /// the prober's due send waits for, so the prober's request goes out right behind the load
    /// generator's and queues behind it at the LC — a collision one instrument causes the other
    #[arg(long)]
    loadgen_busy_poll: bool,
    /// No real-time priority for the instruments (`chrt` is not used): run the whole bench
    /// inside a cpu group without an RT budget (a new cgroup-v1 `cpu` group has
    /// `cpu.rt_runtime_us = 0`), so the agent's SCHED_FIFO is refused as on many hosts
    #[arg(long)]
    no_rt: bool,
}

/// The prober's window is the run's length: the agent takes 5 s to 1 h (`lc.slo.window_s`).
fn seconds(s: &str) -> Result<f64, String> {
    positive_f64(s).and_then(|v| {
        if (5.0..=3600.0).contains(&v) {
            Ok(v)
        } else {
            Err(format!("{s:?} is outside 5..=3600 s"))
        }
    })
}

fn probe_hz(s: &str) -> Result<f64, String> {
    positive_f64(s).and_then(|v| {
        if v <= 10_000.0 {
            Ok(v)
        } else {
            Err(format!("{s:?} is above the agent's 10000 probes/s"))
        }
    })
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Case {
    /// A spinning antagonist (normal CFS task) on the prober's CPU
    Hog,
    /// Nothing else on the prober's CPU
    NoHog,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Hog => "hog",
            Case::NoHog => "no-hog",
        }
    }
}

/// The prober's window picked from the agent's decision log.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
struct ProbeWindow {
    p99_us: f64,
    /// Wall-clock end of the window, ms since the epoch.
    end_unix_ms: u64,
}

/// The window that ended last at or before `load_end_ms` (decision time − the latency's age),
/// if it ended within `max_gap_ms` of it.
fn window_at_end(
    records: &[DecisionRecord],
    load_end_ms: u64,
    max_gap_ms: u64,
) -> Option<ProbeWindow> {
    records
        .iter()
        .filter_map(|r| {
            let p99_us = r.observation.lc_latency_us?;
            let age = r.observation.lc_latency_age_ms?;
            let end_unix_ms = r.t_unix_ms.checked_sub(age)?;
            Some(ProbeWindow {
                p99_us,
                end_unix_ms,
            })
        })
        .filter(|w| w.end_unix_ms <= load_end_ms && load_end_ms - w.end_unix_ms <= max_gap_ms)
        .max_by_key(|w| w.end_unix_ms)
}

/// Whether the prober's p99 is within the issue's bound of the load generator's.
fn agrees(probe_us: f64, loadgen_us: f64) -> bool {
    (probe_us - loadgen_us).abs() <= (AGREE_FRACTION * loadgen_us).max(AGREE_FLOOR_US)
}

/// One case's figures.
#[derive(Debug, Serialize)]
struct Row {
    case: Case,
    probe_p99_us: f64,
    probe_window_end_unix_ms: u64,
    /// Windows the prober refused during the case (its own send lag over the bound).
    probe_windows_refused: usize,
    /// The load generator's p99 from each request's actual send (the prober's definition).
    loadgen_p99_us: f64,
    loadgen_p99_ci_us: [f64; 2],
    /// The load generator's p99 from each request's scheduled send (its headline figure).
    loadgen_scheduled_p99_us: f64,
    loadgen_send_lag_p99_us: f64,
    loadgen_count: u64,
    loadgen_valid: bool,
    loadgen_failed_checks: Vec<String>,
    difference_pct: f64,
    within_bound: bool,
    /// With `--peer`: mutilate -B's p99 over its run (its own samples, exact order statistic).
    #[serde(skip_serializing_if = "Option::is_none")]
    mutilate: Option<PeerFigures>,
}

#[derive(Debug, Serialize)]
struct PeerFigures {
    p99_us: f64,
    samples: usize,
    difference_pct: f64,
    within_bound: bool,
}

/// The `q`-quantile of `v` (sorted in place): the ⌈q·n⌉-th smallest.
fn order_statistic(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// mutilate's `--save` file: one `start_time latency_us` line per request.
fn mutilate_latencies(path: &Path) -> Result<Vec<f64>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect())
}

pub fn run(out: Option<PathBuf>, flags: Flags) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        return Err(ToolError::Needs {
            tool: "headroom bench prober",
            need: format!("2 CPUs (the prober's and the LC's); this host has {cpus}"),
        });
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(ToolError::Needs {
            tool: "headroom bench prober",
            need: "root (SCHED_FIFO for the prober and the load generator)".into(),
        });
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
    println!(
        "headroom bench prober: LC (serve, 1 thread) on CPU {}; the agent's prober ({} Hz, FIFO {}) and the load generator ({} QPS, FIFO {}) on CPU 0; {} s each",
        cpus - 1,
        flags.probe_hz,
        PROBER_FIFO_PRIORITY,
        flags.qps,
        PROBER_FIFO_PRIORITY,
        flags.seconds
    );
    let mut rows = Vec::new();
    for &case in &flags.cases {
        let row = run_case(&runner, &dir, &flags, case).map_err(|e| ToolError::Case {
            case: case.name(),
            source: Box::new(e),
        })?;
        print_row(&row);
        rows.push(row);
    }
    let report = serde_json::json!({
        "seconds": flags.seconds,
        "qps": flags.qps,
        "probe_hz": flags.probe_hz,
        "slo_us": flags.slo_us,
        "bound": format!("|prober − load generator| ≤ max({:.0}% of the load generator's p99, {AGREE_FLOOR_US} µs)", AGREE_FRACTION * 100.0),
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

fn print_row(r: &Row) {
    let [lo, hi] = r.loadgen_p99_ci_us;
    println!(
        "{:<7} prober p99 {:>7.1} µs | load generator p99 {:>7.1} µs (95% CI {lo:.0}–{hi:.0}; from scheduled send {:.1} µs; send lag p99 {:.1} µs; {} samples; {}) | difference {:+.1}% → {} | prober windows refused: {}",
        r.case.name(),
        r.probe_p99_us,
        r.loadgen_p99_us,
        r.loadgen_scheduled_p99_us,
        r.loadgen_send_lag_p99_us,
        r.loadgen_count,
        if r.loadgen_valid {
            "self-checks passed".to_string()
        } else {
            format!("self-checks FAILED: {}", r.loadgen_failed_checks.join("; "))
        },
        r.difference_pct,
        if r.within_bound { "within bound" } else { "OUTSIDE bound" },
        r.probe_windows_refused,
    );
    if let Some(m) = &r.mutilate {
        println!(
            "{:<7} prober p99 {:>7.1} µs | mutilate -B p99 {:>7.1} µs ({} samples) | difference {:+.1}% → {}",
            r.case.name(),
            r.probe_p99_us,
            m.p99_us,
            m.samples,
            m.difference_pct,
            if m.within_bound { "within bound" } else { "OUTSIDE bound" },
        );
    }
}

fn run_case(runner: &Runner, dir: &Path, flags: &Flags, case: Case) -> Result<Row> {
    let name = case.name();
    let (mut serve, addr) = runner.start_serve(&ServeSpec {
        threads: 1,
        ..ServeSpec::default()
    })?;
    let config = dir.join(format!("agent-{name}.toml"));
    let decisions = dir.join(format!("decisions-{name}.jsonl"));
    let _ = std::fs::remove_file(&decisions);
    std::fs::write(
        &config,
        agent_config(dir, name, serve.pid(), addr, flags, free_port()?),
    )
    .with_context(|| format!("writing {}", config.display()))?;
    let agent_log = dir.join("logs").join("agent.log");
    let agent_log_start = std::fs::metadata(&agent_log).map_or(0, |m| m.len());
    let mut agent = runner.start_agent(&config, &decisions, true)?;
    let mut hog: Option<Proc> = match case {
        Case::Hog => {
            let secs = format!("{:.0}", flags.seconds + 120.0);
            let argv = runner.argv(
                &[0],
                &[],
                &[
                    "antagonist".into(),
                    "spin".into(),
                    "--threads".into(),
                    "1".into(),
                    "--duration".into(),
                    secs,
                ],
            );
            Some(runner.spawn("hog", &argv)?)
        }
        Case::NoHog => None,
    };
    std::thread::sleep(Duration::from_secs(2));
    let json = dir.join(format!("load-{name}.json"));
    let _ = std::fs::remove_file(&json);
    let chrt = if flags.no_rt {
        Vec::new()
    } else {
        vec![
            "chrt".to_string(),
            "-f".into(),
            PROBER_FIFO_PRIORITY.to_string(),
        ]
    };
    let argv = runner.argv(&[0], &chrt, &load_args(flags, &addr.to_string(), &json));
    let mut peer = match &flags.peer {
        Some(bin) => {
            let save = dir.join(format!("mutilate-{name}.save"));
            let _ = std::fs::remove_file(&save);
            let mut argv = vec!["taskset".to_string(), "-c".into(), "0".into()];
            argv.extend(chrt.iter().cloned());
            argv.push(bin.display().to_string());
            argv.extend(
                [
                    "-s",
                    &addr.to_string(),
                    "--noload",
                    "-B",
                    // mutilate segfaults on a bare `exponential`; `:1` is its own default spread
                    "-i",
                    "exponential:1",
                    "-T",
                    "1",
                    "-c",
                    "1",
                    "-d",
                    &LOAD_DEPTH.to_string(),
                    "-q",
                    &format!("{:.0}", flags.qps),
                    "-t",
                    &format!("{:.0}", flags.seconds + LOAD_MARGIN_S),
                    "--save",
                    &save.display().to_string(),
                ]
                .map(String::from),
            );
            Some((runner.spawn("mutilate", &argv)?, save))
        }
        None => None,
    };
    let run = runner.run_to_end(
        &argv,
        Duration::from_secs_f64(flags.seconds + LOAD_MARGIN_S + 60.0),
    );
    let load_end_ms = now_unix_ms();
    if let Some((p, _)) = peer.as_mut() {
        // it started with the load generator and runs as long: give it 30 s to write its file
        for _ in 0..300 {
            if p.exited().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        p.stop();
    }
    agent.stop();
    if let Some(h) = hog.as_mut() {
        h.stop();
    }
    serve.stop();
    run?;
    let text =
        std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    let result: LoadResult =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    // The prober times each reply from its actual send: compare with the load generator's
    // latency timed the same way.
    let loadgen_p99_us = result.read_uncorrected.p99_us;
    let records = read_decisions(&decisions)?;
    let Some(window) = window_at_end(&records, load_end_ms.saturating_sub(1000), 2000) else {
        return Err(ToolError::Measurement(format!(
            "the agent published no prober window ending 1–3 s before the load run's end ({} decisions in {}; its log: {})",
            records.len(),
            decisions.display(),
            agent_log.display()
        )));
    };
    let refused = std::fs::read(&agent_log)
        .map(|b| {
            String::from_utf8_lossy(b.get(agent_log_start as usize..).unwrap_or_default())
                .matches("window refused")
                .count()
        })
        .unwrap_or(0);
    let mutilate = match &peer {
        Some((_, save)) => {
            let mut lat = mutilate_latencies(save)?;
            let Some(p99_us) = order_statistic(&mut lat, 0.99) else {
                return Err(ToolError::Measurement(format!(
                    "mutilate wrote no samples to {}",
                    save.display()
                )));
            };
            Some(PeerFigures {
                p99_us,
                samples: lat.len(),
                difference_pct: 100.0 * (window.p99_us - p99_us) / p99_us,
                within_bound: agrees(window.p99_us, p99_us),
            })
        }
        None => None,
    };
    Ok(Row {
        mutilate,
        case,
        probe_p99_us: window.p99_us,
        probe_window_end_unix_ms: window.end_unix_ms,
        probe_windows_refused: refused,
        loadgen_p99_us,
        loadgen_p99_ci_us: result.read_uncorrected.p99_ci_us,
        loadgen_scheduled_p99_us: result.read.p99_us,
        loadgen_send_lag_p99_us: result.client.send_lag_p99_us,
        loadgen_count: result.read_uncorrected.count,
        loadgen_valid: result.valid,
        loadgen_failed_checks: result
            .checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect(),
        difference_pct: 100.0 * (window.p99_us - loadgen_p99_us) / loadgen_p99_us,
        within_bound: agrees(window.p99_us, loadgen_p99_us),
    })
}

fn read_decisions(path: &Path) -> Result<Vec<DecisionRecord>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{}:{}", path.display(), i + 1))
        })
        .collect()
}

fn agent_config(
    dir: &Path,
    name: &str,
    lc_pid: u32,
    addr: std::net::SocketAddr,
    f: &Flags,
    metrics_port: u16,
) -> String {
    format!(
        r#"# Written by headroom bench prober: {name}
[lc]
name = "serve"
cgroup = "headroom-bench-prober/lc"
pids = [{lc_pid}]

[lc.slo]
percentile = 99.0
target_us = {slo:?}
window_s = {window:?}

[lc.latency]
source = "probe"
protocol = "memcache"
address = "{addr}"
rate_hz = {hz:?}

[[be]]
name = "be"
cgroup = "headroom-bench-prober/be"

[policy]
kind = "none"

[safety]
on_exit = "restore"
state_file = "{state}"

[api]
socket = "{socket}"
metrics = "127.0.0.1:{metrics_port}"
"#,
        slo = f.slo_us,
        window = f.seconds,
        hz = f.probe_hz,
        state = dir.join(format!("agent-{name}.state.json")).display(),
        socket = dir.join(format!("agent-{name}.sock")).display(),
    )
}

/// `headroom load`'s arguments: one connection at the prober's rate for the window and a margin.
fn load_args(flags: &Flags, addr: &str, json: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "load",
        "-s",
        addr,
        "-T",
        "1",
        "-c",
        "1",
        // on schedule whatever is in flight, as the prober sends: at depth 1 a request due while
        // the previous one is unanswered waits for it and is timed from then, so the 1–2% that
        // meet the previous one at the LC (the tail the p99 is made of) would carry that wait in
        // the prober's figure and not in this one
        "-d",
        &LOAD_DEPTH.to_string(),
        "-q",
        &format!("{:.0}", flags.qps),
        "-t",
        &format!("{:.0}", flags.seconds + LOAD_MARGIN_S),
        "--noload",
        "--quiet",
        "--invalid-exit-code",
        "0",
        "--json",
        &json.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    if !flags.loadgen_busy_poll {
        args.push("--sleep-only".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_types::allocation::Allocation;
    use headroom_types::observation::Observation;

    fn record(t_unix_ms: u64, p99: Option<f64>, age_ms: Option<u64>) -> DecisionRecord {
        DecisionRecord {
            t_ms: 0,
            t_unix_ms,
            policy: "none".into(),
            observation: Observation {
                lc_latency_us: p99,
                lc_latency_age_ms: age_ms,
                ..Observation::default()
            },
            allocation: Allocation::default(),
            reason: String::new(),
            state: serde_json::Value::Null,
            binding_lc: None,
            repeat: None,
        }
    }

    /// The reference instrument sends as the prober does — on schedule whatever is in flight —
    /// and, unless asked, does not busy-poll on the prober's CPU.
    #[test]
    fn the_load_generator_sends_on_schedule_like_the_prober_and_sleeps_between_sends() {
        use clap::Parser;
        let args = |extra: &[&str]| {
            let flags = Flags::try_parse_from(extra).unwrap();
            load_args(&flags, "127.0.0.1:1", Path::new("d/load.json"))
        };
        let a = args(&[]);
        let depth = a.iter().position(|x| x == "-d").expect("a depth");
        assert!(a[depth + 1].parse::<u32>().unwrap() >= 8, "{a:?}");
        assert!(a.contains(&"--sleep-only".to_string()), "{a:?}");
        let q = a.iter().position(|x| x == "-q").unwrap();
        assert_eq!(a[q + 1], "500");
        let a = args(&["--loadgen-busy-poll", "--qps", "800"]);
        assert!(!a.contains(&"--sleep-only".to_string()), "{a:?}");
        let q = a.iter().position(|x| x == "-q").unwrap();
        assert_eq!(a[q + 1], "800");
    }

    #[test]
    fn the_window_is_the_last_one_ended_before_the_load_run_did() {
        let records = [
            record(10_000, Some(100.0), Some(200)),   // ended 9 800
            record(11_000, Some(120.0), Some(300)),   // ended 10 700
            record(11_500, Some(999.0), Some(100)),   // ended 11 400: after the load's end
            record(11_600, None, None),               // no latency
            record(10_900, Some(130.0), Some(1_000)), // ended 9 900
        ];
        let w = window_at_end(&records, 11_000, 2_000).expect("a window");
        assert_eq!(w.p99_us, 120.0);
        assert_eq!(w.end_unix_ms, 10_700);
        // too long before the end: none
        assert_eq!(window_at_end(&records, 20_000, 2_000), None);
    }

    #[test]
    fn the_p99_of_saved_samples_is_their_order_statistic() {
        let mut v: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        assert_eq!(order_statistic(&mut v, 0.99), Some(198.0));
        assert_eq!(order_statistic(&mut [5.0], 0.99), Some(5.0));
        assert_eq!(order_statistic(&mut [], 0.99), None);
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        std::fs::write(&f, "0.001 31.5\n0.003 40.25\nbad line\n").unwrap();
        assert_eq!(mutilate_latencies(&f).unwrap(), vec![31.5, 40.25]);
    }

    #[test]
    fn agreement_is_twenty_percent_or_thirty_microseconds() {
        assert!(agrees(119.0, 100.0)); // 30 µs floor
        assert!(!agrees(131.0, 100.0));
        assert!(agrees(1190.0, 1000.0)); // 20%
        assert!(!agrees(1210.0, 1000.0));
        assert!(!agrees(790.0, 1000.0));
    }
}
