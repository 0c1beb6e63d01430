//! `sim validate MODEL RUN_DIR`: replays a real `bench colocation` (or `demo`) run on the model —
//! the same per-window load, policy and BE kind — and sets predicted beside measured per window:
//! LC p99, normalised BE throughput, the policy's BE CPUs and reason, and the verdict. Reports the
//! median absolute errors against the targets (≤ 25% on p99, ≤ 0.10 on BE throughput, the same
//! verdict on ≥ 90% of windows) without hiding a miss.
//!
//! `--repeat RUN_DIR2` (a second recording of the same trace) measures the floor under those
//! errors: the same errors between the two *measured* runs, window by window. No model can be
//! expected to predict a window closer than the machine repeats it.

use std::fmt::Write as _;
use std::path::Path;

#[cfg(doc)]
use headroom_report::model::LoadMetrics;
use headroom_report::model::{ColocationRun, Manifest};
use headroom_report::store::{RunDir, RUNS};
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
    /// The load generator's self-checks passed in this window, or only `independence` failed
    /// ([`LoadMetrics::measures_the_server`]): its p99 measures the server. A window that failed
    /// any other (send lag, inter-arrival fit, too few samples — on a VM, usually a stall) is
    /// shown and scored apart, not as ground truth.
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
    /// The errors over the validly measured windows where the real agent and the replayed one
    /// gave BE the same CPUs (within 0.1 CPU per server CPU): the server model's own error,
    /// apart from the windows where the two agents' decisions parted (a real window the model
    /// does not reproduce, e.g. a host stall that tripped the SLO and the cooldown after it).
    pub decisions_agreed: Errors,
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
    /// `p99 X%, BE Y, same verdict Z%` (`–` where nothing was measured).
    fn summary(&self) -> String {
        format!(
            "p99 {}, BE {}, same verdict {}",
            pct_or(self.p99_median_abs_rel_error),
            opt(self.be_median_abs_error, 2),
            pct_or(self.verdict_agreement)
        )
    }

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
    /// The machine's own run-to-run error (`--repeat`), per policy.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repeatability: Vec<Repeatability>,
}

/// One policy's measured windows against a second recording's (window `i` against window `i`):
/// the errors a perfect model would still show.
#[derive(Debug, Clone, Serialize)]
pub struct Repeatability {
    pub policy: String,
    pub repeat_dir: String,
    /// Windows where both recordings passed the load generator's self-checks.
    pub both_valid: Errors,
    pub all_windows: Errors,
}

/// Sets the windows of `a` beside those of `b` as if `b` were the prediction; the verdict is
/// each window's own p99 against `slo_us`.
fn measured_pairs(
    a: &ColocationRun,
    b: &ColocationRun,
    slo_us: f64,
    percentile: f64,
) -> Vec<(WindowCompare, bool)> {
    a.windows
        .iter()
        .zip(&b.windows)
        .filter_map(|(wa, wb)| {
            let pa = wa.load.as_ref().and_then(|l| l.percentile_us(percentile));
            let pb = wb.load.as_ref().and_then(|l| l.percentile_us(percentile))?;
            let valid = |w: &headroom_report::model::Window| {
                w.load.as_ref().is_some_and(|l| l.measures_the_server())
            };
            Some((
                WindowCompare {
                    index: wa.index,
                    load: wa.lc_load_fraction,
                    measured_p99_us: pa,
                    predicted_p99_us: pb,
                    measured_be: wa.be_fraction,
                    predicted_be: wb.be_fraction.unwrap_or(0.0),
                    measured_be_cpus: None,
                    predicted_be_cpus: 0.0,
                    measured_reason: None,
                    predicted_reason: String::new(),
                    measured_violating: pa.map(|p| p > slo_us),
                    predicted_violating: pb > slo_us,
                    measured_valid: valid(wa),
                },
                valid(wa) && valid(wb),
            ))
        })
        .collect()
}

/// A recorded run directory's manifest and its policy runs.
fn open_recording(d: &Path) -> Result<(Manifest, Vec<ColocationRun>), SimError> {
    if !d.join("manifest.json").is_file() {
        return Err(SimError::Parse {
            file: Some(d.to_path_buf()),
            line: None,
            reason: "not a run directory (no manifest.json)".into(),
        });
    }
    let dir = RunDir::open(d)?;
    Ok((dir.read_manifest()?, dir.all(RUNS)?))
}

/// The run-to-run errors of every policy recorded in both `run_dir` and `repeat_dir`.
pub fn repeatability(run_dir: &Path, repeat_dir: &Path) -> Result<Vec<Repeatability>, SimError> {
    let (manifest, a) = open_recording(run_dir)?;
    let (slo_us, percentile) = (manifest.slo_us, manifest.percentile);
    let (_, b) = open_recording(repeat_dir)?;
    Ok(a.iter()
        .filter_map(|ra| {
            let rb = b
                .iter()
                .find(|rb| rb.policy == ra.policy && rb.be == ra.be)?;
            let pairs = measured_pairs(ra, rb, slo_us, percentile);
            Some(Repeatability {
                policy: ra.policy.clone(),
                repeat_dir: repeat_dir.display().to_string(),
                both_valid: Errors::over(pairs.iter().filter(|(_, v)| *v).map(|(w, _)| w)),
                all_windows: Errors::over(pairs.iter().map(|(w, _)| w)),
            })
        })
        .collect())
}

/// Replays every policy run of `run_dir` on `model`.
pub fn validate(model: &ServerModel, run_dir: &Path) -> Result<Validation, SimError> {
    let (manifest, runs) = open_recording(run_dir)?;
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
    // The trace replays the run's absolute rates: a window at fraction f of the run's peak is
    // f × (run's peak / model's peak) of the model's. (Replaying the fraction alone ran the
    // trace at the model's idea of the peak — at SLO 1000 µs, ~1.4× the measured one.)
    let to_model = manifest
        .peak_qps
        .filter(|p| *p > 0.0)
        .map_or(1.0, |p| p / peak);
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
        repeatability: Vec::new(),
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
        // the measured per-window load as a trace: each window holds its own load (a step,
        // not a ramp towards the next window's), after one window at the first window's load
        // — the bench warms the agent up for one latency window before it records
        let warm_up = run.windows.first().into_iter();
        let points: Vec<(f64, f64)> = warm_up
            .chain(run.windows.iter())
            .enumerate()
            .flat_map(|(i, w)| {
                let l = (w.lc_load_fraction * to_model).max(0.01);
                let start = i as f64 * window_s;
                [(start, l), (start + window_s * (1.0 - 1e-9), l)]
            })
            .collect();
        let warm_windows = usize::from(!run.windows.is_empty());
        let mut setup = SimSetup::new(model.clone(), LoadTrace::Points(points));
        setup.vary_servers = false;
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
            duration_s: (run.windows.len() + warm_windows) as f64 * window_s,
        };
        let o = run_server(&setup, &spec, kind, peak, true, |_, _| {})?;
        let mut windows = Vec::new();
        for (w, r) in run.windows.iter().zip(o.records.iter().skip(warm_windows)) {
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
                measured_valid: w.load.as_ref().is_some_and(|l| l.measures_the_server()),
            });
        }
        let scored = Errors::over(windows.iter().filter(|w| w.measured_valid));
        let agreed_cpus = 0.1 * cores as f64;
        let decisions_agreed = Errors::over(windows.iter().filter(|w| {
            w.measured_valid
                && w.measured_be_cpus
                    .is_some_and(|m| (m - w.predicted_be_cpus).abs() <= agreed_cpus)
        }));
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
            decisions_agreed,
        });
    }
    Ok(out)
}

fn opt(v: Option<f64>, d: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.d$}"))
}

fn pct_or(e: Option<f64>) -> String {
    e.map_or("–".into(), |e| format!("{:.1}%", 100.0 * e))
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
            let _ = writeln!(
                s,
                "over all {} windows: {}",
                r.all_windows.windows,
                r.all_windows.summary()
            );
            let _ = writeln!(
                s,
                "over the {} valid windows where both agents gave BE the same CPUs (the server model alone): {}",
                r.decisions_agreed.windows,
                r.decisions_agreed.summary()
            );
        }
        for k in &self.skipped {
            let _ = writeln!(s, "skipped: {k}");
        }
        for r in &self.repeatability {
            let _ = writeln!(
                s,
                "\nthe machine's own repeatability, {} (this run's measured windows against {}'s, window by window): over the {} windows valid in both, {}; over all {}: {}",
                r.policy,
                r.repeat_dir,
                r.both_valid.windows,
                r.both_valid.summary(),
                r.all_windows.windows,
                r.all_windows.summary(),
            );
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

    fn recorded(p99s: &[(f64, bool)], be: f64) -> ColocationRun {
        use headroom_report::model::{LoadMetrics, Window};
        ColocationRun {
            policy: "hybrid".into(),
            be: "spin".into(),
            windows: p99s
                .iter()
                .enumerate()
                .map(|(i, &(p99, valid))| Window {
                    index: i,
                    load: Some(LoadMetrics {
                        p99_us: Some(p99),
                        valid,
                        ..LoadMetrics::default()
                    }),
                    be_fraction: Some(be),
                    ..Window::default()
                })
                .collect(),
            ..ColocationRun::default()
        }
    }

    /// Two recordings of one trace, set window by window: the floor is scored only where both
    /// measurements were valid, and the verdict is each run's own p99 against the SLO.
    #[test]
    fn repeatability_compares_two_measured_runs_window_by_window() {
        let a = recorded(
            &[
                (100.0, true),
                (400.0, true),
                (200.0, true),
                (9_000.0, false),
            ],
            0.5,
        );
        let b = recorded(
            &[(150.0, true), (300.0, true), (200.0, true), (200.0, true)],
            0.6,
        );
        let pairs = measured_pairs(&a, &b, 350.0, 99.0);
        assert_eq!(pairs.len(), 4);
        let both = Errors::over(pairs.iter().filter(|(_, v)| *v).map(|(w, _)| w));
        assert_eq!(both.windows, 3);
        // |150 − 100| / 100 = 0.5, |300 − 400| / 400 = 0.25, 0: median 0.25
        assert!((both.p99_median_abs_rel_error.unwrap() - 0.25).abs() < 1e-9);
        assert!((both.be_median_abs_error.unwrap() - 0.1).abs() < 1e-9);
        // window 1: 400 > 350 measured, 300 ≤ 350 repeated
        assert!((both.verdict_agreement.unwrap() - 2.0 / 3.0).abs() < 1e-9);
        // the stalled window (9 ms, invalid) counts only over all windows
        let all = Errors::over(pairs.iter().map(|(w, _)| w));
        assert_eq!(all.windows, 4);
        assert!((all.p99_median_abs_rel_error.unwrap() - 0.25).abs() < 1e-9);
    }
}
