//! `[policy.static-cores]` and `[policy.static-cycles]`: the static baselines' settings.

use crate::config::checks::*;
use crate::config::error::{invalid, Problems};
use headroom_types::CpuSet;
use serde::{Deserialize, Serialize};

/// `[policy.static-cores]`: PerfIso's "CPU cores" baseline: BE confined to N cores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StaticCoresConfig {
    /// Number of BE cores, taken from the highest-numbered CPUs not pinned to LC.
    pub cores: u32,
    /// Explicit BE CPUs (overrides `cores`).
    #[serde(deserialize_with = "CpuSet::deserialize_distinct")]
    pub cpus: CpuSet,
}

impl Default for StaticCoresConfig {
    fn default() -> Self {
        StaticCoresConfig {
            cores: 1,
            cpus: CpuSet::new(),
        }
    }
}

/// `[policy.static-cycles]`: PerfIso's "CPU cycles" baseline: BE limited to X% of CPU time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StaticCyclesConfig {
    /// Percent of the whole machine's CPU time (PerfIso used 5%).
    pub percent: f64,
    pub period_us: u64,
}

impl Default for StaticCyclesConfig {
    fn default() -> Self {
        StaticCyclesConfig {
            percent: 5.0,
            period_us: 100_000,
        }
    }
}

impl StaticCoresConfig {
    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, _: &mut Problems) {
        // CPUs listed twice (`"1,1"`, `"0-2,1"`, `[1, 1]`) are refused when the list is read
        // (`CpuSet::deserialize_distinct`), in a config file and by `ctl set` alike.
    }
}

impl StaticCyclesConfig {
    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, p: &mut Problems) {
        if !(self.percent > 0.0 && self.percent <= 100.0) {
            p.push(invalid(
                "policy.static-cycles.percent",
                self.percent,
                "must be in (0, 100]",
            ));
        }
        p.check(period("policy.static-cycles.period_us", self.period_us));
    }
}
