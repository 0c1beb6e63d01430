//! The pure half of `headroom bench multi-lc`: the two load schedules, one window's per-service
//! verdicts, and the summary per policy. No clocks, no processes.

use serde::Serialize;

/// The two services' loads over `n` windows, as fractions of each one's capacity alone: `a`
/// falls from `hi` to `lo` and back while `b` rises from `lo` to `hi` and back (half a sine),
/// so `b` peaks exactly when `a` is at its trough — when an agent watching only `a` grows BE —
/// and the sum stays `lo + hi` (the server CPUs' LC work is the same in every window).
pub fn schedules(n: usize, lo: f64, hi: f64) -> (Vec<f64>, Vec<f64>) {
    let s = |i: usize| {
        if n <= 1 {
            1.0
        } else {
            (std::f64::consts::PI * i as f64 / (n - 1) as f64).sin()
        }
    };
    let a = (0..n).map(|i| hi - (hi - lo) * s(i)).collect();
    let b = (0..n).map(|i| lo + (hi - lo) * s(i)).collect();
    (a, b)
}

/// One service's window: what its own load generator offered and measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LcWindow {
    pub lc: String,
    pub target_fraction: f64,
    pub target_qps: f64,
    pub achieved_qps: f64,
    pub p99_us: Option<f64>,
    pub slo_us: f64,
    /// The load generator's self-checks all passed.
    pub valid: bool,
    pub failed_checks: Vec<String>,
    /// The load run could not happen (spawn, timeout, unreadable JSON).
    pub error: Option<String>,
    pub verdict: Verdict,
}

/// What a window says about one service's SLO.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Valid run, p99 within the SLO.
    Ok,
    /// Valid run, p99 above the SLO (or no p99 at all).
    Violated,
    /// The run failed or failed its self-checks: neither ok nor violated, counted apart.
    #[default]
    Invalid,
}

impl Verdict {
    pub fn of(valid: bool, error: bool, p99_us: Option<f64>, slo_us: f64) -> Verdict {
        if error || !valid {
            return Verdict::Invalid;
        }
        match p99_us {
            Some(p) if p <= slo_us => Verdict::Ok,
            _ => Verdict::Violated,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Violated => "VIOLATED",
            Verdict::Invalid => "invalid",
        }
    }
}

/// One window of one policy's run: every service, and BE's progress.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WindowRecord {
    pub policy: String,
    pub index: usize,
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
    pub lcs: Vec<LcWindow>,
    pub be_ops_per_s: Option<f64>,
    /// BE's throughput over its throughput alone on the server CPUs.
    pub be_fraction: Option<f64>,
    /// Σ achieved/capacity over the services + `be_fraction`; none when a service's run is
    /// invalid (its load is not known).
    pub emu: Option<f64>,
    /// What the agent allowed BE over the window (from its decision log), when one ran.
    pub agent: Option<headroom_report::model::AgentWindow>,
    /// CPU time the hypervisor took over the window, % of all CPU time (`/proc/stat` steal):
    /// a VM's neighbours show here, not in the guest's load.
    pub steal_pct: Option<f64>,
}

/// EMU of a window (Heracles: LC load + BE throughput, each relative to alone), summed over the
/// services: `None` when any service's window is invalid or BE's progress is unknown.
pub fn window_emu(lcs: &[(LcWindow, f64)], be_fraction: Option<f64>) -> Option<f64> {
    let mut lc = 0.0;
    for (w, capacity) in lcs {
        if w.verdict == Verdict::Invalid || *capacity <= 0.0 {
            return None;
        }
        lc += w.achieved_qps / capacity;
    }
    Some(crate::stats::emu(lc, be_fraction?))
}

/// One service under one policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LcSummary {
    pub lc: String,
    pub slo_us: f64,
    pub windows: usize,
    pub violating: usize,
    pub invalid: usize,
    /// The worst p99 of the valid windows.
    pub worst_p99_us: Option<f64>,
}

/// One policy's run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PolicySummary {
    pub policy: String,
    pub lcs: Vec<LcSummary>,
    /// Mean EMU over the windows where it is known, and how many those are.
    pub emu_mean: Option<f64>,
    pub emu_windows: usize,
    pub be_fraction_mean: Option<f64>,
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The summary of one policy's windows (services in the first window's order).
pub fn summarize(policy: &str, windows: &[WindowRecord]) -> PolicySummary {
    let names: Vec<(String, f64)> = windows
        .first()
        .map(|w| w.lcs.iter().map(|l| (l.lc.clone(), l.slo_us)).collect())
        .unwrap_or_default();
    let lcs = names
        .into_iter()
        .map(|(name, slo_us)| {
            let mine: Vec<&LcWindow> = windows
                .iter()
                .filter_map(|w| w.lcs.iter().find(|l| l.lc == name))
                .collect();
            let count = |v: Verdict| mine.iter().filter(|l| l.verdict == v).count();
            LcSummary {
                windows: mine.len(),
                violating: count(Verdict::Violated),
                invalid: count(Verdict::Invalid),
                worst_p99_us: mine
                    .iter()
                    .filter(|l| l.verdict != Verdict::Invalid)
                    .filter_map(|l| l.p99_us)
                    .reduce(f64::max),
                lc: name,
                slo_us,
            }
        })
        .collect();
    let emus: Vec<f64> = windows.iter().filter_map(|w| w.emu).collect();
    let bes: Vec<f64> = windows.iter().filter_map(|w| w.be_fraction).collect();
    PolicySummary {
        policy: policy.to_string(),
        lcs,
        emu_mean: mean(&emus),
        emu_windows: emus.len(),
        be_fraction_mean: mean(&bes),
    }
}

/// The summary table: per policy, per service, violating/valid windows, invalid ones, worst p99;
/// EMU mean.
pub fn summary_table(rows: &[PolicySummary]) -> String {
    let mut out = format!(
        "{:<8} {:<10} {:>9} {:>10} {:>8} {:>14} {:>10} {:>9}\n",
        "policy", "LC", "SLO µs", "violating", "invalid", "worst p99 µs", "BE/alone", "EMU mean"
    );
    for r in rows {
        for (i, l) in r.lcs.iter().enumerate() {
            let first = i == 0;
            out.push_str(&format!(
                "{:<8} {:<10} {:>9.0} {:>10} {:>8} {:>14} {:>10} {:>9}\n",
                if first { r.policy.as_str() } else { "" },
                l.lc,
                l.slo_us,
                format!("{}/{}", l.violating, l.windows - l.invalid),
                l.invalid,
                l.worst_p99_us.map_or("–".into(), |v| format!("{v:.0}")),
                if first {
                    r.be_fraction_mean
                        .map_or("–".into(), |v| format!("{:.0}%", v * 100.0))
                } else {
                    String::new()
                },
                if first {
                    r.emu_mean.map_or("–".into(), |v| {
                        format!("{:.0}% ({})", v * 100.0, r.emu_windows)
                    })
                } else {
                    String::new()
                },
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn b_peaks_where_a_is_at_its_trough_and_the_sum_is_constant() {
        let (a, b) = schedules(7, 0.1, 0.6);
        assert_eq!(a.len(), 7);
        assert!((a[0] - 0.6).abs() < 1e-9 && (b[0] - 0.1).abs() < 1e-9);
        assert!((a[3] - 0.1).abs() < 1e-9 && (b[3] - 0.6).abs() < 1e-9);
        for (x, y) in a.iter().zip(&b) {
            assert!((x + y - 0.7).abs() < 1e-9, "{x} + {y}");
        }
        let trough = a
            .iter()
            .enumerate()
            .min_by(|x, y| x.1.total_cmp(y.1))
            .unwrap()
            .0;
        let peak = b
            .iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .unwrap()
            .0;
        assert_eq!(trough, peak);
        // 6 windows (--quick): two middle windows share the peak
        let (a, b) = schedules(6, 0.1, 0.6);
        assert!(b[2] > 0.5 && b[3] > 0.5 && a[2] < 0.2, "{a:?} {b:?}");
        let (a, b) = schedules(1, 0.1, 0.6);
        assert!(
            (a[0] - 0.1).abs() < 1e-9 && (b[0] - 0.6).abs() < 1e-9,
            "{a:?} {b:?}"
        );
    }

    #[test]
    fn a_failed_run_is_invalid_never_ok() {
        assert_eq!(Verdict::of(true, false, Some(90.0), 100.0), Verdict::Ok);
        assert_eq!(
            Verdict::of(true, false, Some(110.0), 100.0),
            Verdict::Violated
        );
        assert_eq!(Verdict::of(true, false, None, 100.0), Verdict::Violated);
        assert_eq!(
            Verdict::of(false, false, Some(10.0), 100.0),
            Verdict::Invalid
        );
        assert_eq!(Verdict::of(true, true, Some(10.0), 100.0), Verdict::Invalid);
    }

    fn lc(name: &str, p99: f64, slo: f64, qps: f64, verdict: Verdict) -> LcWindow {
        LcWindow {
            lc: name.into(),
            achieved_qps: qps,
            p99_us: Some(p99),
            slo_us: slo,
            verdict,
            ..Default::default()
        }
    }

    #[test]
    fn emu_sums_the_services_and_is_unknown_with_an_invalid_one() {
        let a = lc("a", 50.0, 100.0, 3000.0, Verdict::Ok);
        let b = lc("b", 50.0, 200.0, 1000.0, Verdict::Violated);
        let e = window_emu(&[(a.clone(), 10_000.0), (b.clone(), 5000.0)], Some(0.25)).unwrap();
        assert!((e - (0.3 + 0.2 + 0.25)).abs() < 1e-9, "{e}");
        let bad = lc("b", 50.0, 200.0, 1000.0, Verdict::Invalid);
        assert_eq!(window_emu(&[(a.clone(), 1e4), (bad, 5e3)], Some(0.2)), None);
        assert_eq!(window_emu(&[(a, 1e4), (b, 5e3)], None), None);
    }

    #[test]
    fn the_summary_counts_each_service_apart() {
        let w = |i, a: LcWindow, b: LcWindow, emu| WindowRecord {
            policy: "hybrid".into(),
            index: i,
            lcs: vec![a, b],
            be_fraction: Some(0.5),
            emu,
            ..Default::default()
        };
        let windows = vec![
            w(
                0,
                lc("a", 80.0, 100.0, 1.0, Verdict::Ok),
                lc("b", 150.0, 200.0, 1.0, Verdict::Ok),
                Some(1.0),
            ),
            w(
                1,
                lc("a", 90.0, 100.0, 1.0, Verdict::Ok),
                lc("b", 900.0, 200.0, 1.0, Verdict::Violated),
                Some(0.8),
            ),
            w(
                2,
                lc("a", 5000.0, 100.0, 1.0, Verdict::Invalid),
                lc("b", 400.0, 200.0, 1.0, Verdict::Violated),
                None,
            ),
        ];
        let s = summarize("hybrid", &windows);
        assert_eq!(s.lcs.len(), 2);
        let (a, b) = (&s.lcs[0], &s.lcs[1]);
        assert_eq!(
            (a.lc.as_str(), a.windows, a.violating, a.invalid),
            ("a", 3, 0, 1)
        );
        assert_eq!(
            a.worst_p99_us,
            Some(90.0),
            "an invalid window's p99 is not the worst"
        );
        assert_eq!((b.lc.as_str(), b.violating, b.invalid), ("b", 2, 0));
        assert_eq!(b.worst_p99_us, Some(900.0));
        assert_eq!(s.emu_windows, 2);
        assert!((s.emu_mean.unwrap() - 0.9).abs() < 1e-9);
        let table = summary_table(&[s]);
        assert!(table.contains("2/3"), "{table}");
        assert!(table.contains("0/2"), "{table}");
        assert!(table.contains("90% (2)"), "{table}");
        assert_eq!(summarize("none", &[]).lcs.len(), 0);
    }
}
