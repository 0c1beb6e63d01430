//! `[kubernetes] advertise`: each tick the pure [`Advertiser`] is fed what the policy granted BE
//! and how the LCs stood; a change is handed to the edge (headroom-kube's publisher, connected
//! by the binary), which patches the Node on its own thread — the control loop never waits on
//! the API. The floor is the edge's (a watch of the node's bound pods, kept current there).
//!
//! The tick's input is computed in the record phase, from the observation the policy decided
//! on, and logged with the decision ([`AdvertiseInput`]): `--replay` feeds the same inputs to
//! the same advertiser and checks every logged change.
//!
//! On exit nothing is patched: the node keeps the last value published, which was never below
//! the floor of pods then bound, so kubelet rejects none of them on a restart; a node whose agent
//! is gone stops being offered *more* only when another agent publishes (docs/kubernetes.md).

use std::sync::Arc;

use headroom_control::advertise::{
    AdvertiseChange, AdvertiseInput, AdvertiseParams, Advertisement, Advertiser, LcHealth, Tick,
};
use headroom_types::advertise::{AdvertiseEdgeStatus, AdvertiseStatus};
use headroom_types::observation::Observation;

use super::Agent;
use crate::publish::metrics::ServiceSlo;

/// Where the advertised value goes: never blocks (the edge patches on its own thread).
pub trait AdvertiseEdge: Send + Sync {
    /// The value to advertise, milli-CPUs.
    fn set(&self, millicpu: u64);
    /// The floor: what the node's bound pods requested, milli-CPUs; `None` until the first
    /// list of them arrived (nothing is advertised before: a value below pods already bound
    /// would make kubelet reject them on a restart).
    fn floor_millicpu(&self) -> Option<u64>;
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
}

/// The running advertiser and its edge.
pub(super) struct AdvertiseLive {
    pub advertiser: Advertiser,
    pub edge: AdvertiseLink,
    pub last: Option<Advertisement>,
}

impl AdvertiseLive {
    pub(super) fn new(params: AdvertiseParams, edge: AdvertiseLink) -> AdvertiseLive {
        AdvertiseLive {
            advertiser: Advertiser::new(params),
            edge,
            last: None,
        }
    }

    /// The context of the next tick's input: `None` while the floor is unknown (nothing is fed
    /// or set: a value below pods already bound would make kubelet reject them on a restart).
    pub(super) fn ctx(&self, machine_cpus: u32, latency_max_age_ms: u64) -> Option<AdvertiseCtx> {
        Some(AdvertiseCtx {
            floor_millicpu: self.edge.0.floor_millicpu()?,
            machine_cpus,
            bucket_ms: self.advertiser.params().bucket_ms,
            latency_max_age_ms,
        })
    }

    /// Feeds one tick's input and hands a change to the edge.
    pub(super) fn feed(
        &mut self,
        t_ms: u64,
        input: &AdvertiseInput,
    ) -> (Advertisement, Option<AdvertiseChange>) {
        let (ad, change) = self.advertiser.update(&Tick::of(t_ms, input));
        if let Some(c) = &change {
            self.edge.0.set(c.to_millicpu);
        }
        self.last = Some(ad.clone());
        (ad, change)
    }
}

/// How the LCs stood this tick: a violation names the service; no fresh latency, an untrusted
/// figure or BE held for want of a signal is untrusted.
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
    for g in &obs.lc_groups {
        let slo = lcs
            .iter()
            .find(|s| s.name == g.name)
            .map_or(single_slo_us, |s| s.slo_us);
        if let Some(h) = judge(&g.name, g.latency_us, g.latency_age_ms, slo) {
            return h;
        }
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
            edge: self.edge.0.state(),
        }
    }
}

pub(super) fn log_change(c: &AdvertiseChange) {
    tracing::info!(
        from = ?c.from_millicpu,
        to = c.to_millicpu,
        reason = c.reason.as_str(),
        "kubernetes advertise: {} → {}m: {}",
        c.from_millicpu.map_or("none".to_string(), |v| format!("{v}m")),
        c.to_millicpu,
        c.detail
    );
}

#[cfg(test)]
#[path = "advertise_tests.rs"]
mod tests;
