//! Heracles (ISCA'15 §4.3): a top-level controller (Alg. 1) steering three sub-controllers —
//! cores & memory (Alg. 2), power (Alg. 3) and network egress (Alg. 4) — each on its own period.
//!
//! Alg. 1 follows the paper's prose: slack < 0 disables BE and starts a cooldown; load above
//! `load_disable` disables BE; load below `load_enable` (re-)enables it unless cooling down, and
//! in between the enable state is kept (hysteresis). While BE is enabled, slack below
//! `slack_disallow_growth` forbids BE growth and slack below `slack_shrink` takes cores back
//! (`be_cores.Remove(be_cores.Size()-2)` in the pseudo-code: BE keeps at most 2 cores, or with
//! `slack_shrink_action = "remove"`, loses 2). A sub-controller whose input or mechanism is
//! missing is disabled and says why in the decision state; the others still run. When latency
//! or load is unknown the top level changes nothing and looks again after 1 s instead of a full
//! period.

pub mod config;
mod subcontrollers;
mod top_level;

pub(crate) use top_level::{TopLevel, TopOutcome, NO_DATA_RETRY_S};

use std::time::Duration;

use serde_json::json;

use super::{be_candidate_cpus, secs, take_top_cpus, MachineInfo, Mechanism, Policy};
use crate::config::{Config, HeraclesConfig};
use headroom_types::allocation::Allocation;
use headroom_types::decision::Decision;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    GrowLlc,
    GrowCores,
}

/// A reallocation whose DRAM-bandwidth effect is measured on the next core/memory period.
#[derive(Debug, Clone, PartialEq)]
struct Pending {
    bw_before: Option<f64>,
    /// For a cache step: the ways before it and BE progress before it.
    llc: Option<(u32, Option<f64>)>,
}

fn due(next: &mut Option<Duration>, now: Duration, period: Duration) -> bool {
    if next.is_none_or(|t| now >= t) {
        *next = Some(now + period);
        true
    } else {
        false
    }
}

/// The `heracles` policy.
#[derive(Debug, Clone)]
pub struct Heracles {
    config: Config,
    machine: MachineInfo,
    top: TopLevel,
    next_top: Option<Duration>,
    next_cores: Option<Duration>,
    next_power: Option<Duration>,
    next_net: Option<Duration>,
    phase: Phase,
    be_cores: u32,
    llc_ways: u32,
    bw_derivative: f64,
    pending: Option<Pending>,
    freq_cap_mhz: f64,
    egress_ceil: Option<u64>,
    cores_status: String,
    dram_status: String,
    llc_status: String,
    power_status: String,
    net_status: String,
    /// Fill the decision state (see [`Policy::set_explain`]).
    explain: bool,
}

impl Heracles {
    pub fn new(config: &Config, machine: &MachineInfo) -> Self {
        let h = &config.policy.heracles;
        let mut me = Heracles {
            config: config.clone(),
            machine: machine.clone(),
            top: TopLevel::new(),
            next_top: None,
            next_cores: None,
            next_power: None,
            next_net: None,
            phase: Phase::GrowLlc,
            be_cores: h.initial_be_cores,
            llc_ways: 0,
            bw_derivative: 0.0,
            pending: None,
            freq_cap_mhz: h.be_freq_max_mhz,
            egress_ceil: None,
            cores_status: "running".into(),
            dram_status: "running".into(),
            llc_status: "running".into(),
            power_status: "running".into(),
            net_status: "running".into(),
            explain: true,
        };
        me.reset_cores();
        me
    }

    fn h(&self) -> &HeraclesConfig {
        &self.config.policy.heracles
    }

    fn llc_total(&self) -> Option<u32> {
        if self.machine.mechanisms.has(Mechanism::ResctrlL3) {
            self.machine.llc_ways.filter(|w| *w >= 2)
        } else {
            None
        }
    }

    /// BE starts with `initial_be_cores` cores and `initial_llc_frac` of the LLC, in GROW_LLC.
    fn reset_cores(&mut self) {
        let h = self.h().clone();
        self.be_cores = h.initial_be_cores;
        self.llc_ways = self.llc_total().map_or(0, |total| {
            ((h.initial_llc_frac * total as f64).round() as u32).clamp(1, total - 1)
        });
        self.phase = Phase::GrowLlc;
        self.pending = None;
        self.bw_derivative = 0.0;
    }

    fn max_be_cores(&self, candidates: usize) -> u32 {
        let keep_for_lc = self.machine.cpus.len().saturating_sub(1);
        let h = self.h();
        let cap = if h.max_be_cores > 0 {
            h.max_be_cores as usize
        } else {
            keep_for_lc
        };
        candidates.min(cap).min(keep_for_lc) as u32
    }
}

impl Policy for Heracles {
    fn name(&self) -> &'static str {
        "heracles"
    }

    fn decide(&mut self, obs: &Observation, now: Duration) -> Decision {
        let h = self.h().clone();
        let target = self.config.lc().slo.target_us;
        let candidates = be_candidate_cpus(
            &self.machine,
            &CpuSet::from(self.machine.socket_cpus(h.be_socket)),
            &self.config,
            obs,
        );
        let max_cores = self.max_be_cores(candidates.len());
        let mut events: Vec<String> = Vec::new();
        let mut top_outcome = None;

        if due(&mut self.next_top, now, secs(h.interval_s)) {
            let outcome = self.top.step(&h, target, obs, now);
            if outcome == TopOutcome::NoData {
                // nothing was measured: look again in a second rather than a whole period
                self.next_top = Some(now + secs(h.interval_s.min(NO_DATA_RETRY_S)));
            }
            if self.top.just_enabled {
                self.reset_cores();
                // give the new allocation one full core/memory period before the next step
                self.next_cores = Some(now + secs(h.cores_interval_s));
            }
            if outcome == TopOutcome::Shrink {
                self.shrink_for_low_slack();
            }
            top_outcome = Some(outcome);
        }
        self.be_cores = self.be_cores.min(max_cores);
        if self.top.enabled {
            self.cores_status = "running".into();
            if due(&mut self.next_cores, now, secs(h.cores_interval_s)) {
                events.extend(self.cores_and_memory(obs, max_cores));
            }
        } else {
            self.cores_status = "idle: BE disabled".into();
            self.next_cores = None;
        }
        if due(&mut self.next_power, now, secs(h.power_interval_s)) {
            events.extend(self.power(obs));
        }
        if due(&mut self.next_net, now, secs(h.net_interval_s)) {
            events.extend(self.network(obs));
        }

        let cpus = take_top_cpus(&candidates, self.be_cores as usize);
        let enabled = self.top.enabled && !cpus.is_empty();
        let allocation = Allocation {
            be_enabled: enabled,
            be_cpus: if cpus.is_empty() {
                Some(take_top_cpus(&candidates, 1)).filter(|c| !c.is_empty())
            } else {
                Some(cpus)
            },
            be_llc_ways: self.llc_total().map(|_| self.llc_ways),
            be_freq_khz: (self.freq_cap_mhz < h.be_freq_max_mhz)
                .then(|| (self.freq_cap_mhz * 1000.0).round() as u64),
            be_egress_ceil_bytes_per_s: self.egress_ceil,
            ..Allocation::default()
        };
        // A top-level outcome that restricts BE explains the tick best; otherwise the first
        // sub-controller change does, then the routine top-level outcome.
        let reason = match top_outcome {
            _ if self.top.enabled && self.be_cores == 0 => {
                "heracles:no-be-cores:disable".to_string()
            }
            Some(o) if o != TopOutcome::Grow && o != TopOutcome::NoGrowth => o.reason("heracles"),
            o => events
                .first()
                .cloned()
                .or_else(|| o.map(|o| o.reason("heracles")))
                .unwrap_or_else(|| "heracles:hold".to_string()),
        };
        if let Some(o) = top_outcome {
            events.insert(0, o.reason("heracles"));
        }
        if !self.explain {
            return Decision {
                binding_lc: None,
                allocation,
                reason,
                state: serde_json::Value::Null,
            };
        }
        Decision {
            binding_lc: None,
            allocation,
            reason,
            state: json!({
                "top": self.top.state(),
                "events": events,
                "phase": match self.phase { Phase::GrowLlc => "GROW_LLC", Phase::GrowCores => "GROW_CORES" },
                "be_cores": self.be_cores,
                "max_be_cores": max_cores,
                "llc_ways": self.llc_ways,
                "bw_derivative": self.bw_derivative,
                "freq_cap_mhz": self.freq_cap_mhz,
                "egress_ceil": self.egress_ceil,
                "subcontrollers": {
                    "cores": self.cores_status,
                    "dram": self.dram_status,
                    "llc": self.llc_status,
                    "power": self.power_status,
                    "net": self.net_status,
                },
            }),
        }
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
    }

    fn poll_interval(&self) -> Duration {
        let h = self.h();
        [
            h.interval_s,
            h.cores_interval_s,
            h.power_interval_s,
            h.net_interval_s,
        ]
        .into_iter()
        .map(secs)
        .min()
        .unwrap_or(Duration::from_secs(1))
        .min(Duration::from_secs(1))
    }

    fn applied(&mut self, allocation: &Allocation) {
        if !allocation.be_enabled {
            return;
        }
        if let Some(cpus) = &allocation.be_cpus {
            self.be_cores = self.be_cores.min(cpus.len() as u32);
        }
    }

    fn reconfigure(&mut self, config: &Config) {
        self.config = config.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::Heracles;

    /// With the decision state off the policy decides exactly the same and builds no state.
    #[test]
    fn explain_off_changes_no_decision() {
        crate::policy::testing::explain_off_changes_no_decision("heracles", Heracles::new);
    }
}
