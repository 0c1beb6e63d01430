//! `hybrid`: Heracles' top level (slack, load) sets blind isolation's buffer and enables or
//! disables BE; blind isolation runs every poll underneath.

use headroom_types::CpuSet;
use std::time::Duration;

use headroom_control::config::Config;
use headroom_control::policy::{Hybrid, MachineInfo, Policy};
use headroom_types::observation::Observation;

const BASE: &str = r#"
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
kind = "hybrid"
[policy.blind]
buffer_cores = 2
grow_interval_ms = 0
[policy.hybrid]
buffer_min_cores = 1
buffer_max_cores = 4
buffer_step_cores = 1
"#;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn obs(slack: f64, load: f64, idle: f64) -> Observation {
    Observation {
        lc_latency_us: Some(500.0 * (1.0 - slack)),
        lc_latency_age_ms: Some(10),
        lc_load: Some(load),
        lc_load_age_ms: Some(10),
        idle_cpus: Some(idle),
        ..Observation::default()
    }
}

fn hybrid() -> Hybrid {
    Hybrid::new(
        &Config::from_toml_str(BASE).expect("valid"),
        &MachineInfo::with_cpus(8),
    )
}

fn be_cpus(d: &headroom_control::decision::Decision) -> usize {
    if d.allocation.be_enabled {
        d.allocation.be_cpus.as_ref().map_or(8, |c| c.len())
    } else {
        0
    }
}

#[test]
fn outer_loop_enables_and_shrinks_the_buffer_with_ample_slack() {
    let mut h = hybrid();
    let d = h.decide(&obs(0.5, 0.5, 8.0), ms(0));
    assert_eq!(h.buffer(), 1.0, "slack 0.5: B 2 → 1");
    assert!(d.allocation.be_enabled);
    // inner loop grows BE every poll until I = B = 1 (BE CPU-bound: I = 8 - S)
    let mut t = 1;
    let mut d = d;
    while t < 100 {
        let s = be_cpus(&d) as f64;
        d = h.decide(&obs(0.5, 0.5, 8.0 - s), ms(t));
        t += 1;
    }
    assert_eq!(be_cpus(&d), 7);
}

#[test]
fn low_slack_widens_the_buffer_and_the_inner_loop_gives_cores_back() {
    let mut h = hybrid();
    let mut d = h.decide(&obs(0.5, 0.5, 8.0), ms(0));
    for t in 1..200 {
        d = h.decide(&obs(0.5, 0.5, 8.0 - be_cpus(&d) as f64), ms(t));
    }
    assert_eq!(be_cpus(&d), 7);
    // next outer period (window 1 s): slack 3% → B 1 → 2, no growth
    let d = h.decide(&obs(0.03, 0.5, 1.0), ms(1000));
    assert_eq!(d.reason, "hybrid:slack<shrink:shrink");
    assert_eq!(h.buffer(), 2.0);
    assert_eq!(be_cpus(&d), 6, "the inner loop shrank in the same tick");
    let d = h.decide(&obs(0.03, 0.5, 2.0), ms(1001));
    assert_eq!(be_cpus(&d), 6, "I = B now: steady");
    // slack 8%: no growth even with idle CPUs
    let d = h.decide(&obs(0.08, 0.5, 4.0), ms(2000));
    assert_eq!(d.state["top"]["growth_allowed"], false);
    let d = h.decide(&obs(0.08, 0.5, 4.0), ms(2001));
    assert_eq!(be_cpus(&d), 6);
    assert_eq!(d.reason, "hybrid:idle>buffer:growth-disallowed");
}

#[test]
fn negative_slack_disables_with_cooldown_and_load_hysteresis_applies() {
    let mut h = hybrid();
    h.decide(&obs(0.5, 0.5, 8.0), ms(0));
    let d = h.decide(&obs(-0.01, 0.5, 8.0), ms(1000));
    assert_eq!(d.reason, "hybrid:slack<0:disable");
    assert!(!d.allocation.be_enabled);
    assert_eq!(h.buffer(), 2.0, "the buffer widened");
    for s in 2..300 {
        let d = h.decide(&obs(0.5, 0.5, 8.0), ms(s * 1000));
        assert!(!d.allocation.be_enabled, "cooldown at {s} s");
    }
    let d = h.decide(&obs(0.5, 0.5, 8.0), ms(301_000));
    assert!(d.allocation.be_enabled);
    let d = h.decide(&obs(0.5, 0.86, 8.0), ms(302_000));
    assert!(!d.allocation.be_enabled);
    let d = h.decide(&obs(0.5, 0.82, 8.0), ms(303_000));
    assert!(!d.allocation.be_enabled, "hysteresis");
    let d = h.decide(&obs(0.5, 0.79, 8.0), ms(304_000));
    assert!(d.allocation.be_enabled);
}

#[test]
fn buffer_stays_within_its_bounds() {
    let mut h = hybrid();
    for i in 0..10 {
        h.decide(&obs(0.5, 0.5, 8.0), ms(i * 1000));
    }
    assert_eq!(h.buffer(), 1.0);
    for i in 10..20 {
        h.decide(&obs(0.01, 0.5, 0.0), ms(i * 1000));
    }
    assert_eq!(h.buffer(), 4.0);
}

#[test]
fn unknown_latency_is_retried_after_a_second_not_a_window() {
    let text = BASE.replace("window_s = 1", "window_s = 15");
    let mut h = Hybrid::new(
        &Config::from_toml_str(&text).unwrap(),
        &MachineInfo::with_cpus(8),
    );
    let d = h.decide(&Observation::default(), ms(0));
    assert_eq!(d.reason, "hybrid:no-latency-or-load:hold");
    assert!(!d.allocation.be_enabled);
    assert!(!h.decide(&obs(0.5, 0.5, 8.0), ms(999)).allocation.be_enabled);
    assert!(
        h.decide(&obs(0.5, 0.5, 8.0), ms(1000))
            .allocation
            .be_enabled
    );
    // with data, the next evaluation is a whole window later
    assert!(
        h.decide(&obs(-0.5, 0.5, 8.0), ms(15_999))
            .allocation
            .be_enabled
    );
    assert!(
        !h.decide(&obs(-0.5, 0.5, 8.0), ms(16_000))
            .allocation
            .be_enabled
    );
}

/// A 2-CPU machine where BE may only use CPU 1 and the LC is pinned there: blind isolation alone
/// would leave BE nothing, so with `share_lc_cpus` (the default) BE shares CPU 1 as `cpu.idle`
/// while the slack is healthy, and the outer loop still disables it on negative slack.
fn small_machine_hybrid(share: bool) -> Hybrid {
    let toml = BASE.replace("buffer_cores = 2", "buffer_cores = 1\nbe_cpus = [1]")
        + &format!("share_lc_cpus = {share}\n");
    Hybrid::new(
        &Config::from_toml_str(&toml).expect("valid"),
        &MachineInfo::with_cpus(2),
    )
}

fn pinned_obs(slack: f64, load: f64) -> Observation {
    Observation {
        lc_cpus: Some(vec![1]),
        ..obs(slack, load, 0.5)
    }
}

#[test]
fn be_shares_the_lc_cpu_as_idle_when_no_other_cpu_is_left() {
    let mut h = small_machine_hybrid(true);
    let d = h.decide(&pinned_obs(0.5, 0.5), ms(0));
    assert!(d.allocation.be_enabled, "healthy slack: BE runs");
    assert_eq!(d.allocation.be_cpus, Some(CpuSet::from([1])));
    assert_eq!(d.allocation.be_cpu_idle, Some(true));
    assert_eq!(d.reason, "hybrid:share-lc-cpus:idle");

    // an SLO violation at the next outer step disables BE, whatever the sharing rule says
    let d = h.decide(&pinned_obs(-0.2, 0.5), ms(1_000));
    assert!(!d.allocation.be_enabled, "negative slack: BE frozen");
    assert!(
        d.reason.contains("slack"),
        "reason names the slack: {}",
        d.reason
    );
}

#[test]
fn while_be_shares_the_lc_cpu_no_idle_crossing_wakes_the_agent() {
    let mut h = small_machine_hybrid(true);
    let d = h.decide(&pinned_obs(0.5, 0.5), ms(0));
    assert_eq!(d.reason, "hybrid:share-lc-cpus:idle");
    // no inner loop runs: the idle count decides nothing, the loop keeps the periodic duty
    assert!(!h.idle_crossings_matter());
    assert!(!h.idle_crossings().any());
    assert!(h.poll_interval() >= ms(100), "{:?}", h.poll_interval());
    // with CPU 1 no longer the LC's, blind isolation decides BE's CPUs and its crossings matter
    let mut h = small_machine_hybrid(true);
    let d = h.decide(
        &Observation {
            lc_cpus: Some(vec![0]),
            ..obs(0.5, 0.5, 0.5)
        },
        ms(0),
    );
    assert_ne!(d.reason, "hybrid:share-lc-cpus:idle");
    assert!(h.idle_crossings_matter(), "{}", d.reason);
}

#[test]
fn without_sharing_be_gets_nothing_on_the_lc_cpu() {
    let mut h = small_machine_hybrid(false);
    let d = h.decide(&pinned_obs(0.5, 0.5), ms(0));
    assert!(
        !d.allocation.be_enabled,
        "no CPU outside the LC's: BE frozen"
    );
    assert_ne!(d.allocation.be_cpu_idle, Some(true));
}

#[test]
fn the_safety_wrapper_lets_idle_be_share_the_lc_cpu() {
    let toml = BASE.replace("buffer_cores = 2", "buffer_cores = 1\nbe_cpus = [1]");
    let config = Config::from_toml_str(&toml).expect("valid");
    let mut p = headroom_control::policy::build(&config, &MachineInfo::with_cpus(2));
    let d = p.decide(&pinned_obs(0.5, 0.5), ms(0));
    assert!(d.allocation.be_enabled, "reason {}", d.reason);
    assert_eq!(d.allocation.be_cpus, Some(CpuSet::from([1])));
    assert_eq!(d.allocation.be_cpu_idle, Some(true));
}

/// With the decision state off (no decision log), the guarded hybrid policy takes exactly the
/// same decisions — the state only explains them — and builds no state at all.
#[test]
fn explain_off_changes_no_decision() {
    let cfg = Config::from_toml_str(BASE).expect("config");
    let machine = MachineInfo::with_cpus(8);
    let mut on = headroom_control::policy::build(&cfg, &machine);
    let mut off = headroom_control::policy::build(&cfg, &machine);
    off.set_explain(false);
    // a scripted day: idle, load rising past the disable threshold, a violation, recovery
    let script: Vec<(f64, f64, f64)> = (0..4000u64)
        .map(|t| {
            let phase = t as f64 / 4000.0;
            let load = 0.2 + 0.7 * (std::f64::consts::PI * phase).sin();
            let slack = if (1500..1520).contains(&t) { -0.1 } else { 0.3 };
            let idle = (8.0 * (1.0 - load)).max(0.0);
            (slack, load, idle)
        })
        .collect();
    let mut reasons = std::collections::BTreeSet::new();
    for (t, &(slack, load, idle)) in script.iter().enumerate() {
        let o = obs(slack, load, idle);
        let a = on.decide(&o, ms(t as u64 * 5));
        let b = off.decide(&o, ms(t as u64 * 5));
        assert_eq!(a.allocation, b.allocation, "tick {t}");
        assert_eq!(a.reason, b.reason, "tick {t}");
        assert!(a.state.is_object(), "tick {t}: state on");
        assert!(b.state.is_null(), "tick {t}: state off");
        reasons.insert(a.reason);
    }
    // the script exercised more than one rule
    assert!(reasons.len() >= 3, "{reasons:?}");
}
