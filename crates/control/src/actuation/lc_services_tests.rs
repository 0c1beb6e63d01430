//! Several LC services' cpusets (`Allocation::lc_services`) through the one write path, on an
//! in-memory node: written in the plan's order (what one group loses before another gains),
//! refused for a group the agent does not manage, given back when no longer named, restored.

use headroom_types::allocation::LcServiceCpus;
use headroom_types::GroupPath;

use super::mem_node::MemNode;
use super::{Actuation, ActuationError, CgroupKnob, Knob, KnobValue, ManagedGroups};
use headroom_types::allocation::Allocation;
use headroom_types::CpuSet;

impl MemNode {
    /// The named groups' cpuset, weight and freeze, in memory.
    fn service_groups(groups: &[&GroupPath]) -> MemNode {
        let mut n = MemNode::default();
        for g in groups {
            let cpus = KnobValue::Cpus(CpuSet::from([0, 1, 2, 3]));
            n.values
                .insert(Knob::cgroup(g, CgroupKnob::CpusetCpus), cpus);
            n.values.insert(
                Knob::cgroup(g, CgroupKnob::CpuWeight),
                KnobValue::Weight(1024),
            );
            n.values.insert(
                Knob::cgroup(g, CgroupKnob::Frozen),
                KnobValue::Frozen(false),
            );
        }
        n
    }

    fn cpus(&self, g: &GroupPath) -> String {
        self.values[&Knob::cgroup(g, CgroupKnob::CpusetCpus)].to_string()
    }

    /// The cpuset writes since the last call: (group, value).
    fn cpuset_writes(&mut self) -> Vec<(String, String)> {
        self.writes
            .drain(..)
            .filter_map(|(k, v)| match k {
                Knob::Cgroup {
                    group,
                    knob: CgroupKnob::CpusetCpus,
                } => Some((group.to_string(), v.to_string())),
                _ => None,
            })
            .collect()
    }
}

fn g(p: &str) -> GroupPath {
    GroupPath::new(p).unwrap()
}

fn services(a: &[u32], b: &[u32]) -> Vec<LcServiceCpus> {
    vec![
        LcServiceCpus {
            name: "a".into(),
            cgroup: g("hr/a"),
            cpus: CpuSet::from(a),
        },
        LcServiceCpus {
            name: "b".into(),
            cgroup: g("hr/b"),
            cpus: CpuSet::from(b),
        },
    ]
}

fn setup() -> (MemNode, Actuation) {
    let (a, b, be) = (g("hr/a"), g("hr/b"), g("hr/be"));
    let mut node = MemNode::service_groups(&[&a, &b, &be]);
    let groups = ManagedGroups {
        lc: a,
        be: vec![be],
    };
    let act = Actuation::attach(&mut node, groups)
        .unwrap()
        .with_lc_services(&mut node, &[b])
        .unwrap();
    (node, act)
}

#[test]
fn each_service_gets_its_cpus_and_a_cpu_leaves_one_before_another_gets_it() {
    let (mut node, mut act) = setup();
    assert_eq!(act.lc_groups(), [g("hr/a"), g("hr/b")]);
    let mut alloc = Allocation {
        be_enabled: true,
        be_cpus: Some(CpuSet::from([3])),
        lc_services: services(&[0, 1], &[2]),
        ..Allocation::default()
    };
    act.apply(&mut node, &alloc, &[3], false).unwrap();
    assert_eq!(node.cpus(&g("hr/a")), "cpus 0-1");
    assert_eq!(node.cpus(&g("hr/b")), "cpus 2");
    assert_eq!(node.cpus(&g("hr/be")), "cpus 3");
    // narrowing all three: every write is a shrink; LC side before BE within the phase
    let w = node.cpuset_writes();
    assert_eq!(w.len(), 3, "{w:?}");
    assert_eq!(w[2].0, "hr/be", "{w:?}");

    // CPU 1 moves from a to b, CPU 3 from BE to b: both losers first, the gainer last.
    alloc.lc_services = services(&[0], &[1, 2, 3]);
    alloc.be_cpus = Some(CpuSet::from([0]));
    act.apply(&mut node, &alloc, &[0], false).unwrap();
    let w = node.cpuset_writes();
    let at = |grp: &str| w.iter().position(|(x, _)| x == grp).unwrap();
    assert!(
        at("hr/a") < at("hr/b"),
        "a loses CPU 1 before b gets it: {w:?}"
    );
    assert!(
        at("hr/be") < at("hr/b"),
        "BE loses CPU 3 before b gets it: {w:?}"
    );
    assert_eq!(node.cpus(&g("hr/b")), "cpus 1-3");

    // no longer named: the services' cpusets go back to their originals
    alloc.lc_services.clear();
    act.apply(&mut node, &alloc, &[], false).unwrap();
    assert_eq!(node.cpus(&g("hr/a")), "cpus 0-3");
    assert_eq!(node.cpus(&g("hr/b")), "cpus 0-3");
}

#[test]
fn restore_puts_every_service_cpuset_back_and_untouched_ones_are_never_written() {
    let (mut node, mut act) = setup();
    // Without lc_services no LC cpuset is written, and none is restored.
    act.apply(&mut node, &Allocation::default(), &[0, 1, 2, 3], false)
        .unwrap();
    assert!(node.cpuset_writes().iter().all(|(grp, _)| grp == "hr/be"));
    act.restore_original(&mut node).unwrap();
    assert!(node.cpuset_writes().iter().all(|(grp, _)| grp == "hr/be"));

    let alloc = Allocation {
        lc_services: services(&[0], &[1]),
        ..Allocation::default()
    };
    act.apply(&mut node, &alloc, &[2, 3], false).unwrap();
    assert_eq!(node.cpus(&g("hr/b")), "cpus 1");
    act.restore_original(&mut node).unwrap();
    assert_eq!(node.cpus(&g("hr/a")), "cpus 0-3");
    assert_eq!(node.cpus(&g("hr/b")), "cpus 0-3");
}

#[test]
fn a_group_the_agent_does_not_manage_as_an_lc_is_refused_and_nothing_written() {
    let (mut node, mut act) = setup();
    node.writes.clear();
    for (grp, cpus) in [("hr/be", vec![0]), ("elsewhere", vec![0]), ("hr/a", vec![])] {
        let alloc = Allocation {
            lc_services: vec![LcServiceCpus {
                name: "x".into(),
                cgroup: g(grp),
                cpus: CpuSet::from(cpus.as_slice()),
            }],
            ..Allocation::default()
        };
        let e = act.apply(&mut node, &alloc, &[], false).unwrap_err();
        assert!(matches!(e, ActuationError::Target(_)), "{e}");
        assert!(e.to_string().contains("lc_services[\"x\"]"), "{e}");
        assert!(node.writes.is_empty(), "{grp}: {:?}", node.writes);
    }
}
