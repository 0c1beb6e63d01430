//! The study's arithmetic: medians and spreads of repeated points, per-window SLO violations, EMU.

use serde::{Deserialize, Serialize};

/// Median and spread (min..max) of repeated measurements of one point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// How many finite values went in.
    pub n: usize,
}

impl Spread {
    /// `None` when no finite value is given (NaN and infinities are ignored).
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Spread {
            median: median_sorted(&v),
            min: v[0],
            max: v[v.len() - 1],
            n: v.len(),
        })
    }

    /// Half the min..max range relative to the median, in percent (0 when the median is 0).
    pub fn spread_pct(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / 2.0 / self.median.abs() * 100.0
        }
    }
}

fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Median of the finite values, `None` when there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    Spread::of(values).map(|s| s.median)
}

/// Effective Machine Utilization (Heracles §5.1): LC load as a fraction of its peak plus BE
/// throughput as a fraction of the BE running alone. Can exceed 1.0.
pub fn emu(lc_load_fraction: f64, be_throughput_fraction: f64) -> f64 {
    lc_load_fraction + be_throughput_fraction
}

/// Counts windows whose tail latency exceeds the SLO. A window without a latency (`None`, e.g. the
/// load generator failed) counts as violating: an unmeasured window cannot be claimed to meet it.
pub fn slo_violations(window_tail_us: &[Option<f64>], slo_us: f64) -> u64 {
    window_tail_us
        .iter()
        .filter(|t| match t {
            Some(v) => *v > slo_us,
            None => true,
        })
        .count() as u64
}

/// Mean of the finite values, `None` when there are none.
pub fn mean(values: &[f64]) -> Option<f64> {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        None
    } else {
        Some(v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// Minimum of the finite values, `None` when there are none.
pub fn min(values: &[f64]) -> Option<f64> {
    values
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .min_by(f64::total_cmp)
}

/// Maximum of the finite values, `None` when there are none.
pub fn max(values: &[f64]) -> Option<f64> {
    values
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .max_by(f64::total_cmp)
}

/// Rate of a monotone counter over `[start_ms, end_ms]` from `(t_unix_ms, total)` samples sorted by
/// time: the increase between the last sample at or before each edge, over the time between those
/// samples. Samples inside the window only are not needed: a frozen BE writes nothing and rates 0.
pub fn counter_rate(samples: &[(u64, f64)], start_ms: u64, end_ms: u64) -> Option<f64> {
    if samples.is_empty() || end_ms <= start_ms {
        return None;
    }
    let at_or_before = |t: u64| samples.iter().rev().find(|(ts, _)| *ts <= t).copied();
    let first_after_start = samples.iter().find(|(ts, _)| *ts >= start_ms).copied();
    // Before the first sample the counter is unknown: start from the first sample in the window.
    let a = at_or_before(start_ms).or(first_after_start)?;
    let b = at_or_before(end_ms)?;
    if b.0 <= a.0 {
        // No sample advanced within the window: the worker wrote nothing (frozen or starved).
        return Some(0.0);
    }
    // A writer that stopped reporting before the window ended (frozen, killed) was not working then:
    // count the silent tail of the window as time without progress.
    let span_end = if b.0 + 1500 < end_ms { end_ms } else { b.0 };
    Some(((b.1 - a.1).max(0.0)) / ((span_end - a.0) as f64 / 1000.0))
}
