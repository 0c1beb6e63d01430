//! What the sensor hands out: its cumulative counters and histogram, and a window's
//! difference of two of them, with percentiles read from the log-linear buckets.

use super::program::{bucket_low, bucket_width, stats, NBUCKETS};

/// The program's counters (cumulative since load).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Timed requests started: arrivals on a socket with nothing pending.
    pub requests: u64,
    /// Segments with data on the LC's ports (a request in several segments, or pipelined
    /// requests, count several here and one above).
    pub segments: u64,
    /// Requests answered: the histogram's samples.
    pub replies: u64,
    /// Sends on an LC socket with no request pending.
    pub unmatched: u64,
    /// Arrivals not timed: the pending map was full.
    pub map_full: u64,
    /// Sockets closed with a request still pending.
    pub abandoned: u64,
    /// Sum of the timed latencies, ns.
    pub sum_ns: u64,
}

impl Counters {
    fn since(&self, e: &Counters) -> Counters {
        Counters {
            requests: self.requests.saturating_sub(e.requests),
            segments: self.segments.saturating_sub(e.segments),
            replies: self.replies.saturating_sub(e.replies),
            unmatched: self.unmatched.saturating_sub(e.unmatched),
            map_full: self.map_full.saturating_sub(e.map_full),
            abandoned: self.abandoned.saturating_sub(e.abandoned),
            sum_ns: self.sum_ns.saturating_sub(e.sum_ns),
        }
    }
}

/// Counters and bucket counts, cumulative (a read of the map) or for a window
/// ([`LatencySnapshot::since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencySnapshot {
    pub counters: Counters,
    /// Counts per bucket ([`super::program::bucket_of`]).
    pub buckets: Vec<u64>,
}

impl Default for LatencySnapshot {
    fn default() -> Self {
        LatencySnapshot {
            counters: Counters::default(),
            buckets: vec![0; NBUCKETS],
        }
    }
}

impl LatencySnapshot {
    /// Decodes the stats map's entry.
    pub fn decode(entry: &[u8]) -> LatencySnapshot {
        let word = |off: usize| {
            entry
                .get(off..off + 8)
                .map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])))
        };
        LatencySnapshot {
            counters: Counters {
                requests: word(stats::REQUESTS as usize),
                segments: word(stats::SEGMENTS as usize),
                replies: word(stats::REPLIES as usize),
                unmatched: word(stats::UNMATCHED as usize),
                map_full: word(stats::MAP_FULL as usize),
                abandoned: word(stats::ABANDONED as usize),
                sum_ns: word(stats::SUM_NS as usize),
            },
            buckets: (0..NBUCKETS)
                .map(|i| word(stats::BUCKETS as usize + 8 * i))
                .collect(),
        }
    }

    /// The window from `earlier` to this one (both cumulative reads of the same sensor).
    pub fn since(&self, earlier: &LatencySnapshot) -> LatencySnapshot {
        LatencySnapshot {
            counters: self.counters.since(&earlier.counters),
            buckets: self
                .buckets
                .iter()
                .zip(earlier.buckets.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a.saturating_sub(*b))
                .collect(),
        }
    }

    /// Samples in the histogram.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Mean latency, ns.
    pub fn mean_ns(&self) -> Option<f64> {
        let n = self.count();
        (n > 0).then(|| self.counters.sum_ns as f64 / n as f64)
    }

    /// The `q` quantile (0 < q ≤ 1), ns: the midpoint of the bucket holding the sample of
    /// rank ⌈q·n⌉ (within 3.2% of the true value above 16 ns).
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(bucket_low(i) + bucket_width(i) / 2);
            }
        }
        None
    }

    /// Each non-empty bucket as `(midpoint ns, count)`: what an HDR histogram records.
    pub fn values(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (bucket_low(i) + bucket_width(i) / 2, c))
    }
}

#[cfg(test)]
mod tests {
    use super::super::program::bucket_of;
    use super::*;

    fn with(values: &[(u64, u64)]) -> LatencySnapshot {
        let mut s = LatencySnapshot::default();
        for &(v, n) in values {
            s.buckets[bucket_of(v)] += n;
            s.counters.replies += n;
            s.counters.sum_ns += v * n;
        }
        s
    }

    #[test]
    fn quantiles_land_within_a_bucket_of_the_values() {
        // 98 samples at 2 ms, 2 at 10 ms: p50 = 2 ms, p99 = 10 ms
        let s = with(&[(2_000_000, 98), (10_000_000, 2)]);
        let p50 = s.quantile_ns(0.5).unwrap() as f64;
        let p99 = s.quantile_ns(0.99).unwrap() as f64;
        assert!((p50 / 2e6 - 1.0).abs() < 0.035, "{p50}");
        assert!((p99 / 1e7 - 1.0).abs() < 0.035, "{p99}");
        assert_eq!(s.quantile_ns(0.98).unwrap(), s.quantile_ns(0.5).unwrap());
        assert!((s.mean_ns().unwrap() - 2.16e6).abs() < 1.0);
        assert_eq!(LatencySnapshot::default().quantile_ns(0.99), None);
    }

    #[test]
    fn a_window_is_the_difference_of_two_reads() {
        let a = with(&[(1_000, 5)]);
        let b = with(&[(1_000, 7), (50_000, 3)]);
        let w = b.since(&a);
        assert_eq!(w.count(), 5);
        assert_eq!(w.counters.replies, 5);
        assert_eq!(w.values().collect::<Vec<_>>().len(), 2);
        // a sensor reloaded in between (counts went down) gives an empty window, not a wrap
        assert_eq!(a.since(&b).count(), 0);
    }

    #[test]
    fn the_map_entry_decodes_counters_then_buckets() {
        let mut entry = vec![0u8; stats::SIZE];
        entry[0..8].copy_from_slice(&3u64.to_ne_bytes());
        entry[16..24].copy_from_slice(&2u64.to_ne_bytes());
        let b = stats::BUCKETS as usize + 8 * bucket_of(5_000);
        entry[b..b + 8].copy_from_slice(&2u64.to_ne_bytes());
        let s = LatencySnapshot::decode(&entry);
        assert_eq!((s.counters.requests, s.counters.replies), (3, 2));
        assert_eq!(s.count(), 2);
    }
}
