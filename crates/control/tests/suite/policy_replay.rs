//! Replay: a recorded decision log, re-run through a fresh policy, reproduces every decision.

use std::time::Duration;

use headroom_control::config::Config;
use headroom_control::decision::{self, DecisionRecord, LogLine, Mismatch};
use headroom_control::policy::{self, MachineInfo};
use headroom_types::observation::Observation;

const CONFIG: &str = r#"
[lc]
name = "memcached"
cgroup = "headroom/lc"
[lc.slo]
target_us = 500
window_s = 1
[lc.latency]
source = "probe"
address = "127.0.0.1:11211"
rate_hz = 1250
[lc.load]
source = "memcache-stats"
address = "127.0.0.1:11211"
peak_qps = 100000
[policy]
kind = "KIND"
[policy.blind]
buffer_cores = 1.5
grow_step_cpus = 0.5
grow_interval_ms = 3
[policy.heracles]
interval_s = 1
guaranteed_freq_mhz = 2000
[safety]
violation_cooldown_s = 0.5
stale_disable_ms = 40
"#;

/// A deterministic, irregular observation sequence: load waves, a latency spike, a stale gap,
/// idle counts that follow BE's allocation, DRAM, power and egress readings.
fn observation(i: u64, be_cpus: f64) -> Observation {
    let wave = ((i as f64) / 37.0).sin();
    let load = 0.5 + 0.4 * wave;
    let latency = if (300..310).contains(&i) {
        700.0
    } else {
        250.0 + 150.0 * wave
    };
    let stale = (500..560).contains(&i);
    Observation {
        lc_latency_us: (!stale).then_some(latency),
        lc_latency_age_ms: (!stale).then_some(50 + i % 7),
        lc_load: Some(load),
        lc_qps: Some(load * 100_000.0),
        lc_load_age_ms: Some(20),
        idle_cpus: Some((8.0 - be_cpus - 4.0 * load).max(0.0).floor() + (i % 3) as f64 * 0.25),
        dram_bw_bytes_per_s: Some(40e9 + 1e9 * be_cpus + (i % 5) as f64 * 1e8),
        be_dram_bw_bytes_per_s: Some(1e9 * be_cpus),
        dram_bw_peak_bytes_per_s: Some(100e9),
        be_progress: Some(100.0 * be_cpus),
        power_w: Some(80.0 + 20.0 * load),
        tdp_w: Some(100.0),
        lc_freq_mhz: Some(2100.0 - 300.0 * load),
        lc_tx_bytes_per_s: Some(1e8 * load),
        link_bytes_per_s: Some(1.25e9),
        ..Observation::default()
    }
}

/// Runs the live loop and writes the log as JSON lines, as the runtime does.
fn record(config: &Config, machine: &MachineInfo, ticks: u64) -> Vec<String> {
    let mut p = policy::build(config, machine);
    let mut be = 0.0;
    let mut lines = Vec::new();
    for i in 0..ticks {
        let now = decision::tick_time(Duration::from_micros(i * 7_300 + 17));
        let obs = observation(i, be);
        let d = p.decide(&obs, now);
        be = d.allocation.be_cpu_capacity(machine.cpus.len());
        let rec = DecisionRecord::new(
            now,
            1_700_000_000_000 + now.as_millis() as u64,
            config.policy.kind.as_str(),
            &obs,
            &d,
        );
        lines.push(rec.to_json_line());
    }
    lines
}

fn parse(lines: &[String]) -> Vec<DecisionRecord> {
    lines
        .iter()
        .map(|l| DecisionRecord::from_json_line(l).expect("log line parses"))
        .collect()
}

/// `lines` (decisions and events, as the runtime writes them) replay identically through a
/// fresh policy; their decisions alone (the events dropped) do not. How many events the log
/// holds, and where the decisions alone diverged (never empty).
fn assert_replays_only_with_its_events(
    config: &Config,
    machine: &MachineInfo,
    lines: &[String],
) -> (usize, Vec<Mismatch>) {
    let log: Vec<LogLine> = lines
        .iter()
        .map(|l| LogLine::from_json_line(l).expect("log line parses"))
        .collect();
    let mismatches = decision::replay_log(config, machine, &log);
    assert!(
        mismatches.is_empty(),
        "{} mismatches, first: {}",
        mismatches.len(),
        mismatches[0]
    );
    let decisions_only: Vec<DecisionRecord> = log
        .iter()
        .filter_map(|l| match l {
            LogLine::Decision(r) => Some((**r).clone()),
            LogLine::Event(_) => None,
        })
        .collect();
    let events = log.len() - decisions_only.len();
    let diverged = decision::replay(config, machine, &decisions_only);
    assert!(!diverged.is_empty(), "the events changed nothing?");
    (events, diverged)
}

#[test]
fn every_policy_replays_identically() {
    let machine = MachineInfo::with_cpus(8);
    for kind in [
        "none",
        "static-cores",
        "static-cycles",
        "weights",
        "blind",
        "heracles",
        "hybrid",
        "multi",
    ] {
        let config = Config::from_toml_str(&CONFIG.replace("KIND", kind)).expect("valid");
        let lines = record(&config, &machine, 1000);
        let records = parse(&lines);
        let reasons: std::collections::BTreeSet<_> =
            records.iter().map(|r| r.reason.clone()).collect();
        let mismatches = decision::replay(&config, &machine, &records);
        assert!(
            mismatches.is_empty(),
            "{kind}: {} mismatches, first: {}",
            mismatches.len(),
            mismatches[0]
        );
        if kind == "hybrid" || kind == "blind" || kind == "heracles" || kind == "multi" {
            assert!(
                reasons.len() >= 4,
                "{kind}: the script exercises the policy: {reasons:?}"
            );
        }
    }
}

#[test]
fn a_tampered_log_is_reported_at_the_right_record() {
    let machine = MachineInfo::with_cpus(8);
    let config = Config::from_toml_str(&CONFIG.replace("KIND", "hybrid")).expect("valid");
    let mut records = parse(&record(&config, &machine, 400));
    records[123].allocation.be_enabled = !records[123].allocation.be_enabled;
    records[200].reason = "hybrid:forged".into();
    let mismatches = decision::replay(&config, &machine, &records);
    assert_eq!(mismatches.len(), 2, "{mismatches:?}");
    assert_eq!(
        (mismatches[0].index, mismatches[0].field.as_str()),
        (123, "allocation")
    );
    assert_eq!(
        (mismatches[1].index, mismatches[1].field.as_str()),
        (200, "reason")
    );
    assert_eq!(mismatches[1].recorded, serde_json::json!("hybrid:forged"));
    // a different config does not reproduce the log
    let other = Config::from_toml_str(
        &CONFIG
            .replace("KIND", "hybrid")
            .replace("buffer_cores = 1.5", "buffer_cores = 3"),
    )
    .unwrap();
    assert!(
        !decision::replay(&other, &machine, &parse(&record(&config, &machine, 400))).is_empty()
    );
}

#[test]
fn record_json_has_the_contract_keys() {
    let machine = MachineInfo::with_cpus(8);
    let config = Config::from_toml_str(&CONFIG.replace("KIND", "blind")).expect("valid");
    let line = &record(&config, &machine, 3)[2];
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    for key in [
        "t_ms",
        "t_unix_ms",
        "policy",
        "observation",
        "allocation",
        "reason",
        "state",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {line}");
    }
    for key in [
        "be_enabled",
        "be_cpus",
        "be_cpu_weight",
        "be_cpu_idle",
        "be_quota_pct",
    ] {
        assert!(
            v["allocation"].get(key).is_some(),
            "allocation lacks {key}: {line}"
        );
    }
    assert_eq!(v["policy"], "blind");
}

/// A run with `ctl set`, `pause` and `resume` in the middle: the log carries them as events, and
/// replaying the log applies them between the same decisions — identical decisions. Without the
/// events the replay diverges (what the events are for).
#[test]
fn ctl_events_in_the_log_replay_identically() {
    use headroom_control::decision::CtlEvent;
    let machine = MachineInfo::with_cpus(8);
    let config = Config::from_toml_str(&CONFIG.replace("KIND", "hybrid")).expect("valid");
    let mut p = policy::build(&config, &machine);
    let mut be = 0.0;
    let mut lines: Vec<String> = Vec::new();
    for i in 0..900u64 {
        let now = decision::tick_time(Duration::from_micros(i * 7_300 + 17));
        let t_ms = now.as_millis() as u64;
        let event = match i {
            200 => Some(CtlEvent::Set {
                t_ms,
                key: "policy.blind.buffer_cores".into(),
                value: "3".into(),
            }),
            450 => Some(CtlEvent::Pause { t_ms }),
            600 => Some(CtlEvent::Resume { t_ms }),
            _ => None,
        };
        if let Some(e) = event {
            match &e {
                CtlEvent::Set { key, value, .. } => p.set_param(key, value).expect("live set"),
                CtlEvent::Pause { .. } => p.pause(),
                CtlEvent::Resume { .. } => p.resume(),
                CtlEvent::Off { .. }
                | CtlEvent::LcSet { .. }
                | CtlEvent::Advertise { .. }
                | CtlEvent::AdvertiseMemory { .. } => {}
            }
            lines.push(e.to_json_line());
        }
        let obs = observation(i, be);
        let d = p.decide(&obs, now);
        be = d.allocation.be_cpu_capacity(machine.cpus.len());
        lines.push(DecisionRecord::new(now, t_ms, "hybrid", &obs, &d).to_json_line());
    }
    let (events, diverged) = assert_replays_only_with_its_events(&config, &machine, &lines);
    assert_eq!(events, 3);
    // the decisions without their events diverge, from the first event on
    assert!(diverged[0].index >= 200, "{}", diverged[0]);
}

/// Kubernetes discovery under `multi`: pods come and go while the policy decides; the log
/// carries each change of the set as an `lc_set` event, and replaying the log rebuilds the
/// policy's services at the same points — identical decisions. Without the events the replay
/// diverges (the holder service would hold BE throughout). The advertise changes logged between
/// them (each decision with its advertiser input, as the agent logs it) are recomputed and match.
#[test]
fn discovered_lc_sets_in_the_log_replay_identically() {
    use headroom_control::decision::CtlEvent;
    use headroom_control::discovered::{initial_policy_config, policy_config};
    use headroom_types::discovery::{DiscoveredLc, PodQos};
    use headroom_types::observation::LcGroupObservation;
    let machine = MachineInfo::with_cpus(8);
    let config = Config::from_toml_str(
        "[kubernetes]\ndiscover = true\nnode_name = \"n1\"\n[policy]\nkind = \"multi\"\n\
         [policy.blind]\nbuffer_cores = 1.5\n[safety]\nstale_disable_ms = 40\n\
         [[be]]\nname = \"batch\"\ncgroup = \"kubepods/besteffort\"\n",
    )
    .expect("valid");
    let pod = |name: &str, target_us: f64| DiscoveredLc {
        name: name.into(),
        uid: name.into(),
        qos: PodQos::Burstable,
        cgroup: headroom_types::GroupPath::new(&format!("kubepods/burstable/pod{name}")).unwrap(),
        target_us,
        percentile: 99.0,
        latency_port: Some(8080),
        priority: 0,
        container_ports: Vec::new(),
    };
    let mut p = policy::build(&initial_policy_config(&config), &machine);
    let mut be = 0.0;
    let mut lines: Vec<String> = Vec::new();
    let mut lcs: Vec<DiscoveredLc> = Vec::new();
    let mut advertiser =
        headroom_control::advertise::Advertiser::new(config.kubernetes.advertise_params());
    for i in 0..900u64 {
        let now = decision::tick_time(Duration::from_micros(i * 7_300 + 17));
        let t_ms = now.as_millis() as u64;
        let change = match i {
            100 => Some(vec![pod("a", 500.0)]),
            300 => Some(vec![pod("a", 500.0), pod("b", 2000.0)]),
            500 => Some(vec![pod("a", 300.0), pod("b", 2000.0)]),
            700 => Some(vec![pod("b", 2000.0)]),
            _ => None,
        };
        if let Some(set) = change {
            lcs = set;
            p.reconfigure(&policy_config(&config, true, &lcs));
            let e = CtlEvent::LcSet {
                t_ms,
                synced: true,
                lcs: lcs.clone(),
            };
            lines.push(e.to_json_line());
        }
        let mut obs = observation(i, be);
        obs.lc_groups = std::iter::once("kubernetes")
            .chain(lcs.iter().map(|l| l.name.as_str()))
            .map(|name| LcGroupObservation {
                name: name.into(),
                latency_us: (name != "kubernetes")
                    .then_some(obs.lc_latency_us)
                    .flatten(),
                latency_age_ms: (name != "kubernetes").then_some(5),
                ..LcGroupObservation::default()
            })
            .collect();
        let d = p.decide(&obs, now);
        be = d.allocation.be_cpu_capacity(machine.cpus.len());
        // `[kubernetes] advertise`: the decision carries its tick's advertiser input (the floor
        // moving as pods are bound and finish); a change is logged after the decision.
        let input = headroom_control::advertise::AdvertiseInput {
            granted_millicpu: headroom_control::advertise::granted_millicpu(&d.allocation, 8),
            health: headroom_control::advertise::LcHealth::Held,
            floor_millicpu: (i / 150 % 3) * 1500,
        };
        let mut rec = DecisionRecord::new(now, t_ms, "multi", &obs, &d);
        rec.advertise = Some(input.clone());
        lines.push(rec.to_json_line());
        let tick = headroom_control::advertise::Tick::of(t_ms, &input);
        if let (ad, Some(c)) = advertiser.update(&tick) {
            let e = CtlEvent::Advertise {
                t_ms,
                from_millicpu: c.from_millicpu,
                to_millicpu: c.to_millicpu,
                reason: c.reason,
                detail: c.detail,
                floor_millicpu: ad.floor_millicpu,
            };
            let line = e.to_json_line();
            assert!(line.contains("\"event\":\"advertise\""), "{line}");
            lines.push(line);
        }
    }
    assert_replays_only_with_its_events(&config, &machine, &lines);
}
