//! `[kubernetes] advertise`: each tick the pure [`Advertiser`] is fed what the policy granted BE
//! and how the LCs stood, and the pure [`MemoryAdvertiser`] the room the node's memory left BE;
//! a change of either is handed to the edge (headroom-kube's publisher, connected by the
//! binary) with the other's value, which patches both into the Node in one patch on its own
//! thread — the control loop never waits on the API. The floors are the edge's (a watch of the
//! node's bound pods, kept current there).
//!
//! The tick's input is computed in the record phase, from the observation the policy decided
//! on, and logged with the decision ([`AdvertiseInput`]): `--replay` feeds the same inputs to
//! the same advertiser and checks every logged change. be-memory's changes are logged too
//! (`advertise_memory` lines); its input is the host's memory, which replay passes by.
//!
//! On exit nothing is patched: the node keeps the last value published, which was never below
//! the floor of pods then bound, so kubelet rejects none of them on a restart; a node whose agent
//! is gone stops being offered *more* only when another agent publishes (docs/kubernetes.md).

use std::sync::Arc;

use headroom_control::advertise::memory::MemoryAdvertiser;
use headroom_control::advertise::{
    AdvertiseChange, AdvertiseInput, AdvertiseParams, AdvertiseReason, Advertised, Advertisement,
    Advertiser, Change, LcHealth, MemoryInput, Resource, Tick,
};
use headroom_types::advertise::{AdvertiseEdgeStatus, AdvertiseStatus};
use headroom_types::observation::Observation;

use super::Agent;
use crate::publish::metrics::ServiceSlo;

/// Where the advertised value goes: never blocks (the edge patches on its own thread).
pub trait AdvertiseEdge: Send + Sync {
    /// The values to advertise, be-cpu in milli-CPUs and be-memory in bytes (one patch).
    fn set(&self, millicpu: u64, memory_bytes: u64);
    /// The floor: what the node's bound pods requested, milli-CPUs; `None` until the first
    /// list of them arrived (nothing is advertised before: a value below pods already bound
    /// would make kubelet reject them on a restart).
    fn floor_millicpu(&self) -> Option<u64>;
    /// The be-memory floor, bytes; `None` until the first list (as [`Self::floor_millicpu`]).
    fn floor_memory_bytes(&self) -> Option<u64>;
    /// What the edge has done (`ctl status`): the value the API took, errors.
    fn state(&self) -> AdvertiseEdgeStatus;
}

/// The connected edge (shared so [`super::AgentOptions`] stays `Clone`).
#[derive(Clone)]
pub struct AdvertiseLink(pub Arc<dyn AdvertiseEdge>);

impl std::fmt::Debug for AdvertiseLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdvertiseLink")
    }
}

/// What the record phase needs to compute a tick's [`AdvertiseInput`] (set before each tick
/// while the floor is known).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdvertiseCtx {
    pub floor_millicpu: u64,
    pub floor_memory_bytes: u64,
    pub machine_cpus: u32,
    /// The advertiser's bucket width: a run of identical decisions in the log ends at a bucket's
    /// edge, so replay sees a tick in every bucket the live advertiser saw.
    pub bucket_ms: u64,
    pub latency_max_age_ms: u64,
}

/// The advertiser's feed through the publisher: the context before the tick, the input the
/// record phase computed (and logged), taken by [`Agent::advertise_tick`].
#[derive(Debug, Clone, Default)]
pub struct AdvertiseFeed {
    pub ctx: Option<AdvertiseCtx>,
    pub input: Option<AdvertiseInput>,
    pub memory_input: Option<MemoryInput>,
}

/// The running advertisers and their edge.
pub(super) struct AdvertiseLive {
    pub advertiser: Advertiser,
    pub memory: MemoryAdvertiser,
    pub edge: AdvertiseLink,
    pub last: Option<Advertisement>,
    pub last_memory: Option<Advertised>,
    pub last_memory_input: Option<MemoryInput>,
}

/// One tick of both advertisers: each one's advertisement and the change it made.
pub(super) struct Fed {
    pub cpu: (Advertisement, Option<AdvertiseChange>),
    pub memory: (Advertised, Option<Change>),
}

impl AdvertiseLive {
    /// `params` for be-cpu, `memory_params` for be-memory
    /// (`KubernetesConfig::advertise_memory_params`).
    pub(super) fn new(
        params: AdvertiseParams,
        memory_params: AdvertiseParams,
        edge: AdvertiseLink,
    ) -> AdvertiseLive {
        AdvertiseLive {
            advertiser: Advertiser::new(params),
            memory: MemoryAdvertiser::new(memory_params),
            edge,
            last: None,
            last_memory: None,
            last_memory_input: None,
        }
    }

    /// The context of the next tick's input: `None` while the floor is unknown (nothing is fed
    /// or set: a value below pods already bound would make kubelet reject them on a restart).
    pub(super) fn ctx(&self, machine_cpus: u32, latency_max_age_ms: u64) -> Option<AdvertiseCtx> {
        Some(AdvertiseCtx {
            floor_millicpu: self.edge.0.floor_millicpu()?,
            floor_memory_bytes: self.edge.0.floor_memory_bytes()?,
            machine_cpus,
            bucket_ms: self.advertiser.params().bucket_ms,
            latency_max_age_ms,
        })
    }

    /// Feeds one tick's inputs to both advertisers and hands a change of either to the edge,
    /// both values together.
    pub(super) fn feed(&mut self, t_ms: u64, input: &AdvertiseInput, memory: &MemoryInput) -> Fed {
        let (ad, change) = self.advertiser.update(&Tick::of(t_ms, input));
        let (mem, mem_change) = self.memory.update(t_ms, memory);
        if change.is_some() || mem_change.is_some() {
            self.edge.0.set(ad.value_millicpu, mem.value);
        }
        self.last = Some(ad.clone());
        self.last_memory = Some(mem.clone());
        self.last_memory_input = Some(memory.clone());
        Fed {
            cpu: (ad, change),
            memory: (mem, mem_change),
        }
    }
}

/// How the LCs stood this tick: a violation names the service; no fresh latency, an untrusted
/// figure or BE held for want of a signal is untrusted. The discovery holder's group is
/// observed too, with no latency ever, and is no service: judging it kept a discovering node's
/// value at its floor whatever BE was granted (16 vCPUs, `headroom bench advertise`,
/// 2026-11-30); with no service besides it, untrusted.
pub(super) fn health(
    obs: &Observation,
    single_slo_us: f64,
    lcs: &[ServiceSlo],
    max_age_ms: u64,
    held_off: Option<&str>,
) -> LcHealth {
    if let Some(why) = held_off {
        return LcHealth::Untrusted {
            reason: why.to_string(),
        };
    }
    if let Some(why) = &obs.lc_latency_untrusted {
        return LcHealth::Untrusted {
            reason: why.clone(),
        };
    }
    let judge = |name: &str, lat: Option<f64>, age: Option<u64>, slo: f64| -> Option<LcHealth> {
        match (lat, age) {
            (Some(l), Some(a)) if a <= max_age_ms => {
                (slo > 0.0 && l > slo).then(|| LcHealth::Violating {
                    lc: name.to_string(),
                })
            }
            _ => Some(LcHealth::Untrusted {
                reason: format!("no fresh latency for LC {name}"),
            }),
        }
    };
    if obs.lc_groups.is_empty() {
        let name = lcs.first().map_or("lc", |s| s.name.as_str());
        return judge(
            name,
            obs.lc_latency_us,
            obs.lc_latency_age_ms,
            single_slo_us,
        )
        .unwrap_or(LcHealth::Held);
    }
    let holder = |name: &str| {
        name == headroom_control::config::HOLDER_NAME && !lcs.iter().any(|s| s.name == name)
    };
    let mut judged = 0;
    for g in obs.lc_groups.iter().filter(|g| !holder(&g.name)) {
        judged += 1;
        let slo = lcs
            .iter()
            .find(|s| s.name == g.name)
            .map_or(single_slo_us, |s| s.slo_us);
        if let Some(h) = judge(&g.name, g.latency_us, g.latency_age_ms, slo) {
            return h;
        }
    }
    if judged == 0 {
        return LcHealth::Untrusted {
            reason: "no LC service on this node (discovery found none)".to_string(),
        };
    }
    LcHealth::Held
}

impl Agent {
    /// Before a tick: what its record phase needs to compute the advertiser's input.
    pub(super) fn advertise_prepare(&mut self) {
        let cpus = self.machine.cpus.len() as u32;
        let max_age = self.config.safety.latency_max_age_ms;
        self.publisher.advertise.ctx = self.advertise.as_ref().and_then(|l| l.ctx(cpus, max_age));
        self.publisher.advertise.input = None;
        self.publisher.advertise.memory_input = None;
    }

    /// One tick of the advertiser (after the policy decided): never blocks.
    pub(super) fn advertise_tick(&mut self, t_ms: u64) {
        if let Some(live) = self.advertise.as_mut() {
            self.publisher.step_advertiser(live, t_ms);
        }
    }
}

impl AdvertiseLive {
    /// `ctl status`'s `advertise`.
    pub(super) fn status(&self) -> AdvertiseStatus {
        AdvertiseStatus {
            advertisement: self.last.clone(),
            memory: self.last_memory.clone(),
            memory_input: self.last_memory_input.clone(),
            edge: self.edge.0.state(),
        }
    }
}

/// A change in the agent's log (the decision log has its own line).
pub(super) fn log_change(
    resource: Resource,
    from: Option<u64>,
    to: u64,
    reason: AdvertiseReason,
    detail: &str,
) {
    tracing::info!(
        resource = resource.name(),
        from = ?from,
        to,
        reason = reason.as_str(),
        "kubernetes advertise: {} {} → {}: {}",
        resource.name(),
        from.map_or("none".to_string(), |v| resource.show(v)),
        resource.show(to),
        detail
    );
}

#[cfg(test)]
#[path = "advertise_tests.rs"]
mod tests;
