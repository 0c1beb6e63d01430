//! `sim calibrate`: fits the model from `headroom bench` result directories.
//!
//! * latency-vs-load (LC alone): `lc.service_us` and `lc.service_cv` by least median relative
//!   error of the model's p99 (M/G/k on the bench's server CPUs) against every valid point.
//! * scheduling, interference and BE-alone points: see [`fits`] (`sched.delayed_fraction` with the
//!   wake-up delays, `be.KIND.llc_pressure`, `be.KIND.ops_per_cpu_s`), each by replaying the
//!   point on the model ([`replay`]).
//!
//! Points whose load-generator self-checks failed are refused (listed, never fitted); a directory
//! with nothing valid to fit is an error. The model records the load range and CPU count the data
//! covered, so a simulation outside them is refused unless asked to extrapolate.

use std::path::{Path, PathBuf};

use headroom_bench::model::{Manifest, Point};
use headroom_bench::store::{RunDir, BASELINES, POINTS};

mod fits;
pub mod replay;

use fits::Measured;
use replay::{Placement, Weighting};

use crate::error::SimError;
use crate::model::{FittedParam, ServerModel};
use crate::queue::{ResponseTail, ServiceDist};

/// A fitted model and what was refused.
#[derive(Debug, Clone)]
pub struct Fit {
    pub model: ServerModel,
    /// `DIR: point: reason` of every point not fitted.
    pub refused: Vec<String>,
}

struct Obs {
    qps: f64,
    p99: f64,
    load: f64,
    source: String,
}

fn p99_of(point: &Point, percentile: f64) -> Option<f64> {
    point
        .load
        .as_ref()
        .and_then(|l| l.percentile_us(percentile))
}

/// The model's p99 of the LC alone on `cores` CPUs (µs; infinite when saturated).
pub fn alone_p99(cores: f64, qps: f64, service_us: f64, cv: f64, q: f64) -> f64 {
    ResponseTail::mgk(cores, qps / 1e6, ServiceDist::with_mean_cv(service_us, cv))
        .map_or(f64::INFINITY, |r| r.quantile(q))
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    crate::fleet::pct(v, 0.5)
}

/// Fits the model from `dirs`.
pub fn calibrate(dirs: &[PathBuf]) -> Result<Fit, SimError> {
    let mut model = ServerModel::default();
    let mut refused = Vec::new();
    let mut alone: Vec<Obs> = Vec::new();
    let mut sched: Vec<(Weighting, Measured)> = Vec::new();
    let mut interference: Vec<(String, Measured)> = Vec::new();
    let mut solos: Vec<(String, f64, String)> = Vec::new();
    let mut cores_seen: Vec<u32> = Vec::new();
    let mut manifest_slo: Option<(f64, f64)> = None;
    for dir in dirs {
        let (manifest, points, baselines) = read_dir(dir)?;
        let cores = manifest.machine.server_cpus.len().max(1) as u32;
        let placement =
            Placement::from_bench(&manifest.machine.server_cpus, &manifest.machine.be_cpus);
        for b in &baselines {
            if let (Some(kind), Some(rate)) = (
                b.get("kind").and_then(|k| k.as_str()),
                b.get("ops_per_cpu_s").and_then(|r| r.as_f64()),
            ) {
                solos.push((
                    be_kind(kind),
                    rate,
                    format!("{}: solo {kind}", dir.display()),
                ));
            }
        }
        let q = manifest.percentile;
        let mut used = 0;
        for p in &points {
            let label = format!("{}: {}", dir.display(), p.id);
            let Some(load) = &p.load else {
                refused.push(format!(
                    "{label}: no load result ({})",
                    p.error.as_deref().unwrap_or("run failed")
                ));
                continue;
            };
            if !load.valid {
                refused.push(format!(
                    "{label}: failed self-checks ({})",
                    load.failed_checks.join("; ")
                ));
                continue;
            }
            let Some(p99) = p99_of(p, q) else {
                refused.push(format!("{label}: no p{q} in the load result"));
                continue;
            };
            let o = Obs {
                qps: load.achieved_qps,
                p99,
                load: p.load_fraction,
                source: label.clone(),
            };
            let tails: Vec<(f64, f64)> = [95.0, 99.0, 99.9]
                .into_iter()
                .filter_map(|pc| load.percentile_us(pc).map(|v| (pc / 100.0, v)))
                .filter(|(_, v)| v.is_finite() && *v > 0.0)
                .collect();
            let measured = Measured {
                qps: load.achieved_qps,
                tail_us: p99,
                tails,
                placement: placement.clone(),
                source: label.clone(),
            };
            let spin = p.be == "spin" || p.series.contains("(spin)");
            match manifest.experiment.as_str() {
                "latency-vs-load" | "interference" | "isolation" if p.be == "none" => {
                    alone.push(o);
                    used += 1;
                }
                "scheduling" if spin => match Weighting::from_series(&p.series) {
                    Some(w) => {
                        sched.push((w, measured));
                        used += 1;
                    }
                    None => refused.push(format!(
                        "{label}: scheduling series {:?} is not modelled (equal, weights-A:B and be-cpu.idle are)",
                        p.series
                    )),
                },
                "interference" => {
                    interference.push((be_kind(&p.be), measured));
                    used += 1;
                }
                _ => refused.push(format!(
                    "{label}: {} point with BE {} is not used by the fit",
                    manifest.experiment, p.be
                )),
            }
        }
        if used > 0 {
            cores_seen.push(cores);
            manifest_slo.get_or_insert((manifest.slo_us, manifest.percentile));
        }
        model.calibration.sources.push(dir.display().to_string());
    }
    if alone.is_empty() {
        return Err(SimError::Refused(format!(
            "no valid LC-alone point (latency-vs-load, BE none) in {}; {} point(s) refused{}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            refused.len(),
            refused
                .first()
                .map_or(String::new(), |r| format!(", e.g. {r}"))
        )));
    }
    if cores_seen.windows(2).any(|w| w[0] != w[1]) {
        return Err(SimError::Refused(format!(
            "the directories were recorded on different server CPU counts {cores_seen:?}"
        )));
    }
    let cores = cores_seen[0] as f64;
    let (slo, percentile) = manifest_slo.expect("a used directory");
    let q = percentile / 100.0;
    model.lc.slo_us = slo;
    model.lc.percentile = percentile;

    // service time: grid search on (mean, cv), then finer around the grid's best: the
    // interference fits below read what is left of each point's tail after the service time, so
    // a 6% grid step would land in their parameters
    let error_of = |s: f64, cv: f64| {
        let mut errs: Vec<f64> = alone
            .iter()
            .map(|o| (alone_p99(cores, o.qps, s, cv, q) - o.p99).abs() / o.p99)
            .collect();
        median(&mut errs)
    };
    let coarse = (0..120).flat_map(|i| {
        let s = 2.0 * (2000.0f64 / 2.0).powf(i as f64 / 119.0);
        [0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 4.0].map(|cv| (s, cv))
    });
    let (mut best, mut best_err) = ((model.lc.service_us, model.lc.service_cv), f64::INFINITY);
    for (s, cv) in coarse {
        let e = error_of(s, cv);
        if e < best_err {
            (best, best_err) = ((s, cv), e);
        }
    }
    let (s0, cv0) = best;
    let fine = (0..=40).flat_map(|i| {
        let s = s0 * (0.94 + 0.12 * i as f64 / 40.0);
        (0..=20).map(move |j| (s, (cv0 * (0.7 + 0.6 * j as f64 / 20.0)).max(0.05)))
    });
    for (s, cv) in fine {
        let e = error_of(s, cv);
        if e < best_err {
            (best, best_err) = ((s, cv), e);
        }
    }
    model.lc.service_us = best.0;
    model.lc.service_cv = best.1;
    let src = alone.iter().map(|o| o.source.clone()).collect::<Vec<_>>();
    let src = summarize_sources(&src);
    model.calibration.params.push(FittedParam {
        key: "lc.service_us".into(),
        value: best.0,
        source: src.clone(),
        fit_error: best_err,
    });
    model.calibration.params.push(FittedParam {
        key: "lc.service_cv".into(),
        value: best.1,
        source: src,
        fit_error: best_err,
    });

    let params = fits::fit_scheduling(&mut model, &sched, q);
    model.calibration.params.extend(params);
    let params = fits::fit_interference(&mut model, &interference, q);
    model.calibration.params.extend(params);
    let params = fits::fit_be_speed(&mut model, &solos);
    model.calibration.params.extend(params);

    // below the lowest measured load the queue model only gets more exact; above the highest it
    // extrapolates
    let hi = alone.iter().map(|o| o.load).fold(0.0, f64::max);
    model.calibration.load_range = Some([0.0, hi]);
    model.calibration.cores_range = Some([cores_seen[0], cores_seen[0]]);
    model.validate()?;
    Ok(Fit { model, refused })
}

/// The model's BE kind of a bench antagonist name: `llc:0.5`, `llc-0.5` and `llc-os` are `llc`.
fn be_kind(name: &str) -> String {
    let base = name.split(':').next().unwrap_or(name);
    let base = base.strip_suffix("-os").unwrap_or(base);
    match base.rsplit_once('-') {
        Some((kind, arg)) if arg.parse::<f64>().is_ok() => kind.to_string(),
        _ => base.to_string(),
    }
}

pub(crate) fn summarize_sources(s: &[String]) -> String {
    match s.len() {
        0 => String::new(),
        1 => s[0].clone(),
        n => format!("{} and {} more point(s)", s[0], n - 1),
    }
}

type BenchDir = (Manifest, Vec<Point>, Vec<serde_json::Value>);

fn read_dir(dir: &Path) -> Result<BenchDir, SimError> {
    if !dir.join("manifest.json").is_file() {
        return Err(SimError::Parse {
            file: Some(dir.to_path_buf()),
            line: None,
            reason: "not a bench run directory (no manifest.json)".into(),
        });
    }
    let run = RunDir::open(dir)?;
    let manifest = run.read_manifest()?;
    if manifest.experiment == "colocation" {
        return Err(SimError::Refused(format!(
            "{}: a colocation run is validation data (`headroom sim validate`), not calibration data",
            dir.display()
        )));
    }
    let points: Vec<Point> = run.all(POINTS)?;
    let baselines: Vec<serde_json::Value> = run.all(BASELINES)?;
    Ok((manifest, points, baselines))
}
