//! The study's arithmetic on fixtures: medians and spreads, EMU, SLO-violating windows, counter
//! rates from progress files, and agent decision summaries.

use headroom_bench::fixture;
use headroom_bench::runner::{summarize_decisions, DecisionPoint};
use headroom_bench::stats::{self, Spread};
use headroom_bench::study;
use headroom_report::model::{ColocationRun, Window};

#[test]
fn median_and_spread_of_repeats() {
    let s = Spread::of(&[30.0, 10.0, 20.0]).unwrap();
    assert_eq!((s.median, s.min, s.max, s.n), (20.0, 10.0, 30.0, 3));
    assert!((s.spread_pct() - 50.0).abs() < 1e-9);
    let even = Spread::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
    assert_eq!(even.median, 2.5);
    // Non-finite values are ignored, nothing finite gives None.
    assert_eq!(Spread::of(&[f64::NAN, 5.0]).unwrap().n, 1);
    assert!(Spread::of(&[f64::NAN]).is_none());
    assert!(Spread::of(&[]).is_none());
}

#[test]
fn violations_count_windows_over_the_slo_and_unmeasured_ones() {
    let tails = [Some(100.0), Some(500.0), Some(500.1), None, Some(20.0)];
    // 500 is at the SLO (not over it); 500.1 is over; a window without a measurement counts.
    assert_eq!(stats::slo_violations(&tails, 500.0), 2);
    assert_eq!(stats::slo_violations(&[], 500.0), 0);
}

#[test]
fn emu_is_lc_fraction_plus_be_fraction() {
    assert!((stats::emu(0.6, 0.5) - 1.1).abs() < 1e-12);
    assert_eq!(stats::emu(0.2, 0.0), 0.2);
}

#[test]
fn counter_rate_over_a_window() {
    // 1000 ops/s, one sample per second.
    let samples: Vec<(u64, f64)> = (0..=10).map(|i| (i * 1000, i as f64 * 1000.0)).collect();
    let r = stats::counter_rate(&samples, 2000, 7000).unwrap();
    assert!((r - 1000.0).abs() < 1e-9, "{r}");
    // A worker that stopped reporting at t=5 s (frozen) has a lower rate over [2, 10] s.
    let frozen: Vec<(u64, f64)> = samples.iter().copied().take(6).collect();
    let r = stats::counter_rate(&frozen, 2000, 10_000).unwrap();
    assert!((r - 3000.0 / 8.0).abs() < 1e-9, "{r}");
    // Entirely frozen before the window: zero.
    assert_eq!(stats::counter_rate(&frozen, 6000, 9000), Some(0.0));
    assert_eq!(stats::counter_rate(&[], 0, 1000), None);
}

fn decision(t: u64, enabled: bool, cpus: Option<usize>) -> DecisionPoint {
    DecisionPoint {
        t_unix_ms: t,
        be_enabled: enabled,
        be_cpus: cpus,
        be_weight: Some(2.0),
        be_quota_pct: None,
        reason: format!("r{t}"),
    }
}

#[test]
fn decisions_are_time_weighted_over_the_window() {
    // In effect at the start: 2 CPUs; at 5 s BE is disabled; window 0..10 s → mean 1 CPU.
    let before = decision(0, true, Some(2));
    let within = [decision(5000, false, Some(2))];
    let w = summarize_decisions(Some(&before), &within, 0, 10_000, 4).unwrap();
    assert!((w.be_cpus_mean.unwrap() - 1.0).abs() < 1e-9);
    assert!((w.be_enabled_share.unwrap() - 0.5).abs() < 1e-9);
    assert_eq!(w.decisions, 1);
    assert_eq!(w.last_reason.as_deref(), Some("r5000"));
    // No cpuset restriction means every server CPU.
    let w = summarize_decisions(Some(&decision(0, true, None)), &[], 0, 1000, 4).unwrap();
    assert_eq!(w.be_cpus_mean, Some(4.0));
    // No decision at all: nothing to say.
    assert!(summarize_decisions(None, &[], 0, 1000, 4).is_none());
}

#[test]
fn decision_lines_parse_contract_6() {
    let line = r#"{"t_ms":12,"t_unix_ms":1700000000012,"policy":"blind","observation":{},"allocation":{"be_enabled":true,"be_cpus":[1],"be_cpu_weight":{"shares":2,"weight":1},"be_cpu_idle":null,"be_quota_pct":37.5},"reason":"grow","state":{}}"#;
    let d = DecisionPoint::from_line(line).unwrap();
    assert_eq!(d.be_cpus, Some(1));
    assert_eq!(d.be_weight, Some(2.0));
    assert_eq!(d.be_quota_pct, Some(37.5));
    assert_eq!(d.reason, "grow");
    assert!(DecisionPoint::from_line("{not json").is_none());
}

/// A load result that passed its self-checks with this p99.
fn valid_with_p99(p99_us: f64) -> headroom_report::model::LoadMetrics {
    headroom_report::model::LoadMetrics {
        p99_us: Some(p99_us),
        valid: true,
        ..Default::default()
    }
}

/// A colocation manifest with a p99 SLO of `slo_us`.
fn colocation_manifest(slo_us: f64) -> headroom_report::model::Manifest {
    headroom_report::model::Manifest {
        experiment: "colocation".into(),
        slo_us,
        percentile: 99.0,
        ..Default::default()
    }
}

#[test]
fn colocation_summary_from_windows() {
    let m = headroom_report::model::Manifest {
        peak_qps: Some(100_000.0),
        ..colocation_manifest(500.0)
    };
    let mk = |i: usize, load: f64, be: Option<f64>, tail: f64| Window {
        index: i,
        start_unix_ms: i as u64 * 15_000,
        end_unix_ms: (i as u64 + 1) * 15_000,
        target_fraction: load,
        lc_load_fraction: load,
        be_fraction: be,
        load: Some(valid_with_p99(tail)),
        ..Default::default()
    };
    let run = ColocationRun {
        policy: "hybrid".into(),
        be: "spin".into(),
        windows: vec![
            mk(0, 0.2, Some(0.7), 100.0),
            mk(1, 0.9, Some(0.0), 600.0),
            mk(2, 0.5, None, 200.0),
        ],
        ..Default::default()
    };
    let s = study::colocation_run_summary(&run, &m);
    assert_eq!(s.windows, 3);
    assert_eq!(s.slo_violations, 1);
    // EMU over the windows that know their BE throughput: (0.9 + 0.9) / 2.
    assert!((s.emu_mean.unwrap() - 0.9).abs() < 1e-9);
    assert!((s.emu_min.unwrap() - 0.9).abs() < 1e-9);
    assert_eq!(s.lc_p99_us_max, Some(600.0));
    assert!((s.be_throughput_norm.unwrap() - 0.35).abs() < 1e-9);
}

#[test]
fn violating_windows_with_no_be_running_are_told_apart() {
    let mk = |tail: Option<f64>, be: Option<f64>, steal: Option<f64>| Window {
        be_fraction: be,
        steal_pct: steal,
        load: tail.map(valid_with_p99),
        ..Default::default()
    };
    let run = ColocationRun {
        policy: "hybrid".into(),
        be: "spin".into(),
        windows: vec![
            mk(Some(100.0), Some(0.0), Some(9.0)), // meets the SLO: not counted, steal ignored
            mk(Some(900.0), Some(0.0), Some(2.5)), // violates, BE frozen
            mk(Some(700.0), Some(0.005), None),    // violates, BE below 1% of solo
            mk(Some(800.0), Some(0.4), Some(0.5)), // violates with BE running
            mk(None, Some(0.5), None),             // no measurement: a violation, BE running
        ],
        ..Default::default()
    };
    let a = study::violation_attribution(&run, 500.0, 99.0);
    assert_eq!(a.violating, 4);
    assert_eq!(a.with_be_idle, 2);
    assert_eq!(a.with_client_late, 0);
    assert_eq!(a.max_steal_pct, Some(2.5));

    // The finding names them; a run whose violations all had BE running gets none.
    let m = colocation_manifest(500.0);
    let st = study::study_colocation(&m, std::slice::from_ref(&run));
    assert!(
        st.findings
            .iter()
            .any(|f| f.contains("in 2 of its 4 violating windows") && f.contains("2.5%")),
        "{:?}",
        st.findings
    );
    let busy = ColocationRun {
        windows: vec![mk(Some(900.0), Some(0.3), Some(1.0))],
        ..run
    };
    let st = study::study_colocation(&m, std::slice::from_ref(&busy));
    assert!(!st.findings.iter().any(|f| f.contains("no BE running")));
    assert!(!st.findings.iter().any(|f| f.contains("load generator")));
}

#[test]
fn violating_windows_where_the_load_generator_was_late_are_told_apart() {
    let mk = |tail: f64, lag: f64, steal: f64| {
        let mut load = valid_with_p99(tail);
        load.send_lag_p99_us = Some(lag);
        Window {
            be_fraction: Some(0.0),
            steal_pct: Some(steal),
            load: Some(load),
            ..Default::default()
        }
    };
    let run = ColocationRun {
        policy: "hybrid".into(),
        be: "spin".into(),
        windows: vec![
            mk(400_000.0, 396_000.0, 4.9), // the client stalled for most of the tail
            mk(900.0, 80.0, 0.2),          // violates, client on time
            mk(300.0, 900.0, 7.0),         // meets the SLO: not counted
        ],
        ..Default::default()
    };
    let a = study::violation_attribution(&run, 500.0, 99.0);
    assert_eq!((a.violating, a.with_client_late), (2, 1));
    assert_eq!(a.max_steal_pct, Some(4.9));
    let m = colocation_manifest(500.0);
    let st = study::study_colocation(&m, std::slice::from_ref(&run));
    let late: Vec<_> = st
        .findings
        .iter()
        .filter(|f| f.contains("load generator sent late"))
        .collect();
    assert_eq!(late.len(), 1, "{:?}", st.findings);
    assert!(late[0].contains("in 1 of its 2 violating windows") && late[0].contains("4.9%"));
    // The steal figure is said once, with the client's finding.
    let be_idle = st
        .findings
        .iter()
        .find(|f| f.contains("no BE running"))
        .unwrap();
    assert!(!be_idle.contains("hypervisor"), "{be_idle}");
}

#[test]
fn diurnal_trace_goes_20_90_20() {
    let t = fixture::diurnal(9, 0.2, 0.9);
    assert_eq!(t.len(), 9);
    assert!((t[0] - 0.2).abs() < 1e-9 && (t[8] - 0.2).abs() < 1e-9);
    assert!((t[4] - 0.9).abs() < 1e-9);
    assert!(t.windows(2).take(4).all(|w| w[1] > w[0]));
}

#[test]
fn subprocess_log_tails_lose_their_colour_codes() {
    let coloured = "\u{1b}[2m2026\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m write failed";
    assert_eq!(
        headroom_bench::runner::strip_ansi(coloured),
        "2026  WARN write failed"
    );
}

#[test]
fn medians_count_the_repeats_whose_self_checks_passed() {
    use headroom_bench::fixture::synthetic_load;
    use headroom_report::model::Point;
    let point = |repeat: u32, p99: f64, valid: bool| {
        let mut load = synthetic_load(1000.0, 50.0, 0.5, valid);
        load.p99_us = Some(p99);
        Point {
            id: format!("alone/050.0/r{repeat}"),
            series: "alone".into(),
            load_fraction: 0.5,
            repeat,
            load: Some(load),
            ..Default::default()
        }
    };
    // A noisy minute: two repeats' load generator fell behind (self-checks failed).
    let noisy = [
        point(0, 7000.0, false),
        point(1, 1300.0, false),
        point(2, 350.0, true),
    ];
    let groups = headroom_bench::study::group(&noisy, &[]);
    let level = &groups[0].1[0];
    assert_eq!(level.spread(|l| l.p99_us).unwrap().median, 350.0);
    assert_eq!(level.checks_label(), "1/3");
    // None valid: every repeat counts, and the table says NO.
    let bad = [
        point(0, 7000.0, false),
        point(1, 1300.0, false),
        point(2, 350.0, false),
    ];
    let groups = headroom_bench::study::group(&bad, &[]);
    assert_eq!(groups[0].1[0].spread(|l| l.p99_us).unwrap().median, 1300.0);
    assert_eq!(groups[0].1[0].checks_label(), "NO");
    let good = [
        point(0, 300.0, true),
        point(1, 400.0, true),
        point(2, 350.0, true),
    ];
    let groups = headroom_bench::study::group(&good, &[]);
    assert_eq!(groups[0].1[0].spread(|l| l.p99_us).unwrap().median, 350.0);
    assert_eq!(groups[0].1[0].checks_label(), "yes");
}
