//! LC services discovered live (Kubernetes pods annotated `headroom.io/slo-p99-us`): the set
//! `headroom-kube` publishes and the agent runtime consumes, and `headroom kube-discover` prints
//! one [`LcSetEvent`] a line. A contract: extend with optional fields, never rename.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::GroupPath;

/// A pod's QoS class (`status.qosClass`), which decides its kubelet cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PodQos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl fmt::Display for PodQos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PodQos::Guaranteed => "Guaranteed",
            PodQos::Burstable => "Burstable",
            PodQos::BestEffort => "BestEffort",
        })
    }
}

/// Which kubelet cgroup layout names the pod groups (`[kubernetes] cgroup_layout`): detected
/// on the node (`kubepods.slice` = systemd driver, `kubepods` = cgroupfs driver), or fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutChoice {
    #[default]
    Auto,
    Cgroupfs,
    Systemd,
}

impl std::str::FromStr for LayoutChoice {
    type Err = crate::values::ValueError;

    fn from_str(s: &str) -> Result<LayoutChoice, Self::Err> {
        match s {
            "auto" => Ok(LayoutChoice::Auto),
            "cgroupfs" => Ok(LayoutChoice::Cgroupfs),
            "systemd" => Ok(LayoutChoice::Systemd),
            other => Err(crate::values::ValueError::new(
                "kubelet cgroup layout",
                other,
                "expected auto, cgroupfs or systemd",
            )),
        }
    }
}

/// One LC service found on the node: a Running pod with a valid SLO annotation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiscoveredLc {
    /// `namespace/pod`: the LC's name in observations, decisions and metrics.
    pub name: String,
    /// The pod's UID (a pod re-created under the same name is another LC).
    pub uid: String,
    pub qos: PodQos,
    /// The pod's cgroup relative to the cgroup root, in the node's kubelet layout.
    pub cgroup: GroupPath,
    /// The SLO: `percentile` latency at most `target_us` (`headroom.io/slo-p99-us`).
    pub target_us: f64,
    pub percentile: f64,
    /// The TCP port the kernel latency sensor watches (`headroom.io/latency-port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_port: Option<u16>,
    /// Rank among LCs, higher = more important (`headroom.io/priority`, default 0).
    #[serde(default)]
    pub priority: i32,
    /// The pod's declared TCP `containerPorts` (sorted, distinct), watched by the kernel
    /// sensor when the pod has no `latency_port` (empty when it has one: the annotation wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_ports: Vec<u16>,
}

/// Why a discovered LC has no latency source (`LcSet::unmeasured`).
pub const NO_LATENCY_PORT: &str =
    "no latency port: annotate headroom.io/latency-port or declare a containerPort";

impl DiscoveredLc {
    /// The TCP ports the kernel sensor watches: the annotated port, else the declared
    /// container ports; empty: the LC has no latency source.
    pub fn latency_ports(&self) -> Vec<u16> {
        match self.latency_port {
            Some(p) => vec![p],
            None => self.container_ports.clone(),
        }
    }
}

/// Why a pod is not (or not yet) an LC: the pod, the key and value at fault, the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRefusal {
    /// `namespace/pod`.
    pub pod: String,
    /// The annotation or field at fault (`headroom.io/slo-p99-us`, `status.qosClass`, `cgroup`).
    pub key: String,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for PodRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} = {:?}: {}",
            self.pod, self.key, self.value, self.reason
        )
    }
}

/// The LC services of a node at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LcSet {
    /// Bumped on every change of `lcs`, `refused` or `waiting`.
    pub version: u64,
    /// The node whose pods these are.
    pub node: String,
    /// Sorted by name.
    pub lcs: Vec<DiscoveredLc>,
    /// Annotated pods refused for a bad annotation or QoS class (they stay refused until the
    /// pod changes), sorted by pod.
    #[serde(default)]
    pub refused: Vec<PodRefusal>,
    /// Annotated Running pods whose cgroup is not (yet, or no longer) on the node.
    #[serde(default)]
    pub waiting: Vec<PodRefusal>,
    /// LCs of `lcs` with no latency source (no `headroom.io/latency-port`, no TCP
    /// `containerPort`): protected, but their latency is unknown (see docs/kubernetes.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmeasured: Vec<PodRefusal>,
    /// Refusals since the discovery started (each distinct refusal of a pod counted once).
    #[serde(default)]
    pub refusals_total: u64,
    /// Whether the first full list of the node's pods has arrived (before it, `lcs` is empty
    /// because nothing is known, not because the node has no LC).
    #[serde(default)]
    pub synced: bool,
}

impl LcSet {
    /// The LC named `namespace/pod`.
    pub fn get(&self, name: &str) -> Option<&DiscoveredLc> {
        self.lcs.iter().find(|l| l.name == name)
    }
}

/// What changed between two LC sets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "kebab-case")]
pub enum LcChange {
    /// A pod became an LC.
    Added { lc: DiscoveredLc },
    /// An LC's SLO, port, priority or cgroup changed.
    Changed { lc: DiscoveredLc },
    /// An LC went (pod deleted or stopped, annotation removed, cgroup gone).
    Removed { name: String },
    /// A pod was refused (a new refusal).
    Refused { refusal: PodRefusal },
}

/// One line of `headroom kube-discover`: the new set and what changed to make it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LcSetEvent {
    pub t_unix_ms: u64,
    pub changes: Vec<LcChange>,
    pub set: LcSet,
}

/// The changes from `old` to `new` (added, changed and removed LCs; refusals new in `new`).
pub fn lc_changes(old: &LcSet, new: &LcSet) -> Vec<LcChange> {
    let mut out = Vec::new();
    for lc in &new.lcs {
        match old.get(&lc.name) {
            None => out.push(LcChange::Added { lc: lc.clone() }),
            Some(before) if before != lc => out.push(LcChange::Changed { lc: lc.clone() }),
            Some(_) => {}
        }
    }
    for lc in &old.lcs {
        if new.get(&lc.name).is_none() {
            out.push(LcChange::Removed {
                name: lc.name.clone(),
            });
        }
    }
    for r in &new.refused {
        if !old.refused.contains(r) {
            out.push(LcChange::Refused { refusal: r.clone() });
        }
    }
    out
}
