//! The BE groups' process limit (`pids.max`, issue 42, hostile pass 24's medium), on an
//! in-memory node: the target holds it for each BE group and never for the LC's or a
//! kubelet-owned group's; it is written with the confining writes, before any widening; and
//! `restore` puts the original back.

use headroom_types::allocation::Allocation;
use headroom_types::{CpuSet, GroupPath};

use super::mem_node::MemNode;
use super::{Actuation, CgroupKnob, Knob, KnobValue, ManagedGroups};

fn g(p: &str) -> GroupPath {
    GroupPath::new(p).unwrap()
}

/// A node whose groups each have a cpuset (`cpus`), a freezer and `pids.max` = `max`.
fn node(groups: &[(&GroupPath, &[u32])]) -> MemNode {
    let mut n = MemNode::default();
    for (group, cpus) in groups {
        for (k, v) in [
            (CgroupKnob::CpusetCpus, KnobValue::Cpus(CpuSet::from(*cpus))),
            (CgroupKnob::Frozen, KnobValue::Frozen(false)),
            (CgroupKnob::PidsMax, KnobValue::PidsMax(None)),
        ] {
            n.values.insert(Knob::cgroup(group, k), v);
        }
    }
    n
}

fn pids(group: &GroupPath) -> Knob {
    Knob::cgroup(group, CgroupKnob::PidsMax)
}

#[test]
fn the_target_bounds_each_be_groups_processes_and_never_the_lcs() {
    let (lc, be1, be2) = (g("bp/lc"), g("bp/be1"), g("bp/be2"));
    let mut node = node(&[(&lc, &[0]), (&be1, &[1]), (&be2, &[1])]);
    let groups = ManagedGroups {
        lc: lc.clone(),
        be: vec![be1.clone(), be2.clone()],
    };
    let mut act = Actuation::attach(&mut node, groups).unwrap();
    // BE widened (CPU 1 → 1-3) and bounded in one plan.
    let a = Allocation {
        be_cpus: Some(CpuSet::from([1, 2, 3])),
        be_pids_max: Some(64),
        ..Allocation::default()
    };
    let target = act.target(&node, &a, &[1, 2, 3]).unwrap();
    for be in [&be1, &be2] {
        assert_eq!(
            target.get(&pids(be)),
            Some(&KnobValue::PidsMax(Some(64))),
            "{be}"
        );
    }
    assert!(
        !target.contains_key(&pids(&lc)),
        "the LC's pids.max is never the agent's: {target:?}"
    );
    act.apply(&mut node, &a, &[1, 2, 3], true).unwrap();
    let order: Vec<&Knob> = node.writes.iter().map(|(k, _)| k).collect();
    let at = |k: &Knob| order.iter().position(|w| *w == k).expect("written");
    for be in [&be1, &be2] {
        assert!(
            at(&pids(be)) < at(&Knob::cgroup(be, CgroupKnob::CpusetCpus)),
            "the limit (a shrink) goes before BE gains CPUs: {order:?}"
        );
        assert_eq!(node.values[&pids(be)], KnobValue::PidsMax(Some(64)));
    }
    assert!(!order.contains(&&pids(&lc)), "{order:?}");
    assert_eq!(node.values[&pids(&lc)], KnobValue::PidsMax(None));
    act.restore_original(&mut node).unwrap();
    for be in [&be1, &be2] {
        assert_eq!(node.values[&pids(be)], KnobValue::PidsMax(None), "restored");
    }
}

#[test]
fn a_kubelet_groups_pids_max_is_left_as_kubelet_wrote_it() {
    let (lc, be) = (g("bp/lc"), g("kubepods/besteffort"));
    let mut node = node(&[(&lc, &[0]), (&be, &[1])]);
    node.values
        .insert(pids(&be), KnobValue::PidsMax(Some(4096)));
    let groups = ManagedGroups {
        lc: lc.clone(),
        be: vec![be.clone()],
    };
    let mut act = Actuation::attach(&mut node, groups).unwrap();
    let a = Allocation {
        be_pids_max: Some(64),
        ..Allocation::default()
    };
    act.apply(&mut node, &a, &[1], true).unwrap();
    assert!(
        !node.writes.iter().any(|(k, _)| *k == pids(&be)),
        "{:?}",
        node.writes
    );
    assert_eq!(node.values[&pids(&be)], KnobValue::PidsMax(Some(4096)));
}

/// Hostile pass 26's low: the default `be_pids_max` (no value in the config) replaced a lower
/// `pids.max` an operator had set on an existing BE group (100 became 8192 for the run). The
/// default is now never above a group's original; a value given in the config is written as
/// given, above the original too.
#[test]
fn the_default_keeps_a_lower_limit_an_operator_set_and_a_given_value_is_taken() {
    let (lc, low, open) = (g("bp/lc"), g("bp/low"), g("bp/open"));
    let mut node = node(&[(&lc, &[0]), (&low, &[1]), (&open, &[1])]);
    node.values
        .insert(pids(&low), KnobValue::PidsMax(Some(100)));
    let groups = ManagedGroups {
        lc: lc.clone(),
        be: vec![low.clone(), open.clone()],
    };
    let act = Actuation::attach(&mut node, groups).unwrap();
    let default = Allocation {
        be_pids_max: Some(8192),
        be_pids_max_default: true,
        ..Allocation::default()
    };
    let target = act.target(&node, &default, &[1]).unwrap();
    assert_eq!(
        target.get(&pids(&low)),
        Some(&KnobValue::PidsMax(Some(100))),
        "the operator's 100 under the default 8192"
    );
    assert_eq!(
        target.get(&pids(&open)),
        Some(&KnobValue::PidsMax(Some(8192))),
        "a group with no limit gets the default"
    );
    let given = Allocation {
        be_pids_max_default: false,
        ..default
    };
    let target = act.target(&node, &given, &[1]).unwrap();
    assert_eq!(
        target.get(&pids(&low)),
        Some(&KnobValue::PidsMax(Some(8192))),
        "a value given in the config is written as given"
    );
}

/// What the start says (hostile pass 26's lows): a group keeping its own lower limit under
/// the default, and a BE group under kubelet's pods root whose `pids.max` is `max` (BE pods
/// bounded by nothing unless kubelet's `podPidsLimit` is set) — a WARNING there. Nothing for
/// a group the limit bounds, a kubelet group with a limit, or a value given in the config.
#[test]
fn the_start_names_a_group_keeping_a_lower_limit_and_an_unbounded_kubelet_group() {
    use super::target::{pids_note, PidsNote};
    let (be, kube) = (g("bp/be"), g("kubepods/besteffort"));
    assert_eq!(
        pids_note(&be, Some(Some(100)), Some(8192), true),
        Some(PidsNote::KeepsLower {
            group: be.clone(),
            original: 100,
            default: 8192
        })
    );
    let said = pids_note(&kube, Some(None), Some(8192), true).expect("said");
    assert_eq!(
        said,
        PidsNote::KubeletUnbounded {
            group: kube.clone()
        }
    );
    assert!(said.to_string().contains("podPidsLimit"), "{said}");
    assert_eq!(pids_note(&kube, Some(None), Some(64), false), Some(said));
    for (group, original, limit, default) in [
        (&be, Some(None), Some(8192), true),
        (&be, Some(Some(100)), Some(64), false),
        (&be, Some(Some(100)), None, false),
        (&be, None, Some(8192), true),
        (&kube, Some(Some(4096)), Some(8192), true),
        (&kube, None, Some(8192), true),
    ] {
        assert_eq!(
            pids_note(group, original, limit, default),
            None,
            "{group} {original:?} {limit:?} {default}"
        );
    }
}
