//! `multi`: several `[[lc]]` services on one server (issue 29).
//!
//! Every tick sees each service's slack = (target − latency) / target, from `obs.lc_groups`
//! (one entry per `[[lc]] name`; with one LC, the top-level `lc_*` fields). BE is bounded by
//! every service: the tightest slack (ties → the higher `priority`) drives `hybrid`'s outer
//! loop (Heracles Alg. 1), and the services' loads summed (`load = "sum"`: each load relative
//! to the service's peak alone on the server) or their maximum (`"max"`) is the load it
//! compares with `load_disable`/`load_enable`. `hybrid` itself runs unchanged on a view of the observation in
//! which the binding service's latency is scaled onto the first service's target (same slack).
//! A service whose latency is unknown makes the view's latency unknown (the outer loop holds);
//! one older than `safety.latency_max_age_ms` is the safety rules' (no growth, then BE disabled).
//!
//! With every service pinned (`[lc.threads] pin` + `cpus`, or an observed affinity narrower
//! than the machine) to disjoint CPU sets, the services own them and BE gets what none owns
//! (sets that intersect own nothing: the services are then judged as one LC on their CPUs,
//! BE as under `hybrid`, sharing them in `cpu.idle` where it has no others); blind
//! isolation's idle count is then the idle of the services' CPUs. Once per `interval_s`
//! (PARTIES' order, one step at a time): a service whose slack is below `upsize_slack` takes one
//! CPU, first from BE, then from the service with the most slack (lower priority on ties, which
//! must keep `donor_min_slack` and `min_service_cpus`); the next period judges the move by the
//! recipient's slack and reverts it when it did not improve. The sets are emitted in
//! `Allocation.lc_services`.

pub mod config;

use std::time::Duration;

use serde_json::json;

use super::hybrid::Hybrid;
use super::{secs, IdleCrossings, MachineInfo, Policy};
use crate::config::Config;
use config::LoadAggregate;
use headroom_types::allocation::Allocation;
use headroom_types::allocation::LcServiceCpus;
use headroom_types::decision::Decision;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;
use headroom_types::GroupPath;

/// One service's signals this tick.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Signal {
    /// `None`: unknown or stale.
    latency_us: Option<f64>,
    latency_age_ms: Option<u64>,
    load: Option<f64>,
    slack: Option<f64>,
}

/// Who gave the CPU of a move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Donor {
    Be,
    Service(usize),
}

/// A CPU move judged at the next arbitration.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Move {
    to: usize,
    from: Donor,
    cpu: u32,
    slack_before: f64,
}

#[derive(Debug, Clone)]
struct Service {
    name: String,
    cgroup: GroupPath,
    priority: i32,
    target_us: f64,
    /// Whether it has a load source (`[lc.load]`); one without is judged by latency alone.
    has_load: bool,
    /// The CPUs the service owns (sorted); empty = not pinned.
    cpus: Vec<u32>,
}

/// The `multi` policy.
#[derive(Debug, Clone)]
pub struct Multi {
    config: Config,
    machine: MachineInfo,
    hybrid: Hybrid,
    services: Vec<Service>,
    /// Whether the services' CPU sets were taken (from the config or the first observation).
    sets_known: bool,
    /// The union of those sets when they intersected (then none is owned: no moves, BE as
    /// under `hybrid` on these CPUs); empty otherwise.
    shared_cpus: Vec<u32>,
    pending: Option<Move>,
    next_arbitration: Option<Duration>,
    /// The last arbitration's event (a move, a kept move, a revert), for the state.
    last_event: Option<String>,
    explain: bool,
}

impl Multi {
    pub fn new(config: &Config, machine: &MachineInfo) -> Self {
        let services = config
            .lcs
            .iter()
            .map(|lc| Service {
                name: lc.name.clone(),
                cgroup: lc.cgroup.clone(),
                priority: lc.priority,
                target_us: lc.slo.target_us,
                has_load: lc.load.is_some(),
                cpus: if lc.threads.pin {
                    lc.threads.cpus.iter().collect()
                } else {
                    Vec::new()
                },
            })
            .collect::<Vec<_>>();
        Multi {
            config: config.clone(),
            machine: machine.clone(),
            hybrid: Hybrid::new(config, machine),
            sets_known: false,
            shared_cpus: Vec::new(),
            services,
            pending: None,
            next_arbitration: None,
            last_event: None,
            explain: true,
        }
    }

    /// Each service's signals, in config order: `obs.lc_groups` by name, or the top-level
    /// fields when the agent reports one LC.
    fn signals(&self, obs: &Observation) -> Vec<Signal> {
        // A stale latency still counts here, as in `hybrid`: the safety rules judge its age
        // per service (no growth, then BE disabled, naming the service).
        let make = |latency: Option<f64>, age: Option<u64>, load: Option<f64>, target: f64| {
            let known = latency.filter(|l| l.is_finite() && target > 0.0);
            Signal {
                latency_us: known,
                latency_age_ms: age,
                load,
                slack: known.map(|l| (target - l) / target),
            }
        };
        if obs.lc_groups.is_empty() {
            let target = self.services[0].target_us;
            let mut out = vec![make(
                obs.lc_latency_us,
                obs.lc_latency_age_ms,
                obs.lc_load,
                target,
            )];
            // several configured but one reported: the others are unknown
            out.resize(self.services.len(), make(None, None, None, 1.0));
            return out;
        }
        self.services
            .iter()
            .map(|s| match obs.lc_groups.iter().find(|g| g.name == s.name) {
                Some(g) => make(g.latency_us, g.latency_age_ms, g.load, s.target_us),
                None => make(None, None, None, s.target_us),
            })
            .collect()
    }

    /// The service that binds: the first unknown one (highest priority first), else the
    /// tightest slack (ties → higher priority, then config order).
    fn binding(&self, signals: &[Signal]) -> usize {
        let order = |a: &usize, b: &usize| {
            self.services[*b]
                .priority
                .cmp(&self.services[*a].priority)
                .then(a.cmp(b))
        };
        let mut idx: Vec<usize> = (0..self.services.len()).collect();
        idx.sort_by(order);
        if let Some(&i) = idx.iter().find(|&&i| signals[i].slack.is_none()) {
            return i;
        }
        idx.into_iter()
            .min_by(|a, b| {
                let (sa, sb) = (
                    signals[*a].slack.unwrap_or(0.0),
                    signals[*b].slack.unwrap_or(0.0),
                );
                sa.total_cmp(&sb).then(order(a, b))
            })
            .unwrap_or(0)
    }

    /// Takes each service's CPU set from the config, else from its observed affinity (when
    /// narrower than the machine), once.
    fn learn_sets(&mut self, obs: &Observation) {
        if self.sets_known {
            return;
        }
        self.sets_known = true;
        for s in &mut self.services {
            if !s.cpus.is_empty() {
                continue;
            }
            let observed = obs
                .lc_groups
                .iter()
                .find(|g| g.name == s.name)
                .and_then(|g| g.cpus.clone())
                .or_else(|| {
                    (self.config.lcs.len() == 1)
                        .then(|| obs.lc_cpus.clone())
                        .flatten()
                });
            if let Some(mut cpus) = observed {
                if !self.machine.cpus.iter().all(|c| cpus.contains(c)) {
                    cpus.sort_unstable();
                    cpus.dedup();
                    s.cpus = cpus;
                }
            }
        }
        // Services that share CPUs own none of them: there is nothing to move between them,
        // and "BE gets what no service owns" would leave BE nothing where hybrid shares the
        // services' CPUs with it in `cpu.idle` (two LCs both on the server's CPUs did exactly
        // this on 16 vCPUs: BE held at 0 CPUs for the whole run). They are judged as one LC.
        // (re-learned when the service set changes: the old union says nothing of the new one)
        self.shared_cpus.clear();
        if self.sets_overlap() {
            self.shared_cpus = self.union();
            for s in &mut self.services {
                s.cpus.clear();
            }
        }
    }

    /// Whether two services' CPU sets intersect.
    fn sets_overlap(&self) -> bool {
        self.services.iter().enumerate().any(|(i, a)| {
            self.services[i + 1..]
                .iter()
                .any(|b| a.cpus.iter().any(|c| b.cpus.contains(c)))
        })
    }

    /// Whether every service owns a CPU set (PARTIES' moves need owners).
    fn pinned(&self) -> bool {
        self.services.iter().all(|s| !s.cpus.is_empty())
    }

    fn union(&self) -> Vec<u32> {
        let mut u: Vec<u32> = self.services.iter().flat_map(|s| s.cpus.clone()).collect();
        u.sort_unstable();
        u.dedup();
        u
    }

    /// CPUs no service owns (BE's).
    fn pool(&self) -> Vec<u32> {
        let u = self.union();
        self.machine
            .cpus
            .iter()
            .copied()
            .filter(|c| !u.contains(c))
            .collect()
    }

    fn give(&mut self, cpu: u32, to: Option<usize>, from: Option<usize>) {
        if let Some(f) = from {
            self.services[f].cpus.retain(|&c| c != cpu);
        }
        if let Some(t) = to {
            let cpus = &mut self.services[t].cpus;
            if !cpus.contains(&cpu) {
                cpus.push(cpu);
                cpus.sort_unstable();
            }
        }
    }

    /// One PARTIES step: judge the pending move, else move one CPU to the service most in need.
    fn arbitrate(&mut self, signals: &[Signal]) -> Option<String> {
        let m = &self.config.policy.multi;
        let (upsize, donor_min, gain, keep) = (
            m.upsize_slack,
            m.donor_min_slack,
            m.revert_min_gain,
            m.min_service_cpus as usize,
        );
        let mut kept = None;
        if let Some(p) = self.pending.take() {
            let name = self.services[p.to].name.clone();
            let Some(now) = signals[p.to].slack else {
                // not measured yet: judge it at the next period
                self.pending = Some(p);
                return None;
            };
            if now <= p.slack_before + gain {
                let back = match p.from {
                    Donor::Be => None,
                    Donor::Service(i) => Some(i),
                };
                self.give(p.cpu, back, Some(p.to));
                return Some(format!("multi:no-gain:revert:{name}"));
            }
            kept = Some(format!("multi:move-kept:{name}"));
        }
        self.next_move(signals, upsize, donor_min, keep).or(kept)
    }

    /// Moves one CPU to the service most short of slack, if one is below `upsize`.
    fn next_move(
        &mut self,
        signals: &[Signal],
        upsize: f64,
        donor_min: f64,
        keep: usize,
    ) -> Option<String> {
        let prio = |i: usize| self.services[i].priority;
        let to = (0..self.services.len())
            .filter(|&i| signals[i].slack.is_some_and(|s| s < upsize))
            .min_by(|&a, &b| {
                let (sa, sb) = (
                    signals[a].slack.unwrap_or(0.0),
                    signals[b].slack.unwrap_or(0.0),
                );
                sa.total_cmp(&sb)
                    .then(prio(b).cmp(&prio(a)))
                    .then(a.cmp(&b))
            })?;
        let slack_before = signals[to].slack?;
        let name = self.services[to].name.clone();
        // the cheapest resource first: a CPU BE holds (the lowest: BE takes from the top)
        if let Some(&cpu) = self.pool().first() {
            self.give(cpu, Some(to), None);
            self.pending = Some(Move {
                to,
                from: Donor::Be,
                cpu,
                slack_before,
            });
            return Some(format!("multi:cpu-from-be:{name}"));
        }
        let from = (0..self.services.len())
            .filter(|&i| i != to && self.services[i].cpus.len() > keep)
            .filter(|&i| signals[i].slack.is_some_and(|s| s >= donor_min))
            .max_by(|&a, &b| {
                let (sa, sb) = (
                    signals[a].slack.unwrap_or(0.0),
                    signals[b].slack.unwrap_or(0.0),
                );
                sa.total_cmp(&sb)
                    .then(prio(b).cmp(&prio(a)))
                    .then(b.cmp(&a))
            });
        let Some(from) = from else {
            return Some(format!("multi:no-donor:{name}"));
        };
        let cpu = *self.services[from].cpus.last().expect("donor keeps a CPU");
        self.give(cpu, Some(to), Some(from));
        self.pending = Some(Move {
            to,
            from: Donor::Service(from),
            cpu,
            slack_before,
        });
        Some(format!(
            "multi:cpu-from-{}:{name}",
            self.services[from].name
        ))
    }

    /// The observation `hybrid` decides on: the binding service's latency scaled onto the first
    /// service's target (so hybrid's slack is the binding slack), the highest load, the
    /// services' CPUs as the LC's, and their idle as the idle count.
    fn view(&self, obs: &Observation, signals: &[Signal], binding: usize) -> Observation {
        let mut v = obs.clone();
        let b = &signals[binding];
        let all_known = signals.iter().all(|s| s.slack.is_some());
        let target0 = self.config.lc().slo.target_us;
        let target_b = self.services[binding].target_us;
        v.lc_latency_us = if all_known {
            // exact when the targets agree (one LC: `hybrid`'s very input)
            b.latency_us.map(|l| {
                if target_b == target0 {
                    l
                } else {
                    target0 * l / target_b
                }
            })
        } else {
            None
        };
        v.lc_latency_age_ms = b.latency_age_ms;
        // Services with no load source at all (discovered pods: no `[lc.load]`) are judged by
        // their latency alone; the others' loads make the aggregate (0 when none has one).
        let loaded = || {
            signals
                .iter()
                .zip(&self.services)
                .filter(|(_, svc)| svc.has_load)
        };
        v.lc_load = if loaded().all(|(s, _)| s.load.is_some()) {
            let loads = loaded().filter_map(|(s, _)| s.load);
            match self.config.policy.multi.load {
                LoadAggregate::Sum => loads.reduce(|a, b| a + b),
                LoadAggregate::Max => loads.reduce(f64::max),
            }
            .or(Some(0.0))
        } else {
            None
        };
        let lc_cpus = if self.pinned() {
            Some(self.union())
        } else {
            (!self.shared_cpus.is_empty()).then(|| self.shared_cpus.clone())
        };
        if let Some(union) = lc_cpus {
            if let Some(per_cpu) = &obs.cpu_idle {
                let idle: f64 = union
                    .iter()
                    .filter_map(|&c| per_cpu.get(c as usize))
                    .filter(|f| f.is_finite())
                    .map(|f| f.clamp(0.0, 1.0))
                    .sum();
                v.idle_cpus = Some(idle);
            }
            v.lc_cpus = Some(union);
        }
        v
    }

    fn lc_services(&self) -> Vec<LcServiceCpus> {
        if !self.pinned() {
            return Vec::new();
        }
        self.services
            .iter()
            .map(|s| LcServiceCpus {
                name: s.name.clone(),
                cgroup: s.cgroup.clone(),
                cpus: CpuSet::from(s.cpus.as_slice()),
            })
            .collect()
    }
}

impl Policy for Multi {
    fn name(&self) -> &'static str {
        "multi"
    }

    fn decide(&mut self, obs: &Observation, now: Duration) -> Decision {
        self.learn_sets(obs);
        let signals = self.signals(obs);
        let binding = self.binding(&signals);
        let mut event = None;
        if self.pinned() && self.next_arbitration.is_none_or(|t| now >= t) {
            let interval = self
                .config
                .policy
                .multi
                .interval_s
                .unwrap_or(self.config.lc().slo.window_s);
            self.next_arbitration = Some(now + secs(interval));
            event = self.arbitrate(&signals);
            if event.is_some() {
                self.last_event.clone_from(&event);
            }
        }
        let view = self.view(obs, &signals, binding);
        let d = self.hybrid.decide(&view, now);
        let mut allocation = d.allocation;
        if self.pinned() {
            // BE gets only what no service owns (services owning every CPU read as "not
            // pinned" to the single-LC helpers, which would share them with BE)
            let pool = self.pool();
            if let Some(cpus) = &mut allocation.be_cpus {
                *cpus = cpus.iter().filter(|c| pool.contains(c)).collect();
                if cpus.is_empty() {
                    allocation.be_cpus = None;
                    allocation.be_enabled = false;
                    allocation.be_cpu_idle = None;
                    allocation.be_quota_pct = None;
                    allocation.be_quota_period_us = None;
                }
            }
        }
        allocation.lc_services = self.lc_services();
        let binding_name = self.services[binding].name.clone();
        let unknown = signals[binding].slack.is_none();
        let tail = d.reason.trim_start_matches("hybrid:");
        let reason = match (&event, unknown) {
            // a move changes what the services own: it explains the tick best
            (Some(e), _) if !e.starts_with("multi:move-kept") => e.clone(),
            (_, true) if tail.starts_with("no-latency-or-load") => {
                format!("multi:latency-unknown:hold:{binding_name}")
            }
            _ => format!("multi:{tail}"),
        };
        let state = if self.explain {
            json!({
                "binding": binding_name,
                "services": self.services.iter().zip(&signals).map(|(s, g)| json!({
                    "name": s.name,
                    "priority": s.priority,
                    "slack": g.slack,
                    "load": g.load,
                    "cpus": CpuSet::from(s.cpus.as_slice()),
                })).collect::<Vec<_>>(),
                "pending": self.pending.map(|p| json!({
                    "to": self.services[p.to].name,
                    "from": match p.from {
                        Donor::Be => "be".to_string(),
                        Donor::Service(i) => self.services[i].name.clone(),
                    },
                    "cpu": p.cpu,
                    "slack_before": p.slack_before,
                })),
                "last_event": self.last_event,
                "next_arbitration_ms": self.next_arbitration.map(|t| t.as_millis() as u64),
                "shared_cpus": CpuSet::from(self.shared_cpus.as_slice()),
                "hybrid": d.state,
            })
        } else {
            serde_json::Value::Null
        };
        Decision {
            allocation,
            reason,
            state,
            binding_lc: Some(binding_name),
        }
    }

    fn poll_interval(&self) -> Duration {
        self.hybrid.poll_interval()
    }

    fn idle_buffer(&self) -> Option<f64> {
        self.hybrid.idle_buffer()
    }

    fn idle_crossings_matter(&self) -> bool {
        self.hybrid.idle_crossings_matter()
    }

    /// Hybrid's: none while BE is off, the inner loop's sides while it runs.
    fn idle_crossings(&self) -> IdleCrossings {
        self.hybrid.idle_crossings()
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
        self.hybrid.set_explain(on);
    }

    fn applied(&mut self, allocation: &Allocation) {
        self.hybrid.applied(allocation);
    }

    fn reconfigure(&mut self, config: &Config) {
        self.hybrid.reconfigure(config);
        let before: Vec<String> = self.services.iter().map(|s| s.name.clone()).collect();
        let after: Vec<String> = config.lcs.iter().map(|l| l.name.clone()).collect();
        if before == after {
            for s in &mut self.services {
                if let Some(lc) = config.lcs.iter().find(|l| l.name == s.name) {
                    s.priority = lc.priority;
                    s.target_us = lc.slo.target_us;
                }
            }
        } else {
            // The service set changed (Kubernetes discovery): services that stay keep the CPU
            // sets they had; new ones learn theirs from the next observation; a move in
            // flight is dropped (its indexes no longer mean the same services).
            let old = std::mem::take(&mut self.services);
            let fresh = Multi::new(config, &self.machine).services;
            self.services = fresh
                .into_iter()
                .map(|mut s| {
                    if let Some(o) = old.iter().find(|o| o.name == s.name) {
                        if s.cpus.is_empty() {
                            s.cpus.clone_from(&o.cpus);
                        }
                    }
                    s
                })
                .collect();
            self.sets_known = false;
            self.pending = None;
        }
        self.config = config.clone();
    }

    fn set_param(&mut self, key: &str, value: &str) -> Result<(), crate::config::ConfigError> {
        let mut updated = self.config.clone();
        updated.set(key, value)?;
        self.reconfigure(&updated);
        Ok(())
    }
}
