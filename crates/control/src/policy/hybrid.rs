//! `hybrid` (our default): PerfIso blind isolation as the fast inner loop (every `poll_ms`),
//! under Heracles' top-level controller (Alg. 1) as the slow outer loop.
//!
//! The outer loop runs every `policy.hybrid.interval_s` (default: the SLO window) with
//! `[policy.heracles]`'s thresholds: slack < 0 or load > `load_disable` disable BE (slack < 0
//! also starts the cooldown and widens the buffer); load < `load_enable` enables it. While
//! enabled, it sets the inner loop's buffer B from the slack: slack ≥ `slack_disallow_growth` →
//! B shrinks by `buffer_step_cores` (BE may grow); slack below it → BE may not grow; slack below
//! `slack_shrink` → B widens by a step, so the inner loop gives cores back at its next poll. The
//! step that re-enables BE after a violation keeps the step the violation added (its slack was
//! measured without BE).

pub mod config;

use std::time::Duration;

use serde_json::json;

use super::blind::Blind;
use super::heracles::{TopLevel, TopOutcome, NO_DATA_RETRY_S};
use super::{be_candidate_cpus, round6, secs, take_top_cpus, IdleCrossings, MachineInfo, Policy};
use crate::config::Config;
use headroom_types::allocation::Allocation;
use headroom_types::decision::Decision;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;

/// How often the loop looks while BE shares the LC's CPUs (the periodic duty's period).
const SHARING_POLL: Duration = Duration::from_millis(100);

/// The `hybrid` policy.
#[derive(Debug, Clone)]
pub struct Hybrid {
    config: Config,
    machine: MachineInfo,
    top: TopLevel,
    next_top: Option<Duration>,
    inner: Blind,
    last_outcome: Option<TopOutcome>,
    /// B was widened by a violation and BE has not run since.
    widened_by_violation: bool,
    /// The last decision ran BE on the LC's CPUs in `cpu.idle` (no inner loop).
    sharing: bool,
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
            widened_by_violation: false,
            sharing: false,
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
    fn shared_lc_cpus(&self, obs: &Observation) -> CpuSet {
        if !self.config.policy.hybrid.share_lc_cpus {
            return CpuSet::new();
        }
        let allowed = &self.config.policy.blind.be_cpus;
        if !be_candidate_cpus(&self.machine, allowed, &self.config, obs).is_empty() {
            return CpuSet::new();
        }
        self.machine
            .cpus
            .iter()
            .copied()
            .filter(|&c| allowed.is_empty() || allowed.contains(c))
            .collect()
    }

    fn outer(&mut self, obs: &Observation, now: Duration) -> TopOutcome {
        let h = self.config.policy.heracles.clone();
        let step = self.config.policy.hybrid.buffer_step_cores;
        let outcome = self.top.step(&h, self.config.lc().slo.target_us, obs, now);
        let b = self.inner.buffer();
        if self.top.just_enabled {
            self.inner.reset();
        }
        let hold_buffer = self.top.just_enabled && self.widened_by_violation;
        if self.top.just_enabled {
            self.widened_by_violation = false;
        }
        match outcome {
            TopOutcome::SlackNegative => {
                self.inner.set_buffer(self.clamp_buffer(b + step));
                self.inner.reset();
                self.widened_by_violation = true;
            }
            TopOutcome::LoadHigh => self.inner.reset(),
            TopOutcome::Shrink => self.inner.set_buffer(self.clamp_buffer(b + step)),
            // The step that re-enables BE after a violation's cooldown saw windows BE did not
            // run in: their slack says nothing about B, so B keeps the step the violation added
            // until a window with BE running at that B shows the slack to shrink it. (Taking
            // it back here re-ran BE at the very buffer that had violated, every cooldown.)
            TopOutcome::Grow if hold_buffer => {}
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
            .unwrap_or(self.config.lc().slo.window_s);
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
        self.sharing = self.top.enabled && !shared.is_empty();
        let (allocation, inner_state, inner_reason) = if self.sharing {
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
                binding_lc: None,
                allocation,
                reason: outer_reason.unwrap_or(inner_reason),
                state: serde_json::Value::Null,
            };
        }
        Decision {
            binding_lc: None,
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

    /// The inner loop's, except while BE shares the LC's CPUs: nothing then decides on the
    /// idle count, and the outer loop keeps its own schedule.
    fn poll_interval(&self) -> Duration {
        if self.sharing {
            self.inner.poll_interval().max(SHARING_POLL)
        } else {
            self.inner.poll_interval()
        }
    }

    fn idle_buffer(&self) -> Option<f64> {
        Some(self.inner.buffer())
    }

    /// While BE is disabled only the outer loop (on its own schedule) can enable it; while it
    /// shares the LC's CPUs in `cpu.idle` no inner loop runs, so no crossing can change the
    /// next decision (armed, they would follow every sleep of any CPU, the agent's own
    /// neighbours included).
    fn idle_crossings_matter(&self) -> bool {
        self.top.enabled && !self.sharing
    }

    /// While blind isolation runs BE, the inner loop's: none at its bounds' side, no rise while
    /// the outer loop disallows growth.
    fn idle_crossings(&self) -> IdleCrossings {
        if self.idle_crossings_matter() {
            self.inner.idle_crossings()
        } else {
            IdleCrossings::NONE
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 CPUs, SLO 500 µs over 15 s windows, B starts at 1 and moves by 0.5 per outer step,
    /// cooldown 300 s (the defaults the 16-CPU simulation runs with).
    fn hybrid() -> Hybrid {
        let toml = r#"
[lc]
name = "svc"
cgroup = "headroom/lc"
[lc.slo]
target_us = 500
window_s = 15
[lc.latency]
source = "probe"
address = "127.0.0.1:11211"
[lc.load]
source = "memcache-stats"
address = "127.0.0.1:11211"
peak_qps = 100000
[policy]
kind = "hybrid"
"#;
        Hybrid::new(
            &Config::from_toml_str(toml).expect("valid config"),
            &MachineInfo::with_cpus(8),
        )
    }

    fn obs(latency_us: f64, load: f64, idle: f64) -> Observation {
        Observation {
            lc_latency_us: Some(latency_us),
            lc_latency_age_ms: Some(0),
            lc_load: Some(load),
            lc_load_age_ms: Some(0),
            idle_cpus: Some(idle),
            ..Observation::default()
        }
    }

    fn s(v: u64) -> Duration {
        Duration::from_secs(v)
    }

    /// A violation widens B by a step; the outer step that re-enables BE after the cooldown
    /// must keep it (its slack was measured with BE off), and only a window with BE running at
    /// the wider B may shrink it. Before the fix the re-enabling step shrank B straight back to
    /// the buffer that had just violated.
    #[test]
    fn the_re_enabling_step_keeps_the_buffer_the_violation_widened() {
        let mut h = hybrid();
        h.decide(&obs(200.0, 0.5, 4.0), s(0));
        assert!(h.top.enabled);
        assert_eq!(
            h.buffer(),
            1.0,
            "ample slack at B_min: B stays at its minimum"
        );
        // BE ran at B = 1 and the window violated
        let d = h.decide(&obs(900.0, 0.5, 1.0), s(15));
        assert!(!d.allocation.be_enabled);
        assert_eq!(h.buffer(), 1.5, "the violation widened B by one step");
        // cooldown: the windows without BE have ample slack, nothing changes
        let mut t = 30;
        while t < 315 {
            let d = h.decide(&obs(150.0, 0.5, 5.0), s(t));
            assert!(!d.allocation.be_enabled, "t {t}: still cooling down");
            t += 15;
        }
        // first step after the cooldown: BE re-enabled, B kept
        let d = h.decide(&obs(150.0, 0.5, 5.0), s(315));
        assert!(d.allocation.be_enabled, "re-enabled: {}", d.reason);
        assert_eq!(
            h.buffer(),
            1.5,
            "re-enabling must not undo the violation's step"
        );
        // a window with BE running at B = 1.5 and ample slack: now B may shrink
        h.decide(&obs(200.0, 0.5, 1.5), s(330));
        assert_eq!(h.buffer(), 1.0);
    }
}
