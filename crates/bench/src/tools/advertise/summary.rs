//! What `headroom bench advertise` prints: one row per sample (the load, what hybrid granted
//! BE, the advertised value, the floor, the reason) and the run's verdict on issue 40's target
//! — never below the committed pod, at most one change per damping period while the load
//! holds, the value beside what hybrid granted. Pure: the rows and the decision log's changes
//! in, figures out.

use serde::Serialize;

/// One sample of the agent (`ctl status`) and the API (the Node's allocatable).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Seconds since the first load phase started.
    pub t_s: f64,
    /// The phase's name (`20%`, `80%`).
    pub phase: String,
    /// What the load generator was asked to send.
    pub offered_qps: f64,
    /// The LC's p99 as the agent last measured it, and its SLO.
    pub lc_p99_us: Option<f64>,
    pub slo_us: Option<f64>,
    /// The BE CPUs hybrid's last allocation granted, milli-CPUs.
    pub granted_millicpu: Option<u64>,
    /// The advertised value, its floor and reason (`None` before the first).
    pub advertised_millicpu: Option<u64>,
    pub floor_millicpu: Option<u64>,
    pub reason: Option<String>,
    /// What the Node's `status.allocatable` holds (the stand-in's copy).
    pub api_allocatable: Option<String>,
}

/// A change of the advertised value (from the decision log), ms since the agent started.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Change {
    pub t_ms: u64,
    pub to_millicpu: u64,
}

/// One load phase's verdict: from its start (less the settling time) to its end, on the
/// agent's clock.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseSummary {
    pub phase: String,
    pub changes: usize,
    /// The most changes within any one damping period of the phase's held part.
    pub max_changes_per_damping: usize,
    /// Means over the phase's rows that have both.
    pub mean_granted_millicpu: Option<f64>,
    pub mean_advertised_millicpu: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// The least value advertised, over the samples and every logged change after the first
    /// list (`None`: nothing was advertised).
    pub min_advertised_millicpu: Option<u64>,
    pub committed_millicpu: u64,
    pub damping_s: f64,
    pub phases: Vec<PhaseSummary>,
    pub never_below_committed: bool,
    pub at_most_one_change_per_damping: bool,
    pub held: bool,
}

/// The most of `times` (sorted, ms) inside any window of `width_ms` that starts at one of them.
pub fn max_in_window(times: &[u64], width_ms: u64) -> usize {
    let mut best = 0;
    let mut end = 0;
    for (i, &t) in times.iter().enumerate() {
        end = end.max(i);
        while end < times.len() && times[end] < t.saturating_add(width_ms) {
            end += 1;
        }
        best = best.max(end - i);
    }
    best
}

/// A phase on the agent's clock: its name and the ms its held part spans (from the change of
/// load plus the settling time to the next change of load).
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSpan {
    pub name: String,
    pub held_from_ms: u64,
    pub to_ms: u64,
}

fn mean(values: impl Iterator<Item = u64>) -> Option<f64> {
    let (n, sum) = values.fold((0u64, 0.0), |(n, s), v| (n + 1, s + v as f64));
    (n > 0).then(|| sum / n as f64)
}

/// The run's verdict from its rows, the logged changes and the phases.
pub fn summarize(
    rows: &[Row],
    changes: &[Change],
    phases: &[PhaseSpan],
    committed_millicpu: u64,
    damping_s: f64,
) -> Summary {
    let damping_ms = (damping_s * 1000.0).round() as u64;
    let min_advertised_millicpu = rows
        .iter()
        .filter_map(|r| r.advertised_millicpu)
        .chain(changes.iter().map(|c| c.to_millicpu))
        .min();
    let phases: Vec<PhaseSummary> = phases
        .iter()
        .map(|p| {
            let times: Vec<u64> = changes
                .iter()
                .map(|c| c.t_ms)
                .filter(|&t| t >= p.held_from_ms && t < p.to_ms)
                .collect();
            let mine = || rows.iter().filter(|r| r.phase == p.name);
            PhaseSummary {
                phase: p.name.clone(),
                changes: times.len(),
                max_changes_per_damping: max_in_window(&times, damping_ms),
                mean_granted_millicpu: mean(mine().filter_map(|r| r.granted_millicpu)),
                mean_advertised_millicpu: mean(mine().filter_map(|r| r.advertised_millicpu)),
            }
        })
        .collect();
    let never_below_committed = min_advertised_millicpu.is_some_and(|m| m >= committed_millicpu);
    let at_most_one_change_per_damping = phases.iter().all(|p| p.max_changes_per_damping <= 1);
    Summary {
        min_advertised_millicpu,
        committed_millicpu,
        damping_s,
        held: never_below_committed && at_most_one_change_per_damping,
        never_below_committed,
        at_most_one_change_per_damping,
        phases,
    }
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_string(), T::to_string)
}

/// The table's header and one row, aligned.
pub fn header() -> String {
    format!(
        "{:>6} {:>5} {:>8} {:>8} {:>6} {:>9} {:>11} {:>7} {:>10}  reason",
        "t_s",
        "phase",
        "load_qps",
        "lc_p99",
        "slo",
        "granted_m",
        "advertised_m",
        "floor_m",
        "api_alloc"
    )
}

pub fn row_line(r: &Row) -> String {
    format!(
        "{:>6.0} {:>5} {:>8.0} {:>8} {:>6} {:>9} {:>11} {:>7} {:>10}  {}",
        r.t_s,
        r.phase,
        r.offered_qps,
        opt(&r.lc_p99_us.map(|v| format!("{v:.0}"))),
        opt(&r.slo_us.map(|v| format!("{v:.0}"))),
        opt(&r.granted_millicpu),
        opt(&r.advertised_millicpu),
        opt(&r.floor_millicpu),
        opt(&r.api_allocatable),
        opt(&r.reason),
    )
}

/// The verdict in words.
pub fn summary_lines(s: &Summary) -> Vec<String> {
    let mut out = vec![format!(
        "min advertised: {}m (committed {}m): {}",
        opt(&s.min_advertised_millicpu),
        s.committed_millicpu,
        if s.never_below_committed {
            "never below"
        } else {
            "BELOW"
        }
    )];
    for p in &s.phases {
        out.push(format!(
            "phase {}: {} changes while the load held, at most {} per damping period ({} s); mean granted {}m, mean advertised {}m",
            p.phase,
            p.changes,
            p.max_changes_per_damping,
            s.damping_s,
            opt(&p.mean_granted_millicpu.map(|v| format!("{v:.0}"))),
            opt(&p.mean_advertised_millicpu.map(|v| format!("{v:.0}"))),
        ));
    }
    out.push(format!(
        "targets: never below {}m: {}; <= 1 change per damping period: {}; held: {}",
        s.committed_millicpu,
        yes(s.never_below_committed),
        yes(s.at_most_one_change_per_damping),
        yes(s.held)
    ));
    out
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(phase: &str, granted: u64, advertised: u64) -> Row {
        Row {
            t_s: 0.0,
            phase: phase.into(),
            offered_qps: 1000.0,
            lc_p99_us: Some(100.0),
            slo_us: Some(1000.0),
            granted_millicpu: Some(granted),
            advertised_millicpu: Some(advertised),
            floor_millicpu: Some(1500),
            reason: Some("slo".into()),
            api_allocatable: Some(advertised.to_string()),
        }
    }

    #[test]
    fn the_most_changes_in_one_damping_period_are_counted_from_each_change() {
        assert_eq!(max_in_window(&[], 1000), 0);
        assert_eq!(max_in_window(&[5], 1000), 1);
        // 0 and 999 in one period; 1000 starts the next
        assert_eq!(max_in_window(&[0, 999, 1000], 1000), 2);
        assert_eq!(max_in_window(&[0, 1000, 2000], 1000), 1);
    }

    /// Changes before a phase's held part (the settling after the load moved) are not held
    /// against it; two changes within a damping period of a held part are; a value below the
    /// committed pod fails the run.
    #[test]
    fn the_verdict_counts_changes_per_phase_and_the_least_value() {
        let phases = [
            PhaseSpan {
                name: "20%".into(),
                held_from_ms: 10_000,
                to_ms: 100_000,
            },
            PhaseSpan {
                name: "80%".into(),
                held_from_ms: 110_000,
                to_ms: 200_000,
            },
        ];
        let rows = [row("20%", 3000, 2000), row("80%", 1000, 1500)];
        let change = |t_ms, to_millicpu| Change { t_ms, to_millicpu };
        let ok = [
            change(1_000, 1500),
            change(20_000, 2000),
            change(105_000, 1500),
        ];
        let s = summarize(&rows, &ok, &phases, 1500, 30.0);
        assert!(s.held, "{s:?}");
        assert_eq!(s.min_advertised_millicpu, Some(1500));
        assert_eq!(s.phases[0].changes, 1);
        assert_eq!(s.phases[1].changes, 0);
        assert_eq!(s.phases[0].mean_granted_millicpu, Some(3000.0));
        let flapping = [
            change(20_000, 2000),
            change(30_000, 1500),
            change(40_000, 2000),
        ];
        let s = summarize(&rows, &flapping, &phases, 1500, 30.0);
        assert_eq!(s.phases[0].max_changes_per_damping, 3);
        assert!(!s.at_most_one_change_per_damping && !s.held);
        let below = [change(20_000, 1000)];
        let s = summarize(&rows, &below, &phases, 1500, 30.0);
        assert!(!s.never_below_committed && !s.held);
        assert!(summary_lines(&s).iter().any(|l| l.contains("BELOW")));
    }
}
