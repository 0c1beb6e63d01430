//! The floors of the advertised BE capacity (pure): the sums of `headroom.io/be-cpu` and of
//! `headroom.io/be-memory` requested by the pods bound to the node that have not finished. Each
//! advertised value never goes below its floor, so kubelet never rejects or fails a pod it
//! already admitted (on its restart it re-admits the node's pods against the allocatable it
//! finds).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// The CPU extended resource (milli-CPUs, an integer count).
pub const BE_CPU: &str = "headroom.io/be-cpu";
/// The memory extended resource (bytes, an integer count: `2Gi` is whole).
pub const BE_MEMORY: &str = "headroom.io/be-memory";

/// A pod's request of an extended resource that is not a whole non-negative count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: container {container}: {resource} = {value:?}: {reason}")]
pub struct RequestError {
    pub pod: String,
    pub container: String,
    pub resource: &'static str,
    pub value: String,
    pub reason: &'static str,
}

/// A pod bound to the node and what it requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPod {
    /// `namespace/pod`.
    pub name: String,
    pub millicpu: u64,
    pub memory_bytes: u64,
}

/// Parses an extended resource quantity as the API writes one (its canonical form: `2k` for
/// 2000): a whole number with a decimal SI suffix (`k` `M` `G` `T` `P` `E`), a binary one (`Ki`
/// … `Ei`) or a decimal exponent (`2e3`), or milli-units that make a whole count (`3000m`). The
/// API refuses fractions of extended resources, so they are refused here.
pub(crate) fn parse_count(q: &str) -> Result<u64, &'static str> {
    const NOT_WHOLE: &str = "not a whole count (extended resources are integers)";
    let q = q.trim();
    let split = q
        .find(|c: char| !c.is_ascii_digit() && c != '+')
        .unwrap_or(q.len());
    let (digits, suffix) = q.split_at(split);
    let n: u64 = digits.parse().map_err(|_| NOT_WHOLE)?;
    // The quantity suffixes: decimal SI, then binary (each a power of its base).
    const SUFFIXES: [(&str, u64, u32); 12] = [
        ("k", 1000, 1),
        ("M", 1000, 2),
        ("G", 1000, 3),
        ("T", 1000, 4),
        ("P", 1000, 5),
        ("E", 1000, 6),
        ("Ki", 1024, 1),
        ("Mi", 1024, 2),
        ("Gi", 1024, 3),
        ("Ti", 1024, 4),
        ("Pi", 1024, 5),
        ("Ei", 1024, 6),
    ];
    let scale = |base: u64, exp: u32| {
        base.checked_pow(exp)
            .and_then(|m| n.checked_mul(m))
            .ok_or("too large")
    };
    match suffix {
        "" => Ok(n),
        "m" if n.is_multiple_of(1000) => Ok(n / 1000),
        "m" => Err(NOT_WHOLE),
        s => match SUFFIXES.iter().find(|(name, _, _)| *name == s) {
            Some(&(_, base, exp)) => scale(base, exp),
            None => {
                let exp: u32 = s
                    .strip_prefix(['e', 'E'])
                    .and_then(|x| x.strip_prefix('+').unwrap_or(x).parse().ok())
                    .ok_or(NOT_WHOLE)?;
                scale(10, exp)
            }
        },
    }
}

/// What `pod` requests of [`BE_CPU`]. `None`: the pod requests none.
pub fn requested(pod: &Pod) -> Result<Option<u64>, RequestError> {
    requested_of(pod, BE_CPU)
}

/// What `pod` requests of the extended resource `resource` (its containers' requests, each
/// defaulting to its limit as the API does for extended resources; init containers run before,
/// one at a time, so their largest counts when it is larger). `None`: the pod requests none.
pub fn requested_of(pod: &Pod, resource: &'static str) -> Result<Option<u64>, RequestError> {
    let name = pod_name(pod);
    let Some(spec) = &pod.spec else {
        return Ok(None);
    };
    let one = |c: &k8s_openapi::api::core::v1::Container| -> Result<Option<u64>, RequestError> {
        let r = c.resources.as_ref();
        let q = r
            .and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(resource))
            .or_else(|| {
                r.and_then(|r| r.limits.as_ref())
                    .and_then(|m| m.get(resource))
            });
        q.map(|q| {
            parse_count(&q.0).map_err(|reason| RequestError {
                pod: name.clone(),
                container: crate::pod::escaped(&c.name),
                resource,
                value: crate::pod::shown(&q.0),
                reason,
            })
        })
        .transpose()
    };
    let mut sum = None::<u64>;
    for c in &spec.containers {
        if let Some(v) = one(c)? {
            sum = Some(sum.unwrap_or(0).saturating_add(v));
        }
    }
    for c in spec.init_containers.iter().flatten() {
        if let Some(v) = one(c)? {
            sum = Some(sum.unwrap_or(0).max(v));
        }
    }
    Ok(sum)
}

/// `namespace/pod`, escaped (it goes into log lines and `ctl status`).
fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        crate::pod::escaped(pod.metadata.namespace.as_deref().unwrap_or("")),
        crate::pod::escaped(pod.metadata.name.as_deref().unwrap_or(""))
    )
}

/// Whether a pod of the node still holds what it requested (Succeeded and Failed pods do not).
pub fn holds(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded") | Some("Failed"))
}

/// A pod's key in the floor: its UID, namespace and name. kube-apiserver always sets a UID, but
/// keyed by UID alone every pod a broken or hostile server sends without one shared a key and
/// counted once (a floor too low, the unsafe side); with the name two distinct pods never merge.
type PodKey = (String, String, String);

fn key(pod: &Pod) -> PodKey {
    let m = &pod.metadata;
    (
        m.uid.clone().unwrap_or_default(),
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// The node's bound pods by UID (and name), kept from the watch's events.
#[derive(Debug, Clone, Default)]
pub struct Floor {
    pods: BTreeMap<PodKey, BoundPod>,
    /// Pods whose request could not be read (they count as nothing; each said once).
    refused: BTreeMap<PodKey, RequestError>,
    /// Whether the first list has arrived.
    pub synced: bool,
    /// The node whose pods count (empty: every pod given). The watch selects the node's pods on
    /// the server; a pod of another node that comes all the same counts nothing.
    node: String,
    /// Pods not kept since the last list began because [`MAX_BOUND_PODS`] were kept already:
    /// while any, the sums lack what they requested (a floor too low), see [`Floor::over_cap`].
    over_cap: u64,
}

/// The most bound pods the floor keeps, as the discovery's [`crate::state::MAX_PODS`]: a node
/// runs a few hundred, so more is a broken or hostile API server streaming distinct pods, which
/// must not grow the publisher (and its copy of the list at each event) without end. Past it the
/// floor is not cut (that would lower it, unsafe): it fails, see [`Floor::over_cap`].
pub const MAX_BOUND_PODS: usize = crate::state::MAX_PODS;

impl Floor {
    /// The floor of `node`'s pods.
    pub fn of_node(node: &str) -> Floor {
        Floor {
            node: node.to_string(),
            ..Floor::default()
        }
    }

    /// A pod came or changed. `Some(error)` the first time a pod's request is refused.
    pub fn apply(&mut self, pod: &Pod) -> Option<RequestError> {
        let uid = key(pod);
        let known = self.pods.remove(&uid).is_some() || self.refused.contains_key(&uid);
        if !known && self.pods.len() + self.refused.len() >= MAX_BOUND_PODS {
            self.over_cap += 1;
            return None;
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if !holds(pod) || (!self.node.is_empty() && node != Some(self.node.as_str())) {
            self.refused.remove(&uid);
            return None;
        }
        // A pod counts what it requests of either resource; one bad request refuses the pod
        // (it counts nothing, said once).
        match requested(pod).and_then(|c| Ok((c, requested_of(pod, BE_MEMORY)?))) {
            Ok((None, None)) => {
                self.refused.remove(&uid);
                None
            }
            Ok((millicpu, memory)) => {
                self.refused.remove(&uid);
                let name = pod_name(pod);
                self.pods.insert(
                    uid,
                    BoundPod {
                        name,
                        millicpu: millicpu.unwrap_or(0),
                        memory_bytes: memory.unwrap_or(0),
                    },
                );
                None
            }
            Err(e) => {
                let new = self.refused.get(&uid) != Some(&e);
                self.refused.insert(uid, e.clone());
                new.then_some(e)
            }
        }
    }

    pub fn delete(&mut self, pod: &Pod) {
        let uid = key(pod);
        self.pods.remove(&uid);
        self.refused.remove(&uid);
    }

    /// A new list begins (a re-list after the watch was lost).
    pub fn reset(&mut self) {
        self.pods.clear();
        self.refused.clear();
        self.over_cap = 0;
    }

    /// Pods not kept since the last list began ([`MAX_BOUND_PODS`] were kept already): while
    /// not 0 the sums are too low, and are not to be published as the floor. A deleted pod does
    /// not bring it back to 0 (which pods were left out is not known): the next list does.
    pub fn over_cap(&self) -> u64 {
        self.over_cap
    }

    /// The sum of `headroom.io/be-cpu` requested, milli-CPUs.
    pub fn millicpu(&self) -> u64 {
        // Saturating: two pods' requests near u64::MAX (a hostile server's) panicked the
        // publisher's thread here in a debug build, and wrapped to a tiny floor in a release one.
        self.pods
            .values()
            .fold(0, |sum: u64, p| sum.saturating_add(p.millicpu))
    }

    /// The sum of `headroom.io/be-memory` requested, bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.pods
            .values()
            .fold(0, |sum: u64, p| sum.saturating_add(p.memory_bytes))
    }

    pub fn pods(&self) -> Vec<BoundPod> {
        self.pods.values().cloned().collect()
    }

    pub fn refused(&self) -> Vec<String> {
        self.refused.values().map(|e| e.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, phase: &str, containers: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "batch", "name": format!("job-{uid}"), "uid": uid},
            "spec": {"nodeName": "n1", "containers": containers},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn c(name: &str, requests: Option<&str>, limits: Option<&str>) -> serde_json::Value {
        let mut r = json!({});
        if let Some(q) = requests {
            r["requests"] = json!({BE_CPU: q});
        }
        if let Some(q) = limits {
            r["limits"] = json!({BE_CPU: q});
        }
        json!({"name": name, "image": "x", "resources": r})
    }

    #[test]
    fn the_floor_sums_what_bound_unfinished_pods_requested() {
        let mut f = Floor::default();
        assert!(f
            .apply(&pod("a", "Running", json!([c("m", Some("1500"), None)])))
            .is_none());
        // A limit alone is the request (as the API defaults it).
        f.apply(&pod(
            "b",
            "Pending",
            json!([c("m", None, Some("2k")), c("s", Some("250"), None)]),
        ));
        // No request: BestEffort without the resource, not counted.
        f.apply(&pod("c", "Running", json!([c("m", None, None)])));
        assert_eq!(f.millicpu(), 1500 + 2250);
        // b finishes: it holds nothing.
        f.apply(&pod("b", "Succeeded", json!([c("m", None, Some("2k"))])));
        assert_eq!(f.millicpu(), 1500);
        f.delete(&pod("a", "Running", json!([])));
        assert_eq!(f.millicpu(), 0);
    }

    #[test]
    fn the_memory_floor_sums_be_memory_with_the_same_grammar() {
        let mut f = Floor::default();
        let mut p = pod("a", "Running", json!([c("m", Some("1500"), None)]));
        p.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .requests
            .as_mut()
            .unwrap()
            .insert(
                BE_MEMORY.into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("2Gi".into()),
            );
        f.apply(&p);
        // A pod that asks memory only counts in the memory floor.
        let mut m = pod("b", "Running", json!([{"name": "m", "image": "x"}]));
        m.spec.as_mut().unwrap().containers[0].resources =
            Some(serde_json::from_value(json!({"limits": {BE_MEMORY: "512M"}})).unwrap());
        f.apply(&m);
        assert_eq!(f.millicpu(), 1500);
        assert_eq!(f.memory_bytes(), (2u64 << 30) + 512_000_000);
        // A fraction of a byte is refused, naming the resource.
        let mut bad = pod("x", "Running", json!([{"name": "m", "image": "x"}]));
        bad.spec.as_mut().unwrap().containers[0].resources =
            Some(serde_json::from_value(json!({"requests": {BE_MEMORY: "1.5Gi"}})).unwrap());
        let e = f.apply(&bad).expect("refused");
        assert!(e.to_string().contains(BE_MEMORY), "{e}");
        assert_eq!(f.memory_bytes(), (2u64 << 30) + 512_000_000);
    }

    #[test]
    fn a_pod_of_another_node_counts_nothing() {
        let mut f = Floor::of_node("n1");
        f.apply(&pod("a", "Running", json!([c("m", Some("1500"), None)])));
        let mut elsewhere = pod("b", "Running", json!([c("m", Some("700"), None)]));
        elsewhere.spec.as_mut().unwrap().node_name = Some("n2".into());
        f.apply(&elsewhere);
        assert_eq!(f.millicpu(), 1500);
        // Every pod counts where no node is named.
        let mut any = Floor::default();
        any.apply(&elsewhere);
        assert_eq!(any.millicpu(), 700);
    }

    #[test]
    fn quantities_parse_as_the_api_writes_them() {
        for (q, want) in [
            ("1500", 1500),
            ("2k", 2000),
            ("2e3", 2000),
            ("2E+3", 2000),
            ("1Ki", 1024),
            ("3000m", 3),
            ("1M", 1_000_000),
            (" 7 ", 7),
        ] {
            assert_eq!(parse_count(q), Ok(want), "{q}");
        }
        for q in ["1.5", "1500m", "-1", "", "k", "2x", "1e-3", "99E"] {
            assert!(parse_count(q).is_err(), "{q} accepted");
        }
        assert_eq!(parse_count("18446744073709551615k"), Err("too large"));
    }

    #[test]
    fn a_bad_request_is_named_once_and_counts_nothing() {
        let mut f = Floor::default();
        let p = pod("x", "Running", json!([c("m", Some("1.5"), None)]));
        let e = f.apply(&p).expect("refused");
        let text = e.to_string();
        assert!(
            text.contains("batch/job-x")
                && text.contains("\"1.5\"")
                && text.contains("container m"),
            "{text}"
        );
        assert!(f.apply(&p).is_none(), "said once");
        assert_eq!(f.millicpu(), 0);
        assert_eq!(f.refused().len(), 1);
        // Init containers: the largest, when larger than the sum.
        let mut p = pod("y", "Running", json!([c("m", Some("500"), None)]));
        p.spec.as_mut().unwrap().init_containers =
            Some(vec![
                serde_json::from_value(c("i", Some("800"), None)).unwrap()
            ]);
        assert_eq!(requested(&p).unwrap(), Some(800));
    }
}
