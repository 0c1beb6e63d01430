//! The fits past the LC's service time, each through the model's own replay of the bench point
//! ([`predicted_tail`]), so a parameter means in `sim` what it meant when it was measured:
//!
//! * scheduling (`spin` BE on the LC's CPU): `sched.delayed_fraction` jointly with the wake-up
//!   delays `sched.delay_fair_us` (`equal`), `sched.delay_low_weight_us` (`weights-A:B`) and
//!   `sched.delay_idle_us` (`be-cpu.idle`) — a grid over the fraction, and for each fraction the
//!   delay of each series that minimises its median relative error;
//! * interference: `be.KIND.llc_pressure` of each antagonist kind the bench ran;
//! * BE alone: `be.KIND.ops_per_cpu_s` from the solo baselines.

use crate::model::{BeKind, FittedParam, ServerModel};

use super::replay::{predicted_tail, Placement, Weighting};
use super::{median, summarize_sources};

/// One valid bench point, ready to replay.
#[derive(Debug, Clone)]
pub struct Measured {
    pub qps: f64,
    /// The SLO percentile's tail, µs.
    pub tail_us: f64,
    /// Every tail the load generator reported `(quantile, µs)`: p95 and p99.9 beside the SLO's
    /// p99 tell how many requests met a wake-up delay from how long it was.
    pub tails: Vec<(f64, f64)>,
    pub placement: Placement,
    pub source: String,
}

fn rel_err(pred: f64, measured: f64) -> f64 {
    if pred.is_finite() {
        (pred - measured).abs() / measured
    } else {
        f64::INFINITY
    }
}

/// A point's error over every tail it has (the mean relative error), or over the SLO's alone.
fn tails_error(m: &ServerModel, o: &Measured, be: &BeKind, w: Weighting, q: f64) -> f64 {
    if o.tails.is_empty() {
        return rel_err(
            predicted_tail(m, &o.placement, Some(be), w, o.qps, q),
            o.tail_us,
        );
    }
    let sum: f64 = o
        .tails
        .iter()
        .map(|&(tq, v)| rel_err(predicted_tail(m, &o.placement, Some(be), w, o.qps, tq), v))
        .sum();
    sum / o.tails.len() as f64
}

/// Candidate wake-up delays, µs: 0 and 1 µs .. 100 ms on a log grid.
fn delay_grid() -> Vec<f64> {
    let mut g = vec![0.0];
    g.extend((0..=50).map(|i| 10f64.powf(5.0 * i as f64 / 50.0)));
    g
}

const DELAYED_FRACTIONS: [f64; 12] = [
    0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.3, 0.5,
];

fn set_delay(model: &mut ServerModel, w: Weighting, delay: f64) {
    match w {
        Weighting::Equal => model.sched.delay_fair_us = delay,
        Weighting::Shares { .. } => model.sched.delay_low_weight_us = delay,
        Weighting::Idle => model.sched.delay_idle_us = delay,
    }
}

fn delay_key(w: Weighting) -> &'static str {
    match w {
        Weighting::Equal => "sched.delay_fair_us",
        Weighting::Shares { .. } => "sched.delay_low_weight_us",
        Weighting::Idle => "sched.delay_idle_us",
    }
}

/// Fits the wake-up delays and the share of requests that meet them from scheduling points
/// (each with the weighting of its series), the spinning BE `spin` of `model`.
pub fn fit_scheduling(
    model: &mut ServerModel,
    points: &[(Weighting, Measured)],
    q: f64,
) -> Vec<FittedParam> {
    if points.is_empty() {
        return Vec::new();
    }
    let spin = model.be.get("spin").cloned().unwrap_or_default();
    // `equal` first: the low-weight delay is interpolated towards the fair one by the weight
    // ratio, so the fair delay must be in place when the others are fitted.
    let mut order: Vec<Weighting> = points.iter().map(|(w, _)| *w).collect();
    order.sort_by_key(|w| w.rank());
    order.dedup_by_key(|w| w.rank());
    let same_series = |a: &Weighting, b: &Weighting| a.rank() == b.rank();
    let grid = delay_grid();
    // (mean error, the model with its delays, each series' (weighting, delay, error))
    type Candidate = (f64, ServerModel, Vec<(Weighting, f64, f64)>);
    let mut best: Option<Candidate> = None;
    for &fraction in &DELAYED_FRACTIONS {
        let mut m = model.clone();
        m.sched.delayed_fraction = fraction;
        let mut per_series = Vec::new();
        for w in &order {
            let pts: Vec<&(Weighting, Measured)> =
                points.iter().filter(|(pw, _)| same_series(pw, w)).collect();
            let (mut best_d, mut best_e) = (0.0, f64::INFINITY);
            for &d in &grid {
                set_delay(&mut m, *w, d);
                let mut errs: Vec<f64> = pts
                    .iter()
                    .map(|(pw, o)| tails_error(&m, o, &spin, *pw, q))
                    .collect();
                let e = median(&mut errs);
                if e < best_e {
                    (best_d, best_e) = (d, e);
                }
            }
            set_delay(&mut m, *w, best_d);
            per_series.push((*w, best_d, best_e));
        }
        // every series must fit: the mean of their medians (a median over all points would let
        // two well-fitted series outvote a third fitted badly)
        let total = per_series.iter().map(|(_, _, e)| e).sum::<f64>() / per_series.len() as f64;
        if best.as_ref().is_none_or(|(e, _, _)| total < *e) {
            best = Some((total, m, per_series));
        }
    }
    let Some((total, fitted, per_series)) = best else {
        return Vec::new();
    };
    *model = fitted;
    let sources = |w: &Weighting| {
        summarize_sources(
            &points
                .iter()
                .filter(|(pw, _)| same_series(pw, w))
                .map(|(_, o)| o.source.clone())
                .collect::<Vec<_>>(),
        )
    };
    let mut out: Vec<FittedParam> = per_series
        .iter()
        .map(|(w, d, e)| FittedParam {
            key: delay_key(*w).into(),
            value: *d,
            source: sources(w),
            fit_error: *e,
        })
        .collect();
    out.push(FittedParam {
        key: "sched.delayed_fraction".into(),
        value: model.sched.delayed_fraction,
        source: summarize_sources(
            &points
                .iter()
                .map(|(_, o)| o.source.clone())
                .collect::<Vec<_>>(),
        ),
        fit_error: total,
    });
    out
}

/// Fits `be.KIND.llc_pressure` of each kind from interference points (BE placed as the bench
/// placed it, kernel-default weights). A kind the model does not know is added with the
/// default kind's other parameters.
pub fn fit_interference(
    model: &mut ServerModel,
    points: &[(String, Measured)],
    q: f64,
) -> Vec<FittedParam> {
    let mut kinds: Vec<&str> = points.iter().map(|(k, _)| k.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let mut out = Vec::new();
    for kind in kinds {
        let pts: Vec<&Measured> = points
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, o)| o)
            .collect();
        let mut be: BeKind = model.be.get(kind).cloned().unwrap_or_default();
        let (mut best_v, mut best_e) = (be.llc_pressure, f64::INFINITY);
        for i in 0..=50 {
            be.llc_pressure = i as f64 / 50.0;
            let mut errs: Vec<f64> = pts
                .iter()
                .map(|o| {
                    rel_err(
                        predicted_tail(model, &o.placement, Some(&be), Weighting::Equal, o.qps, q),
                        o.tail_us,
                    )
                })
                .collect();
            let e = median(&mut errs);
            if e < best_e {
                (best_v, best_e) = (be.llc_pressure, e);
            }
        }
        be.llc_pressure = best_v;
        model.be.insert(kind.to_string(), be);
        out.push(FittedParam {
            key: format!("be.{kind}.llc_pressure"),
            value: best_v,
            source: summarize_sources(&pts.iter().map(|o| o.source.clone()).collect::<Vec<_>>()),
            fit_error: best_e,
        });
    }
    out
}

/// `be.KIND.ops_per_cpu_s` from the solo baselines `(kind, ops per CPU-second, source)`: the
/// median of each kind's measurements, its spread as the fit error.
pub fn fit_be_speed(model: &mut ServerModel, solos: &[(String, f64, String)]) -> Vec<FittedParam> {
    let mut kinds: Vec<&str> = solos.iter().map(|(k, _, _)| k.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let mut out = Vec::new();
    for kind in kinds {
        let v: Vec<f64> = solos
            .iter()
            .filter(|(k, r, _)| k == kind && r.is_finite() && *r > 0.0)
            .map(|(_, r, _)| *r)
            .collect();
        if v.is_empty() {
            continue;
        }
        let mid = median(&mut v.clone());
        let mut dev: Vec<f64> = v.iter().map(|x| (x - mid).abs() / mid).collect();
        let err = median(&mut dev);
        model.be.entry(kind.to_string()).or_default().ops_per_cpu_s = mid;
        out.push(FittedParam {
            key: format!("be.{kind}.ops_per_cpu_s"),
            value: mid,
            source: summarize_sources(
                &solos
                    .iter()
                    .filter(|(k, _, _)| k == kind)
                    .map(|(_, _, s)| s.clone())
                    .collect::<Vec<_>>(),
            ),
            fit_error: err,
        });
    }
    out
}
