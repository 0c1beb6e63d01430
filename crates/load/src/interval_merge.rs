//! Per-worker interval reports merged into whole intervals, in order.

use std::collections::BTreeMap;

use crate::engine::{IntervalMsg, INTERVAL_NS};
use crate::results::Interval;
use crate::stats::LatencyHist;

/// One interval's reports so far.
#[derive(Default)]
struct PendingInterval {
    hist: LatencyHist,
    actual_send: LatencyHist,
    send_lag: LatencyHist,
    completed: u64,
    /// Workers that reported it (a straggler folded in does not count).
    reports: usize,
}

impl PendingInterval {
    fn merge(&mut self, msg: &IntervalMsg, counts: bool) {
        self.hist.merge(&msg.hist);
        self.actual_send.merge(&msg.actual_send);
        self.send_lag.merge(&msg.send_lag);
        self.completed += msg.completed;
        if counts {
            self.reports += 1;
        }
    }
}

/// Merges per-worker interval reports into whole intervals, in order.
pub(crate) struct IntervalMerger {
    workers: usize,
    t0: u64,
    warm_end: u64,
    pending: BTreeMap<u64, PendingInterval>,
    next: u64,
}

impl IntervalMerger {
    pub(crate) fn new(workers: usize, t0: u64, warm_end: u64) -> Self {
        IntervalMerger {
            workers,
            t0,
            warm_end,
            pending: BTreeMap::new(),
            next: 0,
        }
    }

    pub(crate) fn add(&mut self, msg: IntervalMsg) -> Vec<Interval> {
        if msg.index < self.next {
            // A straggler for an interval already shown: fold it into the next one.
            self.pending
                .entry(self.next)
                .or_default()
                .merge(&msg, false);
            return Vec::new();
        }
        self.pending.entry(msg.index).or_default().merge(&msg, true);
        let _ = msg.worker;
        // Every interval up to the newest complete one is ready.
        let ready = self
            .pending
            .iter()
            .filter(|(_, v)| v.reports >= self.workers)
            .map(|(k, _)| *k)
            .max();
        match ready {
            Some(upto) => self.take_upto(upto, None),
            None => Vec::new(),
        }
    }

    fn take_upto(&mut self, upto: u64, end_ns: Option<u64>) -> Vec<Interval> {
        let mut out = Vec::new();
        let keys: Vec<u64> = self.pending.range(..=upto).map(|(k, _)| *k).collect();
        for k in keys {
            let p = self.pending.remove(&k).expect("key listed");
            let start = self.t0 + k * INTERVAL_NS;
            let stop = match end_ns {
                Some(e) if k == upto => e.clamp(start + 1, start + INTERVAL_NS),
                _ => start + INTERVAL_NS,
            };
            let interval_s = (stop - start) as f64 * 1e-9;
            out.push(Interval {
                index: k,
                t_s: (stop - self.t0) as f64 * 1e-9,
                interval_s,
                qps: p.completed as f64 / interval_s,
                hist: p.hist,
                actual_send: p.actual_send,
                send_lag: p.send_lag,
                warmup: stop <= self.warm_end,
            });
            self.next = k + 1;
        }
        out
    }

    pub(crate) fn finish(&mut self, now: u64) -> Vec<Interval> {
        match self.pending.keys().next_back().copied() {
            Some(last) => self.take_upto(last, Some(now)),
            None => Vec::new(),
        }
    }
}
