//! The BE capacity a node advertises to the cluster, pure (docs/kubernetes.md):
//! `headroom.io/be-cpu` (milli-CPUs), what the policy has been able to give BE while every LC
//! held its SLO, and `headroom.io/be-memory` (bytes, [`memory`]), the node's memory less the
//! LC's and system's peak. One [`Engine`] serves both, in the resource's unit.
//!
//! Every tick feeds one sample: for be-cpu the BE CPUs the policy granted and whether every LC
//! held its SLO (or which one did not, or why the signal is untrusted); for be-memory the room
//! BE had and whether the memory figures were read. And the floor — the sum of the resource
//! requested by pods already bound to the node. The samples go into buckets over a horizon
//! (default an hour, so the diurnal peak is in view); a bucket that saw a violation or an
//! untrusted signal counts as 0. The target is a low percentile of the buckets less a margin,
//! capped where a cap is set, rounded down to a step; 0 while an LC violates or the signal is
//! untrusted. The advertised value:
//! - is never below the floor (kubelet never rejects or fails a pod it already admitted);
//! - falls at once (to the target, at worst to the floor);
//! - rises only by at least one step, at most once per damping period, and only after a
//!   damping period with no violation — so a flapping LC makes it fall once and stay down.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

pub use headroom_types::advertise::{
    AdvertiseChange, AdvertiseInput, AdvertiseReason, Advertised, Advertisement, Change, Horizon,
    HorizonFigures, LcHealth, MemoryInput, Resource, MEMORY_RESOURCE, RESOURCE,
};
use headroom_types::allocation::Allocation;

/// How the advertised value is derived (built from `[kubernetes]` by
/// [`crate::config::KubernetesConfig::advertise_params`] and
/// [`crate::config::Config::advertise_memory_params`], which validated it). Amounts are in the
/// resource's unit (milli-CPUs, bytes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdvertiseParams {
    /// How far back the samples are looked at, ms.
    pub horizon_ms: u64,
    /// Which low percentile of the horizon's buckets is the target (0 < p ≤ 100; 0: the least).
    pub percentile: f64,
    /// Taken off the percentile.
    pub margin: u64,
    /// The value moves in steps of this much (a rise must be a whole step).
    pub step: u64,
    /// The target is at most this, where set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u64>,
    /// At most one rise per this many ms, and only this long after the last violation.
    pub damping_ms: u64,
    /// The width of one horizon bucket, ms (a bucket keeps the least granted in it).
    pub bucket_ms: u64,
    /// How much of the horizon must be seen before anything above the floor is advertised, ms.
    pub min_history_ms: u64,
}

impl Default for AdvertiseParams {
    fn default() -> Self {
        AdvertiseParams {
            horizon_ms: 3_600_000,
            percentile: 10.0,
            margin: 200,
            step: 100,
            cap: None,
            damping_ms: 300_000,
            bucket_ms: 10_000,
            min_history_ms: 600_000,
        }
    }
}

/// One tick's input.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    /// ms since the agent started (the policy's clock).
    pub t_ms: u64,
    /// The BE CPUs the policy granted this tick, milli-CPUs ([`granted_millicpu`]).
    pub granted_millicpu: u64,
    pub health: LcHealth,
    /// The sum of `headroom.io/be-cpu` requested by the pods bound to the node.
    pub floor_millicpu: u64,
}

impl Tick {
    /// The tick at `t_ms` of a logged input.
    pub fn of(t_ms: u64, input: &AdvertiseInput) -> Tick {
        Tick {
            t_ms,
            granted_millicpu: input.granted_millicpu,
            health: input.health.clone(),
            floor_millicpu: input.floor_millicpu,
        }
    }
}

/// The BE CPUs an allocation grants, milli-CPUs: 0 when BE is disabled, else its cpuset's CPUs
/// (all `machine_cpus` without one), capped by its quota (a percentage of one CPU) when it has one. A weight alone grants
/// every CPU (work-conserving: BE may use what LC leaves).
pub fn granted_millicpu(a: &Allocation, machine_cpus: u32) -> u64 {
    if !a.be_enabled {
        return 0;
    }
    let cpus = a
        .be_cpus
        .as_ref()
        .map(|c| c.len() as u64)
        .unwrap_or(u64::from(machine_cpus));
    let milli = cpus * 1000;
    match a.be_quota_pct {
        Some(pct) if pct.is_finite() && pct >= 0.0 => {
            // Quota is a percentage of one CPU (150 = 1.5 CPUs: cpu.max's quota over its
            // period), as the write path and `Allocation::be_cpu_capacity` read it.
            let quota = (pct * 10.0).floor() as u64;
            milli.min(quota)
        }
        _ => milli,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Bucket {
    start_ms: u64,
    /// The least sample in the bucket (0 where the signal was troubled).
    least: u64,
    troubled: bool,
}

/// One tick's sample for an [`Engine`], in its resource's unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    pub t_ms: u64,
    /// be-cpu: the CPUs granted; be-memory: the room BE had.
    pub value: u64,
    pub health: &'a LcHealth,
    /// The sum of the resource requested by the pods bound to the node.
    pub floor: u64,
}

/// The advertising machinery of one resource: the horizon's buckets, the value, its last change.
#[derive(Debug, Clone)]
pub struct Engine {
    resource: Resource,
    params: AdvertiseParams,
    buckets: VecDeque<Bucket>,
    first_ms: Option<u64>,
    value: Option<u64>,
    last_change: Option<Change>,
    last_trouble_ms: Option<u64>,
}

impl Engine {
    pub fn new(resource: Resource, params: AdvertiseParams) -> Engine {
        Engine {
            resource,
            params,
            buckets: VecDeque::new(),
            first_ms: None,
            value: None,
            last_change: None,
            last_trouble_ms: None,
        }
    }

    pub fn params(&self) -> &AdvertiseParams {
        &self.params
    }

    /// The value now (`None` before the first tick).
    pub fn value(&self) -> Option<u64> {
        self.value
    }

    fn record(&mut self, s: &Sample) {
        let troubled = *s.health != LcHealth::Held;
        let sampled = if troubled { 0 } else { s.value };
        let bucket_ms = self.params.bucket_ms.max(1);
        let start = s.t_ms - s.t_ms % bucket_ms;
        match self.buckets.back_mut() {
            // A clock that went back stays in the newest bucket.
            Some(b) if b.start_ms >= start => {
                b.least = b.least.min(sampled);
                b.troubled |= troubled;
            }
            _ => self.buckets.push_back(Bucket {
                start_ms: start,
                least: sampled,
                troubled,
            }),
        }
        let horizon_start = s.t_ms.saturating_sub(self.params.horizon_ms);
        while self
            .buckets
            .front()
            .is_some_and(|b| b.start_ms + bucket_ms <= horizon_start)
        {
            self.buckets.pop_front();
        }
        if troubled {
            self.last_trouble_ms = Some(s.t_ms);
        }
    }

    fn figures(&self, t_ms: u64) -> Horizon {
        let mut values: Vec<u64> = self.buckets.iter().map(|b| b.least).collect();
        values.sort_unstable();
        let p = self.params.percentile;
        let percentile_value = if values.is_empty() {
            0
        } else {
            // Nearest rank.
            let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
            values[rank.clamp(1, values.len()) - 1]
        };
        let covered_ms = self
            .first_ms
            .map(|f| t_ms.saturating_sub(f).min(self.params.horizon_ms))
            .unwrap_or(0);
        Horizon {
            buckets: values.len(),
            troubled_buckets: self.buckets.iter().filter(|b| b.troubled).count(),
            covered_s: covered_ms as f64 / 1000.0,
            horizon_s: self.params.horizon_ms as f64 / 1000.0,
            percentile: p,
            percentile_value,
            min: values.first().copied().unwrap_or(0),
            max: values.last().copied().unwrap_or(0),
            margin: self.params.margin,
            cap: self.params.cap,
        }
    }

    /// The target while the signal holds: the percentile less the margin, capped, in steps.
    fn held_target(&self, h: &Horizon, step: u64) -> (AdvertiseReason, String, u64) {
        let show = |v: u64| self.resource.show(v);
        let less = h.percentile_value.saturating_sub(h.margin);
        let (reason, text) = match self.resource {
            Resource::BeCpu => (
                AdvertiseReason::Slo,
                format!(
                    "p{} of BE granted while every LC held its SLO over {:.0} s = {}m, less margin {}m",
                    h.percentile, h.covered_s, h.percentile_value, h.margin
                ),
            ),
            Resource::BeMemory => (
                AdvertiseReason::Peak,
                format!(
                    "the node's memory less the LC's and system's peak over {:.0} s leaves {}, less margin {}",
                    h.covered_s,
                    show(h.percentile_value),
                    show(h.margin)
                ),
            ),
        };
        match h.cap {
            Some(cap) if cap < less => (
                AdvertiseReason::Capped,
                format!(
                    "{text}; capped at {} (safety.be_memory_limit_bytes)",
                    show(cap)
                ),
                cap / step * step,
            ),
            _ => (reason, text, less / step * step),
        }
    }

    /// Takes one tick; the advertisement now, and the change this tick made (if any).
    pub fn update(&mut self, s: &Sample) -> (Advertised, Option<Change>) {
        self.first_ms.get_or_insert(s.t_ms);
        self.record(s);
        let h = self.figures(s.t_ms);
        let step = self.params.step.max(1);
        let floor = s.floor;
        let show = |v: u64| self.resource.show(v);
        let (cause, cause_detail, target) = match s.health {
            LcHealth::Violating { lc } => (
                AdvertiseReason::Violating,
                format!("LC {lc} violates its SLO"),
                0,
            ),
            LcHealth::Untrusted { reason } => (
                AdvertiseReason::Untrusted,
                format!("signal untrusted: {reason}"),
                0,
            ),
            LcHealth::Held if h.covered_s * 1000.0 < self.params.min_history_ms as f64 => (
                AdvertiseReason::Warming,
                format!(
                    "{:.0} s of the horizon seen, {:.0} s needed",
                    h.covered_s,
                    self.params.min_history_ms as f64 / 1000.0
                ),
                0,
            ),
            LcHealth::Held => self.held_target(&h, step),
        };
        let desired = target.max(floor);
        let (desired_reason, desired_detail) = if floor > target {
            (
                AdvertiseReason::Floor,
                format!(
                    "bound pods requested {} ({cause_detail}: {})",
                    show(floor),
                    show(target)
                ),
            )
        } else {
            (cause, cause_detail)
        };
        let quiet = |since: Option<u64>| {
            since.is_none_or(|t| s.t_ms.saturating_sub(t) >= self.params.damping_ms)
        };
        let (next, reason, detail) = match self.value {
            None => (desired, desired_reason, desired_detail),
            // The floor is a hard bound: a rise to it is never damped.
            Some(v) if v < floor => (desired, desired_reason, desired_detail),
            Some(v) if desired < v => (desired, desired_reason, desired_detail),
            Some(v) if desired >= v + step => {
                let last_rise_ok = quiet(self.last_change.as_ref().map(|c| c.t_ms));
                let trouble_ok = quiet(self.last_trouble_ms);
                if last_rise_ok && trouble_ok {
                    (desired, desired_reason, desired_detail)
                } else {
                    let why = if trouble_ok {
                        "the last change"
                    } else {
                        "the last violation or untrusted signal"
                    };
                    (
                        v,
                        AdvertiseReason::Damped,
                        format!(
                            "target {} ({desired_detail}); held until {} s after {why}",
                            show(desired),
                            self.params.damping_ms / 1000
                        ),
                    )
                }
            }
            // Within a step above: no change (hysteresis); the reason is the target's.
            Some(v) => (v, desired_reason, desired_detail),
        };
        let change = (self.value != Some(next)).then(|| Change {
            t_ms: s.t_ms,
            from: self.value,
            to: next,
            reason,
            detail: detail.clone(),
        });
        if let Some(c) = &change {
            self.last_change = Some(c.clone());
        }
        self.value = Some(next);
        let ad = Advertised {
            resource: self.resource,
            value: next,
            reason,
            detail,
            floor,
            target: desired,
            horizon: h,
            last_change: self.last_change.clone(),
        };
        (ad, change)
    }
}

/// The be-cpu advertiser: an [`Engine`] of milli-CPUs whose output keeps be-cpu's field names.
#[derive(Debug, Clone)]
pub struct Advertiser(Engine);

impl Advertiser {
    pub fn new(params: AdvertiseParams) -> Advertiser {
        Advertiser(Engine::new(Resource::BeCpu, params))
    }

    pub fn params(&self) -> &AdvertiseParams {
        self.0.params()
    }

    /// The value now (`None` before the first tick).
    pub fn value(&self) -> Option<u64> {
        self.0.value()
    }

    /// Takes one tick; the advertisement now, and the change this tick made (if any).
    pub fn update(&mut self, tick: &Tick) -> (Advertisement, Option<AdvertiseChange>) {
        let (ad, change) = self.0.update(&Sample {
            t_ms: tick.t_ms,
            value: tick.granted_millicpu,
            health: &tick.health,
            floor: tick.floor_millicpu,
        });
        (ad.into(), change.map(Into::into))
    }
}

#[path = "advertise_memory.rs"]
pub mod memory;

#[cfg(test)]
#[path = "advertise_tests.rs"]
mod tests;
