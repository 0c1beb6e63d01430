//! Latency histograms per time block of the measured interval (by scheduled send time), the raw
//! material of the batch-means confidence intervals ([`super::batch`]), and the summary built
//! from them.

use base64::Engine as _;
use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use headroom_types::load_result::LatencyStats;

use super::batch::{tail_quantile_ci, BatchCi, Blocked, BASE_BLOCKS};
use super::{HistError, LatencyHist, HIGHEST_NS, LOWEST_NS};

/// Significant digits of a block histogram: blocks only count samples below a threshold the
/// full-resolution histogram chose, so 1% buckets suffice (30 KB a block instead of 220 KB).
const BLOCK_DIGITS: u8 = 2;

/// [`BASE_BLOCKS`] histograms (ns), allocated on the first record.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockHists {
    hists: Vec<Histogram<u64>>,
}

fn block_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_NS, BLOCK_DIGITS)
        .expect("constant histogram bounds are valid")
}

impl BlockHists {
    /// The block of a request scheduled `since_ns` after the start of the measured interval of
    /// length `span_ns`.
    #[inline]
    pub fn block_of(since_ns: u64, span_ns: u64) -> usize {
        let j = (since_ns as u128 * BASE_BLOCKS as u128) / span_ns.max(1) as u128;
        (j as usize).min(BASE_BLOCKS - 1)
    }

    /// Records a latency (ns, clamped as [`LatencyHist`] does) in block `block`.
    #[inline]
    pub fn record_ns(&mut self, block: usize, ns: u64) {
        if self.hists.is_empty() {
            self.hists = (0..BASE_BLOCKS).map(|_| block_histogram()).collect();
        }
        let v = ns.clamp(LOWEST_NS, HIGHEST_NS);
        self.hists[block.min(BASE_BLOCKS - 1)].saturating_record(v);
    }

    /// True when nothing was recorded (no batching possible).
    pub fn is_empty(&self) -> bool {
        self.hists.iter().all(|h| h.is_empty())
    }

    /// Adds another thread's or client's blocks (blocks are aligned on the measured interval).
    pub fn merge(&mut self, other: &BlockHists) {
        if other.hists.is_empty() {
            return;
        }
        if self.hists.is_empty() {
            self.hists = other.hists.clone();
            return;
        }
        for (a, b) in self.hists.iter_mut().zip(&other.hists) {
            // Same constant bounds on both sides: add cannot fail.
            let _ = a.add(b);
        }
    }

    /// Wire form: one base64 HDR V2-deflate histogram per block (empty when nothing recorded).
    pub fn to_base64(&self) -> Vec<String> {
        self.hists
            .iter()
            .map(|h| {
                let mut bytes = Vec::new();
                V2DeflateSerializer::new()
                    .serialize(h, &mut bytes)
                    .expect("serializing into memory cannot fail for a histogram we built");
                base64::engine::general_purpose::STANDARD.encode(bytes)
            })
            .collect()
    }

    /// Reads [`BlockHists::to_base64`]'s form.
    pub fn from_base64(blocks: &[String]) -> Result<BlockHists, HistError> {
        if blocks.is_empty() {
            return Ok(BlockHists::default());
        }
        if blocks.len() != BASE_BLOCKS {
            return Err(HistError::Decode {
                input: format!("{} block histograms", blocks.len()),
                detail: format!("expected {BASE_BLOCKS}"),
            });
        }
        let mut out = Vec::with_capacity(BASE_BLOCKS);
        for text in blocks {
            let full = LatencyHist::from_base64(text)?;
            let mut h = block_histogram();
            for v in full.histogram().iter_recorded() {
                h.saturating_record_n(v.value_iterated_to(), v.count_at_value());
            }
            out.push(h);
        }
        Ok(BlockHists { hists: out })
    }
}

/// A full-resolution histogram with its time blocks, seen as a [`Blocked`] series.
pub struct BlockedLatency<'a> {
    pub all: &'a LatencyHist,
    pub blocks: &'a BlockHists,
}

impl Blocked for BlockedLatency<'_> {
    fn blocks(&self) -> usize {
        self.blocks.hists.len()
    }
    fn block_len(&self, j: usize) -> u64 {
        self.blocks.hists[j].len()
    }
    fn count_le(&self, j: usize, x_us: f64) -> u64 {
        let h = &self.blocks.hists[j];
        let x = ((x_us * 1e3) as u64).clamp(1, HIGHEST_NS);
        h.count_between(1, x)
    }
    fn total(&self) -> u64 {
        self.all.count()
    }
    fn value_at_rank(&self, rank: u64) -> f64 {
        self.all.value_at_rank_ns(rank) as f64 / 1e3
    }
}

/// The batch-means interval of `percentile` (0–100), None without samples or blocks; a tail
/// percentile's inflation pooled with the p90's ([`tail_quantile_ci`]).
pub fn blocked_ci(all: &LatencyHist, blocks: &BlockHists, percentile: f64) -> Option<BatchCi> {
    if blocks.is_empty() || all.is_empty() {
        return None;
    }
    tail_quantile_ci(&BlockedLatency { all, blocks }, percentile / 100.0)
}

/// [`LatencyHist::summary`] with the p50/p99/p99.9 intervals from batch means over the time
/// blocks (valid for autocorrelated latencies); without blocks, the independent-sample intervals.
pub fn summary_blocked(all: &LatencyHist, blocks: &BlockHists) -> LatencyStats {
    let mut s = all.summary();
    if all.is_empty() {
        return s;
    }
    let cis: Vec<Option<BatchCi>> = [50.0, 99.0, 99.9]
        .iter()
        .map(|p| blocked_ci(all, blocks, *p))
        .collect();
    if let (Some(p50), Some(p99), Some(p999)) = (&cis[0], &cis[1], &cis[2]) {
        s.p50_ci_us = p50.ci_us;
        s.p99_ci_us = p99.ci_us;
        s.p999_ci_us = p999.ci_us;
        s.ci_batches = p99.batches as u32;
        s.p50_variance_inflation = p50.inflation;
        s.p99_variance_inflation = p99.inflation;
    }
    s
}
