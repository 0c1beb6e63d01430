//! `[kubernetes] discover`: the LC sets the discovery publishes (headroom-kube, connected by
//! the binary) taken in between ticks. Each discovered pod the agent accepts becomes a service:
//! its sources started, its group sampled (never created, moved into or removed: it is
//! kubelet's), its SLO given to the policy through [`headroom_control::discovered::policy_config`] (the
//! change logged for `--replay`). A pod that goes has its sources stopped; a group that
//! vanished first only costs sensor errors until the set drops it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_types::discovery::{LcSet, PodRefusal, NO_LATENCY_PORT};
use headroom_types::GroupPath;

use super::lc_events::LcEvents;
use super::lc_sources::service_signals;
use super::Agent;
use crate::sensors::lc_services::LcServiceSensor;
use crate::sensors::lc_signal::StopFlag;
use crate::state;
use headroom_control::config::LcConfig;
use headroom_control::decision::CtlEvent;
use headroom_control::discovered::{accept, policy_config};

/// A discovered service the agent runs.
struct Running {
    config: LcConfig,
    stop: StopFlag,
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    fn stop(self) -> Vec<JoinHandle<()>> {
        self.stop.store(true, Ordering::SeqCst);
        crate::sensors::wake(&self.threads);
        self.threads
    }
}

/// The discovery as the agent last took it.
pub(super) struct KubeLive {
    events: LcEvents,
    /// The last set taken, with the agent's own refusals added to `refused`.
    set: LcSet,
    running: Vec<Running>,
    /// Refusals of the agent's own (a static [lc]'s or BE's group) since start.
    own_refusals: u64,
    /// One agent per group: the lock on each accepted pod's group directories, by pod, with
    /// the group it locks (a pod recreated under its name has another group).
    locks: BTreeMap<String, (GroupPath, state::GroupLock)>,
    /// The last set as the discovery sent it, retried while a pod's group is another
    /// agent's (taken once that agent lets go).
    raw: Option<LcSet>,
    lock_retry_at: Option<Instant>,
}

/// How often pods whose groups another agent holds are tried again.
const LOCK_RETRY: Duration = Duration::from_secs(1);

impl KubeLive {
    pub(super) fn new(events: LcEvents, node: &str) -> KubeLive {
        KubeLive {
            events,
            set: LcSet {
                node: node.to_string(),
                ..LcSet::default()
            },
            running: Vec::new(),
            own_refusals: 0,
            locks: BTreeMap::new(),
            raw: None,
            lock_retry_at: None,
        }
    }

    pub(super) fn set(&self) -> &LcSet {
        &self.set
    }

    /// The discovered services now, in the set's order.
    pub(super) fn services(&self) -> impl Iterator<Item = &LcConfig> {
        self.running.iter().map(|r| &r.config)
    }

    /// Stops every discovered service's sources; their threads, to join.
    pub(super) fn stop_all(&mut self) -> Vec<JoinHandle<()>> {
        self.running.drain(..).flat_map(Running::stop).collect()
    }

    /// Why BE is held for the discovery's sake, if it is: (metric label, line).
    pub(super) fn holding(&self, statics: usize) -> Option<(&'static str, String)> {
        if !self.set.synced {
            return Some((
                "kube_not_synced",
                "kubernetes: waiting for the first list of the node's pods: BE held at its minimum until it arrives".into(),
            ));
        }
        if statics == 0 && self.running.is_empty() {
            return Some((
                "kube_no_lc",
                format!(
                    "kubernetes: no LC pod on node {} ({} refused, {} waiting for their group): BE held at its minimum",
                    self.set.node,
                    self.set.refused.len(),
                    self.set.waiting.len()
                ),
            ));
        }
        // An LC measured by nothing: its latency is never known, so the safety rules hold BE
        // for it (docs/kubernetes.md); say so, naming the pods and the fix.
        let unmeasured: Vec<&str> = self
            .set
            .unmeasured
            .iter()
            .map(|u| u.pod.as_str())
            .filter(|p| self.running.iter().any(|r| r.config.name == *p))
            .collect();
        if !unmeasured.is_empty() {
            return Some((
                "kube_no_latency_port",
                format!(
                    "kubernetes: LC pod {} has {}: its latency is unknown, so BE is held at its minimum",
                    unmeasured.join(", "),
                    NO_LATENCY_PORT
                ),
            ));
        }
        None
    }
}

impl Agent {
    /// Locks the directories of a discovered pod's group (every hierarchy), as the static
    /// groups are locked at start; kept while the pod is an LC here. A dry run locks nothing.
    fn lock_pod_group(&self, kube: &mut KubeLive, c: &LcConfig) -> Result<(), state::StateError> {
        let Some(own) = &self.group_lock else {
            return Ok(());
        };
        match kube.locks.get(&c.name) {
            Some((group, _)) if *group == c.cgroup => return Ok(()),
            // The pod was recreated under its name (a new UID, a new group): the old group's
            // lock goes, the new one is taken.
            Some(_) => {
                kube.locks.remove(&c.name);
            }
            None => {}
        }
        // The pod's group and the groups above it, as for a configured group: an agent on a
        // parent of the pod's group (or inside it) is refused, and the reverse.
        let (dirs, above) = crate::group_lock::lock_keys(self.node.cgroups(), [&c.cgroup]);
        let lock =
            state::GroupLock::acquire_nested(own.dir(), &dirs, &above, own.holder().clone())?;
        kube.locks.insert(c.name.clone(), (c.cgroup.clone(), lock));
        Ok(())
    }

    /// Takes the newest LC set the discovery sent, if any (between ticks).
    pub(super) fn take_discovery(&mut self) {
        let Some(kube) = self.kube.as_mut() else {
            return;
        };
        // The source threads of services stopped before (each ends once it sees its flag).
        crate::sensors::join_ended(&mut self.threads);
        let set = match kube.events.latest() {
            Some(ev) => ev.set,
            // Pods refused because another agent held their groups: tried again.
            None => match (&kube.raw, kube.lock_retry_at) {
                (Some(raw), Some(at)) if Instant::now() >= at => raw.clone(),
                _ => return,
            },
        };
        self.take_lc_set(set);
    }

    fn take_lc_set(&mut self, mut set: LcSet) {
        let Some(mut kube) = self.kube.take() else {
            return;
        };
        kube.raw = Some(set.clone());
        kube.lock_retry_at = None;
        // The pods the agent accepts, and its own refusals (a static [lc]'s or BE's group).
        let mut accepted = Vec::new();
        let mut held_elsewhere = Vec::new();
        for d in &set.lcs {
            match accept(&self.config, d) {
                Ok(c) => match self.lock_pod_group(&mut kube, &c) {
                    Ok(()) => accepted.push(c),
                    Err(e) => {
                        let r = PodRefusal {
                            pod: d.name.clone(),
                            key: "cgroup".into(),
                            value: d.cgroup.to_string(),
                            reason: e.to_string(),
                        };
                        // Tried again every second: said when it is new, not at each try.
                        if !kube.set.refused.contains(&r) {
                            tracing::warn!(lc = %c.name, "kubernetes: pod refused as an LC: {e}");
                        }
                        set.refused.push(r);
                        held_elsewhere.push(d.name.clone());
                    }
                },
                Err(reason) => {
                    let r = PodRefusal {
                        pod: d.name.clone(),
                        key: reason.key().into(),
                        value: reason
                            .value()
                            .map_or_else(|| d.cgroup.to_string(), str::to_string),
                        reason: reason.to_string(),
                    };
                    if !kube.set.refused.contains(&r) {
                        tracing::warn!("kubernetes: pod refused as an LC: {reason}");
                        kube.own_refusals += 1;
                    }
                    set.refused.push(r);
                }
            }
        }
        // A pod another agent holds is not this agent's LC: out of the policy's set until its
        // lock is taken.
        set.lcs.retain(|d| !held_elsewhere.contains(&d.name));
        // Compared with the last set as the policy took it (the held pods out of both): a
        // retry that changes nothing is no change.
        let policy_changed = set.synced != kube.set.synced || set.lcs != kube.set.lcs;
        kube.locks
            .retain(|name, _| accepted.iter().any(|c: &LcConfig| &c.name == name));
        if !held_elsewhere.is_empty() {
            kube.lock_retry_at = Some(Instant::now() + LOCK_RETRY);
        }
        set.refusals_total += kube.own_refusals;
        set.unmeasured.retain(|u| {
            accepted
                .iter()
                .any(|c: &headroom_control::config::LcConfig| c.name == u.pod)
        });
        // Services that go, or whose sources must restart (another port or percentile);
        // the others keep their sources and take the new SLO and priority in place.
        let mut old: BTreeMap<String, Running> = kube
            .running
            .drain(..)
            .map(|r| (r.config.name.clone(), r))
            .collect();
        let mut running = Vec::new();
        let mut sensors: BTreeMap<String, LcServiceSensor> = self
            .node
            .sensors_mut()
            .map(|s| std::mem::take(s.lc_services_mut()))
            .unwrap_or_default()
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        for c in accepted {
            // A pod recreated under its name (StatefulSet) has a new UID and group: its sensor
            // samples the group, so it starts again on the new one.
            // (The one it replaces is stopped: dropped unstopped, its sensor threads ran on.)
            let kept = match old.remove(&c.name) {
                Some(r)
                    if r.config.latency == c.latency
                        && r.config.slo.percentile == c.slo.percentile
                        && r.config.cgroup == c.cgroup =>
                {
                    Some(r)
                }
                Some(r) => {
                    self.threads.extend(r.stop());
                    None
                }
                None => None,
            };
            match kept {
                Some(mut r) => {
                    if r.config != c {
                        tracing::info!(lc = %c.name, target_us = c.slo.target_us, priority = c.priority, "kubernetes: LC service changed in place");
                    }
                    r.config = c;
                    running.push(r);
                }
                None => {
                    let stop: StopFlag = Arc::new(AtomicBool::new(false));
                    let mut threads = Vec::new();
                    let signals = match service_signals(
                        &self.config,
                        &c,
                        &stop,
                        &mut threads,
                        &mut BTreeMap::new(),
                    ) {
                        Ok((signals, _cells)) => signals,
                        Err(e) => {
                            // Measured by nothing: its latency is unknown, the safety rules
                            // hold BE for it.
                            tracing::warn!(lc = %c.name, error = %e, "kubernetes: the LC's latency source did not start");
                            Default::default()
                        }
                    };
                    tracing::info!(lc = %c.name, cgroup = %c.cgroup, target_us = c.slo.target_us, "kubernetes: LC service added");
                    sensors.insert(
                        c.name.clone(),
                        LcServiceSensor::new(&c.name, c.cgroup.clone(), signals),
                    );
                    running.push(Running {
                        config: c,
                        stop,
                        threads,
                    });
                }
            }
        }
        for (name, r) in old {
            tracing::info!(lc = %name, "kubernetes: LC service gone");
            sensors.remove(&name);
            self.threads.extend(r.stop());
        }
        // The sensors in the runtime's order: the static services after the first, then the
        // discovered ones.
        let mut list: Vec<LcServiceSensor> = Vec::new();
        for lc in self.config.lcs.iter().skip(1) {
            list.extend(sensors.remove(&lc.name));
        }
        for r in &running {
            list.extend(sensors.remove(&r.config.name));
        }
        if let Some(s) = self.node.sensors_mut() {
            *s.lc_services_mut() = list;
        }
        kube.running = running;
        // What the metrics, status and the advertiser's health compare against: the services,
        // not the discovery holder, whose latency is never known.
        self.publisher.lcs = self
            .config
            .static_lcs()
            .iter()
            .chain(kube.services())
            .map(|l| crate::publish::metrics::ServiceSlo {
                name: l.name.clone(),
                slo_us: l.slo.target_us,
            })
            .collect();
        let m = &self.publisher.metrics;
        m.kube_refused.set(set.refused.len() as f64);
        m.kube_refusals_total.set(set.refusals_total as f64);
        m.kube_lcs.set(kube.running.len() as f64);
        if policy_changed {
            let pc = policy_config(&self.config, set.synced, &set.lcs);
            self.controller.policy_mut().reconfigure(&pc);
            let t_ms = self.t_ms();
            self.publisher.log_event(&CtlEvent::LcSet {
                t_ms,
                synced: set.synced,
                lcs: set.lcs.clone(),
            });
        }
        kube.set = set;
        self.kube = Some(kube);
        self.publisher.state_dirty = true;
    }
}
