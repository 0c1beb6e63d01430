//! `summary.json` of an experiment run directory (docs/architecture.md "The JSON contracts"): produced by
//! headroom-bench. The key names are a contract: extend, don't rename.

use serde::{Deserialize, Serialize};

/// The whole `summary.json`: one experiment, its SLO, and one entry per configuration run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Experiment name (`colocation`, `isolation`, ...).
    pub experiment: String,
    /// The LC tail-latency target in microseconds.
    pub slo_us: f64,
    /// The percentile the SLO applies to (99.0 = p99).
    pub percentile: f64,
    /// One entry per configuration (policy × BE workload).
    pub runs: Vec<RunSummary>,
}

/// One configuration of an experiment: a policy (or scheduler setting) with one BE workload.
///
/// Fields that an experiment cannot measure are `null` (e.g. EMU without a BE progress feed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Agent policy or configuration name (`none`, `hybrid`, `weights-10000:2`, ...).
    pub policy: String,
    /// BE workload (`spin`, `dram`, ...) or `none` when the LC runs alone.
    pub be: String,
    /// Windows (or measurement points) whose LC tail latency exceeded the SLO.
    pub slo_violations: u64,
    /// Windows (or measurement points) measured.
    pub windows: u64,
    /// Mean effective machine utilization: LC load fraction + BE throughput fraction.
    pub emu_mean: Option<f64>,
    /// Lowest per-window EMU.
    pub emu_min: Option<f64>,
    /// Worst LC tail latency (at `percentile`) seen, in microseconds.
    pub lc_p99_us_max: Option<f64>,
    /// BE throughput normalized to the BE running alone (1.0 = as fast as alone).
    pub be_throughput_norm: Option<f64>,
    /// Windows whose load run passed its self-checks, and how many of those violated the SLO
    /// (`None` where the experiment keeps no per-window validity). A verdict rests on these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_windows: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_violations_valid: Option<u64>,
}
