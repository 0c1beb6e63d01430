//! The kernel's resource values as the control logic plans them: resctrl capabilities and
//! schemata, CFS bandwidth, disk throttles. The host layer reads and writes them; the pure
//! control crate only computes with them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// L3 cache allocation capabilities (`info/L3`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct L3Info {
    pub cbm_mask: u64,
    pub min_cbm_bits: u32,
    pub num_closids: u32,
    pub shareable_bits: u64,
}

impl L3Info {
    /// Number of cache ways (bits in the full mask).
    pub fn ways(&self) -> u32 {
        self.cbm_mask.count_ones()
    }
}

/// Memory bandwidth allocation capabilities (`info/MB`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MbInfo {
    pub bandwidth_gran: u32,
    pub min_bandwidth: u32,
    pub num_closids: u32,
    pub delay_linear: bool,
}

/// One group's allocation: L3 CBM and MB percent per cache domain id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schemata {
    pub l3: BTreeMap<u32, u64>,
    pub mb: BTreeMap<u32, u32>,
}

impl Schemata {
    /// The lines written to `schemata`: `L3:0=ff;1=ff` and `MB:0=50;1=50` (only non-empty ones).
    pub fn to_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.l3.is_empty() {
            let parts: Vec<String> = self.l3.iter().map(|(d, m)| format!("{d}={m:x}")).collect();
            out.push(format!("L3:{}", parts.join(";")));
        }
        if !self.mb.is_empty() {
            let parts: Vec<String> = self.mb.iter().map(|(d, p)| format!("{d}={p}")).collect();
            out.push(format!("MB:{}", parts.join(";")));
        }
        out
    }
}

/// The contiguous mask of the `ways` highest ways of `cbm_mask` (BE gets the top, LC the bottom).
pub fn top_ways_mask(l3: &L3Info, ways: u32) -> u64 {
    let total = l3.ways();
    let ways = ways.clamp(l3.min_cbm_bits.max(1), total);
    let low = ((1u128 << ways) - 1) as u64;
    low << (total - ways)
}

/// CPU bandwidth: `quota_us` of CPU time per `period_us` (`None` = unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuQuota {
    pub quota_us: Option<u64>,
    pub period_us: u64,
}

impl CpuQuota {
    /// The kernel default period (100 ms).
    pub const DEFAULT_PERIOD_US: u64 = 100_000;

    /// No limit, default period.
    pub fn unlimited() -> Self {
        CpuQuota {
            quota_us: None,
            period_us: Self::DEFAULT_PERIOD_US,
        }
    }

    /// `percent` of ONE CPU per default period (200 = two CPUs); at least the kernel's 1 ms.
    pub fn percent_of_cpu(percent: f64) -> Self {
        let quota = (percent / 100.0 * Self::DEFAULT_PERIOD_US as f64)
            .round()
            .max(1000.0) as u64;
        CpuQuota {
            quota_us: Some(quota),
            period_us: Self::DEFAULT_PERIOD_US,
        }
    }
}

/// Disk throttles of one device (`None` = unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoLimits {
    pub read_bps: Option<u64>,
    pub write_bps: Option<u64>,
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
}

/// The most TCP ports the passive latency sensor follows (its BPF map's size).
pub const MAX_LATENCY_PORTS: usize = 64;

/// The margin a start-up check leaves where run-time conditions can only lower a count (a
/// loaded host sends fewer probes than asked, an LC serves fewer requests than it did): a
/// count derived from the config must reach this many times the minimum it is checked
/// against, so a config accepted at start is not refused window after window at run time.
pub const COUNT_MARGIN: f64 = 1.25;

/// `min` with the [`COUNT_MARGIN`] (rounded up).
pub fn with_margin(min: u64) -> u64 {
    (min as f64 * COUNT_MARGIN).ceil() as u64
}

/// Samples needed before the `percentile` (0–100) is worth reporting: 10 / (1 − p), so that at
/// least 10 samples lie above it (p99 → 1000, p99.9 → 10000, p99.99 → 100000).
pub fn min_samples_for(percentile: f64) -> u64 {
    let tail = 1.0 - (percentile / 100.0).clamp(0.0, 1.0);
    if tail <= 0.0 {
        return u64::MAX;
    }
    (10.0 / tail).round() as u64
}
