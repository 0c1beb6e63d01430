//! The node's pods as the watch last told them, and the LC set they make (pure: the layout and
//! whether a group exists are passed in, the time too).

use std::collections::BTreeMap;

use headroom_types::discovery::{lc_changes, LcSet, LcSetEvent, PodRefusal, NO_LATENCY_PORT};
use headroom_types::GroupPath;

use crate::layout::KubeletLayout;
use crate::pod::{verdict, PodFacts, Verdict, LATENCY_PORT};

/// What the watch says about the node's pods (kube-runtime's watcher events, reduced).
#[derive(Debug, Clone, PartialEq)]
pub enum PodEvent {
    /// A (re)list begins: the pods that follow, until `InitDone`, replace the known ones.
    Init,
    InitApply(PodFacts),
    InitDone,
    /// A pod was added or changed.
    Apply(PodFacts),
    /// A pod was deleted.
    Delete(PodFacts),
}

/// The discovery's state: the pods and the last published set.
#[derive(Debug, Clone)]
pub struct Discoverer {
    node: String,
    pods: BTreeMap<String, PodFacts>,
    /// Pods of a relist in progress (they replace `pods` at `InitDone`).
    relist: Option<BTreeMap<String, PodFacts>>,
    synced: bool,
    set: LcSet,
    /// Pods not kept because [`MAX_PODS`] were kept already.
    over_cap: u64,
}

/// The most pods the discovery keeps: kubelet runs at most a few hundred per node (110 by
/// default), so more is a broken or hostile API server streaming distinct pods, which must not
/// grow the agent (and each evaluation) without end.
pub const MAX_PODS: usize = 4096;

/// Keeps `p` in `pods` unless that would pass [`MAX_PODS`] (a pod already kept is replaced);
/// `false` when it was not kept.
fn keep(pods: &mut BTreeMap<String, PodFacts>, p: PodFacts) -> bool {
    let key = p.key();
    if pods.len() >= MAX_PODS && !pods.contains_key(&key) {
        return false;
    }
    pods.insert(key, p);
    true
}

impl Discoverer {
    pub fn new(node: &str) -> Discoverer {
        Discoverer {
            node: node.to_string(),
            pods: BTreeMap::new(),
            relist: None,
            synced: false,
            over_cap: 0,
            set: LcSet {
                node: node.to_string(),
                ..LcSet::default()
            },
        }
    }

    /// The last published set.
    pub fn set(&self) -> &LcSet {
        &self.set
    }

    /// How many pods kept now (this node's, at most [`MAX_PODS`]).
    pub fn pods_kept(&self) -> usize {
        self.pods.len()
    }

    /// Pod events not kept because [`MAX_PODS`] were kept already (since start).
    pub fn over_cap(&self) -> u64 {
        self.over_cap
    }

    /// Takes in one watch event (the set is recomputed by [`Discoverer::evaluate`]).
    pub fn apply(&mut self, event: PodEvent) {
        match event {
            PodEvent::Init => self.relist = Some(BTreeMap::new()),
            // Only this node's pods are kept (the server's field selector should have sent no
            // other); one that says another node now is gone from this one.
            PodEvent::InitApply(p) if p.node != self.node => {}
            PodEvent::Apply(p) if p.node != self.node => {
                self.pods.remove(&p.key());
            }
            PodEvent::InitApply(p) => {
                if !keep(self.relist.get_or_insert_with(BTreeMap::new), p) {
                    self.over_cap += 1;
                }
            }
            PodEvent::InitDone => {
                self.pods = self.relist.take().unwrap_or_default();
                self.synced = true;
            }
            PodEvent::Apply(p) => {
                if !keep(&mut self.pods, p) {
                    self.over_cap += 1;
                }
            }
            PodEvent::Delete(p) => {
                self.pods.remove(&p.key());
            }
        }
    }

    /// Recomputes the set with the node's kubelet `layout` (`None`: not found yet) and
    /// `exists`, whether a pod group is on the node. Returns the event to publish when the set
    /// changed, `None` when it did not.
    pub fn evaluate(
        &mut self,
        layout: Option<KubeletLayout>,
        exists: impl Fn(&GroupPath) -> bool,
        t_unix_ms: u64,
    ) -> Option<LcSetEvent> {
        let mut next = LcSet {
            version: self.set.version,
            node: self.node.clone(),
            refusals_total: self.set.refusals_total,
            synced: self.synced,
            ..LcSet::default()
        };
        for pod in self.pods.values() {
            match verdict(pod, &self.node, layout) {
                Verdict::NotLc => {}
                Verdict::Refused(r) => next.refused.push(r),
                Verdict::Waiting(w) => next.waiting.push(w),
                Verdict::Lc(lc) if exists(&lc.cgroup) => next.lcs.push(lc),
                Verdict::Lc(lc) => next.waiting.push(PodRefusal {
                    pod: lc.name,
                    key: "cgroup".into(),
                    value: lc.cgroup.to_string(),
                    reason: "not on the node (the pod has not started or has gone)".into(),
                }),
            }
        }
        // Protected, but measured by nothing: said next to the set (the agent holds BE for
        // them and says so), never silent.
        next.unmeasured = next
            .lcs
            .iter()
            .filter(|lc| lc.latency_ports().is_empty())
            .map(|lc| PodRefusal {
                pod: lc.name.clone(),
                key: LATENCY_PORT.into(),
                value: String::new(),
                reason: NO_LATENCY_PORT.into(),
            })
            .collect();
        let changes = lc_changes(&self.set, &next);
        let same = next.lcs == self.set.lcs
            && next.refused == self.set.refused
            && next.waiting == self.set.waiting
            && next.synced == self.set.synced;
        if same {
            return None;
        }
        next.refusals_total += next
            .refused
            .iter()
            .filter(|r| !self.set.refused.contains(r))
            .count() as u64;
        next.version += 1;
        self.set = next.clone();
        Some(LcSetEvent {
            t_unix_ms,
            changes,
            set: next,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::SLO_P99_US;
    use headroom_types::discovery::LcChange;

    fn pod(name: &str, uid: &str, slo: Option<&str>, phase: &str) -> PodFacts {
        PodFacts {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
            node: "n1".into(),
            phase: phase.into(),
            qos_class: "Guaranteed".into(),
            annotations: slo
                .map(|s| (SLO_P99_US.to_string(), s.to_string()))
                .into_iter()
                .collect(),
            container_ports: Vec::new(),
        }
    }

    const L: Option<KubeletLayout> = Some(KubeletLayout::Cgroupfs);

    fn names(d: &Discoverer) -> Vec<&str> {
        d.set().lcs.iter().map(|l| l.name.as_str()).collect()
    }

    #[test]
    fn pods_come_run_change_and_go() {
        let mut d = Discoverer::new("n1");
        d.apply(PodEvent::Init);
        d.apply(PodEvent::InitApply(pod("a", "u1", Some("500"), "Running")));
        d.apply(PodEvent::InitApply(pod("plain", "u2", None, "Running")));
        // Not synced yet: nothing published but the empty set.
        assert!(d.set().lcs.is_empty());
        d.apply(PodEvent::InitDone);
        let e = d.evaluate(L, |_| true, 1).unwrap();
        assert!(e.set.synced);
        assert_eq!(names(&d), ["ns/a"]);
        assert!(matches!(&e.changes[..], [LcChange::Added { lc }] if lc.name == "ns/a"));
        // Neither a port annotation nor a containerPort: an LC, listed as unmeasured.
        assert_eq!(e.set.unmeasured.len(), 1);
        assert_eq!(
            e.set.unmeasured[0].to_string(),
            "ns/a: headroom.io/latency-port = \"\": no latency port: annotate \
             headroom.io/latency-port or declare a containerPort"
        );
        assert_eq!(d.evaluate(L, |_| true, 2), None, "nothing changed");

        // A pod that is not yet Running, then runs.
        d.apply(PodEvent::Apply(pod("b", "u3", Some("300"), "Pending")));
        assert_eq!(d.evaluate(L, |_| true, 3), None);
        d.apply(PodEvent::Apply(pod("b", "u3", Some("300"), "Running")));
        let e = d.evaluate(L, |_| true, 4).unwrap();
        assert_eq!(names(&d), ["ns/a", "ns/b"]);
        assert_eq!(e.set.version, 2);

        // Its SLO changes.
        let mut b = pod("b", "u3", Some("200"), "Running");
        b.annotations.insert(LATENCY_PORT.into(), "8080".into());
        d.apply(PodEvent::Apply(b));
        let e = d.evaluate(L, |_| true, 5).unwrap();
        assert!(
            matches!(&e.changes[..], [LcChange::Changed { lc }] if lc.target_us == 200.0 && lc.latency_port == Some(8080))
        );
        let unmeasured: Vec<&str> = e.set.unmeasured.iter().map(|r| r.pod.as_str()).collect();
        assert_eq!(unmeasured, ["ns/a"], "b has a port now");
        // A pod measured on its declared containerPorts is not unmeasured.
        let mut c = pod("c", "u4", Some("100"), "Running");
        c.container_ports = vec![8080];
        d.apply(PodEvent::Apply(c));
        let e = d.evaluate(L, |_| true, 5).unwrap();
        assert_eq!(e.set.get("ns/c").unwrap().latency_ports(), [8080]);
        assert_eq!(e.set.unmeasured.len(), 1);
        d.apply(PodEvent::Delete(pod("c", "u4", Some("100"), "Running")));
        d.evaluate(L, |_| true, 5).unwrap();

        // a finishes, b is deleted.
        d.apply(PodEvent::Apply(pod("a", "u1", Some("500"), "Succeeded")));
        d.apply(PodEvent::Delete(pod("b", "u3", Some("200"), "Running")));
        let e = d.evaluate(L, |_| true, 6).unwrap();
        assert!(d.set().lcs.is_empty());
        assert_eq!(e.changes.len(), 2);
        assert!(e
            .changes
            .iter()
            .all(|c| matches!(c, LcChange::Removed { .. })));
    }

    #[test]
    fn a_bad_pod_is_refused_once_and_the_others_go_on() {
        let mut d = Discoverer::new("n1");
        d.apply(PodEvent::Init);
        d.apply(PodEvent::InitApply(pod(
            "bad",
            "u1",
            Some("fast"),
            "Running",
        )));
        d.apply(PodEvent::InitApply(pod(
            "good",
            "u2",
            Some("500"),
            "Running",
        )));
        d.apply(PodEvent::InitDone);
        let e = d.evaluate(L, |_| true, 1).unwrap();
        assert_eq!(names(&d), ["ns/good"]);
        assert_eq!(e.set.refused.len(), 1);
        assert_eq!(e.set.refused[0].pod, "ns/bad");
        assert_eq!(e.set.refusals_total, 1);
        assert!(e
            .changes
            .iter()
            .any(|c| matches!(c, LcChange::Refused { refusal } if refusal.pod == "ns/bad")));
        // Another pod arrives: the refusal is not counted again.
        d.apply(PodEvent::Apply(pod("c", "u3", Some("100"), "Running")));
        let e = d.evaluate(L, |_| true, 2).unwrap();
        assert_eq!(e.set.refusals_total, 1);
        // The bad pod is fixed.
        d.apply(PodEvent::Apply(pod("bad", "u1", Some("400"), "Running")));
        let e = d.evaluate(L, |_| true, 3).unwrap();
        assert!(e.set.refused.is_empty());
        assert_eq!(names(&d), ["ns/bad", "ns/c", "ns/good"]);
    }

    #[test]
    fn an_lc_waits_for_its_cgroup_and_leaves_when_it_goes() {
        let mut d = Discoverer::new("n1");
        d.apply(PodEvent::InitDone);
        d.apply(PodEvent::Apply(pod("a", "u1", Some("500"), "Running")));
        let e = d.evaluate(None, |_| true, 1).unwrap();
        assert!(e.set.lcs.is_empty());
        assert_eq!(e.set.waiting[0].key, "cgroup");
        let e = d.evaluate(L, |_| false, 2).unwrap();
        assert_eq!(e.set.waiting[0].value, "kubepods/podu1");
        let e = d.evaluate(L, |g| g == "kubepods/podu1", 3).unwrap();
        assert_eq!(names(&d), ["ns/a"]);
        assert!(e.set.waiting.is_empty());
        // The group disappears before the API says the pod went.
        let e = d.evaluate(L, |_| false, 4).unwrap();
        assert!(matches!(&e.changes[..], [LcChange::Removed { name }] if name == "ns/a"));
    }

    #[test]
    fn a_relist_replaces_the_known_pods_and_ignores_other_nodes() {
        let mut d = Discoverer::new("n1");
        d.apply(PodEvent::Init);
        d.apply(PodEvent::InitApply(pod("a", "u1", Some("500"), "Running")));
        let mut elsewhere = pod("x", "u9", Some("500"), "Running");
        elsewhere.node = "n2".into();
        d.apply(PodEvent::InitApply(elsewhere));
        d.apply(PodEvent::InitDone);
        d.evaluate(L, |_| true, 1).unwrap();
        assert_eq!(names(&d), ["ns/a"]);
        // The watch restarted; `a` went meanwhile, `b` came.
        d.apply(PodEvent::Init);
        d.apply(PodEvent::InitApply(pod("b", "u2", Some("500"), "Running")));
        assert_eq!(
            d.evaluate(L, |_| true, 2),
            None,
            "a relist in progress changes nothing"
        );
        d.apply(PodEvent::InitDone);
        d.evaluate(L, |_| true, 3).unwrap();
        assert_eq!(names(&d), ["ns/b"]);
    }
}
