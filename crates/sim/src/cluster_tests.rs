//! The scheduler over scripted node timelines (no node simulation).

use super::*;

fn params() -> AdvertiseParams {
    AdvertiseParams {
        horizon_ms: 3_600_000,
        percentile: 10.0,
        margin: 200,
        step: 100,
        cap: None,
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
    let blind = blind(&nodes, &stream, NodeCosts::none());
    let adv = schedule(
        &nodes,
        15.0,
        &stream,
        Placement::Advertised,
        params(),
        NodeCosts::none(),
    );
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
        NodeCosts::none(),
    );
    let floor = schedule(
        &nodes,
        15.0,
        &stream,
        Placement::Advertised,
        params(),
        NodeCosts::none(),
    );
    assert!(no_floor.rejections > 0, "{no_floor:?}");
    assert_eq!(floor.rejections, 0, "{floor:?}");
    assert_eq!(floor.lc_violations, 2 * (windows / 200) as u64);
}

fn job(submit_s: f64, size: f64, duration_s: f64, mem_gib: f64) -> Job {
    Job {
        submit_s,
        size,
        work: size * duration_s,
        duration_s,
        mem_gib,
        failures: 0,
        ready_s: 0.0,
    }
}

/// Costs with a BE memory budget of `budget_gib` on a node of 16 cores, no timesharing loss.
/// The stream placed blind (as BestEffort pods are) on `nodes`, 15 s windows, default
/// advertiser, `costs`.
fn blind(nodes: &[NodeTimeline], stream: &[Job], costs: NodeCosts) -> PlacementOutcome {
    schedule(nodes, 15.0, stream, Placement::Blind, params(), costs)
}

fn memory_only(budget_gib: f64) -> NodeCosts {
    NodeCosts {
        node_mem_gib_per_core: 1.0,
        be_mem_fraction: budget_gib / 16.0,
        timeshare_loss: 0.0,
        ..Default::default()
    }
}

#[test]
fn a_crowded_node_evicts_the_largest_pods_until_the_rest_fit() {
    let c = memory_only(6.0);
    let running = vec![
        job(0.0, 1.0, 60.0, 2.0),
        job(0.0, 1.0, 60.0, 5.0),
        job(0.0, 1.0, 60.0, 3.0),
    ];
    // 10 GiB in a 6 GiB budget: the 5 GiB pod goes, then 5 GiB fit.
    assert_eq!(c.evict(&running, c.be_mem_budget_gib(16)), vec![1]);
    assert!(c.evict(&running[..1], c.be_mem_budget_gib(16)).is_empty());
    assert!(NodeCosts::none()
        .evict(&running, NodeCosts::none().be_mem_budget_gib(16))
        .is_empty());
}

#[test]
fn an_evicted_pod_loses_its_progress_and_is_requeued_until_it_fits() {
    // One node, 4 CPUs granted throughout, 6 GiB for BE. A (5 GiB) runs 10 windows; B (3 GiB)
    // arrives: 8 GiB, A is evicted with 10 windows of progress lost, and is evicted again at
    // each rebinding until B is done; then A runs to the end.
    let windows = 200;
    let nodes = vec![node(4.0, windows, None)];
    let stream = vec![job(0.0, 1.0, 600.0, 5.0), job(150.0, 1.0, 300.0, 3.0)];
    let o = blind(&nodes, &stream, memory_only(6.0));
    assert_eq!(o.jobs_done, 2, "{o:?}");
    assert!(o.evictions > 1 && o.jobs_failed == 0, "{o:?}");
    assert!((o.lost_cpu_h * 3600.0 - 150.0).abs() < 1e-6, "{o:?}");
    // Useful work is both jobs whole, the lost progress apart.
    assert!((o.work_cpu_h * 3600.0 - 900.0).abs() < 1e-6, "{o:?}");
    // Without the memory cost nobody is evicted.
    let free = blind(&nodes, &stream, NodeCosts::none());
    assert_eq!((free.evictions, free.lost_cpu_h), (0, 0.0));
    assert!(free.mean_jct_s < o.mean_jct_s, "{free:?}\n{o:?}");
}

#[test]
fn timesharing_more_pods_than_granted_cpus_loses_the_named_fraction() {
    let c = NodeCosts::default();
    assert_eq!(c.timeshare_efficiency(2.0, 4.0), 1.0);
    assert_eq!(c.timeshare_efficiency(4.0, 4.0), 1.0);
    assert!((c.timeshare_efficiency(6.0, 4.0) - (1.0 - c.timeshare_loss)).abs() < 1e-12);
    // On a node: two 2-CPU jobs on 2 granted CPUs take longer than without the loss.
    let nodes = vec![node(2.0, 400, None)];
    let stream = vec![job(0.0, 2.0, 600.0, 0.0), job(0.0, 2.0, 600.0, 0.0)];
    let with = NodeCosts {
        timeshare_loss: 0.1,
        ..NodeCosts::none()
    };
    let lossy = blind(&nodes, &stream, with);
    let free = blind(&nodes, &stream, NodeCosts::none());
    assert_eq!((lossy.jobs_done, free.jobs_done), (2, 2));
    assert!(lossy.mean_jct_s > free.mean_jct_s, "{lossy:?}\n{free:?}");
}

#[test]
fn a_pod_at_zero_cpus_makes_no_progress_but_keeps_its_memory() {
    // 0 CPUs granted all day: the job never finishes, and its memory still counts.
    let nodes = vec![node(0.0, 100, None)];
    let stream = vec![job(0.0, 1.0, 60.0, 5.0), job(30.0, 1.0, 60.0, 3.0)];
    let o = blind(&nodes, &stream, memory_only(6.0));
    assert_eq!(o.jobs_done, 0);
    assert_eq!(o.work_cpu_h, 0.0);
    assert!(o.evictions > 0, "{o:?}");
    assert_eq!(o.lost_cpu_h, 0.0);
}

#[test]
fn drawn_memory_is_seeded_proportional_to_size_and_leaves_the_stream_alone() {
    let a = jobs(9, 0.05, 20_000.0);
    let mut b = a.clone();
    let c = NodeCosts::default();
    c.draw_memory(9, &mut b);
    let mut b2 = a.clone();
    c.draw_memory(9, &mut b2);
    for ((x, y), z) in a.iter().zip(&b).zip(&b2) {
        assert_eq!((x.submit_s, x.work), (y.submit_s, y.work));
        assert_eq!(y.mem_gib, z.mem_gib);
        let per_cpu = y.mem_gib / y.size;
        assert!((c.job_mem_gib_per_cpu / 8.0..=c.job_mem_gib_per_cpu * 8.0).contains(&per_cpu));
    }
}

#[test]
fn the_job_controller_backs_off_and_gives_up_after_the_limit() {
    let c = NodeCosts::default();
    assert_eq!(c.backoff_s(1), Some(10.0));
    assert_eq!(c.backoff_s(2), Some(20.0));
    assert_eq!(c.backoff_s(6), Some(320.0));
    assert_eq!(c.backoff_s(7), None);
    // A job bigger than any node's BE memory: evicted backoff_limit + 1 times, then failed.
    let nodes = vec![node(4.0, 2000, None)];
    let stream = vec![job(0.0, 1.0, 600.0, 50.0)];
    let o = blind(&nodes, &stream, memory_only(6.0));
    assert_eq!(
        (o.evictions, o.jobs_failed, o.jobs_done),
        (7, 1, 0),
        "{o:?}"
    );
    assert_eq!(o.waiting_end, 0, "{o:?}");
}

/// Mean JCT over every submitted job counts the unfinished ones with their time so far: a node
/// too small for the jobs finishes none of them, and that mean is then the mean time from
/// submission to the day's end, not the 0 of an empty finished-only mean.
#[test]
fn mean_jct_over_all_jobs_counts_the_unfinished_to_the_days_end() {
    let windows = 240; // one hour of 15-s windows
    let nodes = vec![node(0.0, windows, None)];
    let stream = jobs(3, 4.0 / mean_job_cpu_s(3), windows as f64 * 15.0);
    let o = blind(&nodes, &stream, NodeCosts::none());
    assert_eq!(o.jobs_done, 0, "{o:?}");
    assert!(o.jobs_submitted > 0, "{o:?}");
    let day_end = windows as f64 * 15.0;
    let submitted: Vec<f64> = stream
        .iter()
        .filter(|j| j.submit_s < day_end)
        .map(|j| day_end - j.submit_s)
        .collect();
    let expected = submitted.iter().sum::<f64>() / submitted.len() as f64;
    assert!(
        (o.mean_jct_all_s - expected).abs() < 1e-6,
        "{} vs {expected}",
        o.mean_jct_all_s
    );
    assert_eq!(o.mean_jct_s, 0.0);
}

/// Advertised placement fits jobs by the advertised be-memory too: on the crowded node of
/// `an_evicted_pod_loses_its_progress_and_is_requeued_until_it_fits` (6 GiB for BE; A 5 GiB, B
/// 3 GiB) B waits for A instead of evicting it; a job larger than the node's be-memory is
/// never bound (it waits, it does not fail); blind still evicts.
#[test]
fn advertised_placement_fits_be_memory_so_nothing_is_evicted() {
    let windows = 400;
    let nodes = vec![node(4.0, windows, None)];
    // After the advertiser's warming (300 s = 20 windows).
    let stream = vec![
        job(400.0, 1.0, 600.0, 5.0),
        job(550.0, 1.0, 300.0, 3.0),
        job(600.0, 1.0, 300.0, 50.0),
    ];
    let adv = schedule(
        &nodes,
        15.0,
        &stream,
        Placement::Advertised,
        params(),
        memory_only(6.0),
    );
    assert_eq!((adv.evictions, adv.jobs_failed), (0, 0), "{adv:?}");
    assert_eq!((adv.jobs_done, adv.waiting_end), (2, 1), "{adv:?}");
    assert_eq!(adv.rejections, 0, "{adv:?}");
    let blind = blind(&nodes, &stream, memory_only(6.0));
    assert!(blind.evictions > 0, "{blind:?}");
    // The memory advertiser's parameters are the agent's defaults on be-cpu's horizon.
    let m = memory_params(params());
    assert_eq!((m.horizon_ms, m.damping_ms), (3_600_000, 300_000));
    assert_eq!((m.percentile, m.margin), (0.0, 512 << 20));
}

#[test]
fn blind_pods_spread_in_proportion_to_node_size_as_kube_scheduler_scores_them() {
    // 100 BestEffort pods, one at a time, on an 8- and a 32-CPU node: the highest
    // LeastAllocated score wins, as in `schedule`'s blind placement.
    let cores = [8u32, 32];
    let mut pods = [0usize; 2];
    for _ in 0..100 {
        let best = (0..2)
            .max_by_key(|&i| {
                (
                    least_allocated_score(cores[i], pods[i] + 1, 4.0),
                    std::cmp::Reverse(i),
                )
            })
            .unwrap();
        pods[best] += 1;
    }
    // By count it would be 50 / 50; by size 20 / 80 (integer scores blur it a little).
    assert!((15..=25).contains(&pods[0]), "{pods:?}");
    // A pod that requests nothing still scores lower on a fuller node.
    assert!(least_allocated_score(8, 10, 4.0) < least_allocated_score(8, 1, 4.0));
    assert_eq!(least_allocated_score(8, 1000, 4.0), 0);
}
