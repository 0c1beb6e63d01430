//! Scripted tick sequences through the advertiser.

use super::*;
use headroom_types::allocation::Allocation;
use headroom_types::CpuSet;

const S: u64 = 1000;

fn params() -> AdvertiseParams {
    AdvertiseParams {
        horizon_ms: 600 * S,
        percentile: 10.0,
        margin: 200,
        step: 100,
        cap: None,
        damping_ms: 60 * S,
        bucket_ms: 10 * S,
        min_history_ms: 120 * S,
    }
}

fn held(t_ms: u64, granted: u64, floor: u64) -> Tick {
    Tick {
        t_ms,
        granted_millicpu: granted,
        health: LcHealth::Held,
        floor_millicpu: floor,
    }
}

fn violating(t_ms: u64, floor: u64) -> Tick {
    Tick {
        t_ms,
        granted_millicpu: 0,
        health: LcHealth::Violating {
            lc: "shop/cart-0".into(),
        },
        floor_millicpu: floor,
    }
}

/// Runs `ticks` (one a second from `from_s` to `to_s`, `make(t_ms)`); the changes made.
fn run(
    a: &mut Advertiser,
    from_s: u64,
    to_s: u64,
    make: impl Fn(u64) -> Tick,
) -> (Advertisement, Vec<AdvertiseChange>) {
    let mut changes = Vec::new();
    let mut last = None;
    for s in from_s..to_s {
        let (ad, c) = a.update(&make(s * S));
        changes.extend(c);
        last = Some(ad);
    }
    (last.expect("at least one tick"), changes)
}

#[test]
fn the_number_is_a_low_percentile_of_what_was_granted_less_the_margin() {
    let mut a = Advertiser::new(params());
    // Warming: nothing above the floor (0) for the first 120 s.
    let (ad, changes) = run(&mut a, 0, 100, |t| held(t, 1500, 0));
    assert_eq!(
        (ad.value_millicpu, ad.reason),
        (0, AdvertiseReason::Warming)
    );
    assert_eq!(changes.len(), 1, "only the first value: {changes:?}");
    // Granted alternates 1500 / 1000 per 10 s bucket, then 10% of the time 300.
    let granted = |t: u64| match (t / (10 * S)) % 10 {
        0 => 300,
        b if b % 2 == 0 => 1500,
        _ => 1000,
    };
    let (ad, changes) = run(&mut a, 100, 400, |t| held(t, granted(t), 0));
    // p10 of the buckets: the 300 buckets are 10% (plus the warming 1500s); p10 picks 300, or
    // 1000 once enough of the others outweigh them.
    assert_eq!(ad.reason, AdvertiseReason::Slo, "{ad:?}");
    let p = ad.horizon.percentile_millicpu;
    assert!(p == 300 || p == 1000, "{ad:?}");
    assert_eq!(ad.value_millicpu, (p - 200) / 100 * 100);
    assert!(ad.horizon.min_millicpu == 300 && ad.horizon.max_millicpu == 1500);
    assert!(!changes.is_empty());
}

#[test]
fn a_violation_drops_it_to_zero_at_once_and_it_rises_damped() {
    let mut a = Advertiser::new(params());
    let (ad, _) = run(&mut a, 0, 300, |t| held(t, 2000, 0));
    assert_eq!((ad.value_millicpu, ad.reason), (1800, AdvertiseReason::Slo));
    // One violating tick: 0 the same tick.
    let (ad, c) = a.update(&violating(300 * S, 0));
    assert_eq!(
        (ad.value_millicpu, ad.reason),
        (0, AdvertiseReason::Violating)
    );
    let c = c.expect("a change");
    assert_eq!((c.from_millicpu, c.to_millicpu), (Some(1800), 0));
    assert!(c.detail.contains("shop/cart-0"), "{c:?}");
    // Held again: the one 0 bucket is under p10 of the 30 horizon buckets, so the target is
    // back at 1800 at once, but the rise waits a damping period after the violation.
    let (ad, changes) = run(&mut a, 301, 360, |t| held(t, 2000, 0));
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!((ad.value_millicpu, ad.reason), (0, AdvertiseReason::Damped));
    assert_eq!(ad.target_millicpu, 1800);
    let (ad, changes) = run(&mut a, 360, 420, |t| held(t, 2000, 0));
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].t_ms, 360 * S);
    assert_eq!((ad.value_millicpu, ad.reason), (1800, AdvertiseReason::Slo));
}

#[test]
fn never_below_what_bound_pods_requested() {
    let mut a = Advertiser::new(params());
    // A pod committed at 1.5 CPUs from the start: the floor holds even while warming.
    let (ad, _) = run(&mut a, 0, 50, |t| held(t, 3000, 1500));
    assert_eq!(
        (ad.value_millicpu, ad.reason),
        (1500, AdvertiseReason::Floor)
    );
    let (ad, _) = run(&mut a, 50, 300, |t| held(t, 3000, 1500));
    assert_eq!((ad.value_millicpu, ad.reason), (2800, AdvertiseReason::Slo));
    // Violating, and untrusted: down to the floor, not to 0.
    let (ad, _) = a.update(&violating(300 * S, 1500));
    assert_eq!(
        (ad.value_millicpu, ad.reason),
        (1500, AdvertiseReason::Floor)
    );
    assert!(ad.detail.contains("violates"), "{}", ad.detail);
    let (ad, _) = a.update(&Tick {
        health: LcHealth::Untrusted {
            reason: "latency unknown".into(),
        },
        ..held(301 * S, 0, 1500)
    });
    assert_eq!(ad.value_millicpu, 1500);
    assert!(ad.detail.contains("latency unknown"), "{}", ad.detail);
    // A second pod binds while it is damped: the floor rises at once.
    let (ad, c) = a.update(&violating(302 * S, 2500));
    assert_eq!(ad.value_millicpu, 2500);
    assert_eq!(c.unwrap().to_millicpu, 2500);
    // Every tick of a long sequence: never below the floor.
    let mut a = Advertiser::new(params());
    for s in 0..2000u64 {
        let floor = if s % 300 < 150 { 1500 } else { 700 };
        let tick = if s % 97 < 5 {
            violating(s * S, floor)
        } else {
            held(s * S, (s * 37) % 4000, floor)
        };
        let (ad, _) = a.update(&tick);
        assert!(ad.value_millicpu >= floor, "t={s}: {ad:?}");
    }
}

#[test]
fn a_flapping_lc_does_not_make_it_flap() {
    let mut a = Advertiser::new(params());
    run(&mut a, 0, 300, |t| held(t, 2000, 500));
    // The LC violates 2 s of every 20 for ten minutes.
    let (ad, changes) = run(&mut a, 300, 900, |t| {
        if (t / S) % 20 < 2 {
            violating(t, 500)
        } else {
            held(t, 2000, 500)
        }
    });
    assert_eq!(changes.len(), 1, "one fall, no rise: {changes:?}");
    assert_eq!(changes[0].to_millicpu, 500);
    assert_eq!(ad.value_millicpu, 500);
    // Quiet again: one rise after the damping period (the troubled buckets still weigh on the
    // percentile, so the target may be lower than before, but it is one change).
    let (_, changes) = run(&mut a, 900, 1200, |t| held(t, 2000, 500));
    assert!(changes.len() <= 2, "{changes:?}");
    for w in changes.windows(2) {
        assert!(w[1].t_ms - w[0].t_ms >= 60 * S, "{changes:?}");
    }
}

#[test]
fn rises_are_whole_steps_at_most_one_per_damping_period() {
    let mut a = Advertiser::new(params());
    // Granted creeps up 10 m a second: the rises come a damping period apart.
    let (_, changes) = run(&mut a, 0, 1200, |t| held(t, 500 + t / S * 10, 0));
    let rises: Vec<&AdvertiseChange> = changes
        .iter()
        .filter(|c| c.from_millicpu.is_some_and(|f| c.to_millicpu > f))
        .collect();
    assert!(rises.len() >= 3, "{changes:?}");
    for w in rises.windows(2) {
        assert!(w[1].t_ms - w[0].t_ms >= 60 * S, "{changes:?}");
        assert!(w[1].to_millicpu - w[0].to_millicpu >= 100, "{changes:?}");
    }
    for c in &changes {
        assert_eq!(c.to_millicpu % 100, 0, "{c:?}");
    }
}

#[test]
fn the_horizon_forgets_what_is_older() {
    let mut a = Advertiser::new(params());
    // A bad first 5 minutes (little granted), then 15 minutes of plenty: once the bad buckets
    // leave the 10-minute horizon, the percentile is the plenty.
    run(&mut a, 0, 300, |t| held(t, 200, 0));
    let (ad, _) = run(&mut a, 300, 1200, |t| held(t, 3000, 0));
    assert_eq!(ad.horizon.min_millicpu, 3000, "{:?}", ad.horizon);
    assert!(ad.horizon.buckets <= 61, "{:?}", ad.horizon);
    assert_eq!(ad.value_millicpu, 2800);
}

#[test]
fn granted_follows_the_allocation() {
    let mut alloc = Allocation {
        be_enabled: true,
        ..Allocation::default()
    };
    assert_eq!(granted_millicpu(&alloc, 8), 8000);
    alloc.be_cpus = Some("2-4".parse::<CpuSet>().unwrap());
    assert_eq!(granted_millicpu(&alloc, 8), 3000);
    // A quota is a percentage of one CPU: 150 % is 1.5 CPUs, whatever the machine's size.
    alloc.be_quota_pct = Some(150.0);
    assert_eq!(granted_millicpu(&alloc, 8), 1500);
    assert_eq!(
        granted_millicpu(&alloc, 8) as f64,
        alloc.be_cpu_capacity(8) * 1000.0
    );
    alloc.be_quota_pct = Some(25.0);
    assert_eq!(granted_millicpu(&alloc, 8), 250);
    // Above the cpuset: the cpuset bounds it.
    alloc.be_quota_pct = Some(500.0);
    assert_eq!(granted_millicpu(&alloc, 8), 3000);
    alloc.be_enabled = false;
    assert_eq!(granted_millicpu(&alloc, 8), 0);
}
