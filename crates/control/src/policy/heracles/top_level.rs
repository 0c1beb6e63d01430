//! Heracles' top-level controller (Alg. 1), shared by `heracles` and `hybrid`: from slack and
//! load, whether BE may run, may grow, or must shrink, with the cooldown after a violation.

use std::time::Duration;

use serde_json::json;

use crate::config::HeraclesConfig;
use crate::policy::secs;
use headroom_types::observation::Observation;

/// Retry period of the top level when latency or load was unknown, s.
pub(crate) const NO_DATA_RETRY_S: f64 = 1.0;

/// What one top-level evaluation decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TopOutcome {
    /// Latency or load unknown: nothing changes.
    NoData,
    /// slack < 0: BE disabled, cooldown entered.
    SlackNegative,
    /// Load above `load_disable`: BE disabled.
    LoadHigh,
    /// Still cooling down after a negative slack: BE stays disabled.
    Cooldown,
    /// Load in the hysteresis band while BE is disabled: stays disabled.
    DisabledHold,
    /// BE enabled (or stays enabled) and slack ≥ `slack_disallow_growth`: growth allowed.
    Grow,
    /// slack < `slack_disallow_growth`: no growth.
    NoGrowth,
    /// slack < `slack_shrink`: no growth and cores back to LC.
    Shrink,
}

impl TopOutcome {
    pub(crate) fn reason(self, policy: &str) -> String {
        let tail = match self {
            TopOutcome::NoData => "no-latency-or-load:hold",
            TopOutcome::SlackNegative => "slack<0:disable",
            TopOutcome::LoadHigh => "load>disable:disable",
            TopOutcome::Cooldown => "cooldown:disabled",
            TopOutcome::DisabledHold => "load-hysteresis:disabled",
            TopOutcome::Grow => "slack-ok:grow",
            TopOutcome::NoGrowth => "slack<growth:no-growth",
            TopOutcome::Shrink => "slack<shrink:shrink",
        };
        format!("{policy}:{tail}")
    }
}

/// Alg. 1's state: shared by `heracles` and `hybrid`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TopLevel {
    pub enabled: bool,
    pub growth_allowed: bool,
    pub cooldown_until: Option<Duration>,
    pub slack: Option<f64>,
    pub load: Option<f64>,
    /// True on the evaluation that switched BE from disabled to enabled.
    pub just_enabled: bool,
}

impl TopLevel {
    pub(crate) fn new() -> Self {
        TopLevel {
            enabled: false,
            growth_allowed: false,
            cooldown_until: None,
            slack: None,
            load: None,
            just_enabled: false,
        }
    }

    pub(crate) fn step(
        &mut self,
        h: &HeraclesConfig,
        target_us: f64,
        obs: &Observation,
        now: Duration,
    ) -> TopOutcome {
        self.just_enabled = false;
        self.slack = obs.slack(target_us);
        self.load = obs.lc_load;
        let (Some(slack), Some(load)) = (self.slack, self.load) else {
            return TopOutcome::NoData;
        };
        if slack < 0.0 {
            self.enabled = false;
            self.growth_allowed = false;
            self.cooldown_until = Some(now + secs(h.cooldown_s));
            return TopOutcome::SlackNegative;
        }
        if load > h.load_disable {
            self.enabled = false;
            self.growth_allowed = false;
            return TopOutcome::LoadHigh;
        }
        let cooling = self.cooldown_until.is_some_and(|t| now < t);
        if !self.enabled {
            if cooling {
                return TopOutcome::Cooldown;
            }
            if load >= h.load_enable {
                return TopOutcome::DisabledHold;
            }
            self.enabled = true;
            self.just_enabled = true;
            self.cooldown_until = None;
        }
        if slack < h.slack_disallow_growth {
            self.growth_allowed = false;
            if slack < h.slack_shrink {
                TopOutcome::Shrink
            } else {
                TopOutcome::NoGrowth
            }
        } else {
            self.growth_allowed = true;
            TopOutcome::Grow
        }
    }

    pub(crate) fn state(&self) -> serde_json::Value {
        json!({
            "enabled": self.enabled,
            "growth_allowed": self.growth_allowed,
            "cooldown_until_ms": self.cooldown_until.map(|t| t.as_millis() as u64),
            "slack": self.slack,
            "load": self.load,
        })
    }
}
