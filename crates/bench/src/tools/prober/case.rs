//! One run of `bench prober`: the LC, the agent with one latency source, the hog, the
//! reference load generator (and mutilate), then the figures.

use std::path::Path;
use std::time::Duration;

use super::rt::AgentRt;
use super::windows::{self, agrees, WindowFigures};
use super::{Case, Flags, Lc, Source, PROBER_FIFO_PRIORITY};
use crate::record::write_config;
use crate::runner::{free_port, Proc, Runner, ServeSpec};
use crate::tools::error::{Context, Result, ToolError};
use crate::tools::memcached::{start_memcached, Memcached};
use headroom_control::config::{
    BeConfig, Config, LatencyConfig, LcConfig, OnExit, PolicyConfig, PolicyKind, SafetyConfig,
    SloConfig,
};
use headroom_types::decision::DecisionRecord;
use headroom_types::load_result::LoadResult;
use headroom_types::GroupPath;
use serde::Serialize;

/// One run's figures.
#[derive(Debug, Serialize)]
pub struct Row {
    source: Source,
    case: Case,
    /// Which of `--runs` (from 1).
    run: u32,
    pub windows: WindowFigures,
    /// The load generator's p99 over its run from each request's actual send.
    pub loadgen_p99_us: f64,
    pub loadgen_p99_ci_us: [f64; 2],
    /// The same from each request's scheduled send (its headline figure).
    pub loadgen_scheduled_p99_us: f64,
    pub loadgen_send_lag_p99_us: f64,
    pub loadgen_count: u64,
    pub loadgen_valid: bool,
    pub loadgen_failed_checks: Vec<String>,
    /// The agent's median window against the load generator's p99 over its run from each
    /// request's actual send (its per-window figures are from the scheduled send: where its
    /// own sends ran late, this is the comparison that leaves its lateness out).
    pub run_level: RunLevel,
    /// With `--peer`: mutilate -B's p99 over its run against the agent's median window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutilate: Option<PeerFigures>,
}

impl Row {
    pub fn is(&self, source: Source, case: Case) -> bool {
        self.source == source && self.case == case
    }
}

/// The LC under measurement, stopped when the run ends.
enum LcProcess {
    Serve(Proc),
    Memcached(Memcached),
}

impl LcProcess {
    fn start(runner: &Runner, lc: Lc) -> Result<(LcProcess, std::net::SocketAddr)> {
        match lc {
            Lc::Serve => {
                let (p, addr) = runner.start_serve(&ServeSpec {
                    threads: 1,
                    ..ServeSpec::default()
                })?;
                Ok((LcProcess::Serve(p), addr))
            }
            Lc::Memcached => {
                let cpu = runner.placement.server.first().copied();
                let mc = start_memcached(cpu)?;
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], mc.port));
                Ok((LcProcess::Memcached(mc), addr))
            }
        }
    }

    fn pid(&self) -> u32 {
        match self {
            LcProcess::Serve(p) => p.pid(),
            LcProcess::Memcached(m) => m.pid(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            LcProcess::Serve(_) => "serve",
            LcProcess::Memcached(_) => "memcached",
        }
    }

    fn stop(self) {
        match self {
            LcProcess::Serve(mut p) => p.stop(),
            LcProcess::Memcached(m) => drop(m),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct RunLevel {
    pub agent_p99_median_us: Option<f64>,
    pub loadgen_p99_actual_send_us: f64,
    pub within_bound: bool,
}

#[derive(Debug, Serialize)]
pub struct PeerFigures {
    pub p99_us: f64,
    pub samples: usize,
    pub within_bound: bool,
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

/// Starts the agent on CPU 0 at nice 0 (the hog's equal) where `rt` puts it.
fn start_agent(
    runner: &Runner,
    config: &Path,
    decisions: &Path,
    rt: &AgentRt,
    label: &str,
) -> Result<Proc> {
    let args: Vec<String> = vec![
        "agent".into(),
        "--config".into(),
        config.display().to_string(),
        "--log".into(),
        decisions.display().to_string(),
        "--dry-run".into(),
    ];
    let argv = runner.argv(&[0], &[], &args);
    let mut p = runner.spawn_in(label, &argv, &rt.start())?;
    std::thread::sleep(Duration::from_millis(1500));
    if let Some(status) = p.exited() {
        return Err(ToolError::Command {
            command: format!("{} (SCHED_FIFO {})", argv.join(" "), rt.describe()),
            stderr: format!("{status}: {}", p.log_tail(1500)),
        });
    }
    Ok(p)
}

fn spawn_hog(runner: &Runner, flags: &Flags) -> Result<Proc> {
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
    Ok(runner.spawn("hog", &argv)?)
}

fn spawn_mutilate(
    runner: &Runner,
    bin: &Path,
    chrt: &[String],
    addr: &str,
    flags: &Flags,
    save: &Path,
) -> Result<Proc> {
    let mut argv = vec!["taskset".to_string(), "-c".into(), "0".into()];
    argv.extend(chrt.iter().cloned());
    argv.push(bin.display().to_string());
    argv.extend(
        [
            "-s",
            addr,
            "--noload",
            "-B",
            // mutilate segfaults on a bare `exponential`; `:1` is its own default spread
            "-i",
            "exponential:1",
            "--save",
            &save.display().to_string(),
        ]
        .map(String::from),
    );
    argv.extend(common_load_flags(flags));
    Ok(runner.spawn("mutilate", &argv)?)
}

pub fn run(
    runner: &Runner,
    dir: &Path,
    flags: &Flags,
    (source, case, run): (Source, Case, u32),
    rt: &AgentRt,
    instruments_fifo: bool,
) -> Result<Row> {
    let mut name = super::run_name(source, case).replace('/', "-");
    if flags.runs > 1 {
        name = format!("{name}-{run}");
    }
    let (lc, addr) = LcProcess::start(runner, flags.lc)?;
    let config = dir.join(format!("agent-{name}.toml"));
    let decisions = dir.join(format!("decisions-{name}.jsonl"));
    let _ = std::fs::remove_file(&decisions);
    let written = free_port()
        .map_err(ToolError::from)
        .and_then(|metrics_port| {
            let lc = (lc.name(), lc.pid());
            write_agent_config(&config, dir, &name, lc, addr, source, flags, metrics_port)
        });
    let started = written
        .and_then(|()| start_agent(runner, &config, &decisions, rt, &format!("agent-{name}")));
    let mut agent = match started {
        Ok(a) => a,
        Err(e) => {
            lc.stop();
            return Err(e);
        }
    };
    let mut hog = match case {
        Case::Hog => Some(spawn_hog(runner, flags)?),
        Case::NoHog => None,
    };
    std::thread::sleep(Duration::from_secs(2));
    let json = dir.join(format!("load-{name}.json"));
    let hdr = dir.join(format!("load-{name}.hdr"));
    let _ = std::fs::remove_file(&json);
    let chrt: Vec<String> = if instruments_fifo {
        vec!["chrt".into(), "-f".into(), PROBER_FIFO_PRIORITY.to_string()]
    } else {
        Vec::new()
    };
    let argv = runner.argv(
        &[0],
        &chrt,
        &load_args(flags, &addr.to_string(), &json, &hdr),
    );
    let mut peer = match &flags.peer {
        Some(bin) => {
            let save = dir.join(format!("mutilate-{name}.save"));
            let _ = std::fs::remove_file(&save);
            Some((
                spawn_mutilate(runner, bin, &chrt, &addr.to_string(), flags, &save)?,
                save,
            ))
        }
        None => None,
    };
    let load_run = runner.run_to_end(&argv, Duration::from_secs_f64(flags.seconds + 60.0));
    // the agent's last window inside the run is published at the run's end at the latest
    std::thread::sleep(Duration::from_millis(500));
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
    lc.stop();
    load_run?;
    let text =
        std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    let result: LoadResult =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    let intervals = headroom_load::hdrlog::read_intervals(&hdr)
        .map_err(|e| ToolError::Measurement(e.to_string()))?;
    let records = read_decisions(&decisions)?;
    let configured = match source {
        Source::Probe => "probe",
        Source::Kernel => "kernel",
    };
    let figures = windows::compare(&records, &intervals, flags.window_s, configured);
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
                within_bound: figures
                    .agent_p99_median_us
                    .is_some_and(|a| agrees(a, p99_us)),
            })
        }
        None => None,
    };
    let run_level = RunLevel {
        agent_p99_median_us: figures.agent_p99_median_us,
        loadgen_p99_actual_send_us: result.read_uncorrected.p99_us,
        within_bound: figures
            .agent_p99_median_us
            .is_some_and(|a| agrees(a, result.read_uncorrected.p99_us)),
    };
    Ok(Row {
        source,
        case,
        run,
        run_level,
        windows: figures,
        mutilate,
        loadgen_p99_us: result.read_uncorrected.p99_us,
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

/// The agent's config, built typed and validated once: the LC by pid in the bench's group,
/// one BE group with nothing in it, the latency source alone (the prober of the LC's address,
/// or the kernel sensor of its port with no fallback: the run measures the sensor itself), and
/// `blind` as a dry run. Blind ticks every 100 ms, so every window the sensors publish (one a
/// second) is seen by a tick and lands in the decision log (policy `none` ticks once a second,
/// and the publications falling between two of its ticks were never seen).
#[allow(clippy::too_many_arguments)]
fn write_agent_config(
    path: &Path,
    dir: &Path,
    name: &str,
    (lc_name, lc_pid): (&str, u32),
    addr: std::net::SocketAddr,
    source: Source,
    f: &Flags,
    metrics_port: u16,
) -> Result<()> {
    let latency = match source {
        Source::Probe => LatencyConfig::memcache_probe(addr, f.probe_hz),
        Source::Kernel => LatencyConfig::kernel(addr.port()),
    };
    let slo = SloConfig {
        percentile: 99.0,
        target_us: f.slo_us,
        window_s: f.window_s,
        min_samples: None,
    };
    let top = GroupPath::new("headroom-bench-prober")?;
    let lc = LcConfig::new(
        lc_name,
        top.join("lc")?,
        vec![lc_pid],
        slo,
        Some(latency),
        None,
    );
    let be = BeConfig::new("be", top.join("be")?, Vec::new());
    let mut config = Config::new(vec![lc], vec![be], PolicyConfig::of(PolicyKind::Blind));
    config.policy.blind.poll_ms = 100;
    config.safety = SafetyConfig {
        on_exit: OnExit::Restore,
        state_file: dir
            .join(format!("agent-{name}.state.json"))
            .display()
            .to_string(),
        ..SafetyConfig::default()
    };
    config.api.socket = dir.join(format!("agent-{name}.sock")).display().to_string();
    config.api.metrics =
        Some(std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port)).to_string());
    Ok(write_config(path, &config)?)
}

/// The flags `headroom load` and mutilate share: one thread, `--connections` (1 by default),
/// `--depth` in flight on each (`LOAD_DEPTH` by default), the rate and the run's length.
fn common_load_flags(flags: &Flags) -> Vec<String> {
    [
        "-T".to_string(),
        "1".into(),
        "-c".into(),
        flags.connections.to_string(),
        // on schedule whatever is in flight, as the prober sends: at depth 1 a request due while
        // the previous one is unanswered waits for it and is timed from then, so the 1–2% that
        // meet the previous one at the LC (the tail the p99 is made of) would carry that wait in
        // the prober's figure and not in this one
        "-d".into(),
        flags.depth.to_string(),
        "-q".into(),
        format!("{:.0}", flags.qps),
        "-t".into(),
        format!("{:.0}", flags.seconds),
    ]
    .to_vec()
}

/// `headroom load`'s arguments: one connection at `--qps` for the run, its per-second
/// histograms in `hdr`.
fn load_args(flags: &Flags, addr: &str, json: &Path, hdr: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["load", "-s", addr].map(String::from).to_vec();
    args.extend(common_load_flags(flags));
    args.extend(
        [
            "--noload",
            "--quiet",
            "--invalid-exit-code",
            "0",
            "--json",
            &json.display().to_string(),
            "--hdr",
            &hdr.display().to_string(),
        ]
        .map(String::from),
    );
    if flags.loadgen_sleep_only {
        args.push("--sleep-only".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(extra: &[&str]) -> Flags {
        use clap::Parser;
        Flags::try_parse_from(extra).unwrap()
    }

    /// The reference instrument sends as the prober does — on schedule whatever is in flight —
    /// and sleeps to each send only when asked.
    #[test]
    fn the_load_generator_sends_on_schedule_like_the_prober_and_sleeps_between_sends() {
        let args = |extra: &[&str]| {
            load_args(
                &flags(extra),
                "127.0.0.1:1",
                Path::new("d/load.json"),
                Path::new("d/load.hdr"),
            )
        };
        let a = args(&[]);
        let depth = a.iter().position(|x| x == "-d").expect("a depth");
        assert!(a[depth + 1].parse::<u32>().unwrap() >= 8, "{a:?}");
        assert!(!a.contains(&"--sleep-only".to_string()), "{a:?}");
        let q = a.iter().position(|x| x == "-q").unwrap();
        assert_eq!(a[q + 1], "500");
        let h = a.iter().position(|x| x == "--hdr").unwrap();
        assert_eq!(a[h + 1], "d/load.hdr");
        let a = args(&["--loadgen-sleep-only", "--qps", "800"]);
        assert!(a.contains(&"--sleep-only".to_string()), "{a:?}");
        let q = a.iter().position(|x| x == "-q").unwrap();
        assert_eq!(a[q + 1], "800");
        let a = args(&["--qps", "30000", "--connections", "8", "--depth", "1"]);
        let c = a.iter().position(|x| x == "-c").expect("-c");
        assert_eq!(a[c + 1], "8", "{a:?}");
        let d = a.iter().position(|x| x == "-d").expect("-d");
        assert_eq!(a[d + 1], "1", "{a:?}");
        let a = args(&["--connections", "auto", "--depth", "1"]);
        let c = a.iter().position(|x| x == "-c").expect("-c");
        assert_eq!(a[c + 1], "auto", "{a:?}");
        use clap::Parser;
        for bad in ["0", "257", "many"] {
            assert!(
                Flags::try_parse_from(["--connections", bad]).is_err(),
                "{bad}"
            );
        }
    }

    /// The kernel sensor watches the LC's port with no prober behind it; the prober probes
    /// the LC's address.
    #[test]
    fn each_source_gets_its_own_latency_table() {
        let addr: std::net::SocketAddr = "127.0.0.1:4242".parse().unwrap();
        let f = flags(&["--window-s", "5"]);
        let dir = tempfile::tempdir().unwrap();
        for source in [Source::Probe, Source::Kernel] {
            let path = dir.path().join("agent.toml");
            write_agent_config(
                &path,
                dir.path(),
                "x",
                ("memcached", 1),
                addr,
                source,
                &f,
                9,
            )
            .expect("a valid config");
            let text = std::fs::read_to_string(&path).unwrap();
            let c = Config::from_file_text(&text, &path)
                .unwrap_or_else(|e| panic!("the agent refuses the config: {e}\n{text}"));
            let lc = &c.lcs[0];
            assert_eq!(
                (lc.name.as_str(), lc.pids.as_slice()),
                ("memcached", &[1][..])
            );
            let lat = lc.latency.as_ref().expect("a latency source");
            match source {
                Source::Probe => {
                    assert_eq!(lat.source, headroom_control::config::LatencySource::Probe);
                    assert_eq!(lat.address.as_deref(), Some("127.0.0.1:4242"));
                }
                Source::Kernel => {
                    assert_eq!(lat.source, headroom_control::config::LatencySource::Kernel);
                    assert_eq!(lat.kernel_ports(), vec![4242]);
                    assert!(lat.fallback.is_none(), "{text}");
                }
            }
            assert_eq!(lc.slo.window_s, 5.0);
            assert_eq!(c.policy.kind, PolicyKind::Blind);
            assert_eq!(c.api.metrics.as_deref(), Some("127.0.0.1:9"));
        }
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
}
