//! Blagodurov et al.: static weights (10000 vs 2) and dynamic weights (eqs. 1–3) in fairness
//! and isolation modes, on the paper's worked scenarios (two Wiki instances, RT_sla = 2 s, a
//! load spike on Wiki 2; isolation with an agreed maximum of 30 req/s).

use std::time::Duration;

use headroom_control::config::Config;
use headroom_control::policy::{MachineInfo, Policy, Weights};
use headroom_types::allocation::CpuWeight;
use headroom_types::observation::{LcGroupObservation, Observation};

const TWO_WIKIS: &str = r#"
[lc]
name = "wiki1"
cgroup = "headroom/wiki1"
[lc.latency]
source = "feed"
[policy]
kind = "weights"
[policy.weights]
mode = "MODE"
[[policy.weights.groups]]
name = "wiki1"
cgroup = "headroom/wiki1"
rt_sla_us = 2000000
max_qps = 30
[[policy.weights.groups]]
name = "wiki2"
cgroup = "headroom/wiki2"
rt_sla_us = 2000000
max_qps = 30
"#;

fn wikis(mode: &str) -> Config {
    Config::from_toml_str(&TWO_WIKIS.replace("MODE", mode)).expect("valid")
}

/// The paper's testbed: two 12-core sockets.
fn machine() -> MachineInfo {
    MachineInfo::with_cpus(24)
}

fn group(name: &str, rt_s: f64, qps: f64, server_frac: f64) -> LcGroupObservation {
    LcGroupObservation {
        name: name.to_string(),
        latency_us: Some(rt_s * 1e6),
        qps: Some(qps),
        cpu_usage: Some(server_frac * 24.0),
        ..LcGroupObservation::default()
    }
}

fn obs(groups: Vec<LcGroupObservation>) -> Observation {
    Observation {
        lc_groups: groups,
        ..Observation::default()
    }
}

fn shares(d: &headroom_control::decision::Decision, name: &str) -> u64 {
    d.allocation
        .lc_groups
        .iter()
        .find(|g| g.name == name)
        .unwrap_or_else(|| panic!("no group {name}"))
        .cpu_weight
        .shares
}

#[test]
fn static_weights_are_10000_versus_2_written_natively() {
    let cfg = Config::from_toml_str(
        "[lc]\nname = \"svc\"\ncgroup = \"headroom/lc\"\n[policy]\nkind = \"weights\"\n",
    )
    .unwrap();
    let mut w = Weights::new(&cfg, &machine());
    let d = w.decide(&Observation::default(), Duration::ZERO);
    assert_eq!(d.reason, "weights:static");
    assert_eq!(
        d.allocation.be_cpu_weight,
        Some(CpuWeight {
            shares: 2,
            weight: 1
        })
    );
    assert_eq!(
        d.allocation.lc.cpu_weight,
        Some(CpuWeight {
            shares: 10000,
            weight: 10000
        })
    );
    assert!(d.allocation.be_enabled, "work conserving: BE keeps running");
    assert_eq!(d.allocation.be_cpus, None);
}

#[test]
fn static_with_be_as_cpu_idle() {
    let cfg = Config::from_toml_str(
        "[lc]\nname = \"svc\"\ncgroup = \"headroom/lc\"\n[policy]\nkind = \"weights\"\n[policy.weights]\nbe_cpu_idle = true\n",
    )
    .unwrap();
    let mut w = Weights::new(&cfg, &machine());
    let d = w.decide(&Observation::default(), Duration::ZERO);
    assert_eq!(d.allocation.be_cpu_idle, Some(true));
    assert_eq!(d.allocation.be_cpu_weight, None);
    // a host without cpu.idle falls back to weight 2 and says so
    let mut m = machine();
    m.mechanisms
        .set(headroom_control::policy::Mechanism::CpuIdle, false);
    let mut w = Weights::new(&cfg, &m);
    let d = w.decide(&Observation::default(), Duration::ZERO);
    assert_eq!(d.allocation.be_cpu_idle, None);
    assert_eq!(d.allocation.be_cpu_weight.map(|w| w.shares), Some(2));
    assert!(d.state["be_cpu_idle"]
        .as_str()
        .unwrap()
        .contains("unavailable"));
}

#[test]
fn fair_mode_spike_shifts_weight_to_the_spiking_wiki() {
    let mut w = Weights::new(&wikis("fair"), &machine());
    // both Wikis at 20 req/s, ~20% of the server, RT 1 s: PF = -0.5, C = 0.1 each → W = W^max
    let d = w.decide(
        &obs(vec![
            group("wiki1", 1.0, 20.0, 0.2),
            group("wiki2", 1.0, 20.0, 0.2),
        ]),
        Duration::ZERO,
    );
    assert_eq!(d.reason, "weights:fair:update");
    assert_eq!(shares(&d, "wiki1"), 262_144);
    assert_eq!(shares(&d, "wiki2"), 262_144);
    // Wiki 2's load doubles: RT 3 s (PF = 0.5), 40% of the server → C2 = 0.6, C1 = 0.1
    let spike = obs(vec![
        group("wiki1", 1.0, 20.0, 0.2),
        group("wiki2", 3.0, 40.0, 0.4),
    ]);
    let d = w.decide(&spike, Duration::from_secs(3));
    assert!(
        d.reason.ends_with(":hold"),
        "weights change every 5 s: {}",
        d.reason
    );
    assert_eq!(shares(&d, "wiki1"), 262_144);
    let d = w.decide(&spike, Duration::from_secs(5));
    // W1 = (262144 - 1024) · 0.1/0.6 + 1024 = 44544; W2 = W^max
    assert_eq!(shares(&d, "wiki1"), 44_544);
    assert_eq!(shares(&d, "wiki2"), 262_144);
    let g = &d.state["groups"][1];
    assert!((g["pf"].as_f64().unwrap() - 0.5).abs() < 1e-12);
    assert!((g["c"].as_f64().unwrap() - 0.6).abs() < 1e-12);
    // v2 weights from the same model on the v2 range: (10000 - 100) · 1/6 + 100 = 1750
    let v2 = d.allocation.lc_groups[0].cpu_weight.weight;
    assert_eq!(v2, 1750);
    // BE keeps the batch weight throughout
    assert_eq!(d.allocation.be_cpu_weight.map(|w| w.shares), Some(2));
}

#[test]
fn isolation_mode_over_max_load_gets_infinite_sla_and_minimal_weight() {
    let mut w = Weights::new(&wikis("isolation"), &machine());
    // Wiki 2 exceeds the agreed 30 req/s: RT_sla = a million seconds, PF ≈ -1,
    // C2 = 0.4 · ~0 → clamped to c_min = 0.001; C1 = 0.1 → W1 = W^max
    let d = w.decide(
        &obs(vec![
            group("wiki1", 1.0, 20.0, 0.2),
            group("wiki2", 3.0, 40.0, 0.4),
        ]),
        Duration::ZERO,
    );
    assert_eq!(d.reason, "weights:isolation:over-max-load");
    assert_eq!(shares(&d, "wiki1"), 262_144);
    // W2 = 261120 · 0.001/0.1 + 1024 = 3635.2 → 3635
    assert_eq!(shares(&d, "wiki2"), 3635);
    // below the maximum again: back to the fair model
    let d = w.decide(
        &obs(vec![
            group("wiki1", 1.0, 20.0, 0.2),
            group("wiki2", 3.0, 25.0, 0.4),
        ]),
        Duration::from_secs(5),
    );
    assert_eq!(d.reason, "weights:isolation:update");
    assert_eq!(shares(&d, "wiki2"), 262_144);
    assert_eq!(shares(&d, "wiki1"), 44_544);
}

#[test]
fn fair_mode_in_the_same_spike_does_not_isolate() {
    let mut w = Weights::new(&wikis("fair"), &machine());
    let d = w.decide(
        &obs(vec![
            group("wiki1", 1.0, 20.0, 0.2),
            group("wiki2", 3.0, 40.0, 0.4),
        ]),
        Duration::ZERO,
    );
    assert_eq!(shares(&d, "wiki2"), 262_144);
}

#[test]
fn missing_group_data_keeps_its_previous_weight() {
    let mut w = Weights::new(&wikis("fair"), &machine());
    let d = w.decide(&obs(vec![group("wiki1", 1.0, 20.0, 0.2)]), Duration::ZERO);
    assert_eq!(d.reason, "weights:dynamic:partial-data");
    assert_eq!(shares(&d, "wiki1"), 262_144);
    assert_eq!(
        shares(&d, "wiki2"),
        10_000,
        "still the static critical weight"
    );
    let d = w.decide(&obs(vec![]), Duration::from_secs(5));
    assert_eq!(d.reason, "weights:no-group-data:hold");
}

#[test]
fn single_lc_group_uses_the_top_level_observation() {
    let cfg = Config::from_toml_str(
        "[lc]\nname = \"svc\"\ncgroup = \"headroom/lc\"\n[lc.slo]\ntarget_us = 500\n[lc.latency]\nsource = \"feed\"\n[policy]\nkind = \"weights\"\n[policy.weights]\nmode = \"fair\"\n",
    )
    .unwrap();
    let mut w = Weights::new(&cfg, &MachineInfo::with_cpus(2));
    let o = Observation {
        lc_latency_us: Some(250.0),
        lc_cpu_usage: Some(1.0),
        ..Observation::default()
    };
    let d = w.decide(&o, Duration::ZERO);
    // the only group is its own C^max: W = W^max
    assert_eq!(d.allocation.lc.cpu_weight.map(|w| w.shares), Some(262_144));
    assert!(d.allocation.lc_groups.is_empty());
}
