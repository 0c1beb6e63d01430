//! `sim validate MODEL RUN_DIR`: replays a real `bench colocation` (or `demo`) run on the model —
//! the same per-window load, policy and BE kind — and sets predicted beside measured per window:
//! LC p99, normalised BE throughput, the policy's BE CPUs and reason, and the verdict. Reports the
//! median absolute errors against the targets (≤ 25% on p99, ≤ 0.10 on BE throughput, the same
//! verdict on ≥ 90% of windows) without hiding a miss.

use std::fmt::Write as _;
use std::path::Path;

use headroom_bench::model::ColocationRun;
use headroom_bench::store::{RunDir, RUNS};
use serde::Serialize;

use crate::error::SimError;
use crate::fleet::pct;
use crate::host::SimHost;
use crate::model::ServerModel;
use crate::run::{parse_policy, run_server, ServerSpec, SimSetup};
use crate::trace::LoadTrace;

/// Targets of the issue.
pub const P99_TARGET: f64 = 0.25;
pub const BE_TARGET: f64 = 0.10;
pub const VERDICT_TARGET: f64 = 0.90;

#[derive(Debug, Clone, Serialize)]
pub struct WindowCompare {
    pub index: usize,
    pub load: f64,
    pub measured_p99_us: Option<f64>,
    pub predicted_p99_us: f64,
    pub measured_be: Option<f64>,
    pub predicted_be: f64,
    pub measured_be_cpus: Option<f64>,
    pub predicted_be_cpus: f64,
    pub measured_reason: Option<String>,
    pub predicted_reason: String,
    pub measured_violating: Option<bool>,
    pub predicted_violating: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunCompare {
    pub policy: String,
    pub be: String,
    pub windows: Vec<WindowCompare>,
    /// Median |predicted − measured| / measured over windows with a measured p99.
    pub p99_median_abs_rel_error: Option<f64>,
    pub be_median_abs_error: Option<f64>,
    pub verdict_agreement: Option<f64>,
    pub meets_targets: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Validation {
    pub run_dir: String,
    pub slo_us: f64,
    pub cores: u32,
    pub runs: Vec<RunCompare>,
    /// Runs skipped, with why.
    pub skipped: Vec<String>,
}

/// Replays every policy run of `run_dir` on `model`.
pub fn validate(model: &ServerModel, run_dir: &Path) -> Result<Validation, SimError> {
    if !run_dir.join("manifest.json").is_file() {
        return Err(SimError::Parse {
            file: Some(run_dir.to_path_buf()),
            line: None,
            reason: "not a run directory (no manifest.json)".into(),
        });
    }
    let dir = RunDir::open(run_dir)?;
    let manifest = dir.read_manifest()?;
    let runs: Vec<ColocationRun> = dir.all(RUNS)?;
    if runs.is_empty() {
        return Err(SimError::Parse {
            file: Some(run_dir.to_path_buf()),
            line: None,
            reason: format!(
                "no colocation runs in runs/ (experiment {}): validate replays `bench colocation` or `demo` runs",
                manifest.experiment
            ),
        });
    }
    let cores = manifest.machine.server_cpus.len().max(1) as u32;
    let window_s = manifest
        .params
        .get("window_s")
        .and_then(|v| v.as_f64())
        .unwrap_or(15.0);
    let mut model = model.clone();
    // the run's SLO decides its verdicts
    model.lc.slo_us = manifest.slo_us;
    model.lc.percentile = manifest.percentile;
    let max_load = runs
        .iter()
        .flat_map(|r| r.windows.iter().map(|w| w.lc_load_fraction))
        .fold(0.0, f64::max);
    model.check_coverage(cores, max_load)?;
    let peak = SimHost::peak_qps(&model, cores);
    // The run's deployment: the bench pins the LC to its server CPUs; where BE may only use
    // those same CPUs (a small machine), the agent sees the LC on every CPU BE may use and
    // `hybrid` shares them as `cpu.idle`. The replay's machine is the server CPUs, so the LC is
    // pinned to all of them there too.
    let m = &manifest.machine;
    let be_on_lc_cpus =
        !m.be_cpus.is_empty() && m.be_cpus.iter().all(|c| m.server_cpus.contains(c));
    let deployment = if be_on_lc_cpus {
        let cpus: Vec<String> = (0..cores).map(|c| c.to_string()).collect();
        format!("[lc.threads]\npin = true\ncpus = [{}]\n", cpus.join(", "))
    } else {
        String::new()
    };
    let mut out = Validation {
        run_dir: run_dir.display().to_string(),
        slo_us: manifest.slo_us,
        cores,
        runs: Vec::new(),
        skipped: Vec::new(),
    };
    for run in &runs {
        let Ok(kind) = parse_policy(&run.policy) else {
            out.skipped
                .push(format!("{}: not an agent policy", run.policy));
            continue;
        };
        if model.be_kind(&run.be).is_err() {
            out.skipped.push(format!(
                "{} + {}: the model has no BE kind {:?}",
                run.policy, run.be, run.be
            ));
            continue;
        }
        // the measured per-window load as a trace, one window = one model tick
        let points: Vec<(f64, f64)> = run
            .windows
            .iter()
            .enumerate()
            .map(|(i, w)| (i as f64 * window_s, w.lc_load_fraction.max(0.01)))
            .chain(std::iter::once((
                run.windows.len() as f64 * window_s,
                run.windows
                    .last()
                    .map_or(0.01, |w| w.lc_load_fraction.max(0.01)),
            )))
            .collect();
        let mut setup = SimSetup::new(model.clone(), LoadTrace::Points(points));
        setup.be_pool = vec![run.be.clone()];
        setup.be_job_mean_s = 1e12;
        setup.noise_sd = 0.0;
        setup.tick_s = window_s / 3.0;
        setup.window_s = window_s;
        setup.agent_extra = deployment.clone();
        let spec = ServerSpec {
            cores,
            seed: 1,
            start_s: 0.0,
            duration_s: run.windows.len() as f64 * window_s,
        };
        let o = run_server(&setup, &spec, kind, peak, true, |_, _| {})?;
        let mut windows = Vec::new();
        for (w, r) in run.windows.iter().zip(&o.records) {
            let measured_p99 = w
                .load
                .as_ref()
                .and_then(|l| l.percentile_us(manifest.percentile));
            windows.push(WindowCompare {
                index: w.index,
                load: w.lc_load_fraction,
                measured_p99_us: measured_p99,
                predicted_p99_us: r.p99_us,
                measured_be: w.be_fraction,
                predicted_be: r.be_norm,
                measured_be_cpus: w.agent.as_ref().and_then(|a| a.be_cpus_mean),
                predicted_be_cpus: r.be_cpus,
                measured_reason: w.agent.as_ref().and_then(|a| a.last_reason.clone()),
                predicted_reason: r.reason.clone(),
                measured_violating: measured_p99.map(|p| p > manifest.slo_us),
                predicted_violating: r.violating,
            });
        }
        let mut p99e: Vec<f64> = windows
            .iter()
            .filter_map(|w| {
                w.measured_p99_us
                    .map(|m| (w.predicted_p99_us - m).abs() / m.max(1e-9))
            })
            .collect();
        let mut bee: Vec<f64> = windows
            .iter()
            .filter_map(|w| w.measured_be.map(|m| (w.predicted_be - m).abs()))
            .collect();
        let verdicts: Vec<bool> = windows
            .iter()
            .filter_map(|w| w.measured_violating.map(|m| m == w.predicted_violating))
            .collect();
        let p99_err = (!p99e.is_empty()).then(|| pct(&mut p99e, 0.5));
        let be_err = (!bee.is_empty()).then(|| pct(&mut bee, 0.5));
        let agree = (!verdicts.is_empty())
            .then(|| verdicts.iter().filter(|v| **v).count() as f64 / verdicts.len() as f64);
        out.runs.push(RunCompare {
            policy: run.policy.clone(),
            be: run.be.clone(),
            meets_targets: p99_err.is_some_and(|e| e <= P99_TARGET)
                && be_err.is_none_or(|e| e <= BE_TARGET)
                && agree.is_some_and(|a| a >= VERDICT_TARGET),
            windows,
            p99_median_abs_rel_error: p99_err,
            be_median_abs_error: be_err,
            verdict_agreement: agree,
        });
    }
    Ok(out)
}

fn opt(v: Option<f64>, d: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.d$}"))
}

impl Validation {
    /// The comparison as text: one table per run, then the errors against the targets.
    pub fn render(&self) -> String {
        let mut s = format!(
            "validate {} ({} CPUs, SLO {} µs)\n",
            self.run_dir, self.cores, self.slo_us
        );
        for r in &self.runs {
            let _ = writeln!(s, "\n{} + {}", r.policy, r.be);
            let _ = writeln!(
                s,
                "{:>3} {:>5} {:>9} {:>9} {:>6} {:>6} {:>6} {:>6}  verdict meas/pred  reason meas | pred",
                "win", "load", "p99 meas", "p99 pred", "BE m", "BE p", "CPU m", "CPU p"
            );
            for w in &r.windows {
                let v = |b: Option<bool>| match b {
                    Some(true) => "VIOL",
                    Some(false) => "ok",
                    None => "–",
                };
                let _ = writeln!(
                    s,
                    "{:>3} {:>4.0}% {:>9} {:>9.0} {:>6} {:>6.2} {:>6} {:>6.2}  {:>4}/{:<4}  {} | {}",
                    w.index,
                    100.0 * w.load,
                    opt(w.measured_p99_us, 0),
                    w.predicted_p99_us,
                    opt(w.measured_be, 2),
                    w.predicted_be,
                    opt(w.measured_be_cpus, 2),
                    w.predicted_be_cpus,
                    v(w.measured_violating),
                    v(Some(w.predicted_violating)),
                    w.measured_reason.as_deref().unwrap_or("–"),
                    w.predicted_reason
                );
            }
            let _ = writeln!(
                s,
                "median |error|: p99 {} (target ≤ {:.0}%), BE {} (target ≤ {:.2}); same verdict {} (target ≥ {:.0}%): {}",
                r.p99_median_abs_rel_error
                    .map_or("–".into(), |e| format!("{:.0}%", 100.0 * e)),
                100.0 * P99_TARGET,
                opt(r.be_median_abs_error, 2),
                BE_TARGET,
                r.verdict_agreement
                    .map_or("–".into(), |a| format!("{:.0}%", 100.0 * a)),
                100.0 * VERDICT_TARGET,
                if r.meets_targets { "MET" } else { "NOT MET" }
            );
        }
        for k in &self.skipped {
            let _ = writeln!(s, "skipped: {k}");
        }
        s
    }
}
