//! `[policy.blind]`: PerfIso blind isolation's settings.

use crate::config::checks::*;
use crate::config::error::{invalid, Problems};
use headroom_types::CpuSet;
use serde::{Deserialize, Serialize};

/// `[policy.blind]`: PerfIso CPU blind isolation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BlindConfig {
    /// B: idle buffer CPUs kept for LC bursts; may be fractional (the fraction goes to a quota).
    pub buffer_cores: f64,
    /// Poll period, ms: the policy is evaluated every poll, writes happen only on change.
    pub poll_ms: u64,
    /// Minimum S (BE CPUs); 0 lets BE be frozen.
    pub min_be_cpus: f64,
    /// Maximum S; 0 = every CPU BE may use.
    pub max_be_cpus: f64,
    /// S moves in steps of this (or of B's fractional part when B is fractional).
    pub grow_step_cpus: f64,
    /// Minimum time between two growth steps, ms (grow slowly).
    pub grow_interval_ms: u64,
    /// Grow only when I > B + hysteresis.
    pub hysteresis_cpus: f64,
    /// 0 (default): I is the sum of the per-CPU idle fractions — the mean of PerfIso's
    /// instantaneous idle-core count over the poll; > 0: I counts CPUs whose idle fraction
    /// reaches this.
    pub idle_threshold: f64,
    /// Idle CPU time that counts as noise, CPUs: shrink only when I < B - tolerance, grow when
    /// I >= B + step + hysteresis - tolerance. PerfIso counts whole idle cores; an exact idle
    /// sensor (BPF) sees the agent's own polling and kernel housekeeping as a few percent busy,
    /// which without this would read as "one idle core short" on every poll.
    pub idle_tolerance_cpus: f64,
    /// CFS period for the fractional part, µs.
    pub quota_period_us: u64,
    /// CPUs BE may ever use; empty = all online CPUs (minus the LC's pinned CPUs).
    #[serde(deserialize_with = "CpuSet::deserialize_distinct")]
    pub be_cpus: CpuSet,
}

impl Default for BlindConfig {
    fn default() -> Self {
        BlindConfig {
            buffer_cores: 1.0,
            poll_ms: 1,
            min_be_cpus: 0.0,
            max_be_cpus: 0.0,
            grow_step_cpus: 1.0,
            grow_interval_ms: 50,
            hysteresis_cpus: 0.0,
            idle_threshold: 0.0,
            idle_tolerance_cpus: 0.1,
            quota_period_us: 100_000,
            be_cpus: CpuSet::new(),
        }
    }
}

impl BlindConfig {
    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, p: &mut Problems) {
        p.check(non_negative("policy.blind.buffer_cores", self.buffer_cores));
        if self.poll_ms == 0 || self.poll_ms > 60_000 {
            p.push(invalid(
                "policy.blind.poll_ms",
                self.poll_ms,
                "must be in 1..=60000",
            ));
        }
        p.check(non_negative("policy.blind.min_be_cpus", self.min_be_cpus));
        p.check(non_negative("policy.blind.max_be_cpus", self.max_be_cpus));
        if self.max_be_cpus > 0.0 && self.max_be_cpus < self.min_be_cpus {
            p.push(invalid(
                "policy.blind.max_be_cpus",
                self.max_be_cpus,
                "must be >= min_be_cpus (or 0 for no maximum)",
            ));
        }
        p.check(positive("policy.blind.grow_step_cpus", self.grow_step_cpus));
        p.check(non_negative(
            "policy.blind.hysteresis_cpus",
            self.hysteresis_cpus,
        ));
        p.check(fraction("policy.blind.idle_threshold", self.idle_threshold));
        if !(0.0..0.5).contains(&self.idle_tolerance_cpus) {
            p.push(invalid(
                "policy.blind.idle_tolerance_cpus",
                self.idle_tolerance_cpus,
                "must be in [0, 0.5): a whole idle CPU must still count",
            ));
        }
        p.check(period("policy.blind.quota_period_us", self.quota_period_us));
    }
}
