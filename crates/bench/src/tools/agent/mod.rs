//! `headroom bench agent`: the agent's own cost and speed.
//!
//! Each measurement is taken once per idle sensor (`[sensors] idle = "bpf"`, then
//! `"proc_stat"`; BPF is skipped with the reason when it cannot load), polling, and with BPF
//! also event-driven (`idle_sensing = "events"`, listed as sensor `events`); the per-event
//! reaction histograms and the churn run are in `events.rs`, the reaction log read back in
//! `reaction_log.rs`.
//! - CPU use of a running `headroom agent` (blind, B = 1, no BE command, no decision log) at
//!   `poll_ms` = 1 and 10: steady state over `--seconds` (default 10) after 2 s of start-up,
//!   from the run time of its threads (`/proc/<pid>/task/*/schedstat`, ns), and the whole run
//!   incl. start-up and exit from getrusage(RUSAGE_CHILDREN); as a percentage of one CPU.
//!   Measured twice: on an idle host, and on a busy one (a nice-19 spinner pinned on every CPU,
//!   outside the agent's groups), because the cost of a timer wake-up differs — on an idle VM
//!   it wakes a halted vCPU through the hypervisor, on a colocated host it preempts work. Each
//!   comes with the wake-up floor: a thread that only sleeps to the same deadlines.
//! - Reaction time from a load step to the BE shrink: BE spins in its group on CPU 0, the LC
//!   (an idle process) is pinned on CPU 1. The step is a spinner already in the LC group,
//!   pinned on CPU 1 and held stopped (SIGSTOP): SIGCONT at t0 makes CPU 1 busy at once, and
//!   the time until the BE cpuset or freezer file changes is measured; the spinner is stopped
//!   again and BE allowed to grow back before the next step (`--steps`, default 50).
//!
//! Needs root and writable cgroups; groups and processes are removed at the end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::error::{Context, Result, ToolError};
use headroom_host::process::{cpu_split, send_signal, Signal, Usage};
use headroom_host::spawn::StartIn;
use headroom_host::LinuxHost;
use headroom_types::GroupPath;

mod config;
mod events;
mod reaction;
mod reaction_log;
mod teardown;

use reaction::reaction;
use teardown::{Cleanup, GROUP_PREFIX, SCRATCH_PREFIX};

#[derive(clap::Parser, Debug)]
#[command(name = "headroom bench agent", no_binary_name = true)]
pub struct Flags {
    /// Seconds of each CPU-use measurement
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Load steps for the reaction time
    #[arg(long, default_value_t = 50)]
    steps: usize,
    /// poll_ms of the reaction-time agent
    #[arg(long, default_value_t = 1)]
    poll_ms: u64,
}

/// A scratch directory removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The agent of the CPU-use and reaction runs: B = 1, growing every `poll_ms`.
fn write_config(
    dir: &Path,
    top: &GroupPath,
    poll_ms: u64,
    lc_pid: u32,
    be_spinner: bool,
    sensor: &str,
) -> Result<PathBuf> {
    let (idle, sensing) = config::idle_sensing(sensor)?;
    config::BenchAgent {
        dir,
        top,
        lc_pid,
        be_spinner,
        buffer_cores: 1.0,
        poll_ms,
        grow_interval_ms: poll_ms,
        idle,
        sensing,
        file_name: format!("agent-{poll_ms}ms-{sensor}.toml"),
    }
    .write()
}

/// This binary with `args`, pinned to `cpu`, its output dropped.
pub(super) fn pinned(args: &[&str], cpu: usize) -> Result<Command> {
    started(args, &StartIn::parent().on_cpu(cpu))
}

/// This binary with `args`, started as `start` says, its output dropped.
fn started(args: &[&str], start: &StartIn) -> Result<Command> {
    let bin = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("headroom"));
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    start.apply(&mut cmd)?;
    Ok(cmd)
}

pub fn run(out: Option<PathBuf>, flags: Flags) -> Result<()> {
    if !headroom_host::process::is_root() {
        return Err(ToolError::Needs {
            tool: "headroom bench agent",
            need: "root (it creates cgroups)".into(),
        });
    }
    let cgroups = LinuxHost::system().cgroups()?;
    let top = GroupPath::new(&format!("{GROUP_PREFIX}{}", std::process::id()))?;
    let dir =
        ScratchDir(std::env::temp_dir().join(format!("{SCRATCH_PREFIX}{}", std::process::id())));
    let mut clean = Cleanup::arm(cgroups.clone(), top.clone(), dir.path())?;
    std::fs::create_dir_all(dir.path())
        .with_context(|| format!("creating {}", dir.path().display()))?;
    let bin = std::env::current_exe().context("locating the headroom binary")?;
    // The LC: an idle process (sleep) pinned on CPU 1.
    let lc = {
        let mut sleeper = Command::new("sleep");
        sleeper
            .arg("900")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        StartIn::parent().on_cpu(1).apply(&mut sleeper)?;
        sleeper
    }
    .spawn()
    .context("starting the idle LC (sleep)")?;
    let lc_pid = lc.id();
    clean.adopt(lc);

    let mut report = serde_json::Map::new();
    println!(
        "headroom bench agent  ({} CPUs, kernel {}, load average {})",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        headroom_host::process::kernel_release().unwrap_or_default(),
        loadavg()
    );
    let mut sensors = Vec::new();
    for sensor in ["bpf", "proc_stat"] {
        if sensor == "bpf" {
            if let Err(e) = headroom_host::idle_bpf::BpfIdleSampler::attach(Path::new("/")) {
                println!("idle sensor bpf: skipped ({e})");
                report.insert("bpf_unavailable".into(), serde_json::json!(e.to_string()));
                continue;
            }
        }
        sensors.push(sensor);
    }
    // event-driven sensing (BPF ring buffer) where BPF loads
    let events = sensors.contains(&"bpf");
    if events {
        sensors.insert(0, "events");
    }
    for host in [HostState::Idle, HostState::Busy] {
        // Busy: a nice-19 spinner on every CPU, outside the agent's groups — the colocated host
        // the agent exists for, where its wake-ups preempt work instead of waking an idle vCPU.
        let _spinners = match host {
            HostState::Idle => Spinners(Vec::new()),
            HostState::Busy => start_spinners()?,
        };
        println!("{}:", host.describe());
        cpu_use(
            &bin,
            dir.path(),
            &top,
            lc_pid,
            &flags,
            host,
            &sensors,
            &mut report,
        )?;
    }
    if events {
        events::reactions(
            &bin,
            &cgroups,
            &top,
            dir.path(),
            lc_pid,
            flags.steps,
            &mut clean,
            &mut report,
        )?;
        events::churn(
            &bin,
            &top,
            dir.path(),
            lc_pid,
            flags.seconds,
            &mut clean,
            &mut report,
        )?;
    }
    for sensor in sensors.iter().copied().filter(|s| *s != "events") {
        let r = reaction(
            &bin,
            &cgroups,
            &top,
            dir.path(),
            lc_pid,
            sensor,
            &flags,
            &mut clean,
        )?;
        println!(
            "idle sensor {sensor:>9}: reaction (poll_ms = {}): {} steps measured, median {} ms, p90 {} ms, max {} ms{}",
            flags.poll_ms,
            r.ms.len(),
            r.quantile(0.5).map_or("-".into(), |m| format!("{m:.2}")),
            r.quantile(0.9).map_or("-".into(), |m| format!("{m:.2}")),
            r.quantile(1.0).map_or("-".into(), |m| format!("{m:.2}")),
            if r.no_baseline + r.no_reaction > 0 {
                format!(
                    "; {} steps skipped: BE never ran (no idle CPU), {} without a reaction in 2 s (load average {})",
                    r.no_baseline,
                    r.no_reaction,
                    loadavg()
                )
            } else {
                String::new()
            }
        );
        report.insert(
            format!("reaction_ms_median_{sensor}"),
            serde_json::json!(r.quantile(0.5)),
        );
        report.insert(
            format!("reaction_ms_p90_{sensor}"),
            serde_json::json!(r.quantile(0.9)),
        );
        report.insert(
            format!("reaction_ms_max_{sensor}"),
            serde_json::json!(r.quantile(1.0)),
        );
        report.insert(
            format!("reaction_steps_measured_{sensor}"),
            serde_json::json!(r.ms.len()),
        );
        report.insert(
            format!("reaction_steps_skipped_{sensor}"),
            serde_json::json!(r.no_baseline + r.no_reaction),
        );
    }
    report.insert("loadavg_end".into(), serde_json::json!(loadavg()));
    drop(clean);
    if let Some(out) = out {
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let p = out.join("bench-agent.json");
        let text = serde_json::to_string_pretty(&serde_json::Value::Object(report))
            .context("encoding the figures")?;
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// Whether other work keeps every CPU busy while the agent's CPU use is measured.
#[derive(Debug, Clone, Copy, PartialEq)]
enum HostState {
    Idle,
    Busy,
}

impl HostState {
    fn describe(self) -> &'static str {
        match self {
            HostState::Idle => "idle host (nothing else running)",
            HostState::Busy => {
                "busy host (a nice-19 spinner on every CPU, outside the agent's groups)"
            }
        }
    }

    /// Suffix of the JSON keys: none for the idle host (the keys earlier runs wrote).
    fn key_suffix(self) -> &'static str {
        match self {
            HostState::Idle => "",
            HostState::Busy => "_busy_host",
        }
    }
}

/// Processes killed on drop (also when a measurement fails half-way).
struct Spinners(Vec<Child>);

impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
            teardown::unwatch(c.id());
        }
    }
}

/// One `antagonist spin` per CPU, pinned there at nice 19.
fn start_spinners() -> Result<Spinners> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut children = Spinners(Vec::new());
    for cpu in 0..cpus {
        let child = started(
            &["antagonist", "spin", "--threads", "1", "--duration", "600"],
            &StartIn::parent().on_cpu(cpu).at_nice(19),
        )?
        .spawn()
        .with_context(|| format!("starting the spinner on CPU {cpu}"))?;
        teardown::watch(child.id());
        children.0.push(child);
    }
    // Let them reach their loops before anything is measured.
    std::thread::sleep(Duration::from_millis(500));
    Ok(children)
}

/// The wake-up floor and the agent's CPU use at poll_ms = 1 and 10 for every idle sensor.
#[allow(clippy::too_many_arguments)]
fn cpu_use(
    bin: &Path,
    dir: &Path,
    top: &GroupPath,
    lc_pid: u32,
    flags: &Flags,
    host: HostState,
    sensors: &[&str],
    report: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let suffix = host.key_suffix();
    let mut floors = std::collections::BTreeMap::new();
    let seconds = flags.seconds;
    for poll_ms in [1u64, 10] {
        let floor =
            std::thread::spawn(move || wake_up_floor_pct(Duration::from_millis(poll_ms), seconds))
                .join()
                .map_err(|_| ToolError::Measurement("the wake-up floor thread panicked".into()))?;
        println!(
            "wake-up floor: a thread that only sleeps to absolute {poll_ms:>2} ms deadlines: {floor:.2}% of one CPU"
        );
        report.insert(
            format!("wake_up_floor_pct_poll_{poll_ms}ms{suffix}"),
            serde_json::json!(floor),
        );
        floors.insert(poll_ms, floor);
    }
    for sensor in sensors.iter().copied() {
        // event-driven: the periodic duty is 100 ms whatever poll_ms says
        let polls: &[u64] = if sensor == "events" { &[1] } else { &[1, 10] };
        for &poll_ms in polls {
            let cfg = write_config(dir, top, poll_ms, lc_pid, false, sensor)?;
            let before = cpu_split(Usage::Children).total_s();
            let start = Instant::now();
            let total_s = flags.seconds + WARMUP_S + 1.0;
            // the agent's log, shown if it fails
            let log_path = dir.join(format!("agent-{poll_ms}ms-{sensor}{suffix}.log"));
            let log = std::fs::File::create(&log_path).context("creating the agent's log")?;
            // its idle program's counters at exit (events, and its own wake-ups discounted)
            let reactions = dir.join(format!("reactions-steady-{sensor}{suffix}.log"));
            let _ = std::fs::remove_file(&reactions);
            let mut child = Command::new(bin)
                .env("HEADROOM_REACTION_LOG", &reactions)
                .args(["agent", "--config"])
                .arg(&cfg)
                .args(["--duration", &total_s.to_string()])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("running the agent")?;
            teardown::watch(child.id());
            // Steady state: the agent's threads' run time (ns, /proc/<pid>/task/*/schedstat)
            // over `seconds`, after WARMUP_S of start-up (config, doctor probe, groups, BPF).
            std::thread::sleep(Duration::from_secs_f64(WARMUP_S));
            let a = (Instant::now(), process_run_ns(child.id()));
            std::thread::sleep(Duration::from_secs_f64(flags.seconds));
            let b = (Instant::now(), process_run_ns(child.id()));
            let status = child.wait().context("waiting for the agent");
            teardown::unwatch(child.id());
            let status = status?;
            let wall = start.elapsed().as_secs_f64();
            let cpu = cpu_split(Usage::Children).total_s() - before;
            if !status.success() {
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(ToolError::Measurement(format!(
                    "agent at poll_ms {poll_ms} (idle sensor {sensor}) exited with {status}; the end of its log:\n{}",
                    tail.join("\n")
                )));
            }
            let steady = match (a.1, b.1) {
                (Some(x), Some(y)) => {
                    100.0 * y.saturating_sub(x) as f64 / 1e9 / (b.0 - a.0).as_secs_f64()
                }
                _ => {
                    return Err(ToolError::Measurement(format!(
                        "could not read /proc/{}/task/*/schedstat (the agent's)",
                        child.id()
                    )))
                }
            };
            let whole = 100.0 * cpu / total_s;
            println!(
                "idle sensor {sensor:>9}: cpu use at poll_ms = {poll_ms:>2}: steady {steady:.2}% of one CPU over {:.1} s ({:.2}% above the wake-up floor); whole run incl. start/stop {whole:.2}% ({cpu:.3} s CPU over {wall:.1} s)",
                flags.seconds,
                steady - floors[&poll_ms]
            );
            report.insert(
                format!("cpu_pct_poll_{poll_ms}ms_{sensor}{suffix}"),
                serde_json::json!(steady),
            );
            if sensor == "events" {
                let (answered, counters) = reaction_log::read_log(&reactions);
                if let Some(c) = counters {
                    println!(
                        "  its idle program over the whole run: {} events ({} answered with a write), {} of its own wake-ups discounted, {} crossings held back by hysteresis",
                        c.events, answered.len(), c.own_wakes, c.suppressed
                    );
                    report.insert(
                        format!("idle_events_steady{suffix}"),
                        serde_json::json!({
                            "events": c.events, "answered_with_write": answered.len(),
                            "own_wakes": c.own_wakes, "suppressed": c.suppressed,
                        }),
                    );
                }
            }
            report.insert(
                format!("cpu_pct_whole_run_poll_{poll_ms}ms_{sensor}{suffix}"),
                serde_json::json!(whole),
            );
        }
    }
    Ok(())
}

/// CPU share (% of one CPU) of a thread that does nothing but sleep to absolute `period`
/// deadlines for `seconds`, with the agent's timer slack (1 µs): the cost of the wake-ups alone.
fn wake_up_floor_pct(period: Duration, seconds: f64) -> f64 {
    use headroom_load::clock::{now_ns, thread_cpu_ns};
    // The agent's slack; a refusal (none is known) shows as a higher floor.
    let _ = headroom_host::sched::set_timer_slack_ns(1000);
    let ticks = (seconds / period.as_secs_f64()).round().max(1.0) as u64;
    let period_ns = period.as_nanos() as u64;
    let (cpu0, wall0) = (thread_cpu_ns(), now_ns());
    let mut deadline = wall0;
    for _ in 0..ticks {
        deadline += period_ns;
        headroom_host::timer::sleep_until(deadline);
    }
    let cpu = thread_cpu_ns().saturating_sub(cpu0);
    let wall = now_ns().saturating_sub(wall0).max(1);
    100.0 * cpu as f64 / wall as f64
}

/// Start-up time excluded from the steady-state CPU figure, s.
const WARMUP_S: f64 = 2.0;

/// Sum of the run time of every thread of `pid`, ns.
pub(super) fn process_run_ns(pid: u32) -> Option<u64> {
    headroom_host::process::process_run_time(pid as i32)
        .ok()
        .map(|d| d.as_nanos() as u64)
}

pub(super) fn loadavg() -> String {
    headroom_host::process::load_average_text()
}

/// Sends `sig` to the benchmark's own child `pid` (one already gone: nothing to do).
pub(super) fn signal(pid: u32, sig: Signal) {
    let _ = send_signal(pid as i32, sig);
}

/// Waits (≤ 1 s) until `pid` is in state `want` ('T' stopped, 'R' running) per /proc.
pub(super) fn wait_state(pid: u32, want: char) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(1) {
        if headroom_host::process::process_state(pid as i32) == Some(want) {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}
