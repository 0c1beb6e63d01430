//! `[kubernetes] advertise` through the real kube-rs client against the stand-in API server on
//! 127.0.0.1 (no real API server can be installed here): the value lands in the Node's
//! capacity and allocatable, the floor follows a committed pod, the advertiser's damping shows
//! in the patches, a 403 is said once and retried, and with the API down the last value stays;
//! `headroom.io/be-memory` beside `headroom.io/be-cpu`, in the same patch, the same ways.

use headroom_kube::stand_in;

use std::time::{Duration, Instant};

use headroom_control::advertise::memory::{memory_input, MemoryAdvertiser};
use headroom_control::advertise::{AdvertiseParams, Advertiser, LcHealth, Tick};
use headroom_kube::{PublishOptions, PublishState, Publisher, Wanted, BE_CPU, BE_MEMORY};
use headroom_types::observation::Observation;
use serde_json::json;
use stand_in::{pod, with_be_cpu, with_be_memory, StandIn};

const GIB: u64 = 1 << 30;

const NODE: &str = "node-a";

fn start(s: &StandIn, dir: &std::path::Path) -> Publisher {
    let mut opts = PublishOptions::new(NODE);
    opts.kubeconfig = Some(s.kubeconfig(dir).unwrap());
    opts.retry = Duration::from_millis(50);
    opts.retry_max = Duration::from_millis(200);
    Publisher::start(opts).expect("publisher starts")
}

/// Waits up to 20 s for `want` of the publisher's state.
fn wait(p: &Publisher, what: &str, want: impl Fn(&PublishState) -> bool) -> PublishState {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = p.state();
        if want(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "waiting for {what}: {s:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn committed_pod() -> serde_json::Value {
    with_be_cpu(
        pod("batch-0", "b0", NODE, "Running", "BestEffort", json!({}), 3),
        "1500",
    )
}

#[test]
fn the_value_lands_in_capacity_and_allocatable_never_below_a_committed_pod() {
    let dir = tempfile::tempdir().unwrap();
    let lc = pod(
        "cart-0",
        "c0",
        NODE,
        "Running",
        "Burstable",
        json!({"headroom.io/slo-p99-us": "500"}),
        4,
    );
    let done = with_be_cpu(
        pod(
            "batch-1",
            "b1",
            NODE,
            "Succeeded",
            "BestEffort",
            json!({}),
            5,
        ),
        "4000",
    );
    let s = StandIn::listing(vec![committed_pod(), lc, done]).unwrap();
    s.add_node(NODE, 8);
    let p = start(&s, dir.path());
    let st = wait(&p, "the floor", |s| s.floor_synced);
    assert_eq!(st.floor_millicpu, 1500, "{st:#?}");
    assert_eq!(st.bound_pods.len(), 1);
    // Nothing is patched before the agent sets a value.
    assert!(s.nodes.lock().unwrap().patches.is_empty());

    p.set(2000);
    wait(&p, "2000 published", |s| s.published_millicpu == Some(2000));
    assert_eq!(
        s.node_resource(NODE, BE_CPU),
        (Some("2000".into()), Some("2000".into()))
    );
    // The rest of the status is kept (a merge patch of the status subresource).
    assert_eq!(
        s.node_resource(NODE, "cpu"),
        (Some("8".into()), Some("8".into()))
    );
    assert_eq!(
        s.nodes.lock().unwrap().patches[0].0,
        "application/merge-patch+json"
    );

    // The LC violates: the advertiser falls at once, but only to the floor the API gave.
    let mut a = Advertiser::new(AdvertiseParams {
        min_history_ms: 0,
        ..AdvertiseParams::default()
    });
    let floor = p.floor_millicpu();
    for (t, health) in [
        (0, LcHealth::Held),
        (
            1000,
            LcHealth::Violating {
                lc: "shop/cart-0".into(),
            },
        ),
    ] {
        let (ad, _) = a.update(&Tick {
            t_ms: t,
            granted_millicpu: 3000,
            health,
            floor_millicpu: floor,
        });
        p.set(ad.value_millicpu);
    }
    wait(&p, "the floor published", |s| {
        s.published_millicpu == Some(1500)
    });
    assert_eq!(s.node_resource(NODE, BE_CPU).1.as_deref(), Some("1500"));
}

#[test]
fn the_patches_follow_the_damped_changes_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = StandIn::listing(vec![committed_pod()]).unwrap();
    s.add_node(NODE, 8);
    let p = start(&s, dir.path());
    wait(&p, "the floor", |s| s.floor_synced);
    let params = AdvertiseParams {
        horizon_ms: 600_000,
        damping_ms: 60_000,
        bucket_ms: 10_000,
        min_history_ms: 60_000,
        ..AdvertiseParams::default()
    };
    let mut a = Advertiser::new(params);
    let mut changes = Vec::new();
    // 15 simulated minutes, one tick a second: the LC flaps 2 s in 30 during minutes 5–10.
    for sec in 0..900u64 {
        let flapping = (300..600).contains(&sec) && sec % 30 < 2;
        let health = if flapping {
            LcHealth::Violating {
                lc: "shop/cart-0".into(),
            }
        } else {
            LcHealth::Held
        };
        let (ad, c) = a.update(&Tick {
            t_ms: sec * 1000,
            granted_millicpu: 4000,
            health,
            floor_millicpu: p.floor_millicpu(),
        });
        assert!(ad.value_millicpu >= 1500, "t={sec}: {ad:?}");
        if let Some(c) = c {
            p.set(c.to_millicpu);
            wait(&p, "the change published", |s| {
                s.published_millicpu == Some(c.to_millicpu)
            });
            changes.push(c);
        }
    }
    for w in changes.windows(2) {
        let rise = w[1].to_millicpu > w[0].to_millicpu;
        assert!(!rise || w[1].t_ms - w[0].t_ms >= 60_000, "{changes:#?}");
    }
    // The first value (the floor, warming), the rise after warming, one fall when the flapping
    // starts, and no rise while its troubled buckets are more than p10 of the horizon.
    assert_eq!(changes.len(), 3, "{changes:#?}");
    assert_eq!(changes[2].to_millicpu, 1500, "{changes:#?}");
    let values: Vec<u64> = s
        .nodes
        .lock()
        .unwrap()
        .patches
        .iter()
        .map(|(_, b)| {
            b["status"]["allocatable"][BE_CPU]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let wanted: Vec<u64> = changes.iter().map(|c| c.to_millicpu).collect();
    assert_eq!(values, wanted, "one patch per change");
}

#[test]
fn a_403_is_said_once_and_retried_until_it_passes() {
    let dir = tempfile::tempdir().unwrap();
    let s = StandIn::listing(vec![]).unwrap();
    s.add_node(NODE, 4);
    s.nodes.lock().unwrap().forbid = 4;
    let p = start(&s, dir.path());
    p.set(1000);
    let st = wait(&p, "a refusal", |s| s.errors >= 1);
    let e = st.last_error.clone().unwrap_or_default();
    assert!(e.contains("403") && e.contains("nodes/status"), "{e}");
    let st = wait(&p, "published after the refusals", |s| {
        s.published_millicpu == Some(1000)
    });
    assert_eq!(st.errors, 4, "{st:#?}");
    assert_eq!(st.errors_said, 1, "said once: {st:#?}");
    assert!(st.last_error.is_none());
    assert_eq!(s.node_resource(NODE, BE_CPU).0.as_deref(), Some("1000"));
}

#[test]
fn with_the_api_down_the_last_value_stays_and_nothing_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let s = StandIn::listing(vec![committed_pod()]).unwrap();
    s.add_node(NODE, 4);
    let p = start(&s, dir.path());
    p.set(2500);
    wait(&p, "2500 published", |s| s.published_millicpu == Some(2500));
    let nodes = s.nodes.clone();
    drop(s);
    p.set(3000);
    let st = wait(&p, "retries against the down API", |s| s.errors >= 3);
    assert_eq!(st.published_millicpu, Some(2500), "{st:#?}");
    assert_eq!(st.wanted_millicpu, Some(3000));
    assert_eq!(st.errors_said, 1, "{st:#?}");
    assert!(
        st.last_error
            .as_deref()
            .unwrap_or("")
            .contains("unreachable"),
        "{st:#?}"
    );
    // The floor stays as last known.
    assert_eq!(st.floor_millicpu, 1500);
    // The node keeps the last value the API took.
    let n = nodes.lock().unwrap();
    assert_eq!(n.objects[NODE]["status"]["allocatable"][BE_CPU], "2500");
    drop(n);
    p.stop();
}

/// A pod bound to the node requesting 1500 m of be-cpu and 2 GiB of be-memory.
fn committed_both() -> serde_json::Value {
    with_be_memory(committed_pod(), "2Gi")
}

/// A 16 GiB node whose LC and system hold `others_gib`.
fn memory(others_gib: u64) -> Observation {
    Observation {
        mem_total_bytes: Some(16 * GIB),
        mem_available_bytes: Some((16 - others_gib) * GIB),
        be_memory_bytes: Some(0),
        ..Observation::default()
    }
}

/// The be-memory values of the stand-in's patches (`None`: a patch without it).
fn memory_patches(s: &StandIn) -> Vec<Option<String>> {
    s.nodes
        .lock()
        .unwrap()
        .patches
        .iter()
        .map(|(_, b)| {
            b["status"]["allocatable"][BE_MEMORY]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn both_resources_land_in_one_patch_never_below_the_committed_pod() {
    let dir = tempfile::tempdir().unwrap();
    let s = StandIn::listing(vec![committed_both()]).unwrap();
    s.add_node(NODE, 4);
    let p = start(&s, dir.path());
    let st = wait(&p, "the floors", |s| s.floor_synced);
    assert_eq!((st.floor_millicpu, st.floor_memory_bytes), (1500, 2 * GIB));
    assert_eq!(st.bound_pods[0].memory_bytes, 2 * GIB);
    p.set_both(Wanted {
        millicpu: 2000,
        memory_bytes: Some(6 * GIB),
    });
    wait(&p, "both published", |s| {
        s.published_memory_bytes == Some(6 * GIB)
    });
    assert_eq!(
        s.node_resource(NODE, BE_MEMORY),
        (Some("6442450944".into()), Some("6442450944".into()))
    );
    assert_eq!(s.node_resource(NODE, BE_CPU).1.as_deref(), Some("2000"));
    // One patch carried both; kubelet's own memory figure is kept.
    assert_eq!(s.nodes.lock().unwrap().patches.len(), 1);
    assert_eq!(
        s.node_resource(NODE, "memory").1.as_deref(),
        Some("16777216Ki")
    );

    // The LC's memory peaks at 15 of 16 GiB: be-memory falls at once, to the floor.
    let mut a = MemoryAdvertiser::new(AdvertiseParams {
        min_history_ms: 0,
        percentile: 0.0,
        margin: 512 << 20,
        step: 64 << 20,
        ..AdvertiseParams::default()
    });
    let floor = p.state().floor_memory_bytes;
    for (t, others) in [(0, 4), (1000, 15)] {
        let (ad, _) = a.update(t, &memory_input(&memory(others), floor));
        assert!(ad.value >= 2 * GIB, "{ad:?}");
        p.set_both(Wanted {
            millicpu: 2000,
            memory_bytes: Some(ad.value),
        });
    }
    wait(&p, "the memory floor published", |s| {
        s.published_memory_bytes == Some(2 * GIB)
    });
    assert_eq!(
        s.node_resource(NODE, BE_MEMORY).1.as_deref(),
        Some("2147483648")
    );
    // be-cpu alone later leaves be-memory as it was.
    p.set(1800);
    wait(&p, "be-cpu alone", |s| s.published_millicpu == Some(1800));
    assert_eq!(
        memory_patches(&s).last().unwrap().as_deref(),
        Some("2147483648")
    );
}

#[test]
fn the_memory_patches_follow_the_damped_changes_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = StandIn::listing(vec![committed_both()]).unwrap();
    s.add_node(NODE, 4);
    let p = start(&s, dir.path());
    wait(&p, "the floors", |s| s.floor_synced);
    let mut a = MemoryAdvertiser::new(AdvertiseParams {
        horizon_ms: 120_000,
        damping_ms: 60_000,
        bucket_ms: 10_000,
        min_history_ms: 0,
        percentile: 0.0,
        margin: 512 << 20,
        step: 64 << 20,
        cap: None,
    });
    let mut changes = Vec::new();
    // 10 simulated minutes, one tick a second: the LC's memory swings between 4 and 9 GiB, a
    // different level every 20 s.
    for sec in 0..600u64 {
        let others = 4 + (sec / 20 * 7) % 6;
        let (ad, c) = a.update(
            sec * 1000,
            &memory_input(&memory(others), p.state().floor_memory_bytes),
        );
        assert!(ad.value >= 2 * GIB, "t={sec}: {ad:?}");
        if let Some(c) = c {
            p.set_both(Wanted {
                millicpu: 1500,
                memory_bytes: Some(c.to),
            });
            wait(&p, "the change published", |s| {
                s.published_memory_bytes == Some(c.to)
            });
            changes.push(c);
        }
    }
    assert!(changes.len() >= 2, "{changes:#?}");
    for w in changes.windows(2) {
        let rise = w[1].to > w[0].to;
        assert!(!rise || w[1].t_ms - w[0].t_ms >= 60_000, "{changes:#?}");
    }
    let patched: Vec<u64> = memory_patches(&s)
        .into_iter()
        .map(|v| v.expect("be-memory in every patch").parse().unwrap())
        .collect();
    let wanted: Vec<u64> = changes.iter().map(|c| c.to).collect();
    assert_eq!(patched, wanted, "one patch per change");
}

#[test]
fn with_the_api_down_both_last_values_stay() {
    let dir = tempfile::tempdir().unwrap();
    let s = StandIn::listing(vec![committed_both()]).unwrap();
    s.add_node(NODE, 4);
    let p = start(&s, dir.path());
    p.set_both(Wanted {
        millicpu: 2500,
        memory_bytes: Some(5 * GIB),
    });
    wait(&p, "published", |s| {
        s.published_memory_bytes == Some(5 * GIB)
    });
    let nodes = s.nodes.clone();
    drop(s);
    p.set_both(Wanted {
        millicpu: 3000,
        memory_bytes: Some(7 * GIB),
    });
    let st = wait(&p, "retries against the down API", |s| s.errors >= 3);
    assert_eq!(
        (st.published_millicpu, st.published_memory_bytes),
        (Some(2500), Some(5 * GIB)),
        "{st:#?}"
    );
    assert_eq!(st.wanted_memory_bytes, Some(7 * GIB));
    assert_eq!(st.floor_memory_bytes, 2 * GIB);
    let n = nodes.lock().unwrap();
    assert_eq!(
        n.objects[NODE]["status"]["allocatable"][BE_MEMORY],
        "5368709120"
    );
    drop(n);
    p.stop();
}
