//! The model's response to each knob the agent writes, through `Node::write` as the write path
//! does it: each moves LC latency, BE throughput and power the way the papers measured.

use std::time::Duration;

use headroom_control::actuation::{CgroupKnob, Knob, KnobValue};
use headroom_control::node::Node;
use headroom_sim::host::{SimHost, TickState};
use headroom_sim::model::ServerModel;
use headroom_sim::node::sim_groups;
use headroom_types::resources::CpuQuota;

const CORES: u32 = 16;

fn host(kind: &str) -> SimHost {
    let m = ServerModel::default();
    SimHost::new(&m, CORES, m.be_kind(kind).unwrap(), 5.0)
}

fn be(k: CgroupKnob) -> Knob {
    Knob::cgroup(&sim_groups().be[0], k)
}

fn set(h: &mut SimHost, knob: Knob, v: KnobValue) {
    let from = h.read(&knob).unwrap();
    h.write(&knob, &from, &v).unwrap();
}

fn state(h: &mut SimHost, load: f64) -> TickState {
    let peak = SimHost::peak_qps(&ServerModel::default(), CORES);
    h.set_inputs(load * peak, None, peak);
    h.sense(Duration::ZERO);
    *h.last_state().unwrap()
}

fn p99(s: &TickState) -> f64 {
    s.tail.quantile(0.99)
}

#[test]
fn freezing_be_gives_the_lc_alone() {
    let mut h = host("spin");
    set(&mut h, be(CgroupKnob::Frozen), KnobValue::Frozen(true));
    let s = state(&mut h, 0.5);
    assert_eq!(s.be_norm, 0.0);
    assert_eq!(s.stretch, 1.0);
    assert!(p99(&s) < 500.0);
}

#[test]
fn more_be_cpus_more_be_work_less_lc_room() {
    let mut h = host("spin");
    let mut last_be = -1.0;
    let mut last_idle = f64::INFINITY;
    for n in [2u32, 4, 8] {
        set(
            &mut h,
            be(CgroupKnob::CpusetCpus),
            KnobValue::Cpus((16 - n..16).collect()),
        );
        let s = state(&mut h, 0.3);
        assert!(s.be_norm > last_be && s.idle < last_idle, "{n} CPUs: {s:?}");
        (last_be, last_idle) = (s.be_norm, s.idle);
    }
}

#[test]
fn equal_weight_be_on_every_cpu_costs_the_scheduling_delay_and_idle_or_low_weight_do_not() {
    // `none`: BE everywhere at equal weight — the wake-up delay dominates the tail
    let mut h = host("spin");
    let fair = p99(&state(&mut h, 0.3));
    assert!(fair > 3000.0, "equal weights: {fair}");
    set(&mut h, be(CgroupKnob::CpuWeight), KnobValue::Weight(2));
    let low = p99(&state(&mut h, 0.3));
    set(&mut h, be(CgroupKnob::CpuWeight), KnobValue::Weight(1024));
    set(&mut h, be(CgroupKnob::CpuIdle), KnobValue::Idle(true));
    let idle = p99(&state(&mut h, 0.3));
    assert!(
        low < 500.0 && idle < 500.0,
        "weights 2: {low}, cpu.idle: {idle}"
    );
    assert!(idle < low, "cpu.idle {idle} vs low weight {low}");
}

#[test]
fn quota_caps_be_and_frequency_caps_cut_be_speed_and_power() {
    let mut h = host("spin");
    set(
        &mut h,
        be(CgroupKnob::CpusetCpus),
        KnobValue::Cpus((8..16).collect()),
    );
    let full = state(&mut h, 0.3);
    set(
        &mut h,
        be(CgroupKnob::CpuQuota),
        KnobValue::Quota(CpuQuota {
            quota_us: Some(200_000),
            period_us: 100_000,
        }),
    );
    let quota = state(&mut h, 0.3);
    assert!((quota.be_busy - 2.0).abs() < 0.2, "{quota:?}");
    assert!(quota.be_norm < full.be_norm / 3.0);
    set(
        &mut h,
        be(CgroupKnob::CpuQuota),
        KnobValue::Quota(CpuQuota {
            quota_us: None,
            period_us: 100_000,
        }),
    );
    for cpu in 8..16 {
        set(&mut h, Knob::MaxFreq { cpu }, KnobValue::Khz(1_200_000));
    }
    let slow = state(&mut h, 0.3);
    assert!((slow.be_norm / full.be_norm - 0.5).abs() < 0.05, "{slow:?}");
    assert!(slow.power_w < full.power_w);
}

#[test]
fn dram_be_hurts_the_lc_more_than_spin() {
    let mut spin = host("spin");
    let mut dram = host("dram");
    for h in [&mut spin, &mut dram] {
        set(
            h,
            be(CgroupKnob::CpusetCpus),
            KnobValue::Cpus((6..16).collect()),
        );
    }
    let (a, b) = (state(&mut spin, 0.3), state(&mut dram, 0.3));
    assert!(
        b.stretch > a.stretch,
        "spin {} dram {}",
        a.stretch,
        b.stretch
    );
    assert!(b.dram_bytes_per_s > a.dram_bytes_per_s);
}

#[test]
fn smt_siblings_running_be_slow_the_lc() {
    let mut m = ServerModel::default();
    m.server.smt = true;
    let spin = m.be_kind("spin").unwrap().clone();
    let mut h = SimHost::new(&m, CORES, &spin, 5.0);
    // BE on CPUs 8-15: the siblings of the LC's CPUs 0-7
    set(
        &mut h,
        be(CgroupKnob::CpusetCpus),
        KnobValue::Cpus((8..16).collect()),
    );
    let pairs = state(&mut h, 0.3);
    let mut plain = host("spin");
    set(
        &mut plain,
        be(CgroupKnob::CpusetCpus),
        KnobValue::Cpus((8..16).collect()),
    );
    let no_smt = state(&mut plain, 0.3);
    // the SMT penalty (0.3) times a small change in LLC pressure: BE's pressure follows the
    // CPUs it actually keeps busy, which the slower LC's spill onto BE's CPUs changes a little
    assert!(
        (pairs.stretch / no_smt.stretch - 1.3).abs() < 0.01,
        "{} vs {}",
        pairs.stretch,
        no_smt.stretch
    );
}

/// The LC's CPU is charged apart from its service time where the model says so (`lc.cpu_us`,
/// its wake-up and its switch with BE): on one CPU BE shares as `cpu.idle`, BE gets what the LC
/// is not charged, `1 − λ(c + x)/(1 + λx)`; with the two unset, the service time is the charge.
#[test]
fn the_lc_is_charged_its_cpu_time_and_its_switches_with_be() {
    let mut m = ServerModel::default();
    m.lc.service_us = 7.0;
    m.lc.service_cv = 1.0;
    let one_cpu = |m: &ServerModel| {
        let mut h = SimHost::new(m, 1, m.be_kind("spin").unwrap(), 5.0);
        set(&mut h, be(CgroupKnob::CpuIdle), KnobValue::Idle(true));
        let peak = 50_000.0;
        h.set_inputs(20_000.0, None, peak);
        h.sense(Duration::ZERO);
        *h.last_state().unwrap()
    };
    let plain = one_cpu(&m);
    // the service time alone: 20k/s × 7 µs = 0.14 CPU (stretched by BE's little LLC pressure)
    assert!(plain.stretch < 1.05, "{}", plain.stretch);
    let alone = 0.14 * plain.stretch;
    assert!(
        (plain.lc_busy - alone).abs() < 1e-6,
        "{} vs {alone}",
        plain.lc_busy
    );
    m.lc.cpu_us = 3.0;
    m.lc.wake_cpu_us = 10.0;
    m.sched.switch_cpu_us = 20.0;
    let charged = one_cpu(&m);
    let lc = 0.02 * (3.0 * charged.stretch + 20.0) / (1.0 + 0.02 * 20.0);
    assert!(
        (charged.lc_busy - lc).abs() < 1e-6,
        "{} vs {lc}",
        charged.lc_busy
    );
    assert!(
        (charged.be_busy - (1.0 - lc)).abs() < 1e-6,
        "BE {} vs {}",
        charged.be_busy,
        1.0 - lc
    );
    // the queue still sees the service time: the tail is the plain model's but for the
    // stretch of BE's (now smaller) LLC pressure
    let tail_ratio = p99(&charged) / p99(&plain);
    assert!((0.98..=1.0).contains(&tail_ratio), "{tail_ratio}");
}
