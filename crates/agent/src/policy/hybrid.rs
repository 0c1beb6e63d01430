//! `hybrid` (our default): PerfIso blind isolation as the fast inner loop (every `poll_ms`),
//! under Heracles' top-level controller (Alg. 1) as the slow outer loop.
//!
//! The outer loop runs every `policy.hybrid.interval_s` (default: the SLO window) with
//! `[policy.heracles]`'s thresholds: slack < 0 or load > `load_disable` disable BE (slack < 0
//! also starts the cooldown and widens the buffer); load < `load_enable` enables it. While
//! enabled, it sets the inner loop's buffer B from the slack: slack ≥ `slack_disallow_growth` →
//! B shrinks by `buffer_step_cores` (BE may grow); slack below it → BE may not grow; slack below
//! `slack_shrink` → B widens by a step, so the inner loop gives cores back at its next poll.

pub mod config;

use std::time::Duration;

use serde_json::json;

use super::blind::Blind;
use super::heracles::{TopLevel, TopOutcome, NO_DATA_RETRY_S};
use super::{be_candidate_cpus, round6, secs, take_top_cpus, MachineInfo, Policy};
use crate::allocation::Allocation;
use crate::config::Config;
use crate::decision::Decision;
use crate::observation::Observation;

/// The `hybrid` policy.
#[derive(Debug, Clone)]
pub struct Hybrid {
    config: Config,
    machine: MachineInfo,
    top: TopLevel,
    next_top: Option<Duration>,
    inner: Blind,
    last_outcome: Option<TopOutcome>,
    explain: bool,
}

impl Hybrid {
    pub fn new(config: &Config, machine: &MachineInfo) -> Self {
        let mut inner = Blind::new(config, machine);
        let mut me = Hybrid {
            config: config.clone(),
            machine: machine.clone(),
            top: TopLevel::new(),
            next_top: None,
            inner: inner.clone(),
            last_outcome: None,
            explain: true,
        };
        inner.set_buffer(me.clamp_buffer(config.policy.blind.buffer_cores));
        inner.set_growth_allowed(false);
        me.inner = inner;
        me
    }

    fn buffer_bounds(&self) -> (f64, f64) {
        let y = &self.config.policy.hybrid;
        let ncpus = self.machine.cpus.len() as f64;
        let max = if y.buffer_max_cores > 0.0 {
            y.buffer_max_cores.min(ncpus)
        } else {
            ncpus
        };
        (y.buffer_min_cores.min(max), max)
    }

    fn clamp_buffer(&self, b: f64) -> f64 {
        let (min, max) = self.buffer_bounds();
        round6(b.clamp(min, max))
    }

    /// The current buffer B.
    pub fn buffer(&self) -> f64 {
        self.inner.buffer()
    }

    /// The CPUs BE shares with the LC as `cpu.idle` when `share_lc_cpus` is on and every CPU BE
    /// may use is an LC CPU; empty otherwise (blind isolation then runs as usual).
    fn shared_lc_cpus(&self, obs: &Observation) -> Vec<u32> {
        if !self.config.policy.hybrid.share_lc_cpus {
            return Vec::new();
        }
        let allowed = &self.config.policy.blind.be_cpus;
        if !be_candidate_cpus(&self.machine, allowed, &self.config, obs).is_empty() {
            return Vec::new();
        }
        self.machine
            .cpus
            .iter()
            .copied()
            .filter(|c| allowed.is_empty() || allowed.contains(c))
            .collect()
    }

    fn outer(&mut self, obs: &Observation, now: Duration) -> TopOutcome {
        let h = self.config.policy.heracles.clone();
        let step = self.config.policy.hybrid.buffer_step_cores;
        let outcome = self.top.step(&h, self.config.lc.slo.target_us, obs, now);
        let b = self.inner.buffer();
        if self.top.just_enabled {
            self.inner.reset();
        }
        match outcome {
            TopOutcome::SlackNegative => {
                self.inner.set_buffer(self.clamp_buffer(b + step));
                self.inner.reset();
            }
            TopOutcome::LoadHigh => self.inner.reset(),
            TopOutcome::Shrink => self.inner.set_buffer(self.clamp_buffer(b + step)),
            TopOutcome::Grow => self.inner.set_buffer(self.clamp_buffer(b - step)),
            TopOutcome::NoData
            | TopOutcome::Cooldown
            | TopOutcome::DisabledHold
            | TopOutcome::NoGrowth => {}
        }
        self.inner.set_growth_allowed(self.top.growth_allowed);
        outcome
    }
}

impl Policy for Hybrid {
    fn name(&self) -> &'static str {
        "hybrid"
    }

    fn decide(&mut self, obs: &Observation, now: Duration) -> Decision {
        let interval = self
            .config
            .policy
            .hybrid
            .interval_s
            .unwrap_or(self.config.lc.slo.window_s);
        let mut outer_reason = None;
        if self.next_top.is_none_or(|t| now >= t) {
            self.next_top = Some(now + secs(interval));
            let outcome = self.outer(obs, now);
            if outcome == TopOutcome::NoData {
                // nothing was measured: look again in a second rather than a whole window
                self.next_top = Some(now + secs(interval.min(NO_DATA_RETRY_S)));
            }
            self.last_outcome = Some(outcome);
            if !matches!(outcome, TopOutcome::Grow | TopOutcome::NoGrowth) {
                outer_reason = Some(outcome.reason("hybrid"));
            }
        }
        let shared = self.shared_lc_cpus(obs);
        let (allocation, inner_state, inner_reason) = if self.top.enabled && !shared.is_empty() {
            (
                Allocation {
                    be_cpus: Some(shared.clone()),
                    be_cpu_idle: Some(true),
                    ..Allocation::default()
                },
                json!({ "shared_lc_cpus": shared }),
                "hybrid:share-lc-cpus:idle".to_string(),
            )
        } else if self.top.enabled {
            let d = self.inner.decide(obs, now);
            let tail = d.reason.trim_start_matches("blind:").to_string();
            (d.allocation, d.state, format!("hybrid:{tail}"))
        } else {
            let p = &self.config.policy.blind;
            let candidates = be_candidate_cpus(&self.machine, &p.be_cpus, &self.config, obs);
            let keep = take_top_cpus(&candidates, 1);
            (
                Allocation {
                    be_cpus: (!keep.is_empty()).then_some(keep),
                    ..Allocation::default()
                }
                .disabled(),
                json!(null),
                "hybrid:be-disabled:hold".to_string(),
            )
        };
        if !self.explain {
            return Decision {
                allocation,
                reason: outer_reason.unwrap_or(inner_reason),
                state: serde_json::Value::Null,
            };
        }
        Decision {
            allocation,
            reason: outer_reason.unwrap_or(inner_reason),
            state: json!({
                "top": self.top.state(),
                "last_outer": self.last_outcome.map(|o| o.reason("hybrid")),
                "next_outer_ms": self.next_top.map(|t| t.as_millis() as u64),
                "buffer": self.inner.buffer(),
                "inner": inner_state,
            }),
        }
    }

    fn poll_interval(&self) -> Duration {
        self.inner.poll_interval()
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
        self.inner.set_explain(on);
    }

    fn applied(&mut self, allocation: &Allocation) {
        if self.top.enabled {
            self.inner.applied(allocation);
        }
    }

    fn reconfigure(&mut self, config: &Config) {
        let buffer_key_changed =
            config.policy.blind.buffer_cores != self.config.policy.blind.buffer_cores;
        self.config = config.clone();
        let b = if buffer_key_changed {
            config.policy.blind.buffer_cores
        } else {
            self.inner.buffer()
        };
        self.inner.reconfigure(config);
        let b = self.clamp_buffer(b);
        self.inner.set_buffer(b);
    }
}
