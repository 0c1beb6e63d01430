//! What a node advertises to Kubernetes as `headroom.io/be-cpu` and `headroom.io/be-memory`
//! and why: the advertisers' output (headroom-control's `advertise`), shown by `ctl status` and
//! logged per change.

use serde::{Deserialize, Serialize};

/// The CPU extended resource's name (milli-CPUs).
pub const RESOURCE: &str = "headroom.io/be-cpu";
/// The memory extended resource's name (bytes).
pub const MEMORY_RESOURCE: &str = "headroom.io/be-memory";

/// Which extended resource an advertiser serves: its name, unit and how a value reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    /// `headroom.io/be-cpu`, milli-CPUs.
    BeCpu,
    /// `headroom.io/be-memory`, bytes.
    BeMemory,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Resource::BeCpu => RESOURCE,
            Resource::BeMemory => MEMORY_RESOURCE,
        }
    }

    /// The reasons its value can have (the metric's `reason` labels).
    pub fn reasons(self) -> &'static [AdvertiseReason] {
        use AdvertiseReason::*;
        match self {
            Resource::BeCpu => &[Slo, Floor, Violating, Untrusted, Warming, Damped],
            Resource::BeMemory => &[Peak, Capped, Floor, Untrusted, Warming, Damped],
        }
    }

    /// A value in words: `1500m`, `2147483648 B (2.00 GiB)`.
    pub fn show(self, v: u64) -> String {
        match self {
            Resource::BeCpu => format!("{v}m"),
            Resource::BeMemory => format!("{v} B ({:.2} GiB)", v as f64 / (1u64 << 30) as f64),
        }
    }
}

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
    /// be-memory: the node's memory less the LC's and system's peak over the horizon, less the
    /// margin.
    Peak,
    /// be-memory: `safety.be_memory_limit_bytes` caps it.
    Capped,
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
            AdvertiseReason::Peak => "peak",
            AdvertiseReason::Capped => "capped",
        }
    }

    pub const ALL: [AdvertiseReason; 8] = [
        AdvertiseReason::Slo,
        AdvertiseReason::Floor,
        AdvertiseReason::Violating,
        AdvertiseReason::Untrusted,
        AdvertiseReason::Warming,
        AdvertiseReason::Damped,
        AdvertiseReason::Peak,
        AdvertiseReason::Capped,
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

/// The advertisers' unit-neutral output (values in the resource's unit): be-memory's as it is,
/// be-cpu's turned into [`Advertisement`] (whose field names the log and `ctl status` keep).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Advertised {
    pub resource: Resource,
    pub value: u64,
    pub reason: AdvertiseReason,
    /// The reason in words, with the figures.
    pub detail: String,
    pub floor: u64,
    /// What it would be without damping.
    pub target: u64,
    pub horizon: Horizon,
    pub last_change: Option<Change>,
}

/// The horizon's figures behind a target, in the resource's unit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Horizon {
    pub buckets: usize,
    pub troubled_buckets: usize,
    pub covered_s: f64,
    pub horizon_s: f64,
    pub percentile: f64,
    /// The percentile of the buckets' values, and their least and most.
    pub percentile_value: u64,
    pub min: u64,
    pub max: u64,
    pub margin: u64,
    /// The cap on the target, where one is set (be-memory: `safety.be_memory_limit_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u64>,
}

/// A change of an advertised value, in the resource's unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub t_ms: u64,
    /// `None`: the first value.
    pub from: Option<u64>,
    pub to: u64,
    pub reason: AdvertiseReason,
    pub detail: String,
}

impl From<Horizon> for HorizonFigures {
    fn from(h: Horizon) -> Self {
        HorizonFigures {
            buckets: h.buckets,
            troubled_buckets: h.troubled_buckets,
            covered_s: h.covered_s,
            horizon_s: h.horizon_s,
            percentile: h.percentile,
            percentile_millicpu: h.percentile_value,
            min_millicpu: h.min,
            max_millicpu: h.max,
            margin_millicpu: h.margin,
        }
    }
}

impl From<Change> for AdvertiseChange {
    fn from(c: Change) -> Self {
        AdvertiseChange {
            t_ms: c.t_ms,
            from_millicpu: c.from,
            to_millicpu: c.to,
            reason: c.reason,
            detail: c.detail,
        }
    }
}

impl From<Advertised> for Advertisement {
    fn from(a: Advertised) -> Self {
        Advertisement {
            value_millicpu: a.value,
            reason: a.reason,
            detail: a.detail,
            floor_millicpu: a.floor,
            target_millicpu: a.target,
            horizon: a.horizon.into(),
            last_change: a.last_change.map(Into::into),
        }
    }
}

/// What one tick fed the be-memory advertiser (from the tick's observation and the floor).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryInput {
    /// What BE could hold now: the node's memory less what the LC and the system use, bytes
    /// (0 where untrusted).
    pub room_bytes: u64,
    /// MemTotal, and what the LC groups hold (`memory.current` / `memory.usage_in_bytes`).
    pub total_bytes: u64,
    pub lc_bytes: Option<u64>,
    pub health: LcHealth,
    /// The sum of `headroom.io/be-memory` requested by the pods bound to the node, bytes.
    pub floor_bytes: u64,
}

/// `ctl status`'s `advertise`: the advertisement and what the API took of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdvertiseStatus {
    /// `None` until the first tick with the floor known.
    pub advertisement: Option<Advertisement>,
    /// `headroom.io/be-memory` (bytes), `None` until the first tick with the floor known.
    pub memory: Option<Advertised>,
    /// The be-memory advertiser's last input (the node's memory figures behind it).
    pub memory_input: Option<MemoryInput>,
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
    /// The sum of `headroom.io/be-memory` requested by the node's bound pods, bytes.
    pub floor_memory_bytes: u64,
    /// The be-memory value the API last accepted, bytes.
    pub published_memory_bytes: Option<u64>,
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
