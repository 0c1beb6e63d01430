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
    /// The load generator's own self-checks passed in this window: its p99 measures the
    /// server. A window that failed them (send lag, inter-arrival fit, too few independent
    /// samples — on a VM, usually a stall) is shown and scored apart, not as ground truth.
    pub measured_valid: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunCompare {
    pub policy: String,
    pub be: String,
    pub windows: Vec<WindowCompare>,
    /// Median |predicted − measured| / measured over the windows whose measurement passed its
    /// self-checks (the scored errors below are over those windows).
    pub p99_median_abs_rel_error: Option<f64>,
    pub be_median_abs_error: Option<f64>,
    pub verdict_agreement: Option<f64>,
    /// Windows scored (a valid measurement) of all windows.
    pub scored_windows: usize,
    /// The same three errors over every window, the invalid measurements included.
    pub all_windows: Errors,
    pub meets_targets: bool,
}

/// Median absolute errors over a set of windows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Errors {
    pub windows: usize,
    pub p99_median_abs_rel_error: Option<f64>,
    pub be_median_abs_error: Option<f64>,
    pub verdict_agreement: Option<f64>,
}

impl Errors {
    fn over<'a>(windows: impl Iterator<Item = &'a WindowCompare> + Clone) -> Errors {
        let mut p99e: Vec<f64> = windows
            .clone()
            .filter_map(|w| {
                w.measured_p99_us
                    .map(|m| (w.predicted_p99_us - m).abs() / m.max(1e-9))
            })
            .collect();
        let mut bee: Vec<f64> = windows
            .clone()
            .filter_map(|w| w.measured_be.map(|m| (w.predicted_be - m).abs()))
            .collect();
        let verdicts: Vec<bool> = windows
            .clone()
            .filter_map(|w| w.measured_violating.map(|m| m == w.predicted_violating))
            .collect();
        Errors {
            windows: windows.count(),
            p99_median_abs_rel_error: (!p99e.is_empty()).then(|| pct(&mut p99e, 0.5)),
            be_median_abs_error: (!bee.is_empty()).then(|| pct(&mut bee, 0.5)),
            verdict_agreement: (!verdicts.is_empty())
                .then(|| verdicts.iter().filter(|v| **v).count() as f64 / verdicts.len() as f64),
        }
    }
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
                measured_valid: w.load.as_ref().is_some_and(|l| l.valid),
            });
        }
        let scored = Errors::over(windows.iter().filter(|w| w.measured_valid));
        let all_windows = Errors::over(windows.iter());
        out.runs.push(RunCompare {
            policy: run.policy.clone(),
            be: run.be.clone(),
            meets_targets: scored
                .p99_median_abs_rel_error
                .is_some_and(|e| e <= P99_TARGET)
                && scored.be_median_abs_error.is_none_or(|e| e <= BE_TARGET)
                && scored
                    .verdict_agreement
                    .is_some_and(|a| a >= VERDICT_TARGET),
            windows,
            p99_median_abs_rel_error: scored.p99_median_abs_rel_error,
            be_median_abs_error: scored.be_median_abs_error,
            verdict_agreement: scored.verdict_agreement,
            scored_windows: scored.windows,
            all_windows,
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
            let _ = writeln!(
                s,
                "    (* after p99 meas: the load generator's self-checks failed there; not scored)"
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
                    format!(
                        "{}{}",
                        opt(w.measured_p99_us, 0),
                        if w.measured_valid { "" } else { "*" }
                    ),
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
            let pct_or = |e: Option<f64>| e.map_or("–".into(), |e| format!("{:.0}%", 100.0 * e));
            let _ = writeln!(
                s,
                "median |error| over the {} of {} windows measured validly: p99 {} (target ≤ {:.0}%), BE {} (target ≤ {:.2}); same verdict {} (target ≥ {:.0}%): {}",
                r.scored_windows,
                r.windows.len(),
                pct_or(r.p99_median_abs_rel_error),
                100.0 * P99_TARGET,
                opt(r.be_median_abs_error, 2),
                BE_TARGET,
                pct_or(r.verdict_agreement),
                100.0 * VERDICT_TARGET,
                if r.meets_targets {
                    "MET"
                } else if r.scored_windows == 0 {
                    "NOT MET (no window measured validly)"
                } else {
                    "NOT MET"
                }
            );
            let a = &r.all_windows;
            let _ = writeln!(
                s,
                "over all {} windows: p99 {}, BE {}, same verdict {}",
                a.windows,
                pct_or(a.p99_median_abs_rel_error),
                opt(a.be_median_abs_error, 2),
                pct_or(a.verdict_agreement)
            );
        }
        for k in &self.skipped {
            let _ = writeln!(s, "skipped: {k}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(measured: f64, predicted: f64, valid: bool) -> WindowCompare {
        WindowCompare {
            index: 0,
            load: 0.5,
            measured_p99_us: Some(measured),
            predicted_p99_us: predicted,
            measured_be: Some(0.5),
            predicted_be: 0.5,
            measured_be_cpus: None,
            predicted_be_cpus: 1.0,
            measured_reason: None,
            predicted_reason: String::new(),
            measured_violating: Some(measured > 1000.0),
            predicted_violating: predicted > 1000.0,
            measured_valid: valid,
        }
    }

    /// A window whose measurement failed its self-checks (a stall's 8 s p99) is not scored;
    /// over all windows it still shows.
    #[test]
    fn windows_measured_invalidly_are_shown_but_not_scored() {
        let w = [
            window(100.0, 110.0, true),
            window(200.0, 190.0, true),
            window(8_000_000.0, 150.0, false),
        ];
        let scored = Errors::over(w.iter().filter(|w| w.measured_valid));
        assert_eq!(scored.windows, 2);
        let e = scored.p99_median_abs_rel_error.unwrap();
        assert!((0.05..=0.1).contains(&e), "{e}");
        assert_eq!(scored.verdict_agreement, Some(1.0));
        let all = Errors::over(w.iter());
        assert_eq!(all.windows, 3);
        assert_eq!(all.p99_median_abs_rel_error, Some(0.1));
        assert!((all.verdict_agreement.unwrap() - 2.0 / 3.0).abs() < 1e-9);
    }
}
