//! The LC's CPU cost, from the busy time the benches measured on the server CPUs — apart from
//! the service time the tails are fitted with, because host stalls shape the tails and not the
//! CPU a request takes (round 5 of docs/simulation.md: a service time fitted to the tails
//! charged the LC ~0.6 of the CPU the real one used, and the model gave BE the rest).
//!
//! * LC alone: `lc.cpu_us` (CPU time per request) and `lc.wake_cpu_us` (extra per request that
//!   finds its CPU idle) by least squares of relative error on
//!   `busy = λ·c + λ·w·(1 − busy/n)` — linear in `(c, w)` given the measured busy CPUs.
//! * BE spinning on the LC's CPUs (`scheduling`'s `be-cpu.idle` and `weights-A:B`, where the LC
//!   gets the CPU it asks for): `sched.switch_cpu_us`, the extra per request that finds BE on its
//!   CPU, on `lc = λ·c + λ·x·(1 − lc/n)` with the LC's side the CPU BE did not get.
//!
//! The model charges `λ(c + y)/(1 + λy/n)`, the same relation solved for the busy CPUs
//! (`SimHost::evaluate`).

use crate::model::{FittedParam, ServerModel};

use super::{median, summarize_sources};

/// One bench point's CPU use by the LC.
#[derive(Debug, Clone)]
pub struct CpuUse {
    /// Arrivals per second.
    pub qps: f64,
    /// CPUs the LC kept busy (alone), or did not leave to a spinning BE (shared).
    pub lc_cpus: f64,
    /// The server CPUs it ran on.
    pub cores: f64,
    pub source: String,
}

impl CpuUse {
    /// `None` unless the figures make sense (a rate, a share of the CPUs in (0, cores]).
    pub fn new(qps: f64, lc_cpus: f64, cores: f64, source: String) -> Option<CpuUse> {
        (qps > 0.0 && cores > 0.0 && lc_cpus > 0.0 && lc_cpus <= cores * 1.001).then_some(CpuUse {
            qps,
            lc_cpus,
            cores,
            source,
        })
    }

    fn per_us(&self) -> f64 {
        self.qps / 1e6
    }

    /// The share of arrivals that find the LC off its CPU, by the measured busy share.
    fn off_cpu(&self) -> f64 {
        (1.0 - self.lc_cpus / self.cores).max(0.0)
    }
}

/// The model's LC CPUs at `qps` on `cores` CPUs: CPU time `c` per request, `y` extra per
/// request that finds the LC off its CPU.
pub fn charged_cpus(qps: f64, cores: f64, c: f64, y: f64) -> f64 {
    let l = qps / 1e6;
    l * (c + y) / (1.0 + l * y / cores)
}

fn median_rel_err(points: &[CpuUse], c: f64, y: f64) -> f64 {
    let mut errs: Vec<f64> = points
        .iter()
        .map(|p| (charged_cpus(p.qps, p.cores, c, y) - p.lc_cpus).abs() / p.lc_cpus)
        .collect();
    median(&mut errs)
}

/// Least squares of `Σ (a_i·x − r_i)²` for one unknown.
fn one_unknown(rows: impl Iterator<Item = (f64, f64)>) -> Option<f64> {
    let (num, den) = rows.fold((0.0, 0.0), |(n, d), (a, r)| (n + a * r, d + a * a));
    (den > 0.0).then(|| num / den)
}

/// Fits `lc.cpu_us` and `lc.wake_cpu_us` from LC-alone points; nothing when fewer than two
/// distinct rates were measured or the data give no positive CPU time.
pub fn fit_lc_cpu(model: &mut ServerModel, alone: &[CpuUse]) -> Vec<FittedParam> {
    let rates = {
        let mut r: Vec<u64> = alone.iter().map(|p| p.qps.round() as u64).collect();
        r.sort_unstable();
        r.dedup_by(|a, b| (*a as f64 - *b as f64).abs() < 0.05 * *b as f64);
        r.len()
    };
    if rates < 2 {
        return Vec::new();
    }
    // rows divided by the measured busy CPUs: relative error, so the low loads count as much
    let rows: Vec<([f64; 2], f64)> = alone
        .iter()
        .map(|p| {
            let l = p.per_us();
            ([l / p.lc_cpus, l * p.off_cpu() / p.lc_cpus], 1.0)
        })
        .collect();
    let (mut a11, mut a12, mut a22, mut b1, mut b2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for ([x1, x2], y) in &rows {
        a11 += x1 * x1;
        a12 += x1 * x2;
        a22 += x2 * x2;
        b1 += x1 * y;
        b2 += x2 * y;
    }
    let det = a11 * a22 - a12 * a12;
    let (mut c, mut w) = if det.abs() > 1e-12 * a11 * a22 {
        ((b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det)
    } else {
        (f64::NAN, f64::NAN)
    };
    if !(w.is_finite() && w >= 0.0 && c > 0.0) {
        // no wake-up cost the data can see: CPU time alone
        w = 0.0;
        c = one_unknown(rows.iter().map(|([x1, _], y)| (*x1, *y))).unwrap_or(0.0);
    }
    if !(c.is_finite() && c > 0.0) {
        return Vec::new();
    }
    model.lc.cpu_us = c;
    model.lc.wake_cpu_us = w;
    let err = median_rel_err(alone, c, w);
    let source = summarize_sources(&alone.iter().map(|p| p.source.clone()).collect::<Vec<_>>());
    [("lc.cpu_us", c), ("lc.wake_cpu_us", w)]
        .into_iter()
        .map(|(key, value)| FittedParam {
            key: key.into(),
            value,
            source: source.clone(),
            fit_error: err,
        })
        .collect()
}

/// Fits `sched.switch_cpu_us` from points where a spinning BE shares the LC's CPUs, given
/// `lc.cpu_us` (fit it first).
pub fn fit_switch_cpu(model: &mut ServerModel, shared: &[CpuUse]) -> Vec<FittedParam> {
    let c = model.lc.cpu_us;
    if shared.is_empty() || c <= 0.0 {
        return Vec::new();
    }
    let Some(x) = one_unknown(shared.iter().map(|p| {
        let l = p.per_us();
        (l * p.off_cpu() / p.lc_cpus, (p.lc_cpus - l * c) / p.lc_cpus)
    })) else {
        return Vec::new();
    };
    let x = x.max(0.0);
    model.sched.switch_cpu_us = x;
    vec![FittedParam {
        key: "sched.switch_cpu_us".into(),
        value: x,
        source: summarize_sources(&shared.iter().map(|p| p.source.clone()).collect::<Vec<_>>()),
        fit_error: median_rel_err(shared, c, x),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points a model with CPU time `c`, extra `y` would have measured (the relation solved
    /// exactly), at 5%..95% of one CPU's rate.
    fn synthetic(c: f64, y: f64, cores: f64) -> Vec<CpuUse> {
        (1..=10)
            .map(|i| {
                let qps = i as f64 * 8_000.0;
                let busy = charged_cpus(qps, cores, c, y);
                CpuUse::new(qps, busy, cores, format!("p{i}")).unwrap()
            })
            .collect()
    }

    #[test]
    fn the_fits_give_back_the_cpu_time_and_the_wake_and_switch_costs_they_were_made_with() {
        let mut m = ServerModel::default();
        let params = fit_lc_cpu(&mut m, &synthetic(4.5, 7.5, 1.0));
        assert!((m.lc.cpu_us - 4.5).abs() < 1e-6, "{}", m.lc.cpu_us);
        assert!(
            (m.lc.wake_cpu_us - 7.5).abs() < 1e-6,
            "{}",
            m.lc.wake_cpu_us
        );
        assert_eq!(params.len(), 2);
        assert!(params.iter().all(|p| p.fit_error < 1e-9));
        let params = fit_switch_cpu(&mut m, &synthetic(4.5, 18.0, 1.0));
        assert!((m.sched.switch_cpu_us - 18.0).abs() < 1e-6);
        assert!(params[0].fit_error < 1e-9);
    }

    #[test]
    fn a_cost_proportional_to_the_rate_is_cpu_time_with_no_wake_up() {
        let mut m = ServerModel::default();
        let pts: Vec<CpuUse> = (1..=5)
            .map(|i| CpuUse::new(i as f64 * 10_000.0, i as f64 * 0.1, 1.0, "p".into()).unwrap())
            .collect();
        fit_lc_cpu(&mut m, &pts);
        assert!((m.lc.cpu_us - 10.0).abs() < 1e-6, "{}", m.lc.cpu_us);
        assert!(m.lc.wake_cpu_us.abs() < 1e-6, "{}", m.lc.wake_cpu_us);
    }

    #[test]
    fn one_rate_or_nonsense_figures_fit_nothing() {
        let mut m = ServerModel::default();
        let one = vec![CpuUse::new(10_000.0, 0.1, 1.0, "a".into()).unwrap(); 3];
        assert!(fit_lc_cpu(&mut m, &one).is_empty());
        assert_eq!(m.lc.cpu_us, 0.0);
        assert!(CpuUse::new(10_000.0, 1.5, 1.0, "more CPU than the server has".into()).is_none());
        assert!(CpuUse::new(0.0, 0.1, 1.0, "no rate".into()).is_none());
    }
}
