//! PerfIso's baselines: `none` (BE unrestricted), `static-cores` (BE confined to N cores) and
//! `static-cycles` (BE limited to X% of the machine's CPU time).

pub mod config;

use std::time::Duration;

use serde_json::json;

use super::{be_candidate_cpus, take_top_cpus, MachineInfo, Policy};
use crate::config::Config;
use headroom_types::allocation::Allocation;
use headroom_types::decision::Decision;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;

/// Static policies are re-evaluated once a second (only LC pinning changes can move them).
const STATIC_POLL: Duration = Duration::from_secs(1);

/// `none`: BE runs unrestricted (the colocation baseline without isolation).
#[derive(Debug, Clone)]
pub struct NonePolicy;

impl NonePolicy {
    pub fn new(_config: &Config, _machine: &MachineInfo) -> Self {
        NonePolicy
    }
}

impl Policy for NonePolicy {
    fn name(&self) -> &'static str {
        "none"
    }

    fn decide(&mut self, _obs: &Observation, _now: Duration) -> Decision {
        Decision {
            binding_lc: None,
            allocation: Allocation::unrestricted(),
            reason: "none:unrestricted".to_string(),
            state: json!({}),
        }
    }

    fn poll_interval(&self) -> Duration {
        STATIC_POLL
    }

    fn reconfigure(&mut self, _config: &Config) {}
}

/// `static-cores`: BE confined to a fixed set of cores, never the LC's pinned ones.
#[derive(Debug, Clone)]
pub struct StaticCores {
    config: Config,
    machine: MachineInfo,
}

impl StaticCores {
    pub fn new(config: &Config, machine: &MachineInfo) -> Self {
        StaticCores {
            config: config.clone(),
            machine: machine.clone(),
        }
    }
}

impl Policy for StaticCores {
    fn name(&self) -> &'static str {
        "static-cores"
    }

    fn decide(&mut self, obs: &Observation, _now: Duration) -> Decision {
        let p = &self.config.policy.static_cores;
        let candidates = be_candidate_cpus(&self.machine, &p.cpus, &self.config, obs);
        let cpus = if p.cpus.is_empty() {
            take_top_cpus(&candidates, p.cores as usize)
        } else {
            CpuSet::from(candidates.as_slice())
        };
        let (allocation, reason) = if cpus.is_empty() {
            (
                Allocation::default().disabled(),
                "static-cores:no-cpu-left:disable",
            )
        } else {
            (
                Allocation {
                    be_cpus: Some(cpus.clone()),
                    ..Allocation::default()
                },
                "static-cores:confine",
            )
        };
        Decision {
            binding_lc: None,
            allocation,
            reason: reason.to_string(),
            state: json!({ "be_cpus": cpus, "candidates": candidates }),
        }
    }

    fn poll_interval(&self) -> Duration {
        STATIC_POLL
    }

    fn reconfigure(&mut self, config: &Config) {
        self.config = config.clone();
    }
}

/// `static-cycles`: BE limited to a share of the machine's CPU time through a CFS quota.
#[derive(Debug, Clone)]
pub struct StaticCycles {
    config: Config,
    machine: MachineInfo,
}

impl StaticCycles {
    pub fn new(config: &Config, machine: &MachineInfo) -> Self {
        StaticCycles {
            config: config.clone(),
            machine: machine.clone(),
        }
    }
}

impl Policy for StaticCycles {
    fn name(&self) -> &'static str {
        "static-cycles"
    }

    fn decide(&mut self, _obs: &Observation, _now: Duration) -> Decision {
        let p = &self.config.policy.static_cycles;
        // percent of the whole machine → percent of one CPU
        let quota_pct = super::round6(p.percent * self.machine.cpus.len() as f64);
        Decision {
            binding_lc: None,
            allocation: Allocation {
                be_quota_pct: Some(quota_pct),
                be_quota_period_us: Some(p.period_us),
                ..Allocation::default()
            },
            reason: "static-cycles:quota".to_string(),
            state: json!({ "machine_percent": p.percent, "quota_pct_of_one_cpu": quota_pct }),
        }
    }

    fn poll_interval(&self) -> Duration {
        STATIC_POLL
    }

    fn reconfigure(&mut self, config: &Config) {
        self.config = config.clone();
    }
}
