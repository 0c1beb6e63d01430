//! What the sensors saw in one tick: the only input of a policy.
//!
//! Every field is optional because hardware and kernels differ (no RAPL, no resctrl, no probe
//! configured, …); a policy whose input is `None` disables the part that needs it and says so in
//! its decision state. Ages are in milliseconds at the time of the tick, so stale data is visible.

use serde::{Deserialize, Serialize};

/// One tick's view of the machine, the LC service and the BE groups.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Observation {
    // ---- LC service-level signals ----
    /// LC tail latency at the configured SLO percentile (`lc.slo.percentile`), in µs.
    pub lc_latency_us: Option<f64>,
    /// Age of `lc_latency_us`: time since the end of its measurement window, in ms.
    pub lc_latency_age_ms: Option<u64>,
    /// With two latency sources (`source = "kernel"`, `fallback = "probe"`): the kernel
    /// sensor's and the prober's figures side by side, µs, and which one `lc_latency_us` is
    /// (`kernel`, `probe`); recorded, never read by a policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lc_latency_kernel_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lc_latency_probe_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lc_latency_source: Option<String>,
    /// Why `lc_latency_us` may not judge an SLO violation (`None`: it may): a fallback
    /// prober's figure that the kernel sensor's disagrees with or cannot check. Such a
    /// figure above the target holds BE but starts no violation cooldown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lc_latency_untrusted: Option<String>,
    /// LC load in requests per second.
    pub lc_qps: Option<f64>,
    /// LC load as a fraction of `lc.load.peak_qps` (0.0 ..; may exceed 1).
    pub lc_load: Option<f64>,
    /// Age of `lc_qps` / `lc_load`, in ms.
    pub lc_load_age_ms: Option<u64>,
    /// Per-LC signals: one entry per `[[lc]]` service when the agent protects several (the
    /// top-level `lc_*` fields then repeat the first service's, for single-LC policies), or
    /// the `weights` policy's groups. Empty = one LC, described by the top-level fields.
    pub lc_groups: Vec<LcGroupObservation>,

    // ---- CPU ----
    /// Per-CPU idle fraction (0..1) since the previous tick, indexed by CPU id.
    pub cpu_idle: Option<Vec<f64>>,
    /// Number of idle CPUs, when the sensor counts them directly (e.g. from an idle bit mask).
    /// When absent, policies derive it from `cpu_idle`.
    pub idle_cpus: Option<f64>,
    /// CPUs the LC threads are pinned to (union of their affinity masks). `None` or the full set
    /// of online CPUs means "not pinned".
    pub lc_cpus: Option<Vec<u32>>,
    /// LC group CPU usage in CPUs (1.0 = one CPU fully busy) since the previous tick.
    pub lc_cpu_usage: Option<f64>,
    /// BE groups' CPU usage in CPUs since the previous tick.
    pub be_cpu_usage: Option<f64>,
    /// Mean run-queue delay of the LC threads per scheduling event since the previous tick, µs
    /// (from schedstat).
    pub lc_runq_delay_us: Option<f64>,
    /// BE progress in work units per second (e.g. antagonist ops/s), used to judge whether a
    /// resource grant benefits BE (Heracles' `BeBenefit`).
    pub be_progress: Option<f64>,

    // ---- pressure stall information (avg10, percent) ----
    pub psi_cpu_some: Option<f64>,
    pub psi_memory_some: Option<f64>,
    pub psi_memory_full: Option<f64>,
    pub psi_io_some: Option<f64>,

    // ---- memory ----
    pub mem_available_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    /// Memory charged to the BE groups.
    pub be_memory_bytes: Option<u64>,
    /// Memory charged to the LC groups (`memory.current` / `memory.usage_in_bytes`, summed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lc_memory_bytes: Option<u64>,

    // ---- DRAM bandwidth (resctrl mon_data mbm_total_bytes rates) ----
    /// Total DRAM bandwidth in use, bytes/s.
    pub dram_bw_bytes_per_s: Option<f64>,
    /// The BE groups' share of it, bytes/s.
    pub be_dram_bw_bytes_per_s: Option<f64>,
    /// Peak streaming DRAM bandwidth of the machine, bytes/s (measured or configured).
    pub dram_bw_peak_bytes_per_s: Option<f64>,

    // ---- power and frequency ----
    /// Package power from RAPL, watts (summed over sockets).
    pub power_w: Option<f64>,
    /// Thermal design power (RAPL long-term limit), watts.
    pub tdp_w: Option<f64>,
    /// Mean current frequency of the CPUs running LC, MHz.
    pub lc_freq_mhz: Option<f64>,
    /// Mean current frequency of the BE CPUs, MHz.
    pub be_freq_mhz: Option<f64>,

    // ---- network egress ----
    /// LC egress rate, bytes/s.
    pub lc_tx_bytes_per_s: Option<f64>,
    /// BE egress rate, bytes/s.
    pub be_tx_bytes_per_s: Option<f64>,
    /// Cumulative LC egress bytes (counter).
    pub lc_tx_bytes: Option<u64>,
    /// Cumulative BE egress bytes (counter).
    pub be_tx_bytes: Option<u64>,
    /// Link speed of the egress device, bytes/s.
    pub link_bytes_per_s: Option<f64>,
}

/// Signals of one LC service (`[[lc]] name`, one entry per service when the agent protects
/// several) or one LC group of the `weights` policy (Blagodurov's several critical workloads).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LcGroupObservation {
    /// `[[lc]] name`, or the group name as in `[[policy.weights.groups]] name`.
    pub name: String,
    /// Response time at the service's own SLO percentile (`lc[i].slo.percentile`), µs.
    pub latency_us: Option<f64>,
    /// Age of `latency_us`: time since the end of its measurement window, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_age_ms: Option<u64>,
    /// Which source gave `latency_us` (`kernel`, `probe`, `scrape`, `feed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_source: Option<String>,
    /// Why `latency_us` may not judge an SLO violation (as `Observation::lc_latency_untrusted`
    /// for this service): above the target it holds BE but starts no cooldown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_untrusted: Option<String>,
    /// Request rate, requests/s.
    pub qps: Option<f64>,
    /// Load as a fraction of the service's `lc[i].load.peak_qps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<f64>,
    /// CPU consumption in CPUs (1.0 = one CPU fully busy).
    pub cpu_usage: Option<f64>,
    /// CPUs the service's threads are pinned to (union of their affinity masks); `None` or
    /// every online CPU = not pinned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<Vec<u32>>,
}

impl Observation {
    /// Latency slack relative to the SLO target, Heracles' `(target - latency) / target`.
    pub fn slack(&self, target_us: f64) -> Option<f64> {
        let latency = self.lc_latency_us?;
        if !(latency.is_finite() && target_us > 0.0) {
            return None;
        }
        Some((target_us - latency) / target_us)
    }

    /// Number of idle CPUs: `idle_cpus` when the sensor gave it, else the count of CPUs whose idle
    /// fraction reaches `threshold` (`threshold <= 0` sums the idle fractions instead). Non-finite
    /// entries (a CPU with no time accounted in the interval) are unknown, not busy; with no
    /// finite entry at all the count is unknown.
    pub fn idle_cpu_count(&self, threshold: f64) -> Option<f64> {
        if let Some(idle) = self.idle_cpus.filter(|i| i.is_finite()) {
            return Some(idle.max(0.0));
        }
        let per_cpu = self.cpu_idle.as_ref()?;
        let known = per_cpu.iter().filter(|f| f.is_finite());
        known.clone().next()?;
        if threshold <= 0.0 {
            return Some(known.map(|f| f.clamp(0.0, 1.0)).sum());
        }
        Some(known.filter(|f| **f >= threshold).count() as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_count_from_fractions_ignores_unknown_cpus() {
        let o = Observation {
            cpu_idle: Some(vec![1.0, f64::NAN, 0.2, 0.7]),
            ..Observation::default()
        };
        assert_eq!(o.idle_cpu_count(0.5), Some(2.0));
        assert_eq!(o.idle_cpu_count(0.0), Some(1.9));
        let none = Observation {
            cpu_idle: Some(vec![f64::NAN, f64::NAN]),
            ..Observation::default()
        };
        assert_eq!(none.idle_cpu_count(0.5), None);
        let direct = Observation {
            idle_cpus: Some(3.0),
            cpu_idle: Some(vec![0.0; 4]),
            ..Observation::default()
        };
        assert_eq!(direct.idle_cpu_count(0.5), Some(3.0));
    }

    #[test]
    fn slack_is_relative_to_the_target() {
        let o = Observation {
            lc_latency_us: Some(450.0),
            ..Observation::default()
        };
        assert_eq!(o.slack(500.0), Some(0.1));
        assert_eq!(o.slack(0.0), None);
        assert_eq!(Observation::default().slack(500.0), None);
    }
}
