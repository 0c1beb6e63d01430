//! The kernel sensor's sliding window, kept as the sensor's own cumulative reads: the window
//! ending at second `now` is the newest read minus the newest read at least a window older.
//!
//! Why not the prober's [`LatencyWindow`](crate::sensors::lc_signal::LatencyWindow) of
//! per-second HDR histograms: each of those is ~220 KB (1 ns..60 s at 3 digits), so a second
//! cost a fresh one for the read, a fresh slot, and a merge of the window's 15 slots into a
//! third — ~0.8 ms of the agent's CPU a second, more than its whole control loop. Here a second
//! costs a subtraction over the program's buckets and, once the window holds enough requests,
//! one reused HDR histogram refilled from them: the same figure (HDR histograms add linearly,
//! so recording the window's bucket counts equals merging the seconds' histograms).

use std::collections::VecDeque;

use headroom_host::latency_bpf::LatencySnapshot;
use headroom_load::stats::LatencyHist;

/// The kernel's window: the same seconds and sample floor as the prober's.
pub struct KernelWindow {
    window_s: u64,
    min_samples: u64,
    /// Cumulative reads by second, oldest first; the front is the newest read at or before the
    /// window's start (the base), or the read taken at start (second 0).
    reads: VecDeque<(u64, LatencySnapshot)>,
    /// The first second a read was added (the first window fills a window later).
    first_sec: Option<u64>,
    /// The window's counts (reused).
    delta: LatencySnapshot,
    /// The window as an HDR histogram, for the percentile (reused).
    hist: LatencyHist,
}

impl KernelWindow {
    /// A window of `window_s` seconds from `start`, the read taken when the sensor started.
    pub fn new(window_s: f64, min_samples: u64, start: LatencySnapshot) -> KernelWindow {
        KernelWindow {
            window_s: window_s.ceil().max(1.0) as u64,
            min_samples: min_samples.max(1),
            reads: VecDeque::from([(0, start)]),
            first_sec: None,
            delta: LatencySnapshot::default(),
            hist: LatencyHist::new(),
        }
    }

    /// Adds the cumulative read taken at second `sec` (seconds do not go back).
    pub fn add(&mut self, sec: u64, read: LatencySnapshot) {
        self.first_sec.get_or_insert(sec);
        self.reads.push_back((sec, read));
        // keep one read at or before the window's start: the base
        while self
            .reads
            .get(1)
            .is_some_and(|(s, _)| s + self.window_s <= sec)
        {
            self.reads.pop_front();
        }
    }

    /// Data segments on the LC's ports in the window ending at `now_sec`: more than its
    /// requests where requests arrive behind a pending one (pipelined: only the first of each
    /// burst is timed) or span several segments.
    pub fn segments(&self, now_sec: u64) -> u64 {
        match (
            base_of(&self.reads, self.window_s, now_sec),
            self.reads.back(),
        ) {
            (Some((_, base)), Some((_, newest))) => newest
                .counters
                .segments
                .saturating_sub(base.counters.segments),
            _ => 0,
        }
    }

    /// Requests in the window ending at `now_sec` (the newest read), and their `percentile`
    /// in µs — `None` while the window holds fewer than the floor. A first window that is not
    /// full yet publishes as soon as it holds the floor: a serving LC's requests are enough
    /// long before a whole window has passed, and waiting would start the prober for nothing.
    pub fn window(&mut self, now_sec: u64, percentile: f64) -> (u64, Option<f64>) {
        self.figure(now_sec, percentile, self.min_samples)
    }

    /// The same window's percentile over whatever it holds (at least one request): a
    /// cross-check of another source over the same seconds, never a published figure.
    pub fn any(&mut self, now_sec: u64, percentile: f64) -> (u64, Option<f64>) {
        self.figure(now_sec, percentile, 1)
    }

    /// Whether a whole window has passed since the first read.
    pub fn filled(&self, now_sec: u64) -> bool {
        self.first_sec
            .is_some_and(|f| now_sec + 1 >= f + self.window_s)
    }

    /// Seconds the window ending at `now_sec` covers (fewer than the window's during the
    /// first one).
    pub fn covered_s(&self, now_sec: u64) -> u64 {
        base_of(&self.reads, self.window_s, now_sec).map_or(0, |(s, _)| now_sec.saturating_sub(*s))
    }

    fn figure(&mut self, now_sec: u64, percentile: f64, floor: u64) -> (u64, Option<f64>) {
        let base = base_of(&self.reads, self.window_s, now_sec);
        let (Some((_, base)), Some((_, newest))) = (base, self.reads.back()) else {
            return (0, None);
        };
        for (d, (n, b)) in self
            .delta
            .buckets
            .iter_mut()
            .zip(newest.buckets.iter().zip(&base.buckets))
        {
            *d = n.saturating_sub(*b);
        }
        let count = self.delta.count();
        if count == 0 || count < floor.max(1) {
            return (count, None);
        }
        self.hist.reset();
        for (ns, n) in self.delta.values() {
            self.hist.record_n_ns(ns, n);
        }
        (count, Some(self.hist.percentile_us(percentile)))
    }
}

/// The newest read at least a window older than `now_sec` (or the first read).
fn base_of(
    reads: &VecDeque<(u64, LatencySnapshot)>,
    window_s: u64,
    now_sec: u64,
) -> Option<&(u64, LatencySnapshot)> {
    reads
        .iter()
        .rev()
        .find(|(s, _)| s + window_s <= now_sec)
        .or(reads.front())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sensors::lc_signal::LatencyWindow;
    use headroom_host::latency_bpf::program::bucket_of;

    /// The figures the prober's window gives for the same reads (the kernel sensor's path
    /// before this window): a histogram per second, merged.
    fn reference(
        window_s: f64,
        min: u64,
        reads: &[(u64, LatencySnapshot)],
        p: f64,
    ) -> Vec<(u64, Option<f64>)> {
        let mut w = LatencyWindow::new(window_s, min);
        let mut last = reads[0].1.clone();
        let mut out = Vec::new();
        for (sec, snap) in &reads[1..] {
            let mut h = LatencyHist::new();
            for (ns, n) in snap.since(&last).values() {
                h.record_n_ns(ns, n);
            }
            w.add(*sec, &h);
            last = snap.clone();
            out.push((w.count(*sec), w.percentile_us(*sec, p)));
        }
        out
    }

    /// Cumulative reads: second 0 the start, then a varying mix each second (some seconds
    /// skipped, as a late thread does), tails that come and go.
    fn reads() -> Vec<(u64, LatencySnapshot)> {
        let mut cum = LatencySnapshot::default();
        let mut out = vec![(0, cum.clone())];
        let mut sec = 0;
        for i in 0u64..60 {
            sec += if i % 17 == 5 { 2 } else { 1 };
            let n = if (20..26).contains(&i) {
                3
            } else {
                40 + i * 7 % 50
            };
            cum.buckets[bucket_of(80_000 + i * 1_000)] += n;
            cum.buckets[bucket_of(150_000)] += n / 2;
            if i % 4 == 0 {
                cum.buckets[bucket_of(2_000_000 + i * 50_000)] += 2;
            }
            out.push((sec, cum.clone()));
        }
        out
    }

    #[test]
    fn the_same_figures_as_per_second_histograms_merged() {
        let reads = reads();
        for (window_s, min) in [(15.0, 100), (10.0, 1000), (1.0, 10), (3.5, 1)] {
            let want = reference(window_s, min, &reads, 99.0);
            let mut w = KernelWindow::new(window_s, min, reads[0].1.clone());
            let got: Vec<_> = reads[1..]
                .iter()
                .map(|(sec, snap)| {
                    w.add(*sec, snap.clone());
                    w.window(*sec, 99.0)
                })
                .collect();
            // once the first window filled, the same figures; before, the kernel's publishes
            // as soon as it holds the floor (the prober's waits for a whole window)
            for (i, ((g, w), (sec, _))) in got.iter().zip(&want).zip(&reads[1..]).enumerate() {
                if *sec + 1 >= reads[1].0 + window_s.ceil() as u64 {
                    assert_eq!(g, w, "window {window_s} s, floor {min}, read {i}");
                } else {
                    assert_eq!(g.0, w.0, "window {window_s} s, floor {min}, read {i}");
                    assert_eq!(g.1.is_some(), g.0 >= min, "early: {g:?}, floor {min}");
                }
            }
            assert!(
                got.iter().any(|(_, p)| p.is_some()),
                "some window published"
            );
        }
    }

    /// A serving LC's first window publishes at its first second, not a window later; an
    /// idle one's does not, and its cross-check figure is over what it holds.
    #[test]
    fn the_first_window_publishes_once_it_holds_the_floor() {
        let mut cum = LatencySnapshot::default();
        let mut w = KernelWindow::new(15.0, 1000, cum.clone());
        cum.buckets[bucket_of(100_000)] += 3000;
        w.add(1, cum.clone());
        let (n, p) = w.window(1, 99.0);
        assert_eq!(n, 3000);
        let p = p.expect("3000 requests in the first second are enough for a p99");
        assert!((p / 100.0 - 1.0).abs() < 0.04, "{p}");
        assert!(!w.filled(1));
        assert_eq!(w.covered_s(1), 1);

        let mut idle = KernelWindow::new(15.0, 1000, LatencySnapshot::default());
        let mut few = LatencySnapshot::default();
        few.buckets[bucket_of(2_000_000)] += 40;
        idle.add(1, few.clone());
        idle.add(2, few);
        assert_eq!(idle.window(2, 99.0), (40, None));
        let (n, any) = idle.any(2, 99.0);
        assert_eq!(n, 40);
        assert!(
            any.is_some_and(|v| (v / 2000.0 - 1.0).abs() < 0.04),
            "{any:?}"
        );
        assert_eq!(idle.covered_s(2), 2);
    }

    #[test]
    fn keeps_only_the_window_and_its_base() {
        let reads = reads();
        let mut w = KernelWindow::new(15.0, 1, reads[0].1.clone());
        for (sec, snap) in &reads[1..] {
            w.add(*sec, snap.clone());
        }
        assert!(w.reads.len() <= 16, "{} reads kept", w.reads.len());
        let newest = reads.last().expect("reads").0;
        assert!(w.reads[0].0 + 15 <= newest && w.reads[1].0 + 15 > newest);
    }

    /// The window's segments are the counter's growth over the same seconds as its requests.
    #[test]
    fn segments_over_the_window() {
        let read = |segments: u64| {
            let mut r = LatencySnapshot::default();
            r.counters.segments = segments;
            r
        };
        let mut w = KernelWindow::new(2.0, 1, read(0));
        for (sec, segs) in [(1, 100), (2, 250), (3, 600), (4, 1000)] {
            w.add(sec, read(segs));
        }
        // the window ending at 4 s starts at the read of 2 s
        assert_eq!(w.segments(4), 1000 - 250);
        w.add(5, read(1200));
        assert_eq!(w.segments(5), 1200 - 600);
    }
}
