//! `[policy.weights]`: Blagodurov's weights' settings.

use crate::config::checks::*;
use crate::config::error::{invalid, Problems};
use headroom_types::GroupPath;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightsMode {
    /// Static weights: critical 10000, batch 2.
    Static,
    /// Dynamic weights from the performance factor (§V.B).
    Fair,
    /// Dynamic, and a group over its agreed maximum load gets RT_sla = ∞ (§V.C).
    Isolation,
}

/// `[[policy.weights.groups]]`: one critical group for dynamic weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightGroupConfig {
    pub name: String,
    pub cgroup: GroupPath,
    /// Response-time requirement RT_sla at the SLO percentile, µs.
    pub rt_sla_us: f64,
    /// Agreed maximum load (isolation mode), requests/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_qps: Option<f64>,
}

/// `[policy.weights]`: Blagodurov et al.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WeightsConfig {
    pub mode: WeightsMode,
    /// Critical weight, v1 shares (paper: 10000).
    pub lc_shares: u64,
    /// Batch weight, v1 shares (paper: 2, the minimum).
    pub be_shares: u64,
    /// Critical weight, v2 cpu.weight (10000, the maximum).
    pub lc_weight_v2: u64,
    /// Batch weight, v2 cpu.weight (1, the minimum).
    pub be_weight_v2: u64,
    /// Run BE as `cpu.idle` instead of weight 2 (mainline successor of the lowest weight).
    pub be_cpu_idle: bool,
    /// Control interval of dynamic weights, s (paper: 5).
    pub interval_s: f64,
    /// W^max, v1 shares (paper: 256k).
    pub w_max: u64,
    /// W^min, v1 shares (paper: 1k, the default weight).
    pub w_min: u64,
    /// W^max on v2.
    pub w_max_v2: u64,
    /// W^min on v2 (100 = the v2 default).
    pub w_min_v2: u64,
    /// Lower clamp of the desired CPU allocation C (fraction of the server).
    pub c_min: f64,
    /// Upper clamp of C.
    pub c_max: f64,
    /// RT_sla used for a group over its max load in isolation mode, µs (paper: a million seconds).
    pub infinite_rt_sla_us: f64,
    /// Critical groups; empty = the single `[lc]` group with RT_sla = `lc.slo.target_us` and
    /// max load = `lc.load.peak_qps`.
    pub groups: Vec<WeightGroupConfig>,
}

impl Default for WeightsConfig {
    fn default() -> Self {
        WeightsConfig {
            mode: WeightsMode::Static,
            lc_shares: 10_000,
            be_shares: 2,
            lc_weight_v2: 10_000,
            be_weight_v2: 1,
            be_cpu_idle: false,
            interval_s: 5.0,
            w_max: 262_144,
            w_min: 1024,
            w_max_v2: 10_000,
            w_min_v2: 100,
            c_min: 0.001,
            c_max: 1.0,
            infinite_rt_sla_us: 1e12,
            groups: Vec::new(),
        }
    }
}

impl WeightsConfig {
    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, p: &mut Problems) {
        p.check(shares("policy.weights.lc_shares", self.lc_shares));
        p.check(shares("policy.weights.be_shares", self.be_shares));
        p.check(shares("policy.weights.w_max", self.w_max));
        p.check(shares("policy.weights.w_min", self.w_min));
        p.check(weight_v2("policy.weights.lc_weight_v2", self.lc_weight_v2));
        p.check(weight_v2("policy.weights.be_weight_v2", self.be_weight_v2));
        p.check(weight_v2("policy.weights.w_max_v2", self.w_max_v2));
        p.check(weight_v2("policy.weights.w_min_v2", self.w_min_v2));
        if self.w_min > self.w_max {
            p.push(invalid(
                "policy.weights.w_min",
                self.w_min,
                "must be <= w_max",
            ));
        }
        if self.w_min_v2 > self.w_max_v2 {
            p.push(invalid(
                "policy.weights.w_min_v2",
                self.w_min_v2,
                "must be <= w_max_v2",
            ));
        }
        p.check(interval("policy.weights.interval_s", self.interval_s));
        p.check(positive("policy.weights.c_min", self.c_min));
        // `contains` refuses NaN too (a NaN passed both comparisons, then `clamp` panicked
        // at the first dynamic update: twelfth hostile pass).
        if !(self.c_min..=1.0).contains(&self.c_max) {
            p.push(invalid(
                "policy.weights.c_max",
                self.c_max,
                "must be in [c_min, 1] (a fraction of the server)",
            ));
        }
        p.check(positive(
            "policy.weights.infinite_rt_sla_us",
            self.infinite_rt_sla_us,
        ));
        for (i, g) in self.groups.iter().enumerate() {
            p.check(positive(
                &format!("policy.weights.groups[{i}].rt_sla_us"),
                g.rt_sla_us,
            ));
            if let Some(m) = g.max_qps {
                p.check(positive(&format!("policy.weights.groups[{i}].max_qps"), m));
            }
        }
    }
}
