//! `headroom bench agent`, event-driven sensing: reaction per event and churn.
//!
//! - Reaction per event, from the kernel's timestamp of the idle count falling below the
//!   buffer (the BPF idle program's event) to the BE write done (CLOCK_MONOTONIC after the
//!   tick's last cpuset/freezer/quota write returned), and sensing alone (crossing → agent
//!   awake), with the tick's phases between (observation, decision, decision log, plan,
//!   read-back, each write, and what the tick does after its writes),
//!   as histograms, for event-driven sensing and 1 ms / 10 ms polling side by side (every mode
//!   runs the BPF idle program, so every crossing has a kernel timestamp; the agent writes one
//!   line per answered crossing to `HEADROOM_REACTION_LOG`). The LC is pinned on CPU 1, BE
//!   spins on the rest; a step is a stopped spinner in the LC group on CPU 1 let run for
//!   30 ms, then stopped and BE allowed to grow back; B = 0.5 (see [`BUFFER_CORES`]); every
//!   crossing the agent answered with a write is one sample. On an idle host, and on a busy one: a
//!   nice-19 thread outside the agent's groups busy 10 ms of every 20 ms on CPU 0.
//! - Churn: an LC thread flipping CPU 1 between busy and idle at 1 kHz (0.5 ms each) for
//!   `--seconds`: the agent's CPU use, its program's counters (events, crossings held back by
//!   the hysteresis, overruns), and an independent tracker with no hysteresis on the same
//!   flips: every crossing read or counted as an overrun, directions alternating (none lost).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::tools::error::{Context, Result, ToolError};
use headroom_control::config::{IdleSensing, IdleSensor};
use headroom_host::idle_bpf::{BpfIdleTracker, Direction};
use headroom_host::process::Signal;
use headroom_host::{Cgroups, FreezeState};
use headroom_types::GroupPath;

use super::reaction_log::{print_phases, read_log, Histogram};
use super::{loadavg, pinned, process_run_ns, signal, wait_state, Cleanup};

/// B of the reaction and churn runs. Half a CPU: on 2 CPUs the thresholds are "no CPU idle"
/// (shrink by half a CPU, a quota write) and "one CPU idle" (grow), so BE runs and is shrunk
/// even while other work keeps one CPU busy; with B = 1 BE grows only when both CPUs are
/// idle at once, which a host with other work on it rarely offers.
const BUFFER_CORES: f64 = 0.5;

/// How the agent senses, for one measurement.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mode {
    pub name: &'static str,
    pub sensing: IdleSensing,
    pub poll_ms: u64,
}

pub(super) const MODES: [Mode; 3] = [
    Mode {
        name: "events",
        sensing: IdleSensing::Events,
        poll_ms: 1,
    },
    Mode {
        name: "poll_1ms",
        sensing: IdleSensing::Poll,
        poll_ms: 1,
    },
    Mode {
        name: "poll_10ms",
        sensing: IdleSensing::Poll,
        poll_ms: 10,
    },
];

/// The agent of the reaction-per-event and churn runs: B = [`BUFFER_CORES`], growing every
/// 50 ms, sensing as `mode` says.
fn write_config(
    dir: &Path,
    top: &GroupPath,
    lc_pid: u32,
    mode: Mode,
    tag: &str,
) -> Result<std::path::PathBuf> {
    super::config::BenchAgent {
        dir,
        top,
        lc_pid,
        be_spinner: true,
        buffer_cores: BUFFER_CORES,
        poll_ms: mode.poll_ms,
        grow_interval_ms: 50,
        idle: IdleSensor::Bpf,
        sensing: mode.sensing,
        file_name: format!("agent-{}-{tag}.toml", mode.name),
    }
    .write()
}

/// A thread pinned on `cpu` at `nice`, busy `on` then asleep `off`, until `stop` or `limit`.
fn duty_thread(
    cpu: usize,
    on: Duration,
    off: Duration,
    nice: i32,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        use headroom_host::sched::{pin_this_thread, set_sched, SchedPolicy};
        // Refused, the thread runs where and as it was: the phase's figures say so.
        let _ = pin_this_thread(cpu);
        let _ = set_sched(
            0,
            SchedPolicy::Other {
                nice,
                slice_ns: None,
            },
        );
        let end = Instant::now() + limit;
        let mut flips = 0u64;
        while !stop.load(Ordering::Relaxed) && Instant::now() < end {
            let busy_until = Instant::now() + on;
            while Instant::now() < busy_until {
                std::hint::spin_loop();
            }
            std::thread::sleep(off);
            flips += 1;
        }
        flips
    })
}

fn stop_agent(clean: &mut Cleanup, pid: u32) {
    signal(pid, Signal::SIGTERM);
    for c in clean.children.iter_mut().filter(|c| c.id() == pid) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if c.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    clean.forget(&[pid]);
}

#[allow(clippy::too_many_arguments)]
fn spawn_agent(bin: &Path, cfg: &Path, log: &Path, clean: &mut Cleanup) -> Result<u32> {
    let _ = std::fs::remove_file(log);
    // its stderr beside the reaction log, so a phase that logged nothing can say why
    let stderr = std::fs::File::create(stderr_path(log))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null());
    let agent = Command::new(bin)
        .args(["agent", "--config"])
        .arg(cfg)
        .env(headroom_agent::publish::reaction_log::ENV, log)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("running the agent")?;
    let pid = agent.id();
    clean.adopt(agent);
    Ok(pid)
}

/// Where the agent whose reaction log is `log` writes its stderr.
fn stderr_path(log: &Path) -> std::path::PathBuf {
    log.with_extension("stderr")
}

/// How the agent `pid` fared, for a phase that logged no reaction: exited early (with its
/// status and last stderr line), or ran to the end without answering a crossing.
fn why_none_logged(clean: &mut Cleanup, pid: u32, log: &Path) -> String {
    let exited = clean
        .children
        .iter_mut()
        .find(|c| c.id() == pid)
        .and_then(|c| c.try_wait().ok().flatten());
    let stderr = std::fs::read_to_string(stderr_path(log)).unwrap_or_default();
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    match exited {
        Some(status) => format!(
            "the agent exited before the steps ended ({status}); its last stderr line: {last:?}"
        ),
        None => format!(
            "the agent ran throughout and answered no crossing with a write (its stderr: {})",
            stderr_path(log).display()
        ),
    }
}

/// Reaction per event for every mode, on an idle and a busy host.
#[allow(clippy::too_many_arguments)]
pub(super) fn reactions(
    bin: &Path,
    cgroups: &Cgroups,
    top: &GroupPath,
    dir: &Path,
    lc_pid: u32,
    steps: usize,
    clean: &mut Cleanup,
    report: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let be = top.join("be")?;
    let lc_group = top.join("lc")?;
    for busy in [false, true] {
        println!(
            "reaction per event, kernel crossing → BE write done ({}):",
            if busy {
                "busy host: a nice-19 thread busy 10 ms of every 20 ms on CPU 0"
            } else {
                "idle host"
            }
        );
        let stop = Arc::new(AtomicBool::new(false));
        let background = busy.then(|| {
            duty_thread(
                0,
                Duration::from_millis(10),
                Duration::from_millis(10),
                19,
                stop.clone(),
                Duration::from_secs(600),
            )
        });
        for mode in MODES {
            let tag = if busy { "busy" } else { "idle" };
            let cfg = write_config(dir, top, lc_pid, mode, tag)?;
            let log = dir.join(format!("reactions-{}-{tag}.log", mode.name));
            let agent_pid = spawn_agent(bin, &cfg, &log, clean)?;
            std::thread::sleep(Duration::from_secs(2));
            let step = pinned(&["antagonist", "spin", "--duration", "900"], 1)?
                .spawn()
                .context("starting the step spinner")?;
            let step_pid = step.id();
            clean.adopt(step);
            signal(step_pid, Signal::SIGSTOP);
            if !wait_state(step_pid, 'T') {
                return Err(ToolError::Measurement(format!(
                    "the step spinner {step_pid} did not stop"
                )));
            }
            cgroups.move_process(&lc_group, step_pid as i32)?;
            let be_running = || {
                cgroups
                    .freeze_state(&be)
                    .map(|s| s == FreezeState::Thawed)
                    .unwrap_or(false)
                    && cgroups
                        .cpuset_cpus(&be)
                        .map(|c| !c.is_empty())
                        .unwrap_or(false)
            };
            let mut skipped = 0;
            for _ in 0..steps {
                let t = Instant::now();
                while !be_running() && t.elapsed() < Duration::from_millis(500) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if !be_running() {
                    skipped += 1;
                    continue;
                }
                std::thread::sleep(Duration::from_millis(20));
                signal(step_pid, Signal::SIGCONT);
                std::thread::sleep(Duration::from_millis(30));
                signal(step_pid, Signal::SIGSTOP);
                wait_state(step_pid, 'T');
                std::thread::sleep(Duration::from_millis(60));
            }
            // asked before the stop (the log may only be flushed at exit): used if none logged
            let how_it_fared = why_none_logged(clean, agent_pid, &log);
            stop_agent(clean, agent_pid);
            signal(step_pid, Signal::SIGKILL);
            signal(step_pid, Signal::SIGCONT);
            for c in clean.children.iter_mut().filter(|c| c.id() == step_pid) {
                let _ = c.wait();
            }
            clean.forget(&[step_pid]);
            let (rows, _) = read_log(&log);
            let us = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1000.0;
            let reaction = Histogram::new(rows.iter().map(|r| us(r.crossing, r.written)).collect());
            let sensing = Histogram::new(rows.iter().map(|r| us(r.crossing, r.awake)).collect());
            println!("  {:>9} reaction {}", mode.name, reaction.line());
            println!("  {:>9} sensing  {}", "", sensing.line());
            let phases = print_phases(&rows);
            let none_because = rows.is_empty().then_some(how_it_fared);
            if let Some(why) = &none_because {
                println!("  {:>9} no reaction logged: {why}", "");
            }
            if skipped > 0 {
                println!(
                    "  {:>9} {skipped} of {steps} steps skipped: BE was not running 0.5 s after the previous step (load average {})",
                    "",
                    loadavg()
                );
            }
            report.insert(
                format!("event_reaction_{}_{tag}_host", mode.name),
                serde_json::json!({
                    "reaction": reaction.json(), "sensing": sensing.json(),
                    "phases": phases, "steps": steps, "steps_skipped": skipped,
                    "none_logged_because": none_because,
                }),
            );
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(b) = background {
            let _ = b.join();
        }
    }
    Ok(())
}

/// The agent under an LC that flips CPU 1 busy/idle at 1 kHz for `seconds`.
#[allow(clippy::too_many_arguments)]
pub(super) fn churn(
    bin: &Path,
    top: &GroupPath,
    dir: &Path,
    lc_pid: u32,
    seconds: f64,
    clean: &mut Cleanup,
    report: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    let mode = MODES[0];
    let cfg = write_config(dir, top, lc_pid, mode, "churn")?;
    let log = dir.join("reactions-churn.log");
    let agent_pid = spawn_agent(bin, &cfg, &log, clean)?;
    std::thread::sleep(Duration::from_secs(2));
    // an independent tracker watching CPU 1 alone, no hysteresis: every flip is a crossing
    let mut own = BpfIdleTracker::attach_watching(Path::new("/"), Some(&[1]))?;
    own.program().set_thresholds(1, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = duty_thread(
        1,
        Duration::from_micros(500),
        Duration::from_micros(500),
        0,
        stop.clone(),
        Duration::from_secs_f64(seconds + 1.0),
    );
    std::thread::sleep(Duration::from_millis(200));
    let before = (Instant::now(), process_run_ns(agent_pid));
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut seen = Vec::new();
    while Instant::now() < end {
        own.wait(Some(Duration::from_millis(100)))
            .context("waiting on the bench's idle tracker")?;
        own.program_mut().ring().drain(|e| seen.push(e.direction));
    }
    let after = (Instant::now(), process_run_ns(agent_pid));
    stop.store(true, Ordering::Relaxed);
    let flips = flipper.join().unwrap_or(0);
    own.program_mut().ring().drain(|e| seen.push(e.direction));
    let own_counters = own.program().counters();
    drop(own);
    stop_agent(clean, agent_pid);
    let cpu_pct = match (before.1, after.1) {
        (Some(a), Some(b)) => {
            100.0 * b.saturating_sub(a) as f64 / 1e9 / (after.0 - before.0).as_secs_f64()
        }
        _ => {
            return Err(ToolError::Measurement(format!(
                "could not read /proc/{agent_pid}/task/*/schedstat (the agent's) during churn"
            )))
        }
    };
    let (rows, counters) = read_log(&log);
    let alternating = seen.windows(2).all(|w| w[0] != w[1]);
    let lows = seen.iter().filter(|d| **d == Direction::Low).count();
    let lost = flips.saturating_sub(lows as u64 + own_counters.overruns / 2);
    println!(
        "churn (CPU 1 flipped busy/idle at 1 kHz, {flips} flips in {seconds:.0} s): agent CPU {cpu_pct:.2}% of one CPU; agent's program: {}; {} reactions logged",
        counters.map_or("no counters".into(), |c| format!(
            "{} events, {} crossings held back by hysteresis, {} overruns, {} of its own wake-ups discounted",
            c.events, c.suppressed, c.overruns, c.own_wakes
        )),
        rows.len()
    );
    println!(
        "  independent tracker on CPU 1, no hysteresis: {} crossings read ({lows} busy), {} overruns, directions {}; flips that never idled CPU 1 (BE or other work ran in the sleep): {lost}",
        seen.len(),
        own_counters.overruns,
        if alternating { "alternate (none lost)" } else { "DO NOT alternate (a crossing was lost)" }
    );
    report.insert(
        "churn".into(),
        serde_json::json!({
            "seconds": seconds, "flips": flips, "agent_cpu_pct": cpu_pct,
            "agent_events": counters.map(|c| c.events),
            "agent_suppressed": counters.map(|c| c.suppressed),
            "agent_overruns": counters.map(|c| c.overruns),
            "agent_own_wakes": counters.map(|c| c.own_wakes),
            "tracker_crossings_read": seen.len(), "tracker_overruns": own_counters.overruns,
            "tracker_directions_alternate": alternating, "flips_without_busy_crossing": lost,
        }),
    );
    Ok(())
}
