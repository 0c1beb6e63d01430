//! The scheduler over scripted node timelines (no node simulation).

use super::*;

fn params() -> AdvertiseParams {
    AdvertiseParams {
        horizon_ms: 3_600_000,
        percentile: 10.0,
        margin_millicpu: 200,
        step_millicpu: 100,
        damping_ms: 300_000,
        bucket_ms: 10_000,
        min_history_ms: 300_000,
    }
}

fn node(granted: f64, windows: usize, violating_every: Option<usize>) -> NodeTimeline {
    NodeTimeline {
        cores: 16,
        granted: vec![granted; windows],
        violating: (0..windows)
            .map(|w| violating_every.is_some_and(|k| w % k == k - 1))
            .collect(),
    }
}

#[test]
fn the_job_stream_is_seeded_and_shaped_as_documented() {
    let a = jobs(7, 0.05, 86_400.0);
    let b = jobs(7, 0.05, 86_400.0);
    assert_eq!(a.len(), b.len());
    assert!(a
        .iter()
        .zip(&b)
        .all(|(x, y)| x.submit_s == y.submit_s && x.work == y.work));
    // About rate × time jobs.
    assert!((3800..4900).contains(&a.len()), "{}", a.len());
    for j in &a {
        assert!(JOB_SIZES.iter().any(|(s, _)| *s == j.size));
        assert!((JOB_MIN_S..=JOB_MAX_S).contains(&j.duration_s));
    }
    let mut d: Vec<f64> = a.iter().map(|j| j.duration_s).collect();
    let median = crate::fleet::pct(&mut d, 0.5);
    assert!((450.0..800.0).contains(&median), "median {median}");
}

#[test]
fn advertised_placement_avoids_the_starved_node_and_never_undercuts_bound_pods() {
    // 12 h: one node with 12 free CPUs, one with 0.5 CPU.
    let windows = 12 * 240;
    let nodes = vec![node(12.0, windows, None), node(0.5, windows, None)];
    let stream = jobs(3, 12.0 * 0.5 / mean_job_cpu_s(3), windows as f64 * 15.0);
    let blind = schedule(&nodes, 15.0, &stream, Placement::Blind, params());
    let adv = schedule(&nodes, 15.0, &stream, Placement::Advertised, params());
    assert_eq!(adv.rejections, 0);
    assert!(adv.jobs_done > 0 && blind.jobs_done > 0);
    // Blind sends half the jobs to the 0.5-CPU node, where they crawl (the figure of a
    // simulated cluster day is printed by examples/cluster_day.rs, not asserted here).
    assert!(
        blind.mean_jct_s > adv.mean_jct_s && blind.jobs_done < adv.jobs_done,
        "blind {blind:?}\nadvertised {adv:?}"
    );
    assert!(
        adv.work_cpu_h >= blind.work_cpu_h,
        "blind {blind:?}\nadvertised {adv:?}"
    );
}

#[test]
fn without_the_floor_a_violation_undercuts_what_bound_pods_requested() {
    let windows = 6 * 240;
    // The LC violates one window in 200: the advertiser falls to 0 (no floor) with pods bound.
    let nodes = vec![node(8.0, windows, Some(200)), node(8.0, windows, Some(200))];
    let stream = jobs(5, 16.0 * 0.6 / mean_job_cpu_s(5), windows as f64 * 15.0);
    let no_floor = schedule(
        &nodes,
        15.0,
        &stream,
        Placement::AdvertisedNoFloor,
        params(),
    );
    let floor = schedule(&nodes, 15.0, &stream, Placement::Advertised, params());
    assert!(no_floor.rejections > 0, "{no_floor:?}");
    assert_eq!(floor.rejections, 0, "{floor:?}");
    assert_eq!(floor.lc_violations, 2 * (windows / 200) as u64);
}
