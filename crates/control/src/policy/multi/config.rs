//! `[policy.multi]`: the arbitration between several `[[lc]]` services (issue 29).

use crate::config::checks::*;
use crate::config::error::{invalid, Problems};
use serde::{Deserialize, Serialize};

/// `[policy.multi]`: `hybrid` driven by the tightest of several services' slacks, and PARTIES'
/// CPU moves between pinned services. The outer and inner loops use `[policy.hybrid]`,
/// `[policy.heracles]` and `[policy.blind]` as `hybrid` does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MultiConfig {
    /// Period of the CPU moves between pinned services, s; absent = the first service's
    /// `slo.window_s` (a move is judged on the next latency window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
    /// A pinned service whose slack is below this takes one CPU per period (first from BE,
    /// then from the service with the most slack). Default: Heracles' `slack_shrink` (5%), the
    /// slack at which `hybrid` takes cores back from BE.
    pub upsize_slack: f64,
    /// A service gives a CPU only while its slack is at least this (Heracles'
    /// `slack_disallow_growth`, 10%) and it keeps `min_service_cpus`.
    pub donor_min_slack: f64,
    /// A move is kept when the recipient's slack rose by more than this over the next period;
    /// otherwise it is reverted (PARTIES: revert on no gain).
    pub revert_min_gain: f64,
    /// CPUs a pinned service always keeps.
    pub min_service_cpus: u32,
    /// The load the outer loop compares with `load_disable`/`load_enable`: `sum` (default) of
    /// the services' loads — each `[[lc]] load.peak_qps` is then the service's peak alone on
    /// this server, and the sum is the share of the server the LCs use — or `max`, the highest
    /// service's (each `peak_qps` is then the service's own share of the server).
    pub load: LoadAggregate,
}

/// How `multi` combines the services' loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadAggregate {
    Sum,
    Max,
}

impl Default for MultiConfig {
    fn default() -> Self {
        MultiConfig {
            interval_s: None,
            upsize_slack: 0.05,
            donor_min_slack: 0.10,
            revert_min_gain: 0.0,
            min_service_cpus: 1,
            load: LoadAggregate::Sum,
        }
    }
}

impl MultiConfig {
    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, p: &mut Problems) {
        if let Some(i) = self.interval_s {
            p.check(interval("policy.multi.interval_s", i));
        }
        if !(self.upsize_slack.is_finite() && self.upsize_slack < 1.0) {
            p.push(invalid(
                "policy.multi.upsize_slack",
                self.upsize_slack,
                "must be a number below 1 (slack = (target - latency) / target)",
            ));
        }
        if !(self.donor_min_slack.is_finite() && self.donor_min_slack < 1.0) {
            p.push(invalid(
                "policy.multi.donor_min_slack",
                self.donor_min_slack,
                "must be a number below 1",
            ));
        } else if self.donor_min_slack < self.upsize_slack {
            p.push(invalid(
                "policy.multi.donor_min_slack",
                self.donor_min_slack,
                format!(
                    "must be >= upsize_slack ({}): a service would give the CPU it then takes back",
                    self.upsize_slack
                ),
            ));
        }
        p.check(non_negative(
            "policy.multi.revert_min_gain",
            self.revert_min_gain,
        ));
        if self.min_service_cpus == 0 {
            p.push(invalid(
                "policy.multi.min_service_cpus",
                self.min_service_cpus,
                "must be at least 1: a pinned service needs a CPU",
            ));
        }
    }
}
