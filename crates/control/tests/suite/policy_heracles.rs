//! Heracles (ISCA'15) Alg. 1–4, one scripted observation sequence per rule.

use headroom_types::CpuSet;
use std::time::Duration;

use headroom_control::config::Config;
use headroom_control::policy::{Heracles, MachineInfo, Policy};
use headroom_types::observation::Observation;

const BASE: &str = r#"
[lc]
name = "memcached"
cgroup = "headroom/lc"
[lc.slo]
target_us = 500
[lc.latency]
source = "probe"
address = "127.0.0.1:11211"
[lc.load]
source = "memcache-stats"
address = "127.0.0.1:11211"
peak_qps = 100000
[policy]
kind = "heracles"
"#;

fn config(extra: &str) -> Config {
    Config::from_toml_str(&format!("{BASE}{extra}")).expect("test config is valid")
}

fn at(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// An observation with latency for the given slack and load.
fn obs(slack: f64, load: f64) -> Observation {
    Observation {
        lc_latency_us: Some(500.0 * (1.0 - slack)),
        lc_latency_age_ms: Some(100),
        lc_load: Some(load),
        lc_qps: Some(load * 100_000.0),
        lc_load_age_ms: Some(100),
        ..Observation::default()
    }
}

fn state_u64(d: &headroom_control::decision::Decision, key: &str) -> u64 {
    d.state[key]
        .as_u64()
        .unwrap_or_else(|| panic!("state.{key} in {}", d.state))
}

// ---------------- Alg. 1 ----------------

#[test]
fn alg1_negative_slack_disables_with_five_minute_cooldown() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    let d = h.decide(&obs(0.4, 0.5), at(0.0));
    assert!(
        d.allocation.be_enabled,
        "load 0.5, slack 0.4 enables BE: {}",
        d.reason
    );
    let d = h.decide(&obs(-0.01, 0.5), at(15.0));
    assert!(!d.allocation.be_enabled);
    assert_eq!(d.reason, "heracles:slack<0:disable");
    // no re-enable for 300 s, whatever the slack and load
    let mut t = 30.0;
    while t < 315.0 {
        let d = h.decide(&obs(0.5, 0.3), at(t));
        assert!(
            !d.allocation.be_enabled,
            "re-enabled during cooldown at t={t}"
        );
        t += 15.0;
    }
    let d = h.decide(&obs(0.5, 0.3), at(315.0));
    assert!(
        d.allocation.be_enabled,
        "enabled after the cooldown: {}",
        d.reason
    );
}

#[test]
fn alg1_load_hysteresis_between_80_and_85_percent() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    assert!(h.decide(&obs(0.4, 0.5), at(0.0)).allocation.be_enabled);
    let d = h.decide(&obs(0.4, 0.86), at(15.0));
    assert!(!d.allocation.be_enabled);
    assert_eq!(d.reason, "heracles:load>disable:disable");
    let d = h.decide(&obs(0.4, 0.82), at(30.0));
    assert!(!d.allocation.be_enabled, "0.82 after 0.86 stays disabled");
    let d = h.decide(&obs(0.4, 0.79), at(45.0));
    assert!(d.allocation.be_enabled, "0.79 enables: {}", d.reason);
    // and from enabled, 0.82 keeps it enabled
    let d = h.decide(&obs(0.4, 0.82), at(60.0));
    assert!(d.allocation.be_enabled);
}

#[test]
fn alg1_runs_every_15_seconds_only() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    assert!(h.decide(&obs(0.4, 0.5), at(0.0)).allocation.be_enabled);
    // a spike between two top-level periods is not seen by Alg. 1
    assert!(h.decide(&obs(0.4, 0.95), at(7.0)).allocation.be_enabled);
    assert!(!h.decide(&obs(0.4, 0.95), at(15.0)).allocation.be_enabled);
}

/// Drives the policy with ample slack until BE has `n` cores.
fn grow_to(h: &mut Heracles, n: u64, mut t: f64) -> f64 {
    loop {
        let d = h.decide(&obs(0.5, 0.5), at(t));
        if state_u64(&d, "be_cores") >= n {
            return t;
        }
        t += 1.0;
        assert!(t < 1000.0, "never reached {n} BE cores: {}", d.state);
    }
}

#[test]
fn alg1_slack_below_10_percent_stops_growth() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    let t = grow_to(&mut h, 3, 0.0);
    // next top-level period: slack 0.08
    let next_top = (t / 15.0).floor() * 15.0 + 15.0;
    let d = h.decide(&obs(0.08, 0.5), at(next_top));
    let cores = state_u64(&d, "be_cores");
    assert_eq!(d.state["top"]["growth_allowed"], false);
    for i in 1..=7 {
        let d = h.decide(&obs(0.08, 0.5), at(next_top + i as f64 * 2.0));
        assert_eq!(state_u64(&d, "be_cores"), cores, "grew with slack 0.08");
        assert!(d.allocation.be_enabled);
    }
}

#[test]
fn alg1_slack_below_5_percent_leaves_be_two_cores() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    let t = grow_to(&mut h, 5, 0.0);
    let next_top = (t / 15.0).floor() * 15.0 + 15.0;
    let d = h.decide(&obs(0.03, 0.5), at(next_top));
    assert_eq!(d.reason, "heracles:slack<shrink:shrink");
    assert_eq!(state_u64(&d, "be_cores"), 2, "Remove(Size()-2) keeps 2");
    assert_eq!(d.allocation.be_cpus.as_ref().map(|c| c.len()), Some(2));
}

#[test]
fn alg1_slack_below_5_percent_remove_action_takes_two_cores() {
    let cfg = config("[policy.heracles]\nslack_shrink_action = \"remove\"\n");
    let mut h = Heracles::new(&cfg, &MachineInfo::with_cpus(8));
    let t = grow_to(&mut h, 5, 0.0);
    let next_top = (t / 15.0).floor() * 15.0 + 15.0;
    let d = h.decide(&obs(0.03, 0.5), at(next_top));
    assert_eq!(state_u64(&d, "be_cores"), 3);
}

#[test]
fn alg1_unknown_latency_changes_nothing() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    let d = h.decide(&Observation::default(), at(0.0));
    assert!(!d.allocation.be_enabled, "BE starts disabled");
    assert_eq!(d.reason, "heracles:no-latency-or-load:hold");
    // looked at again after 1 s, not 15 s
    assert!(h.decide(&obs(0.5, 0.5), at(1.0)).allocation.be_enabled);
}

// ---------------- Alg. 2 ----------------

fn dram(mut o: Observation, total: f64, be: f64, progress: f64) -> Observation {
    o.dram_bw_bytes_per_s = Some(total);
    o.be_dram_bw_bytes_per_s = Some(be);
    o.dram_bw_peak_bytes_per_s = Some(100e9);
    o.be_progress = Some(progress);
    o
}

#[test]
fn alg2_grow_llc_then_rollback_when_bandwidth_does_not_drop() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    // enabled at t=0: 1 core, 10% of 20 ways = 2 ways, GROW_LLC
    let d = h.decide(&dram(obs(0.5, 0.5), 30e9, 5e9, 100.0), at(0.0));
    assert_eq!(d.allocation.be_llc_ways, Some(2));
    assert_eq!(d.state["phase"], "GROW_LLC");
    // t=2: grow cache
    let d = h.decide(&dram(obs(0.5, 0.5), 30e9, 5e9, 100.0), at(2.0));
    assert_eq!(d.reason, "heracles:grow-llc");
    assert_eq!(d.allocation.be_llc_ways, Some(3));
    // t=4: bandwidth fell and BE benefits: keep, grow again
    let d = h.decide(&dram(obs(0.5, 0.5), 29e9, 4e9, 110.0), at(4.0));
    assert_eq!(d.allocation.be_llc_ways, Some(4));
    assert_eq!(d.state["bw_derivative"].as_f64(), Some(-1e9));
    // t=6: bandwidth rose after the step: roll back to 3 ways, switch to GROW_CORES
    let d = h.decide(&dram(obs(0.5, 0.5), 29.5e9, 4.5e9, 120.0), at(6.0));
    assert_eq!(d.reason, "heracles:llc-bw-not-reduced:rollback");
    assert_eq!(d.allocation.be_llc_ways, Some(3));
    assert_eq!(d.state["phase"], "GROW_CORES");
    // t=8: GROW_CORES adds one core while slack > 10%
    let d = h.decide(&dram(obs(0.5, 0.5), 29.5e9, 4.5e9, 120.0), at(8.0));
    assert_eq!(d.reason, "heracles:grow-cores");
    assert_eq!(state_u64(&d, "be_cores"), 2);
    assert_eq!(d.allocation.be_cpus, Some(CpuSet::from([6, 7])));
}

#[test]
fn alg2_no_be_benefit_switches_to_grow_cores() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    h.decide(&dram(obs(0.5, 0.5), 30e9, 5e9, 100.0), at(0.0));
    h.decide(&dram(obs(0.5, 0.5), 30e9, 5e9, 100.0), at(2.0));
    let d = h.decide(&dram(obs(0.5, 0.5), 29e9, 4e9, 100.0), at(4.0));
    assert_eq!(d.reason, "heracles:llc-no-be-benefit:grow-cores");
    assert_eq!(
        d.allocation.be_llc_ways,
        Some(3),
        "no rollback: bandwidth fell"
    );
    assert_eq!(d.state["phase"], "GROW_CORES");
}

#[test]
fn alg2_dram_over_90_percent_removes_cores_by_per_core_bandwidth() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(16));
    let t = grow_to(&mut h, 4, 0.0);
    // 4 BE cores using 20 GB/s → 5 GB/s per core; total 101 GB/s vs limit 90 → remove ceil(11/5)=3
    let next = t + 2.0;
    let d = h.decide(&dram(obs(0.5, 0.5), 101e9, 20e9, 1.0), at(next));
    assert_eq!(d.reason, "heracles:dram>limit:remove-cores");
    assert_eq!(state_u64(&d, "be_cores"), 1);
}

#[test]
fn alg2_cores_that_would_saturate_dram_switch_to_grow_llc() {
    let cfg = config("[policy.heracles]\ninitial_llc_frac = 0.95\n");
    let mut h = Heracles::new(&cfg, &MachineInfo::with_cpus(8));
    let d = h.decide(&dram(obs(0.5, 0.5), 30e9, 5e9, 100.0), at(0.0));
    assert_eq!(
        d.allocation.be_llc_ways,
        Some(19),
        "LC keeps at least one way"
    );
    // the LLC cannot grow further: GROW_LLC → GROW_CORES
    let d = h.decide(&dram(obs(0.5, 0.5), 89e9, 5e9, 100.0), at(2.0));
    assert_eq!(d.state["phase"], "GROW_CORES");
    // needed = LC (84) + BE (5) + per core (5) = 94 > 90 → back to GROW_LLC, no core added
    let d = h.decide(&dram(obs(0.5, 0.5), 89e9, 5e9, 100.0), at(4.0));
    assert_eq!(d.reason, "heracles:cores-would-saturate-dram:grow-llc");
    assert_eq!(d.state["phase"], "GROW_LLC");
    assert_eq!(state_u64(&d, "be_cores"), 1);
}

#[test]
fn alg2_without_resctrl_grows_cores_only_and_says_why() {
    let mut m = MachineInfo::with_cpus(8);
    m.mechanisms
        .set(headroom_control::policy::Mechanism::ResctrlL3, false);
    let mut h = Heracles::new(&config(""), &m);
    let mut last = None;
    for t in 0..12 {
        last = Some(h.decide(&obs(0.5, 0.5), at(t as f64)));
    }
    let d = last.unwrap();
    assert_eq!(d.allocation.be_llc_ways, None);
    assert!(d.state["subcontrollers"]["llc"]
        .as_str()
        .unwrap()
        .starts_with("disabled"));
    assert!(d.state["subcontrollers"]["dram"]
        .as_str()
        .unwrap()
        .starts_with("disabled"));
    assert!(
        state_u64(&d, "be_cores") >= 4,
        "cores still grow: {}",
        d.state
    );
}

#[test]
fn alg2_keeps_one_cpu_for_lc_and_be_on_one_socket() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(2));
    let t = grow_to(&mut h, 1, 0.0);
    for i in 1..10 {
        let d = h.decide(&obs(0.5, 0.5), at(t + i as f64 * 2.0));
        assert_eq!(
            d.allocation.be_cpus,
            Some(CpuSet::from([1])),
            "2-CPU machine: BE max 1 CPU"
        );
    }
    let mut m = MachineInfo::with_cpus(8);
    m.sockets = vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]];
    let cfg = config("[policy.heracles]\nbe_socket = 0\n");
    let mut h = Heracles::new(&cfg, &m);
    for t in 0..40 {
        let d = h.decide(&obs(0.5, 0.5), at(t as f64));
        if let Some(cpus) = &d.allocation.be_cpus {
            assert!(cpus.iter().all(|c| c < 4), "BE left socket 0: {cpus:?}");
        }
    }
}

// ---------------- Alg. 3 ----------------

fn power(mut o: Observation, watts: f64, lc_mhz: f64) -> Observation {
    o.power_w = Some(watts);
    o.tdp_w = Some(100.0);
    o.lc_freq_mhz = Some(lc_mhz);
    o
}

#[test]
fn alg3_lowers_be_frequency_near_tdp_and_raises_it_back() {
    let cfg = config(
        "[policy.heracles]\nguaranteed_freq_mhz = 2200\nbe_freq_max_mhz = 3000\nbe_freq_min_mhz = 2800\n",
    );
    let mut h = Heracles::new(&cfg, &MachineInfo::with_cpus(8));
    let d = h.decide(&power(obs(0.5, 0.5), 95.0, 2000.0), at(0.0));
    assert_eq!(d.allocation.be_freq_khz, Some(2_900_000));
    let d = h.decide(&power(obs(0.5, 0.5), 95.0, 2000.0), at(1.0));
    assert_eq!(d.allocation.be_freq_khz, Some(2_900_000), "2 s period");
    let d = h.decide(&power(obs(0.5, 0.5), 95.0, 2000.0), at(2.0));
    assert_eq!(d.allocation.be_freq_khz, Some(2_800_000));
    let d = h.decide(&power(obs(0.5, 0.5), 95.0, 2000.0), at(4.0));
    assert_eq!(
        d.allocation.be_freq_khz,
        Some(2_800_000),
        "floor at be_freq_min_mhz"
    );
    // near TDP but LC at its guaranteed frequency: no change (both conditions are needed)
    let d = h.decide(&power(obs(0.5, 0.5), 95.0, 2300.0), at(6.0));
    assert_eq!(d.allocation.be_freq_khz, Some(2_800_000));
    // headroom and LC fast enough: raise, up to uncapped
    let d = h.decide(&power(obs(0.5, 0.5), 80.0, 2300.0), at(8.0));
    assert_eq!(d.allocation.be_freq_khz, Some(2_900_000));
    let d = h.decide(&power(obs(0.5, 0.5), 80.0, 2300.0), at(10.0));
    assert_eq!(
        d.allocation.be_freq_khz, None,
        "back at the maximum = uncapped"
    );
}

#[test]
fn alg3_disabled_without_guaranteed_frequency_or_rapl() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    let d = h.decide(&power(obs(0.5, 0.5), 95.0, 2000.0), at(0.0));
    assert_eq!(d.allocation.be_freq_khz, None);
    assert!(d.state["subcontrollers"]["power"]
        .as_str()
        .unwrap()
        .contains("guaranteed_freq_mhz"));
    let mut m = MachineInfo::with_cpus(8);
    m.mechanisms
        .set(headroom_control::policy::Mechanism::Rapl, false);
    let cfg = config("[policy.heracles]\nguaranteed_freq_mhz = 2200\n");
    let mut h = Heracles::new(&cfg, &m);
    let d = h.decide(&power(obs(0.5, 0.5), 95.0, 2000.0), at(0.0));
    assert_eq!(d.allocation.be_freq_khz, None);
    assert_eq!(d.state["subcontrollers"]["power"], "disabled: RAPL missing");
}

// ---------------- Alg. 4 ----------------

fn net(mut o: Observation, lc: f64) -> Observation {
    o.lc_tx_bytes_per_s = Some(lc);
    o.link_bytes_per_s = Some(1.25e9);
    o
}

#[test]
fn alg4_be_ceiling_is_link_minus_lc_minus_headroom_every_second() {
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    // headroom max(5% of link = 62.5 MB/s, 10% of LC = 10 MB/s)
    let d = h.decide(&net(obs(0.5, 0.5), 100e6), at(0.0));
    assert_eq!(d.allocation.be_egress_ceil_bytes_per_s, Some(1_087_500_000));
    let d = h.decide(&net(obs(0.5, 0.5), 800e6), at(0.5));
    assert_eq!(
        d.allocation.be_egress_ceil_bytes_per_s,
        Some(1_087_500_000),
        "1 s period"
    );
    // headroom max(62.5, 80) = 80 MB/s
    let d = h.decide(&net(obs(0.5, 0.5), 800e6), at(1.0));
    assert_eq!(d.allocation.be_egress_ceil_bytes_per_s, Some(370_000_000));
    // LC above the link: BE gets nothing
    let d = h.decide(&net(obs(0.5, 0.5), 1.3e9), at(2.0));
    assert_eq!(d.allocation.be_egress_ceil_bytes_per_s, Some(0));
}

#[test]
fn alg4_disabled_without_tc_or_rates_while_others_run() {
    let mut m = MachineInfo::with_cpus(8);
    m.mechanisms
        .set(headroom_control::policy::Mechanism::TcHtb, false);
    let mut h = Heracles::new(&config(""), &m);
    let d = h.decide(&net(obs(0.5, 0.5), 100e6), at(0.0));
    assert_eq!(d.allocation.be_egress_ceil_bytes_per_s, None);
    assert_eq!(d.state["subcontrollers"]["net"], "disabled: tc HTB missing");
    assert!(d.allocation.be_enabled, "top level still runs");
    let mut h = Heracles::new(&config(""), &MachineInfo::with_cpus(8));
    let d = h.decide(&obs(0.5, 0.5), at(0.0));
    assert!(d.state["subcontrollers"]["net"]
        .as_str()
        .unwrap()
        .starts_with("disabled"));
}
