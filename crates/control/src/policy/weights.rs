//! Blagodurov et al., weight-based collocation.
//!
//! Static (§IV): critical groups get CPU weight 10000, batch 2 (v2: 10000 and 1, written
//! natively), optionally BE as `cpu.idle` instead. Dynamic (§V), every `interval_s` (5 s), per
//! critical group i:
//!   PF_i = (RT_i − RT_i^sla) / RT_i^sla                      (1)
//!   C_i(t+1) = C_i(t) · (1 + PF_i), clamped to [c_min, c_max] (2)
//!   W_i = (W^max − W^min) · C_i / C^max + W^min               (3)
//! where C_i(t) is the group's CPU consumption as a fraction of the server. Fair mode uses the
//! groups' RT_sla; isolation mode gives a group over its agreed maximum load RT_sla = ∞ (a
//! million seconds, as in the paper), so its weight falls to about W^min.

pub mod config;

use std::time::Duration;

use serde_json::json;

use super::{secs, MachineInfo, Mechanism, Policy};
use crate::config::{Config, WeightsMode};
use headroom_types::allocation::{Allocation, CpuWeight, LcGroupWeight};
use headroom_types::decision::Decision;
use headroom_types::observation::{LcGroupObservation, Observation};
use headroom_types::GroupPath;

#[derive(Debug, Clone)]
struct Group {
    name: String,
    cgroup: GroupPath,
    rt_sla_us: f64,
    max_qps: Option<f64>,
    weight: CpuWeight,
    /// Last desired allocation C and performance factor, for the decision state.
    c: Option<f64>,
    pf: Option<f64>,
}

/// The `weights` policy.
#[derive(Debug, Clone)]
pub struct Weights {
    config: Config,
    machine: MachineInfo,
    groups: Vec<Group>,
    /// True when the groups come from `[[policy.weights.groups]]`, false for the single [lc].
    explicit_groups: bool,
    next_update: Option<Duration>,
    last_reason: String,
    /// Fill the decision state (see [`Policy::set_explain`]).
    explain: bool,
}

impl Weights {
    pub fn new(config: &Config, machine: &MachineInfo) -> Self {
        let mut w = Weights {
            config: config.clone(),
            machine: machine.clone(),
            groups: Vec::new(),
            explicit_groups: false,
            next_update: None,
            last_reason: "weights:init".to_string(),
            explain: true,
        };
        w.groups = w.groups_from_config();
        w
    }

    fn critical(&self) -> CpuWeight {
        let p = &self.config.policy.weights;
        CpuWeight {
            shares: p.lc_shares,
            weight: p.lc_weight_v2,
        }
    }

    fn groups_from_config(&mut self) -> Vec<Group> {
        let p = &self.config.policy.weights;
        let critical = self.critical();
        let make = |name: &str, cgroup: &GroupPath, rt: f64, max: Option<f64>| Group {
            name: name.to_string(),
            cgroup: cgroup.clone(),
            rt_sla_us: rt,
            max_qps: max,
            weight: critical,
            c: None,
            pf: None,
        };
        self.explicit_groups = !p.groups.is_empty();
        if p.groups.is_empty() {
            let lc = self.config.lc();
            vec![make(
                &lc.name,
                &lc.cgroup,
                lc.slo.target_us,
                lc.load.as_ref().map(|l| l.peak_qps),
            )]
        } else {
            p.groups
                .iter()
                .map(|g| make(&g.name, &g.cgroup, g.rt_sla_us, g.max_qps))
                .collect()
        }
    }

    /// The signals of group `index`: from `obs.lc_groups` by name, or the top-level LC fields for
    /// the single-[lc] case.
    fn group_obs(&self, obs: &Observation, index: usize) -> LcGroupObservation {
        let name = &self.groups[index].name;
        if let Some(g) = obs.lc_groups.iter().find(|g| &g.name == name) {
            return g.clone();
        }
        if !self.explicit_groups {
            return LcGroupObservation {
                name: name.clone(),
                latency_us: obs.lc_latency_us,
                qps: obs.lc_qps,
                cpu_usage: obs.lc_cpu_usage,
                ..LcGroupObservation::default()
            };
        }
        LcGroupObservation {
            name: name.clone(),
            ..LcGroupObservation::default()
        }
    }

    /// One step of the dynamic model; returns a reason.
    fn update(&mut self, obs: &Observation) -> String {
        let p = self.config.policy.weights.clone();
        let ncpus = self.machine.cpus.len().max(1) as f64;
        let mut desired: Vec<Option<f64>> = Vec::with_capacity(self.groups.len());
        let mut isolated = Vec::new();
        for i in 0..self.groups.len() {
            let g = self.group_obs(obs, i);
            let group = &mut self.groups[i];
            let (Some(rt), Some(usage)) = (g.latency_us, g.cpu_usage) else {
                group.pf = None;
                group.c = None;
                desired.push(None);
                continue;
            };
            let over_max = p.mode == WeightsMode::Isolation
                && matches!((g.qps, group.max_qps), (Some(q), Some(m)) if q > m);
            let sla = if over_max {
                isolated.push(group.name.clone());
                p.infinite_rt_sla_us
            } else {
                group.rt_sla_us
            };
            let pf = (rt - sla) / sla; // (1)
            let c = ((usage / ncpus) * (1.0 + pf)).clamp(p.c_min, p.c_max); // (2)
            group.pf = Some(pf);
            group.c = Some(c);
            desired.push(Some(c));
        }
        let c_max = desired.iter().flatten().fold(0.0_f64, |a, b| a.max(*b));
        if c_max <= 0.0 {
            return "weights:no-group-data:hold".to_string();
        }
        for (group, c) in self.groups.iter_mut().zip(&desired) {
            if let Some(c) = c {
                let scale = |max: u64, min: u64| -> u64 {
                    ((max - min) as f64 * c / c_max + min as f64).round() as u64
                    // (3)
                };
                group.weight = CpuWeight {
                    shares: scale(p.w_max, p.w_min),
                    weight: scale(p.w_max_v2, p.w_min_v2),
                };
            }
        }
        if desired.iter().any(Option::is_none) {
            "weights:dynamic:partial-data".to_string()
        } else if isolated.is_empty() {
            format!("weights:{}:update", mode_name(p.mode))
        } else {
            "weights:isolation:over-max-load".to_string()
        }
    }
}

fn mode_name(mode: WeightsMode) -> &'static str {
    match mode {
        WeightsMode::Static => "static",
        WeightsMode::Fair => "fair",
        WeightsMode::Isolation => "isolation",
    }
}

impl Policy for Weights {
    fn name(&self) -> &'static str {
        "weights"
    }

    fn decide(&mut self, obs: &Observation, now: Duration) -> Decision {
        let p = self.config.policy.weights.clone();
        let reason = if p.mode == WeightsMode::Static {
            let critical = self.critical();
            for g in &mut self.groups {
                g.weight = critical;
                g.pf = None;
                g.c = None;
            }
            "weights:static".to_string()
        } else if self.next_update.is_none_or(|t| now >= t) {
            self.next_update = Some(now + secs(p.interval_s));
            self.last_reason = self.update(obs);
            self.last_reason.clone()
        } else {
            format!("{}:hold", self.last_reason.trim_end_matches(":hold"))
        };
        let (be_weight, be_idle) =
            if p.be_cpu_idle && self.machine.mechanisms.has(Mechanism::CpuIdle) {
                (None, Some(true))
            } else {
                (
                    Some(CpuWeight {
                        shares: p.be_shares,
                        weight: p.be_weight_v2,
                    }),
                    None,
                )
            };
        let mut allocation = Allocation {
            be_cpu_weight: be_weight,
            be_cpu_idle: be_idle,
            ..Allocation::default()
        };
        if self.explicit_groups {
            allocation.lc_groups = self
                .groups
                .iter()
                .map(|g| LcGroupWeight {
                    name: g.name.clone(),
                    cgroup: g.cgroup.clone(),
                    cpu_weight: g.weight,
                })
                .collect();
        } else {
            allocation.lc.cpu_weight = Some(self.groups[0].weight);
        }
        if !self.explain {
            return Decision {
                binding_lc: None,
                allocation,
                reason,
                state: serde_json::Value::Null,
            };
        }
        let groups: Vec<_> = self
            .groups
            .iter()
            .map(|g| {
                json!({"name": g.name, "rt_sla_us": g.rt_sla_us, "pf": g.pf, "c": g.c,
                       "shares": g.weight.shares, "weight": g.weight.weight})
            })
            .collect();
        let mut state = json!({ "mode": mode_name(p.mode), "groups": groups });
        if p.be_cpu_idle && !self.machine.mechanisms.has(Mechanism::CpuIdle) {
            state["be_cpu_idle"] = json!("unavailable: cpu.idle missing, using be_shares");
        }
        Decision {
            binding_lc: None,
            allocation,
            reason,
            state,
        }
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
    }

    fn poll_interval(&self) -> Duration {
        let p = &self.config.policy.weights;
        if p.mode == WeightsMode::Static {
            Duration::from_secs(1)
        } else {
            secs(p.interval_s).min(Duration::from_secs(1))
        }
    }

    fn reconfigure(&mut self, config: &Config) {
        let same_groups = config.policy.weights.groups == self.config.policy.weights.groups;
        self.config = config.clone();
        if !same_groups {
            self.groups = self.groups_from_config();
        }
        for g in &mut self.groups {
            if let Some(c) = config
                .policy
                .weights
                .groups
                .iter()
                .find(|c| c.name == g.name)
            {
                g.rt_sla_us = c.rt_sla_us;
                g.max_qps = c.max_qps;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Weights;

    /// With the decision state off the policy decides exactly the same and builds no state.
    #[test]
    fn explain_off_changes_no_decision() {
        crate::policy::testing::explain_off_changes_no_decision("weights", Weights::new);
    }
}
