//! `[policy.heracles]`: Heracles' settings (ISCA'15 constants as defaults).

use crate::config::checks::*;
use crate::config::error::{invalid, Problems};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LowSlackAction {
    /// Paper's pseudo-code, `be_cores.Remove(be_cores.Size()-2)`: BE keeps at most N cores.
    Keep,
    /// The prose reading: take N cores back from BE.
    Remove,
}

/// `[policy.heracles]`: Heracles (ISCA'15) Alg. 1–4.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeraclesConfig {
    // Alg. 1
    /// Top-level period, s (15).
    pub interval_s: f64,
    /// BE stays disabled this long after slack < 0, s (5 min).
    pub cooldown_s: f64,
    /// Disable BE when load exceeds this fraction of peak (0.85).
    pub load_disable: f64,
    /// Enable BE when load drops below this (0.80).
    pub load_enable: f64,
    /// Below this slack BE may not grow (0.10).
    pub slack_disallow_growth: f64,
    /// Below this slack cores go back to LC (0.05).
    pub slack_shrink: f64,
    /// What "cores go back" means (see [`LowSlackAction`]).
    pub slack_shrink_action: LowSlackAction,
    /// N in the low-slack action (2).
    pub slack_shrink_cores: u32,
    // Alg. 2
    /// Core & memory sub-controller period, s (2).
    pub cores_interval_s: f64,
    /// DRAM_LIMIT as a fraction of peak streaming bandwidth (0.90).
    pub dram_limit: f64,
    /// Peak DRAM bandwidth, bytes/s; absent = from the observation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dram_peak_bytes_per_s: Option<f64>,
    /// Offline model of the LC's DRAM bandwidth at current load, bytes/s at 100% load (scaled by
    /// load); absent = measured total minus BE.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lc_bw_model_bytes_per_s: Option<f64>,
    /// BE starts with this many cores (1).
    pub initial_be_cores: u32,
    /// Most cores BE may get; 0 = all CPUs of its socket but one kept for LC.
    pub max_be_cores: u32,
    /// BE starts with this fraction of the LLC (0.10).
    pub initial_llc_frac: f64,
    /// LLC ways added per GROW_LLC step.
    pub llc_step_ways: u32,
    /// Minimum relative BE progress gain for a cache step to count as a benefit.
    pub be_benefit_min: f64,
    /// Confine BE to this socket (index into the machine's sockets).
    pub be_socket: u32,
    // Alg. 3
    /// Power sub-controller period, s (2).
    pub power_interval_s: f64,
    /// Power threshold as a fraction of TDP (0.90).
    pub power_tdp_frac: f64,
    /// LC guaranteed frequency, MHz (measured with LC alone at full load); absent disables Alg. 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guaranteed_freq_mhz: Option<f64>,
    /// DVFS step, MHz (100).
    pub freq_step_mhz: f64,
    /// Lowest BE frequency cap, MHz.
    pub be_freq_min_mhz: f64,
    /// Highest BE frequency cap, MHz (the uncapped maximum).
    pub be_freq_max_mhz: f64,
    // Alg. 4
    /// Network sub-controller period, s (1).
    pub net_interval_s: f64,
    /// Headroom as a fraction of the link rate (0.05).
    pub net_link_headroom: f64,
    /// Headroom as a fraction of LC bandwidth (0.10).
    pub net_lc_headroom: f64,
    /// Link rate, bytes/s; absent = from the observation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_bytes_per_s: Option<f64>,
}

impl Default for HeraclesConfig {
    fn default() -> Self {
        HeraclesConfig {
            interval_s: 15.0,
            cooldown_s: 300.0,
            load_disable: 0.85,
            load_enable: 0.80,
            slack_disallow_growth: 0.10,
            slack_shrink: 0.05,
            slack_shrink_action: LowSlackAction::Keep,
            slack_shrink_cores: 2,
            cores_interval_s: 2.0,
            dram_limit: 0.90,
            dram_peak_bytes_per_s: None,
            lc_bw_model_bytes_per_s: None,
            initial_be_cores: 1,
            max_be_cores: 0,
            initial_llc_frac: 0.10,
            llc_step_ways: 1,
            be_benefit_min: 0.0,
            be_socket: 0,
            power_interval_s: 2.0,
            power_tdp_frac: 0.90,
            guaranteed_freq_mhz: None,
            freq_step_mhz: 100.0,
            be_freq_min_mhz: 800.0,
            be_freq_max_mhz: 10_000.0,
            net_interval_s: 1.0,
            net_link_headroom: 0.05,
            net_lc_headroom: 0.10,
            link_bytes_per_s: None,
        }
    }
}

impl HeraclesConfig {
    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, p: &mut Problems) {
        p.check(interval("policy.heracles.interval_s", self.interval_s));
        p.check(non_negative("policy.heracles.cooldown_s", self.cooldown_s));
        p.check(fraction("policy.heracles.load_disable", self.load_disable));
        p.check(fraction("policy.heracles.load_enable", self.load_enable));
        if self.load_enable > self.load_disable {
            p.push(invalid(
                "policy.heracles.load_enable",
                self.load_enable,
                format!(
                    "must be <= load_disable ({}) for hysteresis",
                    self.load_disable
                ),
            ));
        }
        p.check(fraction(
            "policy.heracles.slack_disallow_growth",
            self.slack_disallow_growth,
        ));
        p.check(fraction("policy.heracles.slack_shrink", self.slack_shrink));
        if self.slack_shrink > self.slack_disallow_growth {
            p.push(invalid(
                "policy.heracles.slack_shrink",
                self.slack_shrink,
                "must be <= slack_disallow_growth",
            ));
        }
        p.check(interval(
            "policy.heracles.cores_interval_s",
            self.cores_interval_s,
        ));
        p.check(fraction("policy.heracles.dram_limit", self.dram_limit));
        if let Some(v) = self.dram_peak_bytes_per_s {
            p.check(positive("policy.heracles.dram_peak_bytes_per_s", v));
        }
        if let Some(v) = self.lc_bw_model_bytes_per_s {
            p.check(non_negative("policy.heracles.lc_bw_model_bytes_per_s", v));
        }
        if self.initial_be_cores == 0 {
            p.push(invalid(
                "policy.heracles.initial_be_cores",
                0,
                "must be >= 1",
            ));
        }
        p.check(fraction(
            "policy.heracles.initial_llc_frac",
            self.initial_llc_frac,
        ));
        if self.llc_step_ways == 0 {
            p.push(invalid("policy.heracles.llc_step_ways", 0, "must be >= 1"));
        }
        p.check(non_negative(
            "policy.heracles.be_benefit_min",
            self.be_benefit_min,
        ));
        p.check(interval(
            "policy.heracles.power_interval_s",
            self.power_interval_s,
        ));
        p.check(fraction(
            "policy.heracles.power_tdp_frac",
            self.power_tdp_frac,
        ));
        if let Some(g) = self.guaranteed_freq_mhz {
            p.check(positive("policy.heracles.guaranteed_freq_mhz", g));
        }
        p.check(positive(
            "policy.heracles.freq_step_mhz",
            self.freq_step_mhz,
        ));
        p.check(positive(
            "policy.heracles.be_freq_min_mhz",
            self.be_freq_min_mhz,
        ));
        // Finite too: a NaN or infinite maximum passed the comparison below, and the power
        // sub-controller's cap then never applied (`cap < max` is never true; twelfth pass).
        p.check(positive(
            "policy.heracles.be_freq_max_mhz",
            self.be_freq_max_mhz,
        ));
        if self.be_freq_max_mhz < self.be_freq_min_mhz {
            p.push(invalid(
                "policy.heracles.be_freq_max_mhz",
                self.be_freq_max_mhz,
                "must be >= be_freq_min_mhz",
            ));
        }
        p.check(interval(
            "policy.heracles.net_interval_s",
            self.net_interval_s,
        ));
        p.check(fraction(
            "policy.heracles.net_link_headroom",
            self.net_link_headroom,
        ));
        p.check(non_negative(
            "policy.heracles.net_lc_headroom",
            self.net_lc_headroom,
        ));
        if let Some(v) = self.link_bytes_per_s {
            p.check(positive("policy.heracles.link_bytes_per_s", v));
        }
    }
}
