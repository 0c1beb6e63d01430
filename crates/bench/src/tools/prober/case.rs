//! One run of `bench prober`: the LC, the agent with one latency source, the hog, the
//! reference load generator (and mutilate), then the figures.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::windows::{self, agrees, WindowFigures};
use super::{Case, Flags, Source, PROBER_FIFO_PRIORITY};
use crate::runner::{free_port, Proc, Runner, ServeSpec};
use crate::tools::error::{Context, Result, ToolError};
use headroom_types::decision::DecisionRecord;
use headroom_types::load_result::LoadResult;
use serde::Serialize;

/// The v1 `cpu` group the agent is started in with `--no-rt`.
const NO_RT_GROUP: &str = "headroom-bench-prober-no-rt";

/// How the agent is denied SCHED_FIFO (or not).
#[derive(Debug)]
pub enum AgentRt {
    /// It runs as the bench does.
    Allowed,
    /// In a v1 `cpu` group whose `cpu.rt_runtime_us` is 0.
    Group { dir: PathBuf },
    /// Without CAP_SYS_NICE (setpriv), where no such group can be made.
    NoCapability,
}

/// `chrt -f 1 true` under `prefix`: whether SCHED_FIFO is granted there.
fn fifo_granted(prefix: &[String]) -> bool {
    let mut argv: Vec<String> = prefix.to_vec();
    argv.extend(["chrt", "-f", "1", "true"].map(String::from));
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the bench itself (and so its reference instruments) may use SCHED_FIFO.
pub fn fifo_allowed_here() -> bool {
    fifo_granted(&[])
}

/// The first mounted cgroup-v1 hierarchy with the `cpu` controller's RT budget file.
fn v1_cpu_hierarchy() -> Option<PathBuf> {
    ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("cpu.rt_runtime_us").exists())
}

impl AgentRt {
    /// Prepares a place where SCHED_FIFO is refused, and checks that it is.
    pub fn refuse() -> Result<AgentRt> {
        let rt = match v1_cpu_hierarchy() {
            Some(root) => {
                let dir = root.join(NO_RT_GROUP);
                match std::fs::create_dir(&dir) {
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                    r => r,
                }
                .with_context(|| format!("creating {}", dir.display()))?;
                let budget = dir.join("cpu.rt_runtime_us");
                std::fs::write(&budget, "0")
                    .with_context(|| format!("writing 0 to {}", budget.display()))?;
                AgentRt::Group { dir }
            }
            None => AgentRt::NoCapability,
        };
        if fifo_granted(&rt.prefix()) {
            let what = rt.describe();
            rt.remove();
            return Err(ToolError::Measurement(format!(
                "--no-rt: SCHED_FIFO is still granted ({what}); cannot refuse it on this host"
            )));
        }
        Ok(rt)
    }

    /// The argv prefix that starts a command here.
    pub fn prefix(&self) -> Vec<String> {
        match self {
            AgentRt::Allowed => Vec::new(),
            AgentRt::Group { dir } => vec![
                "sh".into(),
                "-c".into(),
                r#"echo $$ > "$0" && exec "$@""#.into(),
                dir.join("cgroup.procs").display().to_string(),
            ],
            AgentRt::NoCapability => [
                "setpriv",
                "--inh-caps=-sys_nice",
                "--bounding-set=-sys_nice",
            ]
            .map(String::from)
            .to_vec(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            AgentRt::Allowed => "allowed where the host allows it".into(),
            AgentRt::Group { dir } => format!(
                "refused: started in {} (cpu.rt_runtime_us = 0)",
                dir.display()
            ),
            AgentRt::NoCapability => "refused: started without CAP_SYS_NICE".into(),
        }
    }

    /// Removes the group (its processes are gone by then).
    pub fn remove(&self) {
        if let AgentRt::Group { dir } = self {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// One run's figures.
#[derive(Debug, Serialize)]
pub struct Row {
    source: Source,
    case: Case,
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
    let argv = runner.argv(&[0], &rt.prefix(), &args);
    let mut p = runner.spawn(label, &argv)?;
    std::thread::sleep(Duration::from_millis(1500));
    if let Some(status) = p.exited() {
        return Err(ToolError::Command {
            command: argv.join(" "),
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
    source: Source,
    case: Case,
    rt: &AgentRt,
    instruments_fifo: bool,
) -> Result<Row> {
    let name = super::run_name(source, case).replace('/', "-");
    let (mut serve, addr) = runner.start_serve(&ServeSpec {
        threads: 1,
        ..ServeSpec::default()
    })?;
    let config = dir.join(format!("agent-{name}.toml"));
    let decisions = dir.join(format!("decisions-{name}.jsonl"));
    let _ = std::fs::remove_file(&decisions);
    std::fs::write(
        &config,
        agent_config(dir, &name, serve.pid(), addr, source, flags, free_port()?),
    )
    .with_context(|| format!("writing {}", config.display()))?;
    let mut agent = match start_agent(runner, &config, &decisions, rt, &format!("agent-{name}")) {
        Ok(a) => a,
        Err(e) => {
            serve.stop();
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
    let run = runner.run_to_end(&argv, Duration::from_secs_f64(flags.seconds + 60.0));
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
    serve.stop();
    run?;
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

/// `[lc.latency]` for the source: the prober of the LC's address, or the kernel sensor of its
/// port alone (no fallback: the run measures the sensor itself).
fn latency_table(source: Source, addr: std::net::SocketAddr, probe_hz: f64) -> String {
    match source {
        Source::Probe => format!(
            "source = \"probe\"\nprotocol = \"memcache\"\naddress = \"{addr}\"\nrate_hz = {probe_hz:?}\n"
        ),
        Source::Kernel => format!("source = \"kernel\"\nport = {}\n", addr.port()),
    }
}

fn agent_config(
    dir: &Path,
    name: &str,
    lc_pid: u32,
    addr: std::net::SocketAddr,
    source: Source,
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
{latency}
[[be]]
name = "be"
cgroup = "headroom-bench-prober/be"

# dry run: blind decides and writes nothing; it ticks every 100 ms, so every window the
# sensors publish (one a second) is seen by a tick and lands in the decision log (policy none
# ticks once a second, and the publications falling between two of its ticks were never seen)
[policy]
kind = "blind"

[policy.blind]
poll_ms = 100

[safety]
on_exit = "restore"
state_file = "{state}"

[api]
socket = "{socket}"
metrics = "127.0.0.1:{metrics_port}"
"#,
        slo = f.slo_us,
        window = f.window_s,
        latency = latency_table(source, addr, f.probe_hz),
        state = dir.join(format!("agent-{name}.state.json")).display(),
        socket = dir.join(format!("agent-{name}.sock")).display(),
    )
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
    }

    /// The kernel sensor watches the LC's port with no prober behind it; the prober probes
    /// the LC's address.
    #[test]
    fn each_source_gets_its_own_latency_table() {
        let addr: std::net::SocketAddr = "127.0.0.1:4242".parse().unwrap();
        let f = flags(&["--window-s", "5"]);
        for source in [Source::Probe, Source::Kernel] {
            let text = agent_config(Path::new("/d"), "x", 1, addr, source, &f, 9);
            headroom_control::config::Config::from_toml_str(&text)
                .unwrap_or_else(|e| panic!("the agent refuses the config: {e}\n{text}"));
            let v: toml::Value = toml::from_str(&text).expect("the config parses");
            let lat = &v["lc"]["latency"];
            match source {
                Source::Probe => {
                    assert_eq!(lat["source"].as_str(), Some("probe"));
                    assert_eq!(lat["address"].as_str(), Some("127.0.0.1:4242"));
                }
                Source::Kernel => {
                    assert_eq!(lat["source"].as_str(), Some("kernel"));
                    assert_eq!(lat["port"].as_integer(), Some(4242));
                    assert!(lat.get("fallback").is_none(), "{text}");
                }
            }
            assert_eq!(v["lc"]["slo"]["window_s"].as_float(), Some(5.0));
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

    #[test]
    fn the_prefix_puts_the_agent_in_the_group_or_drops_its_capability() {
        let g = AgentRt::Group {
            dir: PathBuf::from("/sys/fs/cgroup/cpu/x"),
        };
        let p = g.prefix();
        assert_eq!(p[0], "sh");
        assert_eq!(p[3], "/sys/fs/cgroup/cpu/x/cgroup.procs");
        assert!(AgentRt::NoCapability.prefix()[0] == "setpriv");
        assert!(AgentRt::Allowed.prefix().is_empty());
    }
}
