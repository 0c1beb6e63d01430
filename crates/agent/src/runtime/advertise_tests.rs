//! What each tick feeds the advertiser (the LCs' health from the observation, the edge's
//! floor) and what reaches the edge.

use std::sync::Mutex;

use headroom_control::advertise::AdvertiseReason;
use headroom_types::observation::LcGroupObservation;

use super::*;
use crate::runtime::publish::Publisher;
use headroom_control::decision::CtlEvent;

/// An edge that records what it was given; its floors are set by the test.
#[derive(Default)]
struct FakeEdge {
    floor: Mutex<Option<u64>>,
    floor_memory: Mutex<u64>,
    sets: Mutex<Vec<u64>>,
    memory_sets: Mutex<Vec<u64>>,
}

impl AdvertiseEdge for FakeEdge {
    fn set(&self, millicpu: u64, memory_bytes: u64) {
        self.sets.lock().unwrap().push(millicpu);
        self.memory_sets.lock().unwrap().push(memory_bytes);
    }
    fn floor_millicpu(&self) -> Option<u64> {
        *self.floor.lock().unwrap()
    }
    fn floor_memory_bytes(&self) -> Option<u64> {
        self.floor
            .lock()
            .unwrap()
            .map(|_| *self.floor_memory.lock().unwrap())
    }
    fn state(&self) -> AdvertiseEdgeStatus {
        let floor = *self.floor.lock().unwrap();
        AdvertiseEdgeStatus {
            floor_synced: floor.is_some(),
            floor_millicpu: floor.unwrap_or(0),
            published_millicpu: self.sets.lock().unwrap().last().copied(),
            ..AdvertiseEdgeStatus::default()
        }
    }
}

fn live(floor: Option<u64>) -> (AdvertiseLive, Arc<FakeEdge>) {
    let edge = Arc::new(FakeEdge::default());
    *edge.floor.lock().unwrap() = floor;
    let params = AdvertiseParams {
        horizon_ms: 600_000,
        damping_ms: 60_000,
        bucket_ms: 1_000,
        min_history_ms: 10_000,
        ..AdvertiseParams::default()
    };
    let memory_params = AdvertiseParams {
        percentile: 0.0,
        margin: 512 << 20,
        step: 64 << 20,
        ..params
    };
    (
        AdvertiseLive::new(params, memory_params, AdvertiseLink(edge.clone())),
        edge,
    )
}

/// One tick as the agent runs it: the input with the edge's floor, fed (`None` while the
/// floor is unknown).
trait Step {
    fn step(
        &mut self,
        t_ms: u64,
        granted_millicpu: u64,
        health: LcHealth,
    ) -> Option<(Advertisement, Option<AdvertiseChange>)>;
}

impl Step for AdvertiseLive {
    fn step(
        &mut self,
        t_ms: u64,
        granted_millicpu: u64,
        health: LcHealth,
    ) -> Option<(Advertisement, Option<AdvertiseChange>)> {
        self.step_both(t_ms, granted_millicpu, health, &Observation::default())
            .map(|f| f.cpu)
    }
}

impl AdvertiseLive {
    /// A tick of both advertisers, be-memory's input from `obs`'s memory figures.
    fn step_both(
        &mut self,
        t_ms: u64,
        granted_millicpu: u64,
        health: LcHealth,
        obs: &Observation,
    ) -> Option<Fed> {
        let ctx = self.ctx(4, 1000)?;
        let input = AdvertiseInput {
            granted_millicpu,
            health,
            floor_millicpu: ctx.floor_millicpu,
        };
        let memory = headroom_control::advertise::memory::memory_input(obs, ctx.floor_memory_bytes);
        Some(self.feed(t_ms, &input, &memory))
    }
}

const GIB: u64 = 1 << 30;

/// A 16 GiB node whose LC and system hold `others_gib` and BE 1 GiB.
fn memory(others_gib: u64) -> Observation {
    Observation {
        mem_total_bytes: Some(16 * GIB),
        mem_available_bytes: Some((15 - others_gib) * GIB),
        be_memory_bytes: Some(GIB),
        ..Observation::default()
    }
}

#[test]
fn be_memory_goes_to_the_edge_with_be_cpu_never_below_its_floor() {
    let (mut l, edge) = live(Some(0));
    *edge.floor_memory.lock().unwrap() = 2 * GIB;
    // Warming (10 s): both at their floors, one set for both.
    let f = l.step_both(0, 4000, LcHealth::Held, &memory(4)).unwrap();
    assert_eq!((f.cpu.0.value_millicpu, f.memory.0.value), (0, 2 * GIB));
    assert_eq!(f.memory.0.reason, AdvertiseReason::Floor);
    assert_eq!(edge.sets.lock().unwrap().len(), 1);
    // Past warming and the damping of the first values: the room (12 GiB) less the margin.
    let mut last = None;
    for s in 1..70u64 {
        last = l.step_both(s * 1000, 4000, LcHealth::Held, &memory(4));
    }
    let f = last.unwrap();
    assert_eq!(f.memory.0.value, 12 * GIB - (512 << 20), "{:?}", f.memory.0);
    assert_eq!(f.memory.0.reason, AdvertiseReason::Peak);
    // An LC violation lowers be-cpu, not be-memory; the edge gets both values.
    let f = l
        .step_both(
            70_000,
            4000,
            LcHealth::Violating {
                lc: "shop/cart-0".into(),
            },
            &memory(4),
        )
        .unwrap();
    assert_eq!(f.cpu.0.value_millicpu, 0);
    assert!(f.memory.1.is_none());
    assert_eq!(
        edge.memory_sets.lock().unwrap().last().copied(),
        Some(12 * GIB - (512 << 20))
    );
    // The LC's memory grows to 14 GiB: be-memory falls at once, to its floor.
    let f = l
        .step_both(71_000, 4000, LcHealth::Held, &memory(14))
        .unwrap();
    assert_eq!(
        (f.memory.0.value, f.memory.0.reason),
        (2 * GIB, AdvertiseReason::Floor)
    );
    assert_eq!(
        edge.memory_sets.lock().unwrap().last().copied(),
        Some(2 * GIB)
    );
    // `ctl status` has it, with the figures behind it.
    let st = l.status();
    let m = st.memory.expect("be-memory advertised");
    assert_eq!((m.value, m.floor), (2 * GIB, 2 * GIB));
    assert_eq!(st.memory_input.unwrap().room_bytes, 2 * GIB);
}

fn slo(name: &str, slo_us: f64) -> ServiceSlo {
    ServiceSlo {
        name: name.into(),
        slo_us,
    }
}

fn single(latency_us: f64, age_ms: u64) -> Observation {
    Observation {
        lc_latency_us: Some(latency_us),
        lc_latency_age_ms: Some(age_ms),
        ..Observation::default()
    }
}

fn group(name: &str, latency_us: Option<f64>, age_ms: u64) -> LcGroupObservation {
    LcGroupObservation {
        name: name.into(),
        latency_us,
        latency_age_ms: Some(age_ms),
        ..LcGroupObservation::default()
    }
}

#[test]
fn one_lc_within_its_slo_with_fresh_latency_is_held() {
    let lcs = [slo("lc", 500.0)];
    assert_eq!(
        health(&single(400.0, 100), 500.0, &lcs, 1000, None),
        LcHealth::Held
    );
    assert_eq!(
        health(&single(600.0, 100), 500.0, &lcs, 1000, None),
        LcHealth::Violating { lc: "lc".into() }
    );
    // Stale: too old to say it held.
    match health(&single(400.0, 5000), 500.0, &lcs, 1000, None) {
        LcHealth::Untrusted { reason } => assert!(reason.contains("lc"), "{reason}"),
        other => panic!("stale latency: {other:?}"),
    }
    // No latency at all.
    assert!(matches!(
        health(&Observation::default(), 500.0, &lcs, 1000, None),
        LcHealth::Untrusted { .. }
    ));
}

#[test]
fn held_off_or_an_untrusted_figure_is_untrusted_with_its_reason_whatever_the_latency() {
    let lcs = [slo("lc", 500.0)];
    let why = "kubernetes: waiting for the first list of the node's pods";
    assert_eq!(
        health(&single(100.0, 10), 500.0, &lcs, 1000, Some(why)),
        LcHealth::Untrusted { reason: why.into() }
    );
    let mut obs = single(100.0, 10);
    obs.lc_latency_untrusted = Some("probe stamps late".into());
    assert_eq!(
        health(&obs, 500.0, &lcs, 1000, None),
        LcHealth::Untrusted {
            reason: "probe stamps late".into()
        }
    );
}

#[test]
fn several_lcs_are_each_judged_by_their_own_slo() {
    // shop/b's own SLO is 300 µs: 400 µs violates it, though the first LC's 500 would not.
    let lcs = [slo("shop/a", 500.0), slo("shop/b", 300.0)];
    let mut obs = Observation {
        lc_groups: vec![
            group("shop/a", Some(450.0), 10),
            group("shop/b", Some(250.0), 10),
        ],
        ..Observation::default()
    };
    assert_eq!(health(&obs, 500.0, &lcs, 1000, None), LcHealth::Held);
    obs.lc_groups[1].latency_us = Some(400.0);
    assert_eq!(
        health(&obs, 500.0, &lcs, 1000, None),
        LcHealth::Violating {
            lc: "shop/b".into()
        }
    );
    // One service without a latency: untrusted, named.
    obs.lc_groups[1].latency_us = None;
    match health(&obs, 500.0, &lcs, 1000, None) {
        LcHealth::Untrusted { reason } => assert!(reason.contains("shop/b"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// A discovering agent observes the holder's empty group beside the pods' (first, never with a
/// latency): the pods judge. Judging the holder kept the advertised value at its floor on a
/// 16-vCPU node that granted BE 12 CPUs (2026-11-30).
#[test]
fn the_discovery_holders_group_is_no_service_to_judge() {
    let holder = headroom_control::config::HOLDER_NAME;
    // The services as the runtime lists them once the pods are known: no holder among them.
    let lcs = [slo("shop/memcached", 1000.0)];
    let mut obs = Observation {
        lc_groups: vec![
            LcGroupObservation {
                name: holder.into(),
                ..LcGroupObservation::default()
            },
            group("shop/memcached", Some(60.0), 50),
        ],
        ..Observation::default()
    };
    assert_eq!(health(&obs, 500.0, &lcs, 1000, None), LcHealth::Held);
    obs.lc_groups[1].latency_us = Some(1100.0);
    assert_eq!(
        health(&obs, 500.0, &lcs, 1000, None),
        LcHealth::Violating {
            lc: "shop/memcached".into()
        }
    );
    // No pod found: the holder alone is no signal.
    obs.lc_groups.truncate(1);
    match health(&obs, 500.0, &[], 1000, None) {
        LcHealth::Untrusted { reason } => assert!(reason.contains("no LC service"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // A service of the config's own that happens to bear the holder's name is judged.
    let named = [slo(holder, 500.0)];
    obs.lc_groups[0].latency_us = Some(900.0);
    obs.lc_groups[0].latency_age_ms = Some(10);
    assert_eq!(
        health(&obs, 500.0, &named, 1000, None),
        LcHealth::Violating { lc: holder.into() }
    );
}

#[test]
fn nothing_is_fed_or_advertised_before_the_floor_is_known() {
    let (mut l, edge) = live(None);
    assert!(l.step(0, 4000, LcHealth::Held).is_none());
    assert!(edge.sets.lock().unwrap().is_empty());
    assert!(l.last.is_none());
    // The first list arrives: the first value goes out at once (the floor while warming).
    *edge.floor.lock().unwrap() = Some(1500);
    let (ad, change) = l.step(1000, 4000, LcHealth::Held).expect("fed");
    assert_eq!(ad.value_millicpu, 1500);
    assert_eq!(ad.reason, AdvertiseReason::Floor);
    assert_eq!(change.map(|c| c.to_millicpu), Some(1500));
    assert_eq!(*edge.sets.lock().unwrap(), vec![1500]);
}

#[test]
fn a_violating_or_untrusted_lc_advertises_0_with_its_reason_never_below_the_floor() {
    let (mut l, edge) = live(Some(0));
    // Held for 70 s at 4 CPUs granted: past warming (10 s) and the damping of the first value
    // (60 s), the value is 4000 less the 200 margin.
    let mut last = None;
    for s in 0..70u64 {
        last = l.step(s * 1000, 4000, LcHealth::Held);
    }
    let (ad, _) = last.unwrap();
    assert_eq!((ad.value_millicpu, ad.reason), (3800, AdvertiseReason::Slo));
    let (ad, c) = l
        .step(
            70_000,
            4000,
            LcHealth::Violating {
                lc: "shop/cart-0".into(),
            },
        )
        .unwrap();
    assert_eq!(
        (ad.value_millicpu, ad.reason),
        (0, AdvertiseReason::Violating)
    );
    assert!(ad.detail.contains("shop/cart-0"), "{}", ad.detail);
    assert_eq!(c.map(|c| c.to_millicpu), Some(0), "falls at once");
    let (ad, _) = l
        .step(
            71_000,
            4000,
            LcHealth::Untrusted {
                reason: "no fresh latency for LC shop/cart-0".into(),
            },
        )
        .unwrap();
    assert_eq!(
        (ad.value_millicpu, ad.reason),
        (0, AdvertiseReason::Untrusted)
    );
    assert!(ad.detail.contains("no fresh latency"), "{}", ad.detail);

    // A pod bound meanwhile: the value rises to its request at once, whatever the LCs say,
    // and stays there while they violate.
    *edge.floor.lock().unwrap() = Some(1500);
    for s in 72..90u64 {
        let (ad, _) = l
            .step(
                s * 1000,
                4000,
                LcHealth::Violating {
                    lc: "shop/cart-0".into(),
                },
            )
            .unwrap();
        assert_eq!(ad.value_millicpu, 1500, "t={s}s: {ad:?}");
        assert_eq!(ad.reason, AdvertiseReason::Floor);
        assert!(ad.detail.contains("violates"), "{}", ad.detail);
    }
    // One set per change, each the value the advertiser chose.
    assert_eq!(*edge.sets.lock().unwrap(), vec![0, 3800, 0, 1500]);
    // `ctl status`: the value, its floor and reason, the last change, what the edge took.
    let st = l.status();
    let ad = st.advertisement.expect("an advertisement");
    assert_eq!((ad.value_millicpu, ad.floor_millicpu), (1500, 1500));
    let c = ad.last_change.expect("a last change");
    assert_eq!((c.from_millicpu, c.to_millicpu), (Some(0), 1500));
    assert_eq!(c.reason, AdvertiseReason::Floor);
    assert!(ad.horizon.buckets > 0, "{:?}", ad.horizon);
    assert_eq!(st.edge.published_millicpu, Some(1500));
}

/// A `static-cores` publisher of the one service `svc` writing its decision log to `path`.
fn publisher(path: &std::path::Path, slo_us: f64) -> Publisher {
    crate::runtime::publish::tests::publisher(
        path,
        "static-cores",
        slo_us,
        vec![slo("svc", slo_us)],
    )
}

/// The decision log the agent writes with `[kubernetes] advertise` (each decision line with
/// its tick's advertiser input, a line per change after it) replays exactly; the same log with
/// one `advertise` line's value changed, or a change dropped, is flagged by `--replay` (before,
/// replay passed over `advertise` lines and took any of them).
#[test]
fn a_log_with_advertise_lines_replays_exactly_and_a_tampered_line_is_flagged() {
    use headroom_control::config::Config;
    use headroom_control::controller::TickSink;
    use headroom_control::decision::{replay_log, tick_time, LogLine};
    use headroom_control::policy::{self, MachineInfo};
    use std::time::Duration;
    let toml = format!(
        "{}{}",
        crate::runtime::publish::tests::SVC_LC,
        r#"
[policy]
kind = "static-cores"
[kubernetes]
advertise = true
node_name = "n1"
advertise_horizon_s = 60
advertise_damping_s = 10
advertise_min_history_s = 5
"#
    );
    let config = Config::from_toml_str(&toml).unwrap();
    let machine = MachineInfo::with_cpus(4);
    let mut policy = policy::build(&config, &machine);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let mut p = publisher(&path, 500.0);
    let edge = Arc::new(FakeEdge::default());
    let mut live = AdvertiseLive::new(
        config.kubernetes.advertise_params(),
        config.kubernetes.advertise_memory_params(&config.safety),
        AdvertiseLink(edge.clone()),
    );
    // 60 s at 100 ms: the floor listed after 1 s (1500m committed from 30 s), an SLO violation
    // at 20-22 s, a stale latency at 40 s; latency windows once a second.
    for i in 0..600u64 {
        let t = tick_time(Duration::from_millis(100 * i));
        let s = i / 10;
        *edge.floor.lock().unwrap() = match s {
            0 => None,
            1..=29 => Some(0),
            _ => Some(1500),
        };
        let latency = if (20..22).contains(&s) { 900.0 } else { 300.0 };
        let age = if s == 40 { 5_000 } else { (i % 10) * 100 };
        let obs = single(latency, age);
        p.advertise.ctx = live.ctx(machine.cpus.len() as u32, config.safety.latency_max_age_ms);
        let d = policy.decide(&obs, t);
        p.record(t, &obs, &d);
        p.step_advertiser(&mut live, t.as_millis() as u64);
    }
    p.end_run();
    p.log.as_mut().unwrap().flush();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<LogLine> = text
        .lines()
        .map(|l| LogLine::from_json_line(l).unwrap())
        .collect();
    let changes: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| matches!(l, LogLine::Event(CtlEvent::Advertise { .. })))
        .map(|(k, _)| k)
        .collect();
    assert!(
        changes.len() >= 3,
        "a first value, a rise and a fall at least: {:?}",
        edge.sets.lock().unwrap()
    );
    assert!(lines
        .iter()
        .any(|l| matches!(l, LogLine::Decision(r) if r.advertise.is_some())));
    let replayed = replay_log(&config, &machine, &lines);
    assert!(replayed.is_empty(), "{replayed:?}");

    // One change's value altered.
    let mut tampered = lines.clone();
    if let LogLine::Event(CtlEvent::Advertise { to_millicpu, .. }) = &mut tampered[changes[1]] {
        *to_millicpu += 100;
    }
    let flagged = replay_log(&config, &machine, &tampered);
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    assert_eq!(flagged[0].field, "advertise");
    // One change dropped: the recomputed change has no line.
    let mut dropped = lines.clone();
    dropped.remove(changes[1]);
    let flagged = replay_log(&config, &machine, &dropped);
    assert_eq!(flagged.len(), 1, "{flagged:?}");
    assert_eq!(flagged[0].field, "advertise");
    assert!(flagged[0].recorded.is_null(), "{}", flagged[0]);
    // A tick's logged granted CPUs that the replayed decision does not grant.
    let mut granted = lines.clone();
    if let Some(LogLine::Decision(r)) = granted
        .iter_mut()
        .find(|l| matches!(l, LogLine::Decision(r) if r.advertise.is_some()))
    {
        r.advertise.as_mut().unwrap().granted_millicpu += 1;
    }
    let flagged = replay_log(&config, &machine, &granted);
    assert!(
        flagged.iter().any(|m| m.field == "advertise_granted"),
        "{flagged:?}"
    );
}
