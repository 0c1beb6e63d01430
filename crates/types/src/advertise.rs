//! What a node advertises to Kubernetes as `headroom.io/be-cpu` and why: the advertiser's
//! output (headroom-control's `advertise`), shown by `ctl status` and logged per change.

use serde::{Deserialize, Serialize};

/// The extended resource's name.
pub const RESOURCE: &str = "headroom.io/be-cpu";

/// Why the value is what it is (the metric's `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvertiseReason {
    /// The horizon's percentile less the margin.
    Slo,
    /// Committed pods hold it up (the target is below what they requested).
    Floor,
    /// An LC violates its SLO: 0, or the floor.
    Violating,
    /// The signal is untrusted: 0, or the floor.
    Untrusted,
    /// Too little of the horizon seen yet: 0, or the floor.
    Warming,
    /// The target is higher, but the rise waits for the damping period.
    Damped,
}

impl AdvertiseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AdvertiseReason::Slo => "slo",
            AdvertiseReason::Floor => "floor",
            AdvertiseReason::Violating => "violating",
            AdvertiseReason::Untrusted => "untrusted",
            AdvertiseReason::Warming => "warming",
            AdvertiseReason::Damped => "damped",
        }
    }

    pub const ALL: [AdvertiseReason; 6] = [
        AdvertiseReason::Slo,
        AdvertiseReason::Floor,
        AdvertiseReason::Violating,
        AdvertiseReason::Untrusted,
        AdvertiseReason::Warming,
        AdvertiseReason::Damped,
    ];
}

/// How the node's LCs stand in one tick (the advertiser's input).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum LcHealth {
    /// Every LC held its SLO with a trusted signal.
    Held,
    /// This LC's tail latency is above its SLO.
    Violating { lc: String },
    /// No trustworthy signal (unknown or stale latency, BE held off, no LC yet): why.
    Untrusted { reason: String },
}

/// What one tick fed the advertiser, kept in the decision log beside the decision so that
/// `--replay` recomputes the advertised value from it (the floor and the LCs' health come from
/// outside the policy: the API's pod list, the held-off state, the SLOs then).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdvertiseInput {
    /// The BE CPUs the decision granted, milli-CPUs.
    pub granted_millicpu: u64,
    pub health: LcHealth,
    /// The sum of `headroom.io/be-cpu` requested by the pods bound to the node.
    pub floor_millicpu: u64,
}

/// The horizon's figures behind the target.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HorizonFigures {
    /// Buckets in the horizon, and how many of them saw a violation or an untrusted signal.
    pub buckets: usize,
    pub troubled_buckets: usize,
    /// How much of the horizon has been seen, s.
    pub covered_s: f64,
    pub horizon_s: f64,
    pub percentile: f64,
    /// The percentile of the buckets' granted CPUs, and their least and most, milli-CPUs.
    pub percentile_millicpu: u64,
    pub min_millicpu: u64,
    pub max_millicpu: u64,
    pub margin_millicpu: u64,
}

/// A change of the advertised value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdvertiseChange {
    pub t_ms: u64,
    /// `None`: the first value.
    pub from_millicpu: Option<u64>,
    pub to_millicpu: u64,
    pub reason: AdvertiseReason,
    pub detail: String,
}

/// What the node advertises now, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Advertisement {
    pub value_millicpu: u64,
    pub reason: AdvertiseReason,
    /// The reason in words, with the figures.
    pub detail: String,
    pub floor_millicpu: u64,
    /// What it would be without damping.
    pub target_millicpu: u64,
    pub horizon: HorizonFigures,
    pub last_change: Option<AdvertiseChange>,
}

/// `ctl status`'s `advertise`: the advertisement and what the API took of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdvertiseStatus {
    /// `None` until the first tick with the floor known.
    pub advertisement: Option<Advertisement>,
    pub edge: AdvertiseEdgeStatus,
}

/// What the edge (the patch of the Node's status) has done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdvertiseEdgeStatus {
    /// Whether the node's pods have been listed (the floor is known).
    pub floor_synced: bool,
    /// The sum of `headroom.io/be-cpu` requested by the node's bound pods, milli-CPUs.
    pub floor_millicpu: u64,
    /// The value the API last accepted.
    pub published_millicpu: Option<u64>,
    pub patches: u64,
    pub errors: u64,
    /// The last error, while it lasts.
    pub last_error: Option<String>,
}

/// `headroom kube-discover --socket`: one JSON line, the agent's advertisement then.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AdvertiseLine {
    pub advertise: AdvertiseStatus,
}
