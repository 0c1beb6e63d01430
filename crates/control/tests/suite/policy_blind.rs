//! PerfIso CPU blind isolation: grow/shrink with B = 1..4 on 2-, 8- and 16-CPU machines, LC
//! pinning, minimum S, fractional buffers, polling vs. updating.

use headroom_types::CpuSet;
use std::time::Duration;

use headroom_control::config::Config;
use headroom_control::policy::{Blind, MachineInfo, Policy};
use headroom_types::observation::Observation;

fn config(extra: &str) -> Config {
    let text = format!(
        "[lc]\nname = \"svc\"\ncgroup = \"headroom/lc\"\n[policy]\nkind = \"blind\"\n{extra}"
    );
    Config::from_toml_str(&text).expect("test config is valid")
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn idle(i: f64) -> Observation {
    Observation {
        idle_cpus: Some(i),
        ..Observation::default()
    }
}

/// A machine where BE is CPU-bound (fills its S CPUs) and the LC keeps `lc_busy` CPUs busy:
/// I = n - S - lc_busy. Runs `polls` polls 1 ms apart from `t0`, returns the last time and S.
fn simulate(b: &mut Blind, n: f64, lc_busy: f64, t0: u64, polls: u64) -> (u64, f64) {
    let mut t = t0;
    for _ in 0..polls {
        let i = (n - b.be_cpus() - lc_busy).max(0.0);
        b.decide(&idle(i), ms(t));
        t += 1;
    }
    (t, b.be_cpus())
}

#[test]
fn grows_to_leave_b_idle_and_shrinks_at_once_on_a_load_step() {
    for n in [2u32, 8, 16] {
        for buffer in 1..=4u32 {
            if buffer >= n {
                continue;
            }
            let cfg = config(&format!(
                "[policy.blind]\nbuffer_cores = {buffer}\npoll_ms = 1\ngrow_interval_ms = 10\n"
            ));
            let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(n));
            let (n_f, b_f) = (n as f64, buffer as f64);
            // LC idle: BE grows one CPU per 10 ms until I == B
            let (t, s) = simulate(&mut b, n_f, 0.0, 0, 400);
            assert_eq!(s, n_f - b_f, "n={n} B={buffer}: steady S");
            // LC load step: it now keeps `lc` CPUs busy, which the idle buffer cannot absorb
            let lc = (n_f - b_f).min(1.0 + (n_f - b_f) / 2.0).floor();
            let expected = (n_f - lc - b_f).max(0.0);
            let i = (n_f - s - lc).max(0.0);
            let d = b.decide(&idle(i), ms(t));
            assert!(
                d.reason.ends_with(":shrink"),
                "n={n} B={buffer}: {}",
                d.reason
            );
            assert_eq!(
                b.be_cpus(),
                (s - (b_f - i)).max(0.0),
                "shrinks by B - I at once"
            );
            // each poll takes back what the buffer lacks: done within ceil(lc / B) polls
            let polls = (lc / b_f).ceil() as u64;
            let (t, _) = simulate(&mut b, n_f, lc, t + 1, polls - 1);
            assert_eq!(
                b.be_cpus(),
                expected,
                "n={n} B={buffer}: shrunk in {polls} polls"
            );
            let d = b.decide(&idle((n_f - b.be_cpus() - lc).max(0.0)), ms(t));
            let cpus = d.allocation.be_cpus.clone().unwrap_or_default();
            if expected > 0.0 {
                assert!(d.allocation.be_enabled);
                assert_eq!(cpus.len() as f64, expected);
                assert!(cpus.iter().all(|c| c < n));
            } else {
                assert!(!d.allocation.be_enabled, "S = 0 freezes BE");
            }
            // the LC's load goes away: BE grows back, one step per grow interval
            let (_, s) = simulate(&mut b, n_f, 0.0, t + 1, 400);
            assert_eq!(s, n_f - b_f, "n={n} B={buffer}: regrown");
        }
    }
}

#[test]
fn growth_is_one_step_per_grow_interval() {
    let cfg = config("[policy.blind]\nbuffer_cores = 1\ngrow_interval_ms = 50\n");
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(16));
    let mut grows = 0;
    for t in 0..200 {
        let d = b.decide(&idle(15.0 - b.be_cpus()), ms(t));
        if d.reason == "blind:idle>buffer:grow" {
            grows += 1;
        }
    }
    assert_eq!(grows, 4, "t = 0, 50, 100, 150");
    assert_eq!(b.be_cpus(), 4.0);
}

#[test]
fn emits_a_change_only_when_s_changes() {
    let cfg = config("[policy.blind]\nbuffer_cores = 2\n");
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(8));
    simulate(&mut b, 8.0, 0.0, 0, 1000);
    let first = b.decide(&idle(2.0), ms(2000));
    for t in 2001..2100 {
        let d = b.decide(&idle(2.0), ms(t));
        assert_eq!(d.allocation, first.allocation);
        assert_eq!(d.reason, "blind:idle=buffer:steady");
    }
}

#[test]
fn never_gives_be_the_lc_pinned_cpus() {
    let cfg = config("[policy.blind]\nbuffer_cores = 1\ngrow_interval_ms = 0\n");
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(8));
    for t in 0..50 {
        let o = Observation {
            idle_cpus: Some(8.0),
            lc_cpus: Some(vec![0, 1, 2]),
            ..Observation::default()
        };
        let d = b.decide(&o, ms(t));
        let cpus = d.allocation.be_cpus.unwrap_or_default();
        assert!(cpus.iter().all(|c| c > 2), "BE got an LC CPU: {cpus:?}");
    }
    assert_eq!(
        b.be_cpus(),
        5.0,
        "max S = the 5 CPUs the LC is not pinned to"
    );
    // LC affinity covering every CPU is "not pinned"
    let o = Observation {
        idle_cpus: Some(8.0),
        lc_cpus: Some((0..8).collect()),
        ..Observation::default()
    };
    b.decide(&o, ms(100));
    b.decide(&o, ms(101));
    assert_eq!(b.be_cpus(), 7.0);
    // configured pinning counts too
    let cfg =
        config("[lc.threads]\npin = true\ncpus = [6, 7]\n[policy.blind]\ngrow_interval_ms = 0\n");
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(8));
    for t in 0..20 {
        let d = b.decide(&idle(8.0), ms(t));
        let cpus = d.allocation.be_cpus.unwrap_or_default();
        assert!(cpus.iter().all(|c| c < 6), "{cpus:?}");
    }
}

#[test]
fn minimum_s_is_kept_and_zero_freezes_be() {
    let cfg = config("[policy.blind]\nbuffer_cores = 2\nmin_be_cpus = 1\n");
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(4));
    let d = b.decide(&idle(0.0), ms(0));
    assert_eq!(b.be_cpus(), 1.0);
    assert!(d.allocation.be_enabled);
    assert_eq!(d.reason, "blind:idle<buffer:at-min");
    let cfg = config("[policy.blind]\nbuffer_cores = 2\nmin_be_cpus = 0\ngrow_interval_ms = 0\n");
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(4));
    b.decide(&idle(4.0), ms(0));
    b.decide(&idle(3.0), ms(1));
    let d = b.decide(&idle(0.0), ms(2));
    assert_eq!(b.be_cpus(), 0.0);
    assert!(!d.allocation.be_enabled, "S = 0 freezes BE");
    assert_eq!(
        d.allocation.be_cpus,
        Some(CpuSet::from([2, 3])),
        "frozen on its last cpuset"
    );
}

#[test]
fn fractional_buffer_on_a_two_cpu_machine_uses_a_quota() {
    let cfg = config("[policy.blind]\nbuffer_cores = 1.5\ngrow_interval_ms = 0\n");
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(2));
    // defaults: S moves in steps of B's fraction (0.5); I sums per-CPU idle fractions
    let mut last = None;
    for t in 0..20 {
        let s = b.be_cpus();
        let per_cpu = vec![(1.0 - s).max(0.0), (1.0 - (s - 1.0).max(0.0)).min(1.0)];
        let o = Observation {
            cpu_idle: Some(per_cpu),
            ..Observation::default()
        };
        last = Some(b.decide(&o, ms(t)));
    }
    let d = last.unwrap();
    assert_eq!(b.be_cpus(), 0.5);
    assert_eq!(
        d.allocation.be_cpus,
        Some(CpuSet::from([1])),
        "whole CPUs via the cpuset"
    );
    assert_eq!(
        d.allocation.be_quota_pct,
        Some(50.0),
        "the fraction via a quota"
    );
    assert_eq!(d.allocation.be_quota_period_us, Some(100_000));
    // LC needs half a CPU more: idle 1.0 < B = 1.5 → S 0.5 → 0.0 frozen
    let d = b.decide(&idle(1.0), ms(100));
    assert_eq!(b.be_cpus(), 0.0);
    assert!(!d.allocation.be_enabled);
}

#[test]
fn idle_from_per_cpu_fractions_with_a_threshold() {
    let cfg =
        config("[policy.blind]\nbuffer_cores = 1\nidle_threshold = 0.5\ngrow_interval_ms = 0\n");
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(4));
    let o = Observation {
        cpu_idle: Some(vec![0.9, 0.6, 0.2, 0.95]),
        ..Observation::default()
    };
    let d = b.decide(&o, ms(0));
    assert_eq!(d.state["idle"], 3.0);
    assert_eq!(d.reason, "blind:idle>buffer:grow");
    let d = b.decide(&Observation::default(), ms(1));
    assert_eq!(d.reason, "blind:no-idle-data:hold");
}

#[test]
fn hysteresis_delays_growth() {
    let cfg =
        config("[policy.blind]\nbuffer_cores = 1\nhysteresis_cpus = 1\ngrow_interval_ms = 0\n");
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(8));
    let d = b.decide(&idle(2.0), ms(0));
    assert_eq!(
        d.reason, "blind:idle=buffer:steady",
        "I = B + 1 is within hysteresis"
    );
    let d = b.decide(&idle(2.5), ms(1));
    assert_eq!(
        d.reason, "blind:idle=buffer:steady",
        "one more CPU would eat into buffer + hysteresis"
    );
    let d = b.decide(&idle(3.0), ms(2));
    assert_eq!(d.reason, "blind:idle>buffer:grow");
}

/// An exact idle sensor sees the agent's own polling as a few percent busy: within
/// `idle_tolerance_cpus` (default 0.1) of B is "B idle" — no shrink at I = 0.97, no refusal to
/// grow at I = 1.95 with B = 1 — while a real step (I = 0.85) still shrinks at once.
#[test]
fn idle_within_the_tolerance_of_b_neither_shrinks_nor_blocks_growth() {
    let cfg = config("[policy.blind]\nbuffer_cores = 1\npoll_ms = 1\ngrow_interval_ms = 1\n");
    assert_eq!(cfg.policy.blind.idle_tolerance_cpus, 0.1);
    let mut b = Blind::new(&cfg, &MachineInfo::with_cpus(2));
    let d = b.decide(&idle(1.95), ms(0));
    assert_eq!(d.reason, "blind:idle>buffer:grow");
    assert_eq!(b.be_cpus(), 1.0);
    for t in 1..50 {
        let d = b.decide(&idle(0.97), ms(t));
        assert_eq!(d.reason, "blind:idle=buffer:steady", "poll {t}");
    }
    assert_eq!(b.be_cpus(), 1.0);
    let d = b.decide(&idle(0.85), ms(50));
    assert_eq!(d.reason, "blind:idle<buffer:shrink");
    assert_eq!(b.be_cpus(), 0.0);

    // tolerance 0 restores the exact comparison
    let exact = config(
        "[policy.blind]\nbuffer_cores = 1\npoll_ms = 1\ngrow_interval_ms = 1\nidle_tolerance_cpus = 0\n",
    );
    let mut b = Blind::new(&exact, &MachineInfo::with_cpus(2));
    assert_eq!(
        b.decide(&idle(1.95), ms(0)).reason,
        "blind:idle=buffer:steady"
    );
    let err = Config::from_toml_str(
        "[lc]\nname = \"s\"\ncgroup = \"h/lc\"\n[policy]\nkind = \"blind\"\n[policy.blind]\nidle_tolerance_cpus = 0.5\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("policy.blind.idle_tolerance_cpus"), "{err}");
}
