//! The LC service's tail latency and load as the sources publish them: a shared cell each source
//! thread updates once per window step, which the sensor loop reads every tick without blocking
//! on I/O, and a sliding window of per-second latency histograms.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use headroom_load::stats::LatencyHist;

/// The latest value of an LC signal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub value: f64,
    /// When the value's measurement window ended.
    pub at: Instant,
}

/// A value shared between a source thread and the sensor loop, plus the source's error count.
#[derive(Debug, Default)]
pub struct SignalCell {
    latest: Mutex<Option<Reading>>,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl SignalCell {
    pub fn new() -> Arc<SignalCell> {
        Arc::new(SignalCell::default())
    }

    pub fn publish(&self, value: f64, at: Instant) {
        *self.latest.lock().expect("signal lock") = Some(Reading { value, at });
    }

    pub fn latest(&self) -> Option<Reading> {
        *self.latest.lock().expect("signal lock")
    }

    /// Counts an error and keeps its message (logged once per distinct message).
    pub fn error(&self, what: &str, message: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_error.lock().expect("signal lock");
        if last.as_deref() != Some(message.as_str()) {
            tracing::warn!(source = what, error = %message, "LC signal source error");
            *last = Some(message);
        }
    }

    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("signal lock").clone()
    }
}

/// Tells source threads to stop.
pub type StopFlag = Arc<AtomicBool>;

/// Per-second latency histograms over a sliding window of `window_s` seconds.
#[derive(Debug)]
pub struct LatencyWindow {
    window_s: u64,
    /// A window with fewer samples publishes nothing: a p99 of 200 probes is their second
    /// slowest, and one slow start-up second must not read as an SLO violation (which turns BE
    /// off for the whole cooldown).
    min_samples: u64,
    slots: VecDeque<(u64, LatencyHist)>,
    /// The first second that ever held samples: nothing is published before the window has
    /// filled once. Heracles decides on 15 s windows because shorter ones are not meaningful;
    /// a window of the first seconds after a start holds the start-up transient (one such
    /// 4-second window, p99 2.9 ms, turned BE off for a 5-minute cooldown in an isolation run).
    first_sec: Option<u64>,
}

impl LatencyWindow {
    pub fn new(window_s: f64, min_samples: u64) -> LatencyWindow {
        LatencyWindow {
            window_s: window_s.ceil().max(1.0) as u64,
            min_samples: min_samples.max(1),
            slots: VecDeque::new(),
            first_sec: None,
        }
    }

    /// The histogram of second `sec` (created if missing; older seconds beyond the window go).
    pub fn slot(&mut self, sec: u64) -> &mut LatencyHist {
        self.first_sec = Some(self.first_sec.map_or(sec, |f| f.min(sec)));
        if self.slots.back().is_none_or(|(s, _)| *s < sec) {
            self.slots.push_back((sec, LatencyHist::new()));
        }
        while self
            .slots
            .front()
            .is_some_and(|(s, _)| *s + self.window_s <= sec)
        {
            self.slots.pop_front();
        }
        match self.slots.iter().rposition(|(s, _)| *s <= sec) {
            Some(i) => &mut self.slots[i].1,
            None => {
                // Older than every kept second but still inside the window.
                self.slots.push_front((sec, LatencyHist::new()));
                &mut self.slots[0].1
            }
        }
    }

    /// Adds a whole histogram to second `sec`.
    pub fn add(&mut self, sec: u64, hist: &LatencyHist) {
        self.slot(sec).merge(hist);
    }

    /// The percentile over the seconds in `(now_sec - window_s, now_sec]`, µs; `None` while the
    /// window holds fewer than `min_samples`, or has not yet been full once.
    pub fn percentile_us(&self, now_sec: u64, percentile: f64) -> Option<f64> {
        if self
            .first_sec
            .is_none_or(|f| now_sec + 1 < f + self.window_s)
        {
            return None;
        }
        let mut merged = LatencyHist::new();
        for (s, h) in &self.slots {
            if *s + self.window_s > now_sec && *s <= now_sec {
                merged.merge(h);
            }
        }
        (!merged.is_empty() && merged.count() >= self.min_samples)
            .then(|| merged.percentile_us(percentile))
    }

    /// Samples in the window ending at `now_sec`.
    pub fn count(&self, now_sec: u64) -> u64 {
        self.slots
            .iter()
            .filter(|(s, _)| *s + self.window_s > now_sec && *s <= now_sec)
            .map(|(_, h)| h.count())
            .sum()
    }
}

/// A counter turned into a rate: the per-second rate between the last two readings.
#[derive(Debug, Default)]
pub struct CounterRate {
    last: Option<(f64, Instant)>,
}

impl CounterRate {
    /// Feeds a counter value; returns the rate once two readings exist (a counter reset gives
    /// no rate for that step).
    pub fn update(&mut self, value: f64, at: Instant) -> Option<f64> {
        let rate = match self.last {
            Some((v, t)) if value >= v => {
                let dt = at.saturating_duration_since(t).as_secs_f64();
                (dt > 0.0).then(|| (value - v) / dt)
            }
            _ => None,
        };
        self.last = Some((value, at));
        rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_drops_old_seconds() {
        let mut w = LatencyWindow::new(2.0, 1);
        w.slot(10).record_ns(1_000_000);
        assert!(
            w.percentile_us(10, 100.0).is_none(),
            "one second of a 2 s window"
        );
        w.slot(11).record_ns(2_000_000);
        assert!(
            w.percentile_us(11, 100.0).is_some(),
            "the window has filled"
        );
        assert_eq!(w.count(11), 2);
        w.slot(12).record_ns(3_000_000);
        assert_eq!(w.count(12), 2);
        let p = w.percentile_us(12, 100.0).unwrap();
        assert!((p - 3000.0).abs() < 10.0, "{p}");
        assert!(w.percentile_us(20, 99.0).is_none());
    }

    #[test]
    fn window_publishes_only_with_enough_samples() {
        // p99 needs 1000 samples (10 beyond it): 999 slow-start samples publish nothing.
        let mut w = LatencyWindow::new(15.0, headroom_load::stats::min_samples_for(99.0));
        w.slot(0).record_ns(100_000);
        for _ in 0..998 {
            w.slot(14).record_ns(5_000_000);
        }
        assert_eq!(w.percentile_us(14, 99.0), None);
        w.slot(14).record_ns(100_000);
        let p = w.percentile_us(14, 99.0).expect("1000 samples suffice");
        assert!((p - 5000.0).abs() < 10.0, "{p}");
        // The slow second leaves the window: nothing left, nothing published again.
        assert_eq!(w.percentile_us(29, 99.0), None);
    }

    #[test]
    fn nothing_is_published_before_the_window_has_filled_once() {
        // A 15 s window: 14 seconds of a slow start publish nothing, however many samples.
        let mut w = LatencyWindow::new(15.0, 1000);
        for sec in 100..114 {
            for _ in 0..2000 {
                w.slot(sec).record_ns(3_000_000);
            }
        }
        assert_eq!(w.percentile_us(113, 99.0), None);
        w.slot(114).record_ns(100_000);
        let p = w.percentile_us(114, 99.0).expect("full window");
        assert!((p - 3000.0).abs() < 10.0, "{p}");
    }

    #[test]
    fn counter_rate() {
        let t0 = Instant::now();
        let mut r = CounterRate::default();
        assert_eq!(r.update(100.0, t0), None);
        let rate = r
            .update(300.0, t0 + std::time::Duration::from_secs(2))
            .unwrap();
        assert_eq!(rate, 100.0);
    }
}
