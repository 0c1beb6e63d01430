//! The safety wrapper: stale/unknown latency, SLO-violation cooldown, low memory, the LC never
//! restricted, missing mechanisms dropped, pause/resume and live `set`.

use headroom_types::CpuSet;
use std::time::Duration;

use headroom_control::config::{Config, ConfigError};
use headroom_control::decision::Decision;
use headroom_control::policy::{self, Guarded, MachineInfo, Policy};
use headroom_types::allocation::{Allocation, CpuWeight};
use headroom_types::observation::Observation;

const BLIND_WITH_LATENCY: &str = r#"
[lc]
name = "memcached"
cgroup = "headroom/lc"
[lc.slo]
target_us = 500
[lc.latency]
source = "probe"
address = "127.0.0.1:11211"
[policy]
kind = "blind"
[policy.blind]
buffer_cores = 1
grow_interval_ms = 0
[safety]
latency_max_age_ms = 2000
stale_disable_ms = 100
violation_cooldown_s = 60
grow_interval_ms = 0
grow_after_shrink_ms = 0
"#;

fn cfg(text: &str) -> Config {
    Config::from_toml_str(text).expect("valid")
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn fresh(latency: f64, idle: f64) -> Observation {
    Observation {
        lc_latency_us: Some(latency),
        lc_latency_age_ms: Some(100),
        idle_cpus: Some(idle),
        ..Observation::default()
    }
}

fn n_be(d: &Decision) -> usize {
    if d.allocation.be_enabled {
        d.allocation
            .be_cpus
            .as_ref()
            .map_or(usize::MAX, CpuSet::len)
    } else {
        0
    }
}

/// Grows BE to `n` CPUs on an 8-CPU machine with fresh, good latency; returns the next time.
fn grown(p: &mut dyn Policy, n: usize) -> u64 {
    for t in 0..100 {
        let d = p.decide(&fresh(100.0, 6.0), ms(t));
        if n_be(&d) == n {
            return t + 1;
        }
    }
    panic!("BE never reached {n} CPUs");
}

#[test]
fn stale_latency_stops_growth_then_disables_be() {
    let mut p = policy::build(&cfg(BLIND_WITH_LATENCY), &MachineInfo::with_cpus(8));
    let t = grown(p.as_mut(), 3);
    let stale = Observation {
        lc_latency_us: Some(100.0),
        lc_latency_age_ms: Some(5000),
        idle_cpus: Some(6.0),
        ..Observation::default()
    };
    let d = p.decide(&stale, ms(t));
    assert_eq!(d.reason, "safety:latency-unknown:no-growth");
    assert_eq!(n_be(&d), 3, "blind wanted 4; held at 3");
    // shrinking still passes
    let d = p.decide(
        &Observation {
            idle_cpus: Some(0.0),
            ..stale.clone()
        },
        ms(t + 1),
    );
    assert_eq!(n_be(&d), 2);
    // after stale_disable_ms of it, BE is disabled
    let d = p.decide(&stale, ms(t + 100));
    assert_eq!(d.reason, "safety:latency-stale:disable");
    assert!(!d.allocation.be_enabled);
    // fresh latency again: growth resumes from what was applied
    let d = p.decide(&fresh(100.0, 8.0), ms(t + 101));
    assert!(d.allocation.be_enabled);
    assert_eq!(n_be(&d), 1, "regrows from 0 in steps");
}

#[test]
fn unknown_latency_and_tick_count_limit() {
    let text = BLIND_WITH_LATENCY.replace(
        "stale_disable_ms = 100",
        "stale_disable_ms = 0\nstale_disable_ticks = 3",
    );
    let mut p = policy::build(&cfg(&text), &MachineInfo::with_cpus(8));
    let t = grown(p.as_mut(), 2);
    let unknown = Observation {
        idle_cpus: Some(6.0),
        ..Observation::default()
    };
    assert_eq!(n_be(&p.decide(&unknown, ms(t))), 2);
    assert_eq!(n_be(&p.decide(&unknown, ms(t + 1))), 2);
    let d = p.decide(&unknown, ms(t + 2));
    assert_eq!(d.reason, "safety:latency-stale:disable");
    assert_eq!(d.state["safety"]["stale_ticks"], 3);
}

#[test]
fn slo_violation_starts_a_cooldown() {
    let mut p = policy::build(&cfg(BLIND_WITH_LATENCY), &MachineInfo::with_cpus(8));
    let t = grown(p.as_mut(), 2);
    let d = p.decide(&fresh(600.0, 6.0), ms(t));
    assert_eq!(d.reason, "safety:slo-violation:cooldown");
    assert!(!d.allocation.be_enabled);
    let d = p.decide(&fresh(100.0, 6.0), ms(t + 59_999));
    assert!(!d.allocation.be_enabled, "still cooling down");
    let d = p.decide(&fresh(100.0, 6.0), ms(t + 60_000));
    assert!(d.allocation.be_enabled, "{}", d.reason);
}

/// Fourth hostile pass (a low left by the third): `ctl set safety.violation_cooldown_s=0`
/// during a running cooldown kept BE off for the old cooldown's length. The cooldown runs
/// from the violation with the value set now: shortened, it ends at once; lengthened, later.
#[test]
fn a_live_cooldown_change_applies_to_the_running_cooldown() {
    let mut p = policy::build(&cfg(BLIND_WITH_LATENCY), &MachineInfo::with_cpus(8));
    let t = grown(p.as_mut(), 2);
    let d = p.decide(&fresh(600.0, 6.0), ms(t));
    assert_eq!(d.reason, "safety:slo-violation:cooldown");
    assert_eq!(
        d.state["safety"]["violation_cooldown_until_ms"],
        t + 60_000,
        "60 s from the violation"
    );
    // lengthened: from the same violation
    p.set_param("safety.violation_cooldown_s", "120").unwrap();
    let d = p.decide(&fresh(100.0, 6.0), ms(t + 90_000));
    assert!(!d.allocation.be_enabled, "120 s from the violation");
    assert_eq!(
        d.state["safety"]["violation_cooldown_until_ms"],
        t + 120_000
    );
    // shortened below what has passed: over at once
    p.set_param("safety.violation_cooldown_s", "5").unwrap();
    let d = p.decide(&fresh(100.0, 6.0), ms(t + 90_001));
    assert!(d.allocation.be_enabled, "{}", d.reason);
    // 0 turns the rule off: a new violation starts none
    p.set_param("safety.violation_cooldown_s", "0").unwrap();
    let d = p.decide(&fresh(600.0, 6.0), ms(t + 90_002));
    assert_ne!(d.reason, "safety:slo-violation:cooldown");
}

/// A fallback prober's figure the kernel sensor does not confirm holds BE (no growth) but
/// starts no cooldown; a trusted one does, and the state names the source that judged it.
#[test]
fn only_a_trusted_violation_starts_the_cooldown() {
    let mut p = policy::build(&cfg(BLIND_WITH_LATENCY), &MachineInfo::with_cpus(8));
    let t = grown(p.as_mut(), 2);
    let untrusted = Observation {
        lc_latency_source: Some("probe".into()),
        lc_latency_untrusted: Some("the kernel sensor reads 100 µs".into()),
        ..fresh(1200.0, 7.0)
    };
    let d = p.decide(&untrusted, ms(t));
    assert_eq!(d.reason, "safety:slo-violation-untrusted:hold");
    assert_eq!(
        n_be(&d),
        2,
        "held where it was, neither grown nor cooled down"
    );
    assert!(d.state["safety"]["violation_cooldown_until_ms"].is_null());
    assert_eq!(
        d.state["safety"]["untrusted_violation"],
        "the kernel sensor reads 100 µs"
    );
    // the kernel's own figure, trusted, a moment later: BE regrows at its pace
    let d = p.decide(&fresh(100.0, 7.0), ms(t + 1_000));
    assert!(d.allocation.be_enabled, "{}", d.reason);
    // a trusted violation: the cooldown, judged by the kernel sensor
    let judged = Observation {
        lc_latency_source: Some("kernel".into()),
        ..fresh(600.0, 7.0)
    };
    let d = p.decide(&judged, ms(t + 2_000));
    assert_eq!(d.reason, "safety:slo-violation:cooldown");
    assert_eq!(d.state["safety"]["violation_judged_by"], "kernel");
    assert!(!d.allocation.be_enabled);
}

#[test]
fn low_memory_disables_be_and_static_limits_are_applied() {
    let text = format!(
        "{BLIND_WITH_LATENCY}min_mem_available_bytes = 1000000\nbe_memory_limit_bytes = 5000000\n[[safety.be_io_limits]]\ndevice = \"8:0\"\nwrite_bps = 1000000\n"
    );
    let mut p = policy::build(&cfg(&text), &MachineInfo::with_cpus(8));
    let mut o = fresh(100.0, 6.0);
    o.mem_available_bytes = Some(2_000_000);
    let d = p.decide(&o, ms(0));
    assert!(d.allocation.be_enabled);
    assert_eq!(d.allocation.be_memory_limit_bytes, Some(5_000_000));
    assert_eq!(d.allocation.be_io_limits.len(), 1);
    assert!(!d.allocation.be_kill);
    o.mem_available_bytes = Some(500_000);
    let d = p.decide(&o, ms(1));
    assert_eq!(d.reason, "safety:low-memory:kill");
    assert!(!d.allocation.be_enabled);
    assert!(d.allocation.be_kill, "freezing would keep BE's memory");
    o.mem_available_bytes = Some(2_000_000);
    let d = p.decide(&o, ms(2));
    assert!(!d.allocation.be_kill);
    // memory pressure stalls count too
    let text = format!("{BLIND_WITH_LATENCY}max_memory_psi_full = 5.0\n");
    let mut p = policy::build(&cfg(&text), &MachineInfo::with_cpus(8));
    let mut o = fresh(100.0, 6.0);
    o.psi_memory_full = Some(12.5);
    let d = p.decide(&o, ms(0));
    assert_eq!(d.reason, "safety:memory-pressure:kill");
    assert!(d.allocation.be_kill);
}

/// A policy that misbehaves: restricts the LC and gives BE everything.
struct Rogue;
impl Policy for Rogue {
    fn name(&self) -> &'static str {
        "rogue"
    }
    fn decide(&mut self, _obs: &Observation, _now: Duration) -> Decision {
        let mut a = Allocation {
            be_cpus: Some((0..8).collect()),
            be_llc_ways: Some(10),
            be_cpu_idle: Some(true),
            ..Allocation::default()
        };
        a.lc.cpu_weight = Some(CpuWeight {
            shares: 2,
            weight: 1,
        });
        a.lc.fifo_priority = Some(50);
        Decision {
            allocation: a,
            reason: "rogue:all".into(),
            state: serde_json::json!({}),
            binding_lc: None,
        }
    }
    fn poll_interval(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn reconfigure(&mut self, _config: &Config) {}
}

#[test]
fn lc_is_never_restricted_and_missing_mechanisms_are_dropped() {
    let text = "[lc]\nname = \"svc\"\ncgroup = \"headroom/lc\"\n[lc.threads]\npin = true\ncpus = [0, 1]\nslice_us = 100\n[policy]\nkind = \"blind\"\n";
    let config = cfg(text);
    let mut m = MachineInfo::with_cpus(8);
    m.mechanisms
        .set(headroom_control::policy::Mechanism::ResctrlL3, false);
    m.mechanisms
        .set(headroom_control::policy::Mechanism::CpuIdle, false);
    let mut p = Guarded::wrap(&config, &m, Box::new(Rogue));
    let o = Observation {
        lc_cpus: Some(vec![2]),
        ..Observation::default()
    };
    let d = p.decide(&o, ms(0));
    assert_eq!(
        d.allocation.be_cpus,
        Some(CpuSet::from([3, 4, 5, 6, 7])),
        "LC CPUs 0-2 removed"
    );
    assert_eq!(
        d.allocation.lc.cpu_weight,
        Some(CpuWeight::DEFAULT),
        "LC weight floor"
    );
    assert_eq!(
        d.allocation.lc.fifo_priority, None,
        "LC treatment only from config"
    );
    assert_eq!(d.allocation.lc.slice_us, Some(100));
    assert_eq!(d.allocation.lc.pin_cpus, Some(CpuSet::from([0, 1])));
    assert_eq!(d.allocation.be_llc_ways, None);
    assert_eq!(d.allocation.be_cpu_idle, None);
    assert_eq!(
        d.allocation.be_cpu_weight,
        Some(CpuWeight::BATCH),
        "idle → weight 2"
    );
    let dropped = d.state["safety"]["unavailable"].to_string();
    assert!(
        dropped.contains("resctrl_l3") && dropped.contains("cpu_idle"),
        "{dropped}"
    );
}

#[test]
fn pause_holds_the_last_decision_and_resume_continues() {
    let mut p = policy::build(&cfg(BLIND_WITH_LATENCY), &MachineInfo::with_cpus(8));
    let t = grown(p.as_mut(), 2);
    p.pause();
    assert!(p.is_paused());
    for i in 0..10 {
        let d = p.decide(&fresh(100.0, 6.0), ms(t + i));
        assert_eq!(n_be(&d), 2, "paused: held");
        assert_eq!(d.reason, "safety:paused:hold");
    }
    // the safety rules still apply while paused
    let d = p.decide(&fresh(900.0, 6.0), ms(t + 10));
    assert!(!d.allocation.be_enabled);
    p.resume();
    let d = p.decide(&fresh(100.0, 6.0), ms(t + 100_000));
    assert!(!p.is_paused());
    assert_ne!(d.reason, "safety:paused:hold");
}

#[test]
fn set_changes_a_parameter_live_with_validation() {
    let mut p = policy::build(&cfg(BLIND_WITH_LATENCY), &MachineInfo::with_cpus(8));
    let t = grown(p.as_mut(), 3);
    p.set_param("policy.blind.buffer_cores", "3")
        .expect("valid change");
    // I = 2 < B = 3 now → shrink
    let d = p.decide(&fresh(100.0, 2.0), ms(t));
    assert_eq!(n_be(&d), 2);
    assert_eq!(d.state["policy"]["buffer"], 3.0);
    let err = p.set_param("policy.blind.buffer_cores", "-1").unwrap_err();
    assert_eq!(
        err.to_string(),
        "policy.blind.buffer_cores = -1.0: must be a finite number >= 0"
    );
    let err = p.set_param("lc.cgroup", "\"x\"").unwrap_err();
    assert!(
        matches!(err, ConfigError::Invalid { ref key, .. } if key == "lc.cgroup"),
        "{err}"
    );
    let err = p.set_param("policy.blind.no_such_key", "1").unwrap_err();
    assert!(err.to_string().contains("no_such_key"), "{err}");
    let err = p
        .set_param("policy.heracles.load_enable", "0.9")
        .unwrap_err();
    assert!(err.to_string().contains("load_enable"), "{err}");
    // changing the kind rebuilds the policy
    p.set_param("policy.kind", "static-cores")
        .expect("kind change");
    assert_eq!(p.name(), "static-cores");
}

#[test]
fn none_baseline_is_not_subject_to_latency_rules() {
    let text = BLIND_WITH_LATENCY.replace("kind = \"blind\"", "kind = \"none\"");
    let mut p = policy::build(&cfg(&text), &MachineInfo::with_cpus(8));
    let d = p.decide(&fresh(5000.0, 0.0), ms(0));
    assert!(d.allocation.be_enabled);
    assert_eq!(d.reason, "none:unrestricted");
    let d = p.decide(&Observation::default(), ms(1000));
    assert!(d.allocation.be_enabled);
}

#[test]
fn growth_is_paced_and_waits_after_a_shrink() {
    let text = BLIND_WITH_LATENCY.replace(
        "grow_interval_ms = 0\ngrow_after_shrink_ms = 0",
        "grow_interval_ms = 10\ngrow_after_shrink_ms = 100",
    );
    let mut p = policy::build(&cfg(&text), &MachineInfo::with_cpus(8));
    // blind alone would grow every 1 ms tick; the wrapper lets it grow every 10 ms
    let mut sizes = Vec::new();
    for t in 0..31 {
        let d = p.decide(&fresh(100.0, 6.0), ms(t));
        sizes.push(n_be(&d));
    }
    assert_eq!(sizes[0], 1);
    assert_eq!(sizes[9], 1, "paced: {sizes:?}");
    assert_eq!(sizes[10], 2);
    assert_eq!(sizes[30], 4);
    let d = p.decide(&fresh(100.0, 6.0), ms(31));
    assert_eq!(d.reason, "safety:grow-paced:hold");
    // shrink passes at once, then no growth for 100 ms
    let d = p.decide(&fresh(100.0, 0.0), ms(40));
    assert_eq!(n_be(&d), 3);
    for t in 41..140 {
        assert_eq!(
            n_be(&p.decide(&fresh(100.0, 6.0), ms(t))),
            3,
            "grew at {t} ms"
        );
    }
    assert_eq!(n_be(&p.decide(&fresh(100.0, 6.0), ms(140))), 4);
}
