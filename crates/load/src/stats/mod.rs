//! Latency statistics: mergeable HDR histograms in nanoseconds, their summary (mutilate's table
//! plus order-statistic confidence intervals), their wire form, and goodness-of-fit tests.

pub mod batch;
pub mod blocks;
pub mod gof;

pub use blocks::{summary_blocked, BlockHists};
pub use gof::{anderson_darling, ks_test, GofResult};

use std::io::Cursor;

use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use headroom_types::load_result::LatencyStats;

/// Smallest latency kept apart: 1 µs (smaller values are counted as 1 µs, see
/// [`LatencyHist::clamped_low`]).
pub const LOWEST_NS: u64 = 1_000;
/// Largest latency kept apart: 60 s (larger values are counted as 60 s).
pub const HIGHEST_NS: u64 = 60_000_000_000;
/// Significant decimal digits kept at every magnitude (relative error ≤ 0.1%).
pub const SIGNIFICANT_DIGITS: u8 = 3;
/// z of a two-sided 95% confidence interval.
const Z_95: f64 = 1.959_963_984_540_054;

/// A histogram the wire form could not be turned back into.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HistError {
    #[error("latency histogram {input}: not base64: {detail}")]
    Base64 { input: String, detail: String },
    #[error("latency histogram {input}: not an HDR V2 histogram: {detail}")]
    Decode { input: String, detail: String },
}

/// How an input string is named in errors: its length and first characters.
fn describe_input(s: &str) -> String {
    let head: String = s.chars().take(24).collect();
    let more = if s.chars().count() > 24 { "…" } else { "" };
    format!("\"{head}{more}\" ({} chars)", s.len())
}

/// A latency histogram in nanoseconds covering 1 µs..60 s at 3 significant digits.
///
/// The lowest discernible value is 1 ns (not 1 µs): with a 1 µs unit, hdrhistogram would keep
/// only 512 ns steps up to 1 ms. Out-of-range values are clamped to the bounds and counted.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyHist {
    hist: Histogram<u64>,
    clamped_low: u64,
    clamped_high: u64,
}

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist::new()
    }
}

fn empty_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds are valid")
}

impl LatencyHist {
    /// An empty histogram.
    pub fn new() -> LatencyHist {
        LatencyHist {
            hist: empty_histogram(),
            clamped_low: 0,
            clamped_high: 0,
        }
    }

    /// Records one latency in nanoseconds (clamped to 1 µs..60 s).
    #[inline]
    pub fn record_ns(&mut self, ns: u64) {
        self.record_n_ns(ns, 1);
    }

    /// Records one latency given as a [`std::time::Duration`].
    #[inline]
    pub fn record_duration(&mut self, d: std::time::Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Records `count` latencies of `ns` nanoseconds each.
    #[inline]
    pub fn record_n_ns(&mut self, ns: u64, count: u64) {
        let v = if ns < LOWEST_NS {
            self.clamped_low += count;
            LOWEST_NS
        } else if ns > HIGHEST_NS {
            self.clamped_high += count;
            HIGHEST_NS
        } else {
            ns
        };
        self.hist.saturating_record_n(v, count);
    }

    /// Adds every value of `other` (histograms are merged, never percentiles averaged).
    pub fn merge(&mut self, other: &LatencyHist) {
        if self.hist.add(&other.hist).is_err() {
            // Only a histogram with other bounds can refuse; re-record its values clamped.
            for v in other.hist.iter_recorded() {
                self.record_n_ns(v.value_iterated_to(), v.count_at_value());
            }
        }
        self.clamped_low += other.clamped_low;
        self.clamped_high += other.clamped_high;
    }

    /// Empties the histogram.
    pub fn reset(&mut self) {
        self.hist.reset();
        self.clamped_low = 0;
        self.clamped_high = 0;
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.hist.is_empty()
    }

    /// Values below 1 µs recorded as 1 µs.
    pub fn clamped_low(&self) -> u64 {
        self.clamped_low
    }

    /// Values above 60 s recorded as 60 s.
    pub fn clamped_high(&self) -> u64 {
        self.clamped_high
    }

    /// The `percentile` (0–100) in µs (0 when empty).
    pub fn percentile_us(&self, percentile: f64) -> f64 {
        if self.is_empty() {
            return 0.0;
        }
        ns_to_us(
            self.hist
                .value_at_quantile((percentile / 100.0).clamp(0.0, 1.0)),
        )
    }

    /// Mean in µs.
    pub fn mean_us(&self) -> f64 {
        self.hist.mean() / 1e3
    }

    /// Standard deviation in µs.
    pub fn stdev_us(&self) -> f64 {
        self.hist.stdev() / 1e3
    }

    /// Smallest value in µs (0 when empty).
    pub fn min_us(&self) -> f64 {
        if self.is_empty() {
            0.0
        } else {
            ns_to_us(self.hist.min())
        }
    }

    /// Largest value in µs (0 when empty).
    pub fn max_us(&self) -> f64 {
        if self.is_empty() {
            0.0
        } else {
            ns_to_us(self.hist.max())
        }
    }

    /// The value of rank `rank` (1-based: the rank-th smallest), as the histogram keeps it
    /// (highest value equivalent to its bucket), in ns.
    pub fn value_at_rank_ns(&self, rank: u64) -> u64 {
        let rank = rank.clamp(1, self.count().max(1));
        let mut seen = 0u64;
        for v in self.hist.iter_recorded() {
            seen += v.count_at_value();
            if seen >= rank {
                return self.hist.highest_equivalent(v.value_iterated_to());
            }
        }
        0
    }

    /// A 95% confidence interval [low, high] in µs for the `percentile` (0–100), from order
    /// statistics: the ranks n·p ∓ 1.96·√(n·p·(1−p)) (normal approximation of the binomial
    /// count below the true percentile), mapped to values through the histogram. With too few
    /// samples the interval reaches the smallest or largest value (see [`min_samples_for`]).
    pub fn percentile_ci_us(&self, percentile: f64) -> [f64; 2] {
        let n = self.count();
        if n == 0 {
            return [0.0, 0.0];
        }
        let (lo, hi) = percentile_rank_interval(n, percentile / 100.0);
        [
            ns_to_us(self.value_at_rank_ns(lo)),
            ns_to_us(self.value_at_rank_ns(hi)),
        ]
    }

    /// The result JSON's latency fields (docs/architecture.md).
    pub fn summary(&self) -> LatencyStats {
        if self.is_empty() {
            return LatencyStats::default();
        }
        LatencyStats {
            count: self.count(),
            avg_us: self.mean_us(),
            std_us: self.stdev_us(),
            min_us: self.min_us(),
            p5_us: self.percentile_us(5.0),
            p10_us: self.percentile_us(10.0),
            p50_us: self.percentile_us(50.0),
            p90_us: self.percentile_us(90.0),
            p95_us: self.percentile_us(95.0),
            p99_us: self.percentile_us(99.0),
            p999_us: self.percentile_us(99.9),
            p9999_us: self.percentile_us(99.99),
            p99_ci_us: self.percentile_ci_us(99.0),
            p999_ci_us: self.percentile_ci_us(99.9),
            p50_ci_us: self.percentile_ci_us(50.0),
            ci_batches: 0,
            p50_variance_inflation: 0.0,
            p99_variance_inflation: 0.0,
        }
    }

    /// The underlying hdrhistogram (values in ns).
    pub fn histogram(&self) -> &Histogram<u64> {
        &self.hist
    }

    /// Wraps an hdrhistogram of nanoseconds; values outside 1 µs..60 s are clamped and counted.
    pub fn from_histogram(h: &Histogram<u64>) -> LatencyHist {
        let mut out = LatencyHist::new();
        if h.low() == 1 && h.high() == HIGHEST_NS && h.sigfig() == SIGNIFICANT_DIGITS {
            let in_range = h.is_empty() || (h.min() >= LOWEST_NS && h.max() <= HIGHEST_NS);
            if in_range && out.hist.add(h).is_ok() {
                return out;
            }
            out.hist.reset();
        }
        for v in h.iter_recorded() {
            out.record_n_ns(v.value_iterated_to(), v.count_at_value());
        }
        out
    }

    /// HDR V2-deflate serialization, base64 (standard alphabet, padded): the form agents and
    /// the live feed send. The clamp counters are not part of it.
    pub fn to_base64(&self) -> String {
        let mut bytes = Vec::new();
        V2DeflateSerializer::new()
            .serialize(&self.hist, &mut bytes)
            .expect("serializing into memory cannot fail for a histogram we built");
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// Reads [`LatencyHist::to_base64`]'s form (also a V2 or V2-deflate histogram from other HDR
    /// tools; values outside 1 µs..60 s are clamped and counted).
    pub fn from_base64(text: &str) -> Result<LatencyHist, HistError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| HistError::Base64 {
                input: describe_input(text),
                detail: e.to_string(),
            })?;
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut Cursor::new(&bytes))
            .map_err(|e| HistError::Decode {
                input: describe_input(text),
                detail: format!("{e:?}"),
            })?;
        Ok(LatencyHist::from_histogram(&h))
    }
}

fn ns_to_us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// 1-based ranks [low, high] of a 95% confidence interval for the `quantile` (0–1) among `n`
/// samples (normal approximation of the binomial; clamped to 1..=n).
pub fn percentile_rank_interval(n: u64, quantile: f64) -> (u64, u64) {
    let q = quantile.clamp(0.0, 1.0);
    let nf = n as f64;
    let half = Z_95 * (nf * q * (1.0 - q)).sqrt();
    let lo = (nf * q - half).floor().max(1.0) as u64;
    let hi = ((nf * q + half).ceil() + 1.0).min(nf).max(1.0) as u64;
    (lo.min(n.max(1)), hi)
}

pub use headroom_types::resources::min_samples_for;

/// True when `count` samples suffice for the `percentile` (0–100), see [`min_samples_for`].
pub fn enough_samples(count: u64, percentile: f64) -> bool {
    count >= min_samples_for(percentile)
}

#[cfg(test)]
mod tests;
