//! Two defects of the fifth hostile pass, on an in-memory node: a BE group someone left frozen
//! stayed frozen while BE was "enabled" (the freeze knob's target was the original), and the
//! groups an earlier agent managed that this config dropped kept what that agent left (frozen,
//! narrowed) for good.

use std::collections::BTreeMap;

use headroom_types::allocation::Allocation;
use headroom_types::{CpuSet, GroupPath};

use super::mem_node::MemNode;
use super::{Actuation, CgroupKnob, EarlierRole, Knob, KnobValue, ManagedGroups};

impl MemNode {
    fn with(&mut self, g: &GroupPath, frozen: bool, cpus: &[u32], weight: u64) {
        for (k, v) in [
            (CgroupKnob::CpusetCpus, KnobValue::Cpus(CpuSet::from(cpus))),
            (CgroupKnob::CpuWeight, KnobValue::Weight(weight)),
            (CgroupKnob::Frozen, KnobValue::Frozen(frozen)),
        ] {
            self.values.insert(Knob::cgroup(g, k), v);
        }
    }

    fn get(&self, g: &GroupPath, k: CgroupKnob) -> KnobValue {
        self.values[&Knob::cgroup(g, k)].clone()
    }
}

fn g(p: &str) -> GroupPath {
    GroupPath::new(p).unwrap()
}

fn enabled() -> Allocation {
    Allocation {
        be_enabled: true,
        be_cpus: Some(CpuSet::from([1])),
        ..Allocation::default()
    }
}

/// A first start on a BE group someone left frozen: its original is FROZEN. Enabled is
/// thawed (BE runs while `ctl status` says enabled); restore puts the original back.
#[test]
fn an_enabled_be_runs_in_a_group_left_frozen_and_restore_puts_it_back() {
    let (lc, be) = (g("hp6/lc"), g("hp6/be"));
    let mut node = MemNode::default();
    node.with(&lc, false, &[0, 1], 1024);
    node.with(&be, true, &[0, 1], 1024);
    let groups = ManagedGroups {
        lc,
        be: vec![be.clone()],
    };
    let mut act = Actuation::attach(&mut node, groups).unwrap();
    act.apply(&mut node, &enabled(), &[1], true).unwrap();
    assert_eq!(
        node.get(&be, CgroupKnob::Frozen),
        KnobValue::Frozen(false),
        "enabled is thawed"
    );
    act.apply(&mut node, &enabled().disabled(), &[1], true)
        .unwrap();
    assert_eq!(node.get(&be, CgroupKnob::Frozen), KnobValue::Frozen(true));
    act.apply(&mut node, &enabled(), &[1], false).unwrap();
    assert_eq!(node.get(&be, CgroupKnob::Frozen), KnobValue::Frozen(false));
    act.restore_original(&mut node).unwrap();
    assert_eq!(
        node.get(&be, CgroupKnob::Frozen),
        KnobValue::Frozen(true),
        "restore: the group's original"
    );
}

/// The config's groups changed between two runs: the earlier agent's state file holds the
/// originals of a BE group (`old`, left frozen on CPU 1) and an LC group (`oldlc`, weight
/// raised) this config dropped. Released: every BE knob back, the LC's weight back (its other
/// knobs never were the agent's), and both forgotten; this agent's groups untouched.
#[test]
fn groups_an_earlier_agent_managed_are_put_back_and_forgotten() {
    let (lc, be, old, oldlc) = (g("hp6/lc"), g("hp6/be"), g("hp6/old"), g("hp6/oldlc"));
    let mut node = MemNode::default();
    node.with(&lc, false, &[0, 1], 1024);
    node.with(&be, false, &[0, 1], 1024);
    // what the earlier agent left
    node.with(&old, true, &[1], 2);
    node.with(&oldlc, false, &[0], 10000);
    // its record: the originals before its first write
    let mut recorded = BTreeMap::new();
    for (grp, cpus) in [(&old, vec![0, 1]), (&oldlc, vec![0, 1])] {
        recorded.insert(
            Knob::cgroup(grp, CgroupKnob::CpusetCpus),
            KnobValue::Cpus(CpuSet::from(&cpus[..])),
        );
        recorded.insert(
            Knob::cgroup(grp, CgroupKnob::CpuWeight),
            KnobValue::Weight(1024),
        );
        recorded.insert(
            Knob::cgroup(grp, CgroupKnob::Frozen),
            KnobValue::Frozen(false),
        );
    }
    let groups = ManagedGroups {
        lc: lc.clone(),
        be: vec![be.clone()],
    };
    let mut act = Actuation::resume(&mut node, groups, recorded).unwrap();
    assert_eq!(act.foreign_groups(), vec![old.clone(), oldlc.clone()]);
    act.apply(&mut node, &enabled().disabled(), &[1], true)
        .unwrap();
    node.refuse = vec![Knob::cgroup(&old, CgroupKnob::CpuWeight)];
    let r = act.release(
        &mut node,
        &[
            (old.clone(), EarlierRole::Be),
            (oldlc.clone(), EarlierRole::Lc),
        ],
    );
    assert!(r.is_err(), "the refused weight is named");
    assert_eq!(node.get(&old, CgroupKnob::Frozen), KnobValue::Frozen(false));
    assert_eq!(
        node.get(&old, CgroupKnob::CpusetCpus),
        KnobValue::Cpus(CpuSet::from([0, 1]))
    );
    assert_eq!(
        node.get(&oldlc, CgroupKnob::CpuWeight),
        KnobValue::Weight(1024)
    );
    assert_eq!(
        node.get(&oldlc, CgroupKnob::CpusetCpus),
        KnobValue::Cpus(CpuSet::from([0])),
        "an LC group's cpuset was never the agent's"
    );
    // the refused knob is kept (the state file keeps its original), the rest forgotten
    assert_eq!(act.foreign_groups(), vec![old.clone()]);
    node.refuse.clear();
    act.release(&mut node, &[(old.clone(), EarlierRole::Be)])
        .unwrap();
    assert_eq!(
        node.get(&old, CgroupKnob::CpuWeight),
        KnobValue::Weight(1024)
    );
    assert!(act.foreign_groups().is_empty());
    // this agent's BE is still frozen (never released, even when named)
    act.release(&mut node, &[(be.clone(), EarlierRole::Be)])
        .unwrap();
    assert_eq!(node.get(&be, CgroupKnob::Frozen), KnobValue::Frozen(true));
    // this agent's LC group was the earlier agent's BE group (the two swapped), left frozen:
    // every original back, and kept (they are the LC group's)
    node.values.insert(
        Knob::cgroup(&lc, CgroupKnob::Frozen),
        KnobValue::Frozen(true),
    );
    act.release(&mut node, &[(lc.clone(), EarlierRole::Be)])
        .unwrap();
    assert_eq!(node.get(&lc, CgroupKnob::Frozen), KnobValue::Frozen(false));
    assert!(act
        .original()
        .contains_key(&Knob::cgroup(&lc, CgroupKnob::Frozen)));
}
