//! Scripted memory figures through the be-memory advertiser.

use super::*;
use crate::advertise::AdvertiseReason;

const S: u64 = 1000;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn params() -> AdvertiseParams {
    AdvertiseParams {
        horizon_ms: 600 * S,
        percentile: 0.0,
        margin: 512 * MIB,
        step: 64 * MIB,
        cap: None,
        damping_ms: 60 * S,
        bucket_ms: 10 * S,
        min_history_ms: 120 * S,
    }
}

/// A 16 GiB node whose LC and system hold `others` and BE `be`.
fn obs(others: u64, be: u64) -> Observation {
    Observation {
        mem_total_bytes: Some(16 * GIB),
        mem_available_bytes: Some(16 * GIB - others - be),
        be_memory_bytes: Some(be),
        ..Observation::default()
    }
}

fn run(
    a: &mut MemoryAdvertiser,
    from_s: u64,
    to_s: u64,
    make: impl Fn(u64) -> MemoryInput,
) -> (Advertised, Vec<Change>) {
    let mut changes = Vec::new();
    let mut last = None;
    for s in from_s..to_s {
        let (ad, c) = a.update(s * S, &make(s * S));
        changes.extend(c);
        last = Some(ad);
    }
    (last.expect("at least one tick"), changes)
}

#[test]
fn the_room_is_the_node_less_the_lc_and_system_with_bes_own_charge_added_back() {
    // 6 GiB held by the LC and system, 3 GiB by BE: BE could hold 10 GiB.
    let i = memory_input(&obs(6 * GIB, 3 * GIB), 0);
    assert_eq!((i.room_bytes, i.health.clone()), (10 * GIB, LcHealth::Held));
    // The LC's page cache (in its memory.current, not in MemTotal − MemAvailable) is the LC's.
    let mut o = obs(6 * GIB, 3 * GIB);
    o.lc_memory_bytes = Some(8 * GIB);
    assert_eq!(memory_input(&o, 0).room_bytes, 8 * GIB);
    // No meminfo: untrusted, no room.
    let i = memory_input(&Observation::default(), 7);
    assert_eq!(i.room_bytes, 0);
    assert!(matches!(i.health, LcHealth::Untrusted { .. }), "{i:?}");
    assert_eq!(i.floor_bytes, 7);
}

#[test]
fn the_value_is_the_least_room_over_the_horizon_less_the_margin_in_steps() {
    let mut a = MemoryAdvertiser::new(params());
    // Warming for 120 s: the floor (0).
    let (ad, _) = run(&mut a, 0, 100, |_| memory_input(&obs(4 * GIB, 0), 0));
    assert_eq!((ad.value, ad.reason), (0, AdvertiseReason::Warming));
    // The LC peaks at 7 GiB for one bucket in the horizon: the value answers the peak.
    let (ad, _) = run(&mut a, 100, 400, |t| {
        let others = if (200 * S..210 * S).contains(&t) {
            7
        } else {
            4
        };
        memory_input(&obs(others * GIB, GIB), 0)
    });
    assert_eq!(ad.reason, AdvertiseReason::Peak, "{ad:?}");
    assert_eq!(ad.horizon.percentile_value, 9 * GIB);
    assert_eq!(ad.value, 9 * GIB - 512 * MIB);
    assert!(
        ad.detail.contains("peak") && ad.detail.contains("GiB"),
        "{}",
        ad.detail
    );
    assert_eq!(ad.resource, Resource::BeMemory);
}

#[test]
fn the_cap_binds_and_says_so() {
    let mut a = MemoryAdvertiser::new(AdvertiseParams {
        cap: Some(3 * GIB + 5),
        min_history_ms: 0,
        ..params()
    });
    let (ad, _) = run(&mut a, 0, 10, |_| memory_input(&obs(4 * GIB, 0), 0));
    assert_eq!((ad.value, ad.reason), (3 * GIB, AdvertiseReason::Capped));
    assert!(ad.detail.contains("be_memory_limit_bytes"), "{}", ad.detail);
}

#[test]
fn never_below_the_floor_falls_at_once_and_rises_damped() {
    let mut a = MemoryAdvertiser::new(AdvertiseParams {
        min_history_ms: 0,
        ..params()
    });
    let floor = 2 * GIB;
    let (ad, _) = run(&mut a, 0, 30, |_| memory_input(&obs(4 * GIB, 0), floor));
    assert_eq!(ad.value, 12 * GIB - 512 * MIB);
    // The LC grows to 15 GiB: the value falls at once, to the floor (never below).
    let (ad, changes) = run(&mut a, 30, 31, |_| memory_input(&obs(15 * GIB, 0), floor));
    assert_eq!((ad.value, ad.reason), (floor, AdvertiseReason::Floor));
    assert_eq!(changes.len(), 1);
    assert!(
        ad.detail.contains("bound pods requested 2147483648 B"),
        "{}",
        ad.detail
    );
    // Unread figures: untrusted, the floor.
    let (ad, _) = run(&mut a, 31, 32, |_| {
        memory_input(&Observation::default(), floor)
    });
    assert_eq!((ad.value, ad.reason), (floor, AdvertiseReason::Floor));
    assert!(ad.detail.contains("untrusted"), "{}", ad.detail);
    // The LC shrinks back: the peak stays in the horizon (600 s), the value stays down.
    let (ad, changes) = run(&mut a, 32, 500, |_| memory_input(&obs(4 * GIB, 0), floor));
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!(ad.value, floor);
    // Once the peak leaves the horizon it rises, one change (the damping long passed).
    let (ad, changes) = run(&mut a, 500, 700, |_| memory_input(&obs(4 * GIB, 0), floor));
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(
        (ad.value, ad.reason),
        (12 * GIB - 512 * MIB, AdvertiseReason::Peak)
    );
}

#[test]
fn a_rise_waits_the_damping_period_after_the_last_change() {
    let mut a = MemoryAdvertiser::new(AdvertiseParams {
        min_history_ms: 0,
        horizon_ms: 20 * S,
        ..params()
    });
    // Room 6 GiB, then 10 GiB: the rise waits 60 s after the first value.
    run(&mut a, 0, 10, |_| memory_input(&obs(10 * GIB, 0), 0));
    let (ad, changes) = run(&mut a, 10, 59, |_| memory_input(&obs(6 * GIB, 0), 0));
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!(ad.reason, AdvertiseReason::Damped, "{ad:?}");
    let (ad, changes) = run(&mut a, 59, 70, |_| memory_input(&obs(6 * GIB, 0), 0));
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(ad.value, 10 * GIB - 512 * MIB);
}
