//! Pod → LC (pure): which pods of the node are LC services, with what SLO and cgroup, and why an
//! annotated pod is refused. The watch (crate::watch) only feeds [`PodFacts`] in.

use std::collections::BTreeMap;

use headroom_types::discovery::{DiscoveredLc, PodQos, PodRefusal};
use k8s_openapi::api::core::v1::Pod;

use crate::layout::KubeletLayout;

/// The SLO annotation: the pod's p99 latency target in µs. A pod with it is an LC.
pub const SLO_P99_US: &str = "headroom.io/slo-p99-us";
/// The LC's TCP port, watched by the kernel latency sensor.
pub const LATENCY_PORT: &str = "headroom.io/latency-port";
/// The LC's rank among LCs (higher = more important).
pub const PRIORITY: &str = "headroom.io/priority";

/// The largest SLO target accepted: 10 s (a larger one is a typo in the unit, not a p99).
pub const MAX_TARGET_US: f64 = 10_000_000.0;
/// The smallest SLO target accepted: 1 µs (below, no request is answered in time: a typo in
/// the unit, `0.0000001` meant as seconds, would hold BE off for ever).
pub const MIN_TARGET_US: f64 = 1.0;

/// What discovery reads of a pod.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.nodeName` (empty before scheduling).
    pub node: String,
    /// `status.phase`: `Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    pub phase: String,
    /// `status.qosClass` as the API spells it (`Guaranteed`, `Burstable`, `BestEffort`).
    pub qos_class: String,
    pub annotations: BTreeMap<String, String>,
    /// The TCP `containerPorts` the pod's containers declare (`spec.containers[].ports[]`
    /// whose protocol is TCP, the default), sorted and distinct.
    pub container_ports: Vec<u16>,
}

impl PodFacts {
    /// `namespace/pod`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The facts of an API object (missing fields read as empty).
    pub fn from_pod(pod: &Pod) -> PodFacts {
        let m = &pod.metadata;
        let status = pod.status.as_ref();
        PodFacts {
            // Escaped here, once: these go into log lines and `ctl status` (the API validates
            // them; a hostile server's newlines or terminal escapes would forge or hide lines).
            namespace: escaped(m.namespace.as_deref().unwrap_or_default()),
            name: escaped(m.name.as_deref().unwrap_or_default()),
            uid: escaped(m.uid.as_deref().unwrap_or_default()),
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
            qos_class: status.and_then(|s| s.qos_class.clone()).unwrap_or_default(),
            annotations: m.annotations.clone().unwrap_or_default(),
            container_ports: tcp_container_ports(pod),
        }
    }
}

/// The TCP ports the pod's containers declare (UDP and SCTP ports are no TCP sensor's;
/// a number outside 1–65535 cannot be one either and is left out: the API refuses it anyway).
fn tcp_container_ports(pod: &Pod) -> Vec<u16> {
    let mut ports: Vec<u16> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.protocol.as_deref().is_none_or(|proto| proto == "TCP"))
        .filter_map(|p| u16::try_from(p.container_port).ok())
        .filter(|&p| p > 0)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Where the kernel sensor measures a pod: `headroom.io/latency-port` when annotated (a bad
/// value refused, naming key and value), else the declared TCP `containerPorts`; `(None, [])`:
/// nowhere (the pod is still an LC; `LcSet::unmeasured` says why its latency is unknown).
pub fn latency_ports(pod: &PodFacts) -> Result<(Option<u16>, Vec<u16>), PodRefusal> {
    match pod.annotations.get(LATENCY_PORT) {
        Some(v) => match v.trim().parse::<u16>() {
            Ok(p) if p > 0 => Ok((Some(p), Vec::new())),
            _ => Err(refusal(
                pod,
                LATENCY_PORT,
                v,
                "not a TCP port (an integer from 1 to 65535)",
            )),
        },
        None => Ok((None, pod.container_ports.clone())),
    }
}

/// What a pod is to the discovery.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Not an LC, and nothing to say about it (no annotation, not Running, another node).
    NotLc,
    /// Annotated but unusable until the pod changes: a bad annotation or QoS class.
    Refused(PodRefusal),
    /// Annotated and valid, but its cgroup cannot be named yet (no kubelet layout found).
    Waiting(PodRefusal),
    Lc(DiscoveredLc),
}

fn refusal(pod: &PodFacts, key: &str, value: &str, reason: impl Into<String>) -> PodRefusal {
    PodRefusal {
        pod: pod.key(),
        key: key.to_string(),
        value: shown(value),
        reason: reason.into(),
    }
}

/// The most of a refused value a refusal keeps, in characters: the API allows 256 kB of
/// annotations, and the refusal goes into a log line and `ctl status`.
pub const MAX_SHOWN_CHARS: usize = 256;

/// `value` as a refusal shows it: [`escaped`], whole when short, else its first
/// [`MAX_SHOWN_CHARS`] characters and how long it was.
pub fn shown(value: &str) -> String {
    // Cut first: a value of 256 kB is refused at each of its pod's events.
    match value.char_indices().nth(MAX_SHOWN_CHARS) {
        None => escaped(value),
        Some((cut, _)) => format!(
            "{}… (cut: {} bytes in all)",
            escaped(&value[..cut]),
            value.len()
        ),
    }
}

/// `text` from the API as a log line or `ctl status` may show it: control characters (a
/// newline, a terminal's escape sequences), bidirectional overrides and backslashes written as
/// Rust escapes them (`\n`, `\u{1b}`, `\\`), so a hostile server can neither forge a line
/// nor hide one; two texts that differ stay different.
pub fn escaped(text: &str) -> String {
    let odd = |c: char| {
        c.is_control()
            || c == '\\'
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(odd) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if odd(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads `pod` as an LC of `node` whose pod groups are in `layout` (`None`: not found yet).
/// Only a Running pod on `node` annotated with [`SLO_P99_US`] is one; an annotated pod with a
/// bad annotation (the first in key order) or a BestEffort QoS class is refused.
pub fn verdict(pod: &PodFacts, node: &str, layout: Option<KubeletLayout>) -> Verdict {
    let Some(slo) = pod.annotations.get(SLO_P99_US) else {
        return Verdict::NotLc;
    };
    if pod.node != node || pod.phase != "Running" {
        return Verdict::NotLc;
    }
    let target_us = match parse_target(slo) {
        Ok(t) => t,
        Err(why) => return Verdict::Refused(refusal(pod, SLO_P99_US, slo, why.to_string())),
    };
    let (latency_port, container_ports) = match latency_ports(pod) {
        Ok(ports) => ports,
        Err(r) => return Verdict::Refused(r),
    };
    let priority = match pod.annotations.get(PRIORITY) {
        None => 0,
        Some(v) => match v.trim().parse::<i32>() {
            Ok(p) => p,
            Err(_) => {
                return Verdict::Refused(refusal(
                    pod,
                    PRIORITY,
                    v,
                    "not an integer (higher = more important)",
                ))
            }
        },
    };
    let qos =
        match pod.qos_class.as_str() {
            "Guaranteed" => PodQos::Guaranteed,
            "Burstable" => PodQos::Burstable,
            "BestEffort" => return Verdict::Refused(refusal(
                pod,
                "status.qosClass",
                &pod.qos_class,
                "a BestEffort pod cannot be an LC: its cgroup lies under the BestEffort parent, \
                 which the agent restricts as BE (give its containers CPU requests)",
            )),
            other => {
                return Verdict::Refused(refusal(
                    pod,
                    "status.qosClass",
                    other,
                    "not a QoS class (Guaranteed, Burstable or BestEffort)",
                ))
            }
        };
    let Some(layout) = layout else {
        return Verdict::Waiting(refusal(
            pod,
            "cgroup",
            "",
            "no kubelet cgroup layout (kubepods or kubepods.slice) under the cgroup root yet",
        ));
    };
    let Some(cgroup) = layout.pod_cgroup(qos, &pod.uid) else {
        return Verdict::Refused(refusal(
            pod,
            "metadata.uid",
            &pod.uid,
            "not a pod UID (letters, digits and `-`)",
        ));
    };
    Verdict::Lc(DiscoveredLc {
        name: pod.key(),
        uid: pod.uid.clone(),
        qos,
        cgroup,
        target_us,
        percentile: 99.0,
        latency_port,
        priority,
        container_ports,
    })
}

/// Why an SLO annotation is not a target.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SloTargetError {
    #[error("not a number of microseconds (write the p99 target as `500`)")]
    NotANumber,
    #[error("must be a positive number of microseconds")]
    NotPositive,
    #[error("below {MIN_TARGET_US} µs: the annotation is in microseconds (write a p99 of 500 µs as `500`)")]
    TooSmall,
    #[error("above {MAX_TARGET_US} µs (10 s): the annotation is in microseconds")]
    TooLarge,
}

/// An SLO target: a positive number of µs, at most [`MAX_TARGET_US`].
fn parse_target(v: &str) -> Result<f64, SloTargetError> {
    let t: f64 = v.trim().parse().map_err(|_| SloTargetError::NotANumber)?;
    if !t.is_finite() || t <= 0.0 {
        return Err(SloTargetError::NotPositive);
    }
    if t < MIN_TARGET_US {
        return Err(SloTargetError::TooSmall);
    }
    if t > MAX_TARGET_US {
        return Err(SloTargetError::TooLarge);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "11111111-2222-3333-4444-555555555555";

    fn pod(annotations: &[(&str, &str)]) -> PodFacts {
        PodFacts {
            namespace: "shop".into(),
            name: "cart-0".into(),
            uid: UID.into(),
            node: "node-a".into(),
            phase: "Running".into(),
            qos_class: "Burstable".into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            container_ports: Vec::new(),
        }
    }

    fn lc(v: Verdict) -> DiscoveredLc {
        match v {
            Verdict::Lc(l) => l,
            other => panic!("expected an LC, got {other:?}"),
        }
    }

    fn refused(v: Verdict) -> PodRefusal {
        match v {
            Verdict::Refused(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn an_annotated_running_pod_is_an_lc() {
        let l = lc(verdict(
            &pod(&[
                (SLO_P99_US, "500"),
                (LATENCY_PORT, "11211"),
                (PRIORITY, "2"),
            ]),
            "node-a",
            Some(KubeletLayout::Cgroupfs),
        ));
        assert_eq!(l.name, "shop/cart-0");
        assert_eq!(l.target_us, 500.0);
        assert_eq!(l.percentile, 99.0);
        assert_eq!(l.latency_port, Some(11211));
        assert_eq!(l.priority, 2);
        assert_eq!(l.qos, PodQos::Burstable);
        assert_eq!(l.cgroup, format!("kubepods/burstable/pod{UID}").as_str());
    }

    #[test]
    fn defaults_without_port_and_priority_and_systemd_guaranteed_path() {
        let mut p = pod(&[(SLO_P99_US, " 250.5 ")]);
        p.qos_class = "Guaranteed".into();
        let l = lc(verdict(&p, "node-a", Some(KubeletLayout::Systemd)));
        assert_eq!(l.target_us, 250.5);
        assert_eq!(l.latency_port, None);
        assert_eq!(l.priority, 0);
        assert_eq!(
            l.cgroup,
            "kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice"
        );
    }

    #[test]
    fn not_an_lc_without_annotation_before_running_after_running_or_elsewhere() {
        let l = Some(KubeletLayout::Cgroupfs);
        assert_eq!(verdict(&pod(&[]), "node-a", l), Verdict::NotLc);
        for phase in ["Pending", "Succeeded", "Failed", "Unknown", ""] {
            let mut p = pod(&[(SLO_P99_US, "500")]);
            p.phase = phase.into();
            assert_eq!(verdict(&p, "node-a", l), Verdict::NotLc, "{phase}");
        }
        assert_eq!(
            verdict(&pod(&[(SLO_P99_US, "500")]), "node-b", l),
            Verdict::NotLc
        );
        // Not yet Running: a bad annotation is not refused before the pod runs either.
        let mut p = pod(&[(SLO_P99_US, "fast")]);
        p.phase = "Pending".into();
        assert_eq!(verdict(&p, "node-a", l), Verdict::NotLc);
    }

    #[test]
    fn a_bad_slo_annotation_is_refused_naming_pod_key_and_value() {
        let l = Some(KubeletLayout::Cgroupfs);
        let r = refused(verdict(&pod(&[(SLO_P99_US, "fast")]), "node-a", l));
        assert_eq!(r.key, SLO_P99_US);
        assert_eq!(
            r.to_string(),
            "shop/cart-0: headroom.io/slo-p99-us = \"fast\": not a number of microseconds \
             (write the p99 target as `500`)"
        );
        for bad in ["", "0", "-5", "NaN", "inf", "500us", "2e7"] {
            let r = refused(verdict(&pod(&[(SLO_P99_US, bad)]), "node-a", l));
            assert_eq!((r.key.as_str(), r.value.as_str()), (SLO_P99_US, bad));
        }
    }

    /// Issue 42: `"0.0000001"` was accepted as an LC whose SLO no request can meet.
    #[test]
    fn a_target_below_one_microsecond_is_refused() {
        let l = Some(KubeletLayout::Cgroupfs);
        for tiny in ["0.0000001", "0.5", "1e-3", "0.999"] {
            let r = refused(verdict(&pod(&[(SLO_P99_US, tiny)]), "node-a", l));
            assert_eq!((r.key.as_str(), r.value.as_str()), (SLO_P99_US, tiny));
            assert!(r.to_string().contains("below 1 µs"), "{r}");
        }
        for fine in ["1", "1.5", "500"] {
            lc(verdict(&pod(&[(SLO_P99_US, fine)]), "node-a", l));
        }
    }

    #[test]
    fn bad_port_priority_qos_and_uid_are_refused() {
        let l = Some(KubeletLayout::Cgroupfs);
        for bad in ["0", "65536", "http", "-1"] {
            let r = refused(verdict(
                &pod(&[(SLO_P99_US, "500"), (LATENCY_PORT, bad)]),
                "node-a",
                l,
            ));
            assert_eq!((r.key.as_str(), r.value.as_str()), (LATENCY_PORT, bad));
        }
        let r = refused(verdict(
            &pod(&[(SLO_P99_US, "500"), (PRIORITY, "high")]),
            "node-a",
            l,
        ));
        assert_eq!((r.key.as_str(), r.value.as_str()), (PRIORITY, "high"));

        let mut p = pod(&[(SLO_P99_US, "500")]);
        p.qos_class = "BestEffort".into();
        let r = refused(verdict(&p, "node-a", l));
        assert_eq!(r.key, "status.qosClass");
        assert!(r.reason.contains("BestEffort parent"), "{r}");
        p.qos_class = String::new();
        assert_eq!(refused(verdict(&p, "node-a", l)).key, "status.qosClass");

        let mut p = pod(&[(SLO_P99_US, "500")]);
        p.uid = "../../etc".into();
        assert_eq!(refused(verdict(&p, "node-a", l)).key, "metadata.uid");
    }

    #[test]
    fn without_a_layout_a_valid_pod_waits() {
        match verdict(&pod(&[(SLO_P99_US, "500")]), "node-a", None) {
            Verdict::Waiting(w) => assert_eq!(w.key, "cgroup"),
            other => panic!("{other:?}"),
        }
    }

    /// A pod of the API with these containers' `ports` (each a list of `(port, protocol)`,
    /// protocol `None` = left out, which the API reads as TCP).
    fn api_pod(annotations: serde_json::Value, containers: &[&[(i32, Option<&str>)]]) -> Pod {
        let containers: Vec<serde_json::Value> = containers
            .iter()
            .enumerate()
            .map(|(i, ports)| {
                let ports: Vec<serde_json::Value> = ports
                    .iter()
                    .map(|(p, proto)| match proto {
                        Some(proto) => serde_json::json!({"containerPort": p, "protocol": proto}),
                        None => serde_json::json!({"containerPort": p}),
                    })
                    .collect();
                serde_json::json!({"name": format!("c{i}"), "image": "x", "ports": ports})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "cart-0", "uid": UID,
                         "annotations": annotations},
            "spec": {"nodeName": "node-a", "containers": containers},
            "status": {"phase": "Running", "qosClass": "Burstable"}
        }))
        .unwrap()
    }

    #[test]
    fn the_latency_port_annotation_wins_over_container_ports() {
        let p = PodFacts::from_pod(&api_pod(
            serde_json::json!({SLO_P99_US: "500", LATENCY_PORT: "11211"}),
            &[&[(8080, None), (9090, Some("TCP"))]],
        ));
        assert_eq!(p.container_ports, [8080, 9090]);
        assert_eq!(latency_ports(&p), Ok((Some(11211), Vec::new())));
        let l = lc(verdict(&p, "node-a", Some(KubeletLayout::Cgroupfs)));
        assert_eq!(l.latency_port, Some(11211));
        assert!(l.container_ports.is_empty(), "the annotation wins");
        assert_eq!(l.latency_ports(), [11211]);
    }

    #[test]
    fn without_the_annotation_the_declared_tcp_container_ports_are_watched() {
        // Several containers, a port declared twice, UDP and SCTP ports beside TCP ones.
        let p = PodFacts::from_pod(&api_pod(
            serde_json::json!({SLO_P99_US: "500"}),
            &[
                &[(9090, Some("TCP")), (53, Some("UDP")), (8080, None)],
                &[
                    (8080, Some("TCP")),
                    (7000, Some("SCTP")),
                    (5353, Some("UDP")),
                ],
            ],
        ));
        assert_eq!(p.container_ports, [8080, 9090], "UDP and SCTP ignored");
        assert_eq!(latency_ports(&p), Ok((None, vec![8080, 9090])));
        let l = lc(verdict(&p, "node-a", Some(KubeletLayout::Cgroupfs)));
        assert_eq!(l.latency_port, None);
        assert_eq!(l.container_ports, [8080, 9090]);
        assert_eq!(l.latency_ports(), [8080, 9090]);
    }

    #[test]
    fn only_udp_ports_or_none_leave_the_pod_an_lc_without_a_latency_port() {
        for containers in [&[&[(53, Some("UDP"))][..]][..], &[&[][..]], &[]] {
            let p =
                PodFacts::from_pod(&api_pod(serde_json::json!({SLO_P99_US: "500"}), containers));
            assert_eq!(latency_ports(&p), Ok((None, Vec::new())), "{containers:?}");
            let l = lc(verdict(&p, "node-a", Some(KubeletLayout::Cgroupfs)));
            assert!(l.latency_ports().is_empty(), "{containers:?}");
        }
    }

    #[test]
    fn a_bad_latency_port_annotation_is_refused_even_with_container_ports() {
        for bad in ["0", "65536", "http", "-1", ""] {
            let p = PodFacts::from_pod(&api_pod(
                serde_json::json!({SLO_P99_US: "500", LATENCY_PORT: bad}),
                &[&[(8080, None)]],
            ));
            let r = latency_ports(&p).unwrap_err();
            assert_eq!((r.key.as_str(), r.value.as_str()), (LATENCY_PORT, bad));
            let r = refused(verdict(&p, "node-a", Some(KubeletLayout::Cgroupfs)));
            assert_eq!(
                r.to_string(),
                format!(
                    "shop/cart-0: headroom.io/latency-port = {bad:?}: not a TCP port (an integer from 1 to 65535)"
                )
            );
        }
    }

    #[test]
    fn facts_from_an_api_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": "cart-0", "uid": UID,
                         "annotations": {SLO_P99_US: "500"}},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running", "qosClass": "Guaranteed"}
        }))
        .unwrap();
        let f = PodFacts::from_pod(&pod);
        assert_eq!(f.key(), "shop/cart-0");
        assert_eq!((f.node.as_str(), f.phase.as_str()), ("node-a", "Running"));
        assert_eq!(f.qos_class, "Guaranteed");
        assert_eq!(f.annotations.get(SLO_P99_US).unwrap(), "500");
    }
}
