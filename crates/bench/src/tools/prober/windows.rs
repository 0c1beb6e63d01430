//! The agent's latency windows against the independent load generator's, window by window.
//!
//! Pure: the decision log's records and the load generator's `--hdr` intervals in, figures out.
//! An agent window is identified by its end (the decision's wall time − the latency's age,
//! the same for every decision that reports it); the load generator's p99 for that window is
//! the merge of its one-second intervals lying inside the window (±½ s at the edges).

use headroom_load::hdrlog::LoggedInterval;
use headroom_load::stats::LatencyHist;
use headroom_types::decision::DecisionRecord;
use serde::Serialize;

/// The agreement bound: 20% of the load generator's p99, or 30 µs, whichever is larger.
pub const AGREE_FRACTION: f64 = 0.20;
pub const AGREE_FLOOR_US: f64 = 30.0;
/// Decisions reporting one window give ends that differ by rounding (ms) only.
const SAME_WINDOW_MS: u64 = 200;
/// How far an interval may stick out of a window at either edge (the intervals are 1 s long
/// and not aligned with the agent's windows).
const EDGE_SLACK_S: f64 = 0.5;
/// A window is compared only when the load generator's intervals inside it cover this share
/// of it.
const MIN_COVERAGE: f64 = 0.8;

/// Whether `agent_us` is within the bound of the reference `loadgen_us`.
pub fn agrees(agent_us: f64, loadgen_us: f64) -> bool {
    (agent_us - loadgen_us).abs() <= (AGREE_FRACTION * loadgen_us).max(AGREE_FLOOR_US)
}

/// One latency window the agent published.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentWindow {
    pub p99_us: f64,
    /// Wall-clock end, ms since the epoch.
    pub end_unix_ms: u64,
    /// Which sensor gave it (`probe`, `kernel`, …), as the decision log says.
    pub source: Option<String>,
}

/// The distinct windows in a decision log (one a second, each over the last `window_s`), in
/// order of their end.
pub fn agent_windows(records: &[DecisionRecord]) -> Vec<AgentWindow> {
    let mut all: Vec<AgentWindow> = records
        .iter()
        .filter_map(|r| {
            let o = &r.observation;
            Some(AgentWindow {
                p99_us: o.lc_latency_us?,
                end_unix_ms: r.t_unix_ms.checked_sub(o.lc_latency_age_ms?)?,
                source: o.lc_latency_source.clone(),
            })
        })
        .collect();
    all.sort_by_key(|w| w.end_unix_ms);
    let mut out: Vec<AgentWindow> = Vec::new();
    for w in all {
        match out.last() {
            Some(last) if w.end_unix_ms - last.end_unix_ms <= SAME_WINDOW_MS => {}
            _ => out.push(w),
        }
    }
    out
}

/// The agent publishes its sliding window once a second (sensors/lc_signal.rs: per-second
/// histograms, the last `window_s` of them), or says why it refuses it.
pub const PUBLISH_STEP_MS: u64 = 1000;

/// How many of the agent's publications fall where their window lies wholly inside
/// `[start_ms, end_ms]`: one a second from `start + window` on. `phase_ms` is the end of any
/// window the agent published (its publications are a second apart from it): with it, the
/// count is of the publication instants the span really holds (a 9.5 s span holds 9 or 10
/// of them, by phase); without it, the most such a span can hold.
pub fn window_slots(start_ms: u64, end_ms: u64, window_ms: u64, phase_ms: Option<u64>) -> usize {
    let first_possible = start_ms + window_ms;
    if end_ms < first_possible {
        return 0;
    }
    let first = match phase_ms {
        Some(p) => {
            let offset = (p % PUBLISH_STEP_MS + PUBLISH_STEP_MS - first_possible % PUBLISH_STEP_MS)
                % PUBLISH_STEP_MS;
            first_possible + offset
        }
        None => first_possible,
    };
    match end_ms.checked_sub(first) {
        Some(room) => (room / PUBLISH_STEP_MS + 1) as usize,
        None => 0,
    }
}

/// The load generator's p99 over one agent window, if its intervals cover it: from each
/// request's actual send where the log keeps it (the agent's sensors stamp requests in the
/// kernel and never see the reference's own send lag), else corrected.
pub fn loadgen_p99_over(
    intervals: &[LoggedInterval],
    window_start_s: f64,
    window_end_s: f64,
) -> Option<f64> {
    let mut merged = LatencyHist::new();
    let mut covered = 0.0;
    for iv in intervals.iter().filter(|iv| {
        !iv.warmup
            && iv.start_unix_s >= window_start_s - EDGE_SLACK_S
            && iv.end_unix_s() <= window_end_s + EDGE_SLACK_S
    }) {
        merged.merge(iv.actual_send.as_ref().unwrap_or(&iv.hist));
        covered += iv.duration_s;
    }
    let span = window_end_s - window_start_s;
    (covered >= MIN_COVERAGE * span && merged.count() > 0).then(|| merged.percentile_us(99.0))
}

/// One window side by side.
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    pub end_unix_ms: u64,
    pub agent_p99_us: f64,
    pub loadgen_p99_us: f64,
    pub difference_us: f64,
    pub within_bound: bool,
}

/// The agent's windows over one load run, against the load generator's.
#[derive(Debug, Clone, Serialize)]
pub struct WindowFigures {
    /// Publications (one a second) whose window lies wholly inside the load run.
    pub slots: usize,
    /// Of those, the windows the agent published (accepted).
    pub accepted: usize,
    pub accepted_pct: f64,
    /// Accepted windows the load generator's intervals cover.
    pub compared: usize,
    pub within_bound: usize,
    pub within_pct: f64,
    pub agent_p99_median_us: Option<f64>,
    pub loadgen_p99_median_us: Option<f64>,
    /// Median and largest |agent − load generator|, µs.
    pub difference_median_us: Option<f64>,
    pub difference_max_us: Option<f64>,
    /// The sources the agent's windows came from, with their counts.
    pub sources: Vec<(String, usize)>,
    pub windows: Vec<Compared>,
}

impl WindowFigures {
    /// The target: ≥ 95% of windows accepted and ≥ 95% of them within the bound.
    pub fn meets_target(&self) -> bool {
        self.slots > 0 && self.accepted_pct >= 95.0 && self.compared > 0 && self.within_pct >= 95.0
    }
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn pct(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Compares the agent's windows lying wholly inside the load run (`intervals`, warmup left
/// out) with the load generator's p99 over the same seconds. A window whose record names no
/// source (the prober as the only source does not) counts as `configured_source`'s.
pub fn compare(
    records: &[DecisionRecord],
    intervals: &[LoggedInterval],
    window_s: f64,
    configured_source: &str,
) -> WindowFigures {
    let window_ms = (window_s * 1000.0).round() as u64;
    let measured: Vec<&LoggedInterval> = intervals.iter().filter(|i| !i.warmup).collect();
    let (start_ms, end_ms) = match (measured.first(), measured.last()) {
        (Some(a), Some(b)) => (
            (a.start_unix_s * 1000.0) as u64,
            (b.end_unix_s() * 1000.0) as u64,
        ),
        _ => (0, 0),
    };
    let all = agent_windows(records);
    let inside: Vec<&AgentWindow> = all
        .iter()
        .filter(|w| w.end_unix_ms >= start_ms + window_ms && w.end_unix_ms <= end_ms)
        .collect();
    let phase = all.first().map(|w| w.end_unix_ms);
    let slots = window_slots(start_ms, end_ms, window_ms, phase).max(inside.len());
    let mut windows = Vec::new();
    for w in &inside {
        let end_s = w.end_unix_ms as f64 / 1000.0;
        if let Some(lg) = loadgen_p99_over(intervals, end_s - window_s, end_s) {
            windows.push(Compared {
                end_unix_ms: w.end_unix_ms,
                agent_p99_us: w.p99_us,
                loadgen_p99_us: lg,
                difference_us: w.p99_us - lg,
                within_bound: agrees(w.p99_us, lg),
            });
        }
    }
    let mut sources: Vec<(String, usize)> = Vec::new();
    for w in &inside {
        let s = w
            .source
            .clone()
            .unwrap_or_else(|| configured_source.to_string());
        match sources.iter_mut().find(|(name, _)| *name == s) {
            Some((_, n)) => *n += 1,
            None => sources.push((s, 1)),
        }
    }
    let within = windows.iter().filter(|c| c.within_bound).count();
    WindowFigures {
        slots,
        accepted: inside.len(),
        accepted_pct: pct(inside.len(), slots),
        compared: windows.len(),
        within_bound: within,
        within_pct: pct(within, windows.len()),
        agent_p99_median_us: median(inside.iter().map(|w| w.p99_us).collect()),
        loadgen_p99_median_us: median(windows.iter().map(|c| c.loadgen_p99_us).collect()),
        difference_median_us: median(windows.iter().map(|c| c.difference_us.abs()).collect()),
        difference_max_us: windows
            .iter()
            .map(|c| c.difference_us.abs())
            .max_by(f64::total_cmp),
        sources,
        windows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_types::allocation::Allocation;
    use headroom_types::observation::Observation;

    fn record(t_unix_ms: u64, p99: Option<f64>, age_ms: Option<u64>) -> DecisionRecord {
        DecisionRecord {
            t_ms: 0,
            t_unix_ms,
            policy: "none".into(),
            observation: Observation {
                lc_latency_us: p99,
                lc_latency_age_ms: age_ms,
                lc_latency_source: p99.map(|_| "kernel".to_string()),
                ..Observation::default()
            },
            allocation: Allocation::default(),
            reason: String::new(),
            state: serde_json::Value::Null,
            binding_lc: None,
            repeat: None,
            advertise: None,
        }
    }

    fn interval(start_s: f64, warmup: bool, values_us: &[u64]) -> LoggedInterval {
        let mut hist = LatencyHist::new();
        for v in values_us {
            hist.record_ns(v * 1000);
        }
        LoggedInterval {
            start_unix_s: start_s,
            duration_s: 1.0,
            warmup,
            hist,
            actual_send: None,
            send_lag: None,
        }
    }

    /// The actual-send figures are compared where the log keeps them: the reference's send lag
    /// is no part of what the agent's sensors see.
    #[test]
    fn the_reference_is_taken_from_actual_send_where_logged() {
        let mut ivs: Vec<LoggedInterval> = (0..10)
            .map(|i| interval(100.0 + i as f64, false, &[500; 100]))
            .collect();
        assert_eq!(
            loadgen_p99_over(&ivs, 100.0, 110.0).map(|p| p.round()),
            Some(500.0)
        );
        for iv in &mut ivs {
            let mut a = LatencyHist::new();
            for _ in 0..100 {
                a.record_ns(200_000);
            }
            iv.actual_send = Some(a);
        }
        assert_eq!(
            loadgen_p99_over(&ivs, 100.0, 110.0).map(|p| p.round()),
            Some(200.0)
        );
    }

    #[test]
    fn agreement_is_twenty_percent_or_thirty_microseconds() {
        assert!(agrees(119.0, 100.0)); // 30 µs floor
        assert!(!agrees(131.0, 100.0));
        assert!(agrees(1190.0, 1000.0)); // 20%
        assert!(!agrees(1210.0, 1000.0));
        assert!(!agrees(790.0, 1000.0));
    }

    #[test]
    fn decisions_reporting_one_window_count_once() {
        let records = [
            record(10_000, Some(100.0), Some(0)),   // ends 10 000
            record(10_500, Some(100.0), Some(499)), // the same window, rounding
            record(11_000, None, None),
            record(20_000, Some(120.0), Some(1)), // ends 19 999
        ];
        let w = agent_windows(&records);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].end_unix_ms, 10_000);
        assert_eq!(w[1].p99_us, 120.0);
        assert_eq!(w[1].source.as_deref(), Some("kernel"));
    }

    #[test]
    fn a_run_holds_one_publication_a_second_after_its_first_window() {
        // run 0..35 s, 10 s windows: publications at 10, 11, …, 35 s
        assert_eq!(window_slots(0, 35_000, 10_000, None), 26);
        assert_eq!(window_slots(0, 10_000, 10_000, None), 1);
        assert_eq!(window_slots(0, 9_999, 10_000, None), 0);
        // a 9.5 s span after the first whole window: 10 instants a second apart fit only if
        // the first falls in its first half second
        assert_eq!(window_slots(0, 19_500, 10_000, Some(123_200)), 10);
        assert_eq!(window_slots(0, 19_500, 10_000, Some(123_700)), 9);
        assert_eq!(window_slots(0, 19_500, 10_000, Some(10_000)), 10);
        assert_eq!(window_slots(0, 10_400, 10_000, Some(7_500)), 0);
    }

    #[test]
    fn windows_inside_the_run_are_compared_with_the_load_generators_seconds() {
        // load run 100..131 s, 1 s intervals of 100 samples; the first is warmup. Latency
        // 100 µs, except 20 samples of 1 ms in 120..121 s: 1.8% of the window 111..121 s,
        // whose p99 is therefore 1 ms, while 121..131 s stays at 100 µs.
        let mut intervals = vec![interval(100.0, true, &[50; 100])];
        for s in 101..131 {
            let mut v = vec![100u64; 80];
            v.extend(if s == 120 { [1_000; 20] } else { [100; 20] });
            intervals.push(interval(s as f64, false, &v));
        }
        let records = [
            record(110_500, Some(105.0), Some(500)), // window 100..110: reaches into warmup
            record(121_000, Some(1_100.0), Some(0)), // 111..121: compared, agrees
            record(131_000, Some(5_000.0), Some(0)), // 121..131: compared, does not agree
            record(140_000, Some(100.0), Some(1_000)), // 129..139: past the run's end
        ];
        let f = compare(&records, &intervals, 10.0, "probe");
        // publications at 111, 112, …, 131 s: 21, of which the log holds 2
        assert_eq!(f.slots, 21, "{f:?}");
        assert_eq!(f.accepted, 2);
        assert_eq!(f.compared, 2);
        assert_eq!(f.within_bound, 1);
        assert_eq!(f.within_pct, 50.0);
        assert!(!f.meets_target());
        let first = &f.windows[0];
        assert!(first.within_bound, "{first:?}");
        // the 1 ms second lies in 111..121 (120..121): its p99 is the 1 ms tail
        assert!(first.loadgen_p99_us > 900.0, "{first:?}");
        assert_eq!(f.sources, vec![("kernel".to_string(), 2)]);
    }

    #[test]
    fn a_run_with_no_published_window_accepts_none_of_its_slots() {
        let intervals: Vec<_> = (0..31)
            .map(|s| interval(1000.0 + s as f64, s == 0, &[100; 10]))
            .collect();
        let f = compare(&[], &intervals, 10.0, "probe");
        assert_eq!(f.slots, 21);
        assert_eq!(f.accepted, 0);
        assert_eq!(f.accepted_pct, 0.0);
        assert!(!f.meets_target());
    }
}
