//! `[policy.hybrid]`: the hybrid policy's outer-loop settings.

use crate::config::checks::*;
use crate::config::error::{invalid, Problems};
use serde::{Deserialize, Serialize};

/// `[policy.hybrid]`: blind isolation inside, Heracles' top level outside. The inner loop uses
/// `[policy.blind]`, the outer loop's thresholds come from `[policy.heracles]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HybridConfig {
    /// Outer-loop period, s; absent = `lc.slo.window_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
    /// Smallest buffer B the outer loop may choose.
    pub buffer_min_cores: f64,
    /// Largest buffer B; 0 = all CPUs (BE squeezed out).
    pub buffer_max_cores: f64,
    /// B changes by this much per outer step.
    pub buffer_step_cores: f64,
    /// When every CPU BE may use is an LC CPU (a small machine), run BE on those CPUs in the
    /// `cpu.idle` class instead of giving it nothing: the mainline successor of BVT warp
    /// (docs/architecture.md), with the outer loop still disabling BE on negative slack or high load.
    pub share_lc_cpus: bool,
}

impl Default for HybridConfig {
    fn default() -> Self {
        HybridConfig {
            interval_s: None,
            buffer_min_cores: 1.0,
            buffer_max_cores: 0.0,
            buffer_step_cores: 0.5,
            share_lc_cpus: true,
        }
    }
}

impl HybridConfig {
    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, p: &mut Problems) {
        if let Some(i) = self.interval_s {
            p.check(interval("policy.hybrid.interval_s", i));
        }
        p.check(non_negative(
            "policy.hybrid.buffer_min_cores",
            self.buffer_min_cores,
        ));
        p.check(non_negative(
            "policy.hybrid.buffer_max_cores",
            self.buffer_max_cores,
        ));
        if self.buffer_max_cores > 0.0 && self.buffer_max_cores < self.buffer_min_cores {
            p.push(invalid(
                "policy.hybrid.buffer_max_cores",
                self.buffer_max_cores,
                "must be >= buffer_min_cores (or 0 for all CPUs)",
            ));
        }
        p.check(positive(
            "policy.hybrid.buffer_step_cores",
            self.buffer_step_cores,
        ));
    }
}
