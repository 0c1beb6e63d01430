//! Coexisting with kubelet (issue 40 item 5), on an in-memory node: the weight of a group under
//! kubelet's pods root is kubelet's — never written, never repaired after kubelet rewrites it,
//! never restored — and `cpu.idle` is never set there (kubelet fails to restart when it cannot
//! write the BestEffort parent's weight); the cpuset and freeze still confine BE. A group outside
//! kubelet's tree gets both, as before.

use std::collections::BTreeMap;

use headroom_types::GroupPath;

use super::mem_node::MemNode;
use super::target::kubelet_owns_weight;
use super::{Actuation, CgroupKnob, Knob, KnobValue, ManagedGroups};
use headroom_types::allocation::{Allocation, CpuWeight, LcTreatment};
use headroom_types::CpuSet;

impl MemNode {
    fn kubelet_groups(groups: &[&GroupPath]) -> MemNode {
        let mut n = MemNode::default();
        for g in groups {
            for (k, v) in [
                (
                    CgroupKnob::CpusetCpus,
                    KnobValue::Cpus(CpuSet::from([0, 1, 2, 3])),
                ),
                (CgroupKnob::CpuWeight, KnobValue::Weight(2)),
                (CgroupKnob::CpuIdle, KnobValue::Idle(false)),
                (CgroupKnob::Frozen, KnobValue::Frozen(false)),
            ] {
                n.values.insert(Knob::cgroup(g, k), v);
            }
        }
        n
    }

    /// The (group, knob) of every write since the last call.
    fn take(&mut self) -> Vec<(String, CgroupKnob)> {
        self.writes
            .drain(..)
            .filter_map(|(k, _)| match k {
                Knob::Cgroup { group, knob } => Some((group.to_string(), knob)),
                _ => None,
            })
            .collect()
    }
}

fn g(p: &str) -> GroupPath {
    GroupPath::new(p).unwrap()
}

/// Everything a weight-and-idle policy asks: BE on CPU 3, idle, a low weight; the LC's weight
/// raised.
fn squeeze() -> Allocation {
    Allocation {
        be_enabled: true,
        be_cpus: Some(CpuSet::from([3])),
        be_cpu_idle: Some(true),
        be_cpu_weight: Some(CpuWeight {
            shares: 2,
            weight: 1,
        }),
        lc: LcTreatment {
            cpu_weight: Some(CpuWeight {
                shares: 4096,
                weight: 400,
            }),
            ..LcTreatment::default()
        },
        ..Allocation::default()
    }
}

fn weight_or_idle(w: &[(String, CgroupKnob)]) -> Vec<&(String, CgroupKnob)> {
    w.iter()
        .filter(|(_, k)| matches!(k, CgroupKnob::CpuWeight | CgroupKnob::CpuIdle))
        .collect()
}

#[test]
fn kubelets_tree_is_every_group_under_its_pods_root_in_both_drivers() {
    for p in [
        "kubepods",
        "kubepods/besteffort",
        "kubepods/burstable/pod1234",
        "kubepods.slice/kubepods-besteffort.slice",
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice",
        "kubelet.slice/kubepods.slice",
    ] {
        assert!(kubelet_owns_weight(&g(p)), "{p}");
    }
    for p in ["hr/be", "system.slice/batch.service", "kubepods-like/be"] {
        assert!(!kubelet_owns_weight(&g(p)), "{p}");
    }
}

#[test]
fn kubelets_weight_is_never_written_repaired_or_restored_and_idle_never_set() {
    for (be, lc) in [
        ("kubepods/besteffort", "kubepods/burstable/podl"),
        (
            "kubepods.slice/kubepods-besteffort.slice",
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podl.slice",
        ),
    ] {
        let (be, lc) = (g(be), g(lc));
        let mut node = MemNode::kubelet_groups(&[&be, &lc]);
        let groups = ManagedGroups {
            lc: lc.clone(),
            be: vec![be.clone()],
        };
        let mut act = Actuation::attach(&mut node, groups).unwrap();
        act.apply(&mut node, &squeeze(), &[3], true).unwrap();
        let w = node.take();
        assert!(weight_or_idle(&w).is_empty(), "{be}: {w:?}");
        assert!(
            w.contains(&(be.to_string(), CgroupKnob::CpusetCpus)),
            "BE still confined by its cpuset: {w:?}"
        );
        assert_eq!(
            node.values[&Knob::cgroup(&be, CgroupKnob::CpuIdle)],
            KnobValue::Idle(false)
        );
        // kubelet rewrites the QoS parent's weight (as at its restart): it succeeds, and the
        // agent's verifying pass leaves it.
        node.values.insert(
            Knob::cgroup(&be, CgroupKnob::CpuWeight),
            KnobValue::Weight(1024),
        );
        let mut off = squeeze();
        off.be_enabled = false;
        for a in [squeeze(), off, squeeze()] {
            act.apply(&mut node, &a, &[3], true).unwrap();
        }
        let w = node.take();
        assert!(weight_or_idle(&w).is_empty(), "{be}: {w:?}");
        assert!(
            w.contains(&(be.to_string(), CgroupKnob::Frozen)),
            "BE still frozen when disabled: {w:?}"
        );
        assert_eq!(
            node.values[&Knob::cgroup(&be, CgroupKnob::CpuWeight)],
            KnobValue::Weight(1024),
            "kubelet's write stands"
        );
        act.restore_original(&mut node).unwrap();
        let w = node.take();
        assert!(weight_or_idle(&w).is_empty(), "restore: {w:?}");
    }
}

#[test]
fn outside_kubelets_tree_weight_and_idle_are_the_agents() {
    let (be, lc) = (g("hr/be"), g("hr/lc"));
    let mut node = MemNode::kubelet_groups(&[&be, &lc]);
    let groups = ManagedGroups {
        lc: lc.clone(),
        be: vec![be.clone()],
    };
    let mut act = Actuation::attach(&mut node, groups).unwrap();
    act.apply(&mut node, &squeeze(), &[3], true).unwrap();
    let w = node.take();
    assert!(w.contains(&(be.to_string(), CgroupKnob::CpuIdle)), "{w:?}");
    assert!(
        w.contains(&(lc.to_string(), CgroupKnob::CpuWeight)),
        "{w:?}"
    );
}

#[test]
fn an_older_agents_idle_on_kubelets_parent_is_put_back_and_never_set_again() {
    let (be, lc) = (g("kubepods/besteffort"), g("kubepods/burstable/podl"));
    let mut node = MemNode::kubelet_groups(&[&be, &lc]);
    // An older agent set cpu.idle on the parent and recorded its original in its state file.
    let idle = Knob::cgroup(&be, CgroupKnob::CpuIdle);
    node.values.insert(idle.clone(), KnobValue::Idle(true));
    let original = BTreeMap::from([(idle.clone(), KnobValue::Idle(false))]);
    let groups = ManagedGroups {
        lc,
        be: vec![be.clone()],
    };
    let mut act = Actuation::resume(&mut node, groups, original).unwrap();
    act.apply(&mut node, &squeeze(), &[3], true).unwrap();
    assert_eq!(node.values[&idle], KnobValue::Idle(false));
    let w = node.take();
    assert_eq!(
        weight_or_idle(&w),
        [&(be.to_string(), CgroupKnob::CpuIdle)],
        "only the put-back: {w:?}"
    );
    act.apply(&mut node, &squeeze(), &[3], true).unwrap();
    assert!(weight_or_idle(&node.take()).is_empty());
}
