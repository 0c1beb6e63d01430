//! One observation sequence through the agent's `Controller::step` on the fake Linux host (the
//! agent tests' temp-dir cgroup v1 tree) and on `SimHost`: the same decisions, the same writes in
//! the same order, and the same knob values read back.

use crate::support;

use std::time::Duration;

use headroom_agent::linux_node::LinuxNode;
use headroom_control::actuation::{Actuation, CgroupKnob, Knob, KnobValue, ManagedGroups};
use headroom_control::config::Config;
use headroom_control::controller::{Controller, Discard, TickOutcome};
use headroom_control::node::{Node, NodeError, NodeFacts};
use headroom_control::policy::{self, MachineInfo};
use headroom_sim::host::SimHost;
use headroom_sim::model::{BeKind, ServerModel};
use headroom_sim::node::{sim_groups, BE_GROUP, LC_GROUP};
use headroom_types::observation::Observation;
use headroom_types::GroupPath;
use support::Fake;

/// A node whose sensors read a script: the same observations for both hosts.
struct Scripted<N: Node> {
    inner: N,
    obs: Observation,
    facts: NodeFacts,
}

impl<N: Node> Node for Scripted<N> {
    fn facts(&self) -> &NodeFacts {
        &self.facts
    }
    fn sense(&mut self, _t: Duration) -> &Observation {
        &self.obs
    }
    fn read(&mut self, knob: &Knob) -> Result<KnobValue, NodeError> {
        self.inner.read(knob)
    }
    fn write(&mut self, knob: &Knob, from: &KnobValue, to: &KnobValue) -> Result<(), NodeError> {
        self.inner.write(knob, from, to)
    }
}

const CONFIG: &str = r#"
[lc]
name = "lc"
cgroup = "headroom/lc"
[lc.slo]
target_us = 500
window_s = 1
[lc.latency]
source = "feed"
[lc.load]
source = "feed"
peak_qps = 100000
[policy]
kind = "KIND"
[policy.blind]
poll_ms = 10
[safety]
violation_cooldown_s = 5
"#;

/// Load, idle CPUs and tail latency per 50 ms step: low load, a burst, a violation, recovery.
fn script(i: u64) -> Observation {
    let t = i as f64 * 0.05;
    let (load, idle, lat) = match t {
        t if t < 3.0 => (0.3, 2.6, 150.0),
        t if t < 4.0 => (0.6, 1.2, 300.0),
        t if t < 5.0 => (0.7, 0.4, 650.0),
        t if t < 12.0 => (0.5, 1.8, 200.0),
        _ => (0.2, 3.1, 120.0),
    };
    Observation {
        lc_latency_us: Some(lat),
        lc_latency_age_ms: Some(0),
        lc_load: Some(load),
        lc_qps: Some(load * 100_000.0),
        lc_load_age_ms: Some(0),
        idle_cpus: Some(idle),
        ..Observation::default()
    }
}

fn controller(kind: &str, node: &mut dyn Node) -> Controller {
    let config = Config::from_toml_str(&CONFIG.replace("KIND", kind)).unwrap();
    let machine = MachineInfo::with_cpus(4);
    let act = Actuation::attach(node, sim_groups()).unwrap();
    Controller::new(policy::build(&config, &machine), Some(act), machine.cpus, 5)
}

fn writes(o: &TickOutcome) -> Vec<(Knob, KnobValue)> {
    match &o.actuation {
        Some(Ok(r)) => r
            .writes
            .iter()
            .map(|w| (w.knob.clone(), w.to.clone()))
            .collect(),
        Some(Err(e)) => panic!("write path failed: {e}"),
        None => Vec::new(),
    }
}

#[test]
fn same_decisions_and_writes_on_linux_and_simhost() {
    for kind in [
        "hybrid",
        "blind",
        "static-cores",
        "static-cycles",
        "weights",
    ] {
        let fake = Fake::v1();
        let host = fake.host();
        let cgroups = host.cgroups().unwrap();
        let groups = ManagedGroups {
            lc: GroupPath::new(LC_GROUP).unwrap(),
            be: vec![GroupPath::new(BE_GROUP).unwrap()],
        };
        cgroups.create(&groups.lc).unwrap();
        cgroups.create(&groups.be[0]).unwrap();
        // the model starts where a fresh BE group on this machine starts: every CPU, unfrozen
        fake.set_knob("cpuset", BE_GROUP, "cpuset.cpus", "0-3\n");
        let linux = LinuxNode::probe(&host, cgroups, &[]);
        let mut linux = Scripted {
            facts: linux.facts().clone(),
            inner: linux,
            obs: Observation::default(),
        };
        let sim = SimHost::new(&ServerModel::default(), 4, &BeKind::default(), 5.0);
        // the fake Linux host has no cpufreq: neither drives frequency here
        let mut sim = Scripted {
            facts: NodeFacts::default(),
            inner: sim,
            obs: Observation::default(),
        };
        let mut on_linux = controller(kind, &mut linux);
        let mut on_sim = controller(kind, &mut sim);
        let mut changes = 0;
        for i in 0..400u64 {
            let t = Duration::from_millis(50 * i);
            linux.obs = script(i);
            sim.obs = script(i);
            let a = on_linux.step(&mut linux, t, &mut Discard);
            let b = on_sim.step(&mut sim, t, &mut Discard);
            assert_eq!(
                a.decision.allocation, b.decision.allocation,
                "{kind} at {t:?}"
            );
            assert_eq!(a.decision.reason, b.decision.reason, "{kind} at {t:?}");
            let (wa, wb) = (writes(&a), writes(&b));
            assert_eq!(wa, wb, "{kind}: writes at {t:?}");
            changes += usize::from(!wa.is_empty());
            for &k in &[
                CgroupKnob::CpusetCpus,
                CgroupKnob::CpuIdle,
                CgroupKnob::CpuQuota,
                CgroupKnob::Frozen,
            ] {
                let knob = Knob::cgroup(&groups.be[0], k);
                assert_eq!(
                    linux.read(&knob).unwrap(),
                    sim.read(&knob).unwrap(),
                    "{kind}: {knob} at {t:?}"
                );
            }
        }
        eprintln!("{kind}: 400 ticks, {changes} with writes, identical on both nodes");
        assert!(
            changes >= 1,
            "{kind}: the script never changed the allocation"
        );
    }
}
