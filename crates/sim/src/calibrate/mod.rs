//! `sim calibrate`: fits the model from `headroom bench` result directories.
//!
//! * latency-vs-load (LC alone): `lc.service_us`, `lc.service_cv` and the host stalls
//!   (`server.stall_fraction`, `server.stall_mean_us`) by least median relative error of the
//!   model's p95, p99 and p99.9 (M/G/k on the bench's server CPUs) against every valid point.
//! * the LC's CPU per request, its wake-up and its switch with BE (`lc.cpu_us`,
//!   `lc.wake_cpu_us`, `sched.switch_cpu_us`) from the server CPUs' measured busy time: [`cpu`].
//! * scheduling, interference and BE-alone points: see [`fits`] (`sched.delayed_fraction` with the
//!   wake-up delays, `be.KIND.llc_pressure`, `be.KIND.ops_per_cpu_s`), each by replaying the
//!   point on the model ([`replay`]).
//!
//! Points whose load-generator self-checks failed (any but `independence`, which only widens the
//! interval: `LoadMetrics::measures_the_server`) are refused (listed, never fitted); a directory
//! with nothing valid to fit is an error. The model records the load range and CPU count the data
//! covered, so a simulation outside them is refused unless asked to extrapolate.

use std::path::{Path, PathBuf};

use headroom_report::model::{Manifest, Point};
use headroom_report::store::{RunDir, BASELINES, POINTS};

mod cpu;
mod fits;
pub mod replay;

use cpu::CpuUse;
use fits::Measured;
use replay::{Placement, Weighting};

use crate::error::SimError;
use crate::model::{FittedParam, ServerModel};
use crate::queue::{ResponseTail, ServiceDist, StallForm};

/// A fitted model and what was refused.
#[derive(Debug, Clone)]
pub struct Fit {
    pub model: ServerModel,
    /// `DIR: point: reason` of every point not fitted.
    pub refused: Vec<String>,
    /// How the forms of the model the data cannot choose between fit them.
    pub notes: Vec<String>,
}

struct Obs {
    qps: f64,
    /// (quantile, µs): the point's p95, p99 and p99.9 where it has them, else its SLO percentile.
    tails: Vec<(f64, f64)>,
    load: f64,
    source: String,
}

fn p99_of(point: &Point, percentile: f64) -> Option<f64> {
    point
        .load
        .as_ref()
        .and_then(|l| l.percentile_us(percentile))
}

/// The model's `q`-quantile of the LC alone on `cores` CPUs, its service time `(mean, cv)` and
/// host stalls `(form, fraction, mean µs)` (µs; infinite when saturated).
pub fn alone_tail(
    cores: f64,
    qps: f64,
    service: (f64, f64),
    stall: (StallForm, f64, f64),
    q: f64,
) -> f64 {
    ResponseTail::mgk(
        cores,
        qps / 1e6,
        ServiceDist::with_mean_cv(service.0, service.1),
    )
    .map_or(f64::INFINITY, |r| {
        r.with_stall(stall.0, stall.1, stall.2).quantile(q)
    })
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    crate::fleet::pct(v, 0.5)
}

/// Fits the model from `dirs`, the host stalls in `stall_form`, with the other form's fit error
/// in the notes.
pub fn calibrate(dirs: &[PathBuf], stall_form: StallForm) -> Result<Fit, SimError> {
    let mut model = ServerModel::default();
    let mut refused = Vec::new();
    let mut notes = Vec::new();
    let mut alone: Vec<Obs> = Vec::new();
    let mut sched: Vec<(Weighting, Measured)> = Vec::new();
    let mut interference: Vec<(String, Measured)> = Vec::new();
    let mut solos: Vec<(String, f64, String)> = Vec::new();
    // the LC's CPU use: alone, and beside a spinning BE that leaves it the CPU it asks for
    let mut cpu_alone: Vec<CpuUse> = Vec::new();
    let mut cpu_shared: Vec<CpuUse> = Vec::new();
    let mut cores_seen: Vec<u32> = Vec::new();
    let mut manifest_slo: Option<(f64, f64)> = None;
    for dir in dirs {
        let (manifest, points, baselines) = read_dir(dir)?;
        let cores = manifest.machine.server_cpus.len().max(1) as u32;
        let placement =
            Placement::from_bench(&manifest.machine.server_cpus, &manifest.machine.be_cpus);
        // BE on exactly the LC's CPUs: the CPU it did not get is the LC's
        let be_on_lc_cpus = placement.be == placement.lc;
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
            if !load.measures_the_server() {
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
            let tails: Vec<(f64, f64)> = [95.0, 99.0, 99.9]
                .into_iter()
                .filter_map(|pc| load.percentile_us(pc).map(|v| (pc / 100.0, v)))
                .filter(|(_, v)| v.is_finite() && *v > 0.0)
                .collect();
            let o = Obs {
                qps: load.achieved_qps,
                tails: if tails.is_empty() {
                    vec![(q / 100.0, p99)]
                } else {
                    tails.clone()
                },
                load: p.load_fraction,
                source: label.clone(),
            };
            let measured = Measured {
                qps: load.achieved_qps,
                tail_us: p99,
                tails,
                placement: placement.clone(),
                source: label.clone(),
            };
            let spin = p.be == "spin" || p.series.contains("(spin)");
            let n = cores as f64;
            let idle_cpus = p.idle_cpu_pct.map(|i| n * i / 100.0);
            match manifest.experiment.as_str() {
                "latency-vs-load" | "interference" | "isolation" if p.be == "none" => {
                    alone.push(o);
                    if let Some(c) =
                        idle_cpus.and_then(|i| CpuUse::new(load.achieved_qps, n - i, n, label))
                    {
                        cpu_alone.push(c);
                    }
                    used += 1;
                }
                "scheduling" if spin => match Weighting::from_series(&p.series) {
                    Some(w) => {
                        let lc_gets_its_cpu = match w {
                            Weighting::Idle => true,
                            Weighting::Shares { lc, be } => lc >= 10 * be,
                            Weighting::Equal => false,
                        };
                        if let (true, true, Some(be), Some(i)) =
                            (lc_gets_its_cpu, be_on_lc_cpus, p.be_norm, idle_cpus)
                        {
                            cpu_shared.extend(CpuUse::new(
                                load.achieved_qps,
                                n * (1.0 - be) - i,
                                n,
                                label,
                            ));
                        }
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

    // The host stalls in both forms (a share of requests, a share of time that a busy server's
    // backlog amplifies), the other's fit error reported beside.
    let service0 = (model.lc.service_us, model.lc.service_cv);
    let by_requests = fit_alone(&alone, cores, StallForm::Requests, service0);
    let by_time = fit_alone(&alone, cores, StallForm::Time, service0);
    // Over p95/p99/p99.9 the two forms trade the service time against the stalls and fit most
    // data about equally (the round trip's: 7.3% each; this VM's: 25.5% and 26.9%), so the
    // form is the caller's choice, not the fit's.
    let (best, other) = match stall_form {
        StallForm::Requests => (by_requests, (StallForm::Time, by_time.2)),
        StallForm::Time => (by_time, (StallForm::Requests, by_requests.2)),
    };
    model.server.stall_form = stall_form;
    notes.push(format!(
        "host stalls as a share of {} (fit error {:.1}%; as a share of {}: {:.1}%)",
        stall_form.noun(),
        100.0 * best.2,
        other.0.noun(),
        100.0 * other.1
    ));
    let ((service_us, service_cv), (stall_fraction, stall_mean_us), best_err) = best;
    model.lc.service_us = service_us;
    model.lc.service_cv = service_cv;
    model.server.stall_fraction = stall_fraction;
    model.server.stall_mean_us = stall_mean_us;
    let src = alone.iter().map(|o| o.source.clone()).collect::<Vec<_>>();
    let src = summarize_sources(&src);
    for (key, value) in [
        ("lc.service_us", service_us),
        ("lc.service_cv", service_cv),
        ("server.stall_fraction", stall_fraction),
        ("server.stall_mean_us", stall_mean_us),
    ] {
        model.calibration.params.push(FittedParam {
            key: key.into(),
            value,
            source: src.clone(),
            fit_error: best_err,
        });
    }

    let params = cpu::fit_lc_cpu(&mut model, &cpu_alone);
    model.calibration.params.extend(params);
    let params = cpu::fit_switch_cpu(&mut model, &cpu_shared);
    model.calibration.params.extend(params);
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
    Ok(Fit {
        model,
        refused,
        notes,
    })
}

/// Service time `(mean, cv)`, host stalls `(fraction, mean µs)` of `form`, and the fit's median
/// relative error, over the LC-alone points `alone` on `cores` CPUs.
fn fit_alone(alone: &[Obs], cores: f64, form: StallForm, service0: (f64, f64)) -> FitAlone {
    // Service time and host stalls, on every tail of every LC-alone point (p99 alone cannot
    // tell many short stalls from few long ones; p95 and p99.9 beside it can): (mean, cv) on a
    // grid with no stalls, then the stalls given that, then (mean, cv) finer given the stalls,
    // then the stalls finer. The fine steps matter: the interference fits below read what is
    // left of each point's tail after the service time and the stalls.
    // over the tails up to quantile `upto` (all of them: 1.0)
    let error_of = |service: (f64, f64), stall: (f64, f64), upto: f64| {
        let mut errs: Vec<f64> = alone
            .iter()
            .filter_map(|o| {
                let tails: Vec<f64> = o
                    .tails
                    .iter()
                    .filter(|(tq, _)| *tq <= upto)
                    .map(|&(tq, v)| {
                        (alone_tail(cores, o.qps, service, (form, stall.0, stall.1), tq) - v).abs()
                            / v
                    })
                    .collect();
                (!tails.is_empty()).then(|| tails.iter().sum::<f64>() / tails.len() as f64)
            })
            .collect();
        if errs.is_empty() {
            f64::INFINITY
        } else {
            median(&mut errs)
        }
    };
    let best_by = |upto: f64,
                   cands: &mut dyn Iterator<Item = ((f64, f64), (f64, f64))>,
                   start: ((f64, f64), (f64, f64), f64)| {
        cands.fold(start, |best, (service, stall)| {
            let e = error_of(service, stall, upto);
            if e < best.2 {
                (service, stall, e)
            } else {
                best
            }
        })
    };
    let none = (0.0, 0.0);
    let best_of =
        |cands: &mut dyn Iterator<Item = ((f64, f64), (f64, f64))>,
         start: ((f64, f64), (f64, f64), f64)| best_by(1.0, cands, start);
    // (mean, cv) for given stalls: a log grid, then ±6% around its best
    let fit_service = |stall: (f64, f64), start: ((f64, f64), (f64, f64), f64), upto: f64| {
        let coarse = (0..120).flat_map(move |i| {
            let s = 2.0 * (2000.0f64 / 2.0).powf(i as f64 / 119.0);
            [0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 4.0].map(|cv| ((s, cv), stall))
        });
        let best = best_by(upto, &mut coarse.into_iter(), start);
        let (s0, cv0) = best.0;
        let fine = (0..=40).flat_map(move |i| {
            let s = s0 * (0.94 + 0.12 * i as f64 / 40.0);
            (0..=20).map(move |j| ((s, (cv0 * (0.7 + 0.6 * j as f64 / 20.0)).max(0.05)), stall))
        });
        best_by(upto, &mut fine.into_iter(), best)
    };
    // stalls for a given service time: 0.05%–20% of requests, 10 µs–30 ms each (log grids)
    let fit_stalls = |service: (f64, f64), start: ((f64, f64), (f64, f64), f64)| {
        let grid = (0..=24).flat_map(move |i| {
            let f = 0.0005 * (400.0f64).powf(i as f64 / 24.0);
            (0..=30).map(move |j| (service, (f, 10.0 * 3000.0f64.powf(j as f64 / 30.0))))
        });
        best_of(&mut grid.into_iter(), start)
    };
    let start = (service0, none, f64::INFINITY);
    // No stalls first: a model without them that fits is kept (a stall must beat it); then
    // stalls and service time in turn. Where stalls set the p99 and p99.9, only the p95 is
    // left to the service time, so (mean, cv) is weakly identified beside them: the round
    // trip checks the tails the fit reproduces and the stalls, not the service time alone.
    let mut best = fit_service(none, start, 1.0);
    for _ in 0..2 {
        best = fit_stalls(best.0, best);
        best = fit_service(best.1, best, 1.0);
    }
    let (service, stall0) = (best.0, best.1);
    if stall0.0 > 0.0 {
        let fine_stalls = (0..=20).flat_map(|i| {
            let f = stall0.0 * (0.8 + 0.4 * i as f64 / 20.0);
            (0..=20).map(move |j| (service, (f, stall0.1 * (0.8 + 0.4 * j as f64 / 20.0))))
        });
        best = best_of(&mut fine_stalls.into_iter(), best);
    }
    best
}

/// `((service mean, cv), (stall fraction, stall mean), median relative error)`.
type FitAlone = ((f64, f64), (f64, f64), f64);

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
