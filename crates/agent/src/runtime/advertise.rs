//! `[kubernetes] advertise`: each tick the pure [`Advertiser`] is fed what the policy granted BE
//! and how the LCs stood; a change is handed to the edge (headroom-kube's publisher, connected
//! by the binary), which patches the Node on its own thread — the control loop never waits on
//! the API. The floor is the edge's (a watch of the node's bound pods, kept current there).
//!
//! On exit nothing is patched: the node keeps the last value published, which was never below
//! the floor of pods then bound, so kubelet rejects none of them on a restart; a node whose agent
//! is gone stops being offered *more* only when another agent publishes (docs/kubernetes.md).

use std::sync::Arc;

use headroom_control::advertise::{
    granted_millicpu, AdvertiseChange, AdvertiseParams, Advertisement, Advertiser, LcHealth, Tick,
};
use headroom_control::decision::CtlEvent;
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

    /// Feeds one tick (what the policy granted BE, how the LCs stood, the edge's floor) and
    /// hands a change to the edge. `None` while the floor is unknown: nothing is fed or set.
    pub(super) fn step(
        &mut self,
        t_ms: u64,
        granted_millicpu: u64,
        health: LcHealth,
    ) -> Option<(Advertisement, Option<AdvertiseChange>)> {
        let floor_millicpu = self.edge.0.floor_millicpu()?;
        let tick = Tick {
            t_ms,
            granted_millicpu,
            health,
            floor_millicpu,
        };
        let (ad, change) = self.advertiser.update(&tick);
        if let Some(c) = &change {
            self.edge.0.set(c.to_millicpu);
        }
        self.last = Some(ad.clone());
        Some((ad, change))
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
    /// One tick of the advertiser (after the policy decided): never blocks.
    pub(super) fn advertise_tick(&mut self, t_ms: u64) {
        let Some(live) = self.advertise.as_mut() else {
            return;
        };
        let Some(allocation) = self.publisher.last_allocation.as_ref() else {
            return;
        };
        let granted = granted_millicpu(allocation, self.machine.cpus.len() as u32);
        let obs = self
            .node
            .sensors()
            .map(|s| s.last().clone())
            .unwrap_or_default();
        let h = health(
            &obs,
            self.publisher.slo_us,
            &self.publisher.lcs,
            self.config.safety.latency_max_age_ms,
            self.publisher.be_held_off.as_deref(),
        );
        let Some((ad, change)) = live.step(t_ms, granted, h) else {
            return;
        };
        if let Some(c) = &change {
            log_change(c);
            self.publisher.log_event(&CtlEvent::Advertise {
                t_ms: c.t_ms,
                from_millicpu: c.from_millicpu,
                to_millicpu: c.to_millicpu,
                reason: c.reason,
                detail: c.detail.clone(),
                floor_millicpu: ad.floor_millicpu,
            });
        }
        self.publisher
            .metrics
            .be_cpu_advertised(ad.value_millicpu, ad.reason.as_str());
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

fn log_change(c: &AdvertiseChange) {
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
