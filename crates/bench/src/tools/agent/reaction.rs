//! `headroom bench agent`, polling: the reaction time from a load step to the BE shrink (the
//! step and its timing are described in `mod.rs`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use headroom_host::process::Signal;
use headroom_host::{Cgroups, FreezeState};
use headroom_types::GroupPath;

use super::{pinned, signal, wait_state, write_config, Cleanup, Flags};
use crate::tools::error::{Context, Result, ToolError};

/// Reaction times of one agent run, ms, sorted.
pub(super) struct Reactions {
    pub(super) ms: Vec<f64>,
    pub(super) no_baseline: usize,
    pub(super) no_reaction: usize,
}

impl Reactions {
    pub(super) fn quantile(&self, q: f64) -> Option<f64> {
        if self.ms.is_empty() {
            return None;
        }
        let i = ((self.ms.len() - 1) as f64 * q).round() as usize;
        self.ms.get(i).copied()
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn reaction(
    bin: &Path,
    cgroups: &Cgroups,
    top: &GroupPath,
    dir: &Path,
    lc_pid: u32,
    sensor: &str,
    flags: &Flags,
    clean: &mut Cleanup,
) -> Result<Reactions> {
    let cfg = write_config(dir, top, flags.poll_ms, lc_pid, true, sensor)?;
    let agent = Command::new(bin)
        .args(["agent", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("running the agent")?;
    let agent_pid = agent.id();
    clean.adopt(agent);
    let be = top.join("be")?;
    let lc_group = top.join("lc")?;
    let state = |cg: &Cgroups| -> (String, bool) {
        (
            cg.cpuset_cpus(&be).map(|c| c.to_list()).unwrap_or_default(),
            cg.freeze_state(&be)
                .map(|s| s != FreezeState::Thawed)
                .unwrap_or(true),
        )
    };
    // The step: a spinner on CPU 1 in the LC group, held stopped until t0.
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
    std::thread::sleep(Duration::from_millis(500));
    cgroups.move_process(&lc_group, step_pid as i32)?;
    let mut r = Reactions {
        ms: Vec::new(),
        no_baseline: 0,
        no_reaction: 0,
    };
    for _ in 0..flags.steps {
        // Wait for BE to be running (grown back) and settled before stepping.
        let t = Instant::now();
        let mut ready = false;
        while t.elapsed() < Duration::from_secs(3) {
            if !state(cgroups).1 {
                ready = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if !ready {
            r.no_baseline += 1;
            continue;
        }
        std::thread::sleep(Duration::from_millis(20));
        let before = state(cgroups);
        if before.1 {
            r.no_baseline += 1;
            continue;
        }
        let t0 = Instant::now();
        signal(step_pid, Signal::SIGCONT);
        let mut reacted = None;
        while t0.elapsed() < Duration::from_secs(2) {
            if state(cgroups) != before {
                reacted = Some(t0.elapsed());
                break;
            }
            std::hint::spin_loop();
        }
        signal(step_pid, Signal::SIGSTOP);
        wait_state(step_pid, 'T');
        match reacted {
            Some(d) => r.ms.push(d.as_secs_f64() * 1000.0),
            None => r.no_reaction += 1,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Stop this agent (restoring the groups) and the step before the next sensor's run.
    signal(agent_pid, Signal::SIGTERM);
    signal(step_pid, Signal::SIGKILL);
    signal(step_pid, Signal::SIGCONT);
    for c in clean.children.iter_mut() {
        if c.id() == agent_pid || c.id() == step_pid {
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
    }
    clean.forget(&[agent_pid, step_pid]);
    r.ms.sort_by(f64::total_cmp);
    Ok(r)
}
