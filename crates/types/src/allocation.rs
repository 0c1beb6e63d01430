//! What the BE groups may use, and how the LC threads are treated: a policy's output.
//!
//! `None` in a limit means "the agent imposes nothing": the reconciler restores the value the
//! group had before the agent touched it. The JSON form is the decision log's `allocation`
//! (docs/architecture.md, contract 6).

use serde::{Deserialize, Serialize};

use crate::values::{CpuSet, DeviceId, GroupPath};

/// A CPU weight written natively on each hierarchy (never converted through shares): v1
/// `cpu.shares` (2..262144) and v2 `cpu.weight` (1..10000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuWeight {
    /// cgroup v1 `cpu.shares`.
    pub shares: u64,
    /// cgroup v2 `cpu.weight`.
    pub weight: u64,
}

impl CpuWeight {
    /// Blagodurov's critical weight: shares 10000, and the v2 maximum 10000.
    pub const CRITICAL: CpuWeight = CpuWeight {
        shares: 10000,
        weight: 10000,
    };
    /// Blagodurov's batch weight: shares 2 (the v1 minimum), and the v2 minimum 1.
    pub const BATCH: CpuWeight = CpuWeight {
        shares: 2,
        weight: 1,
    };
    /// The kernel defaults (1024 / 100).
    pub const DEFAULT: CpuWeight = CpuWeight {
        shares: 1024,
        weight: 100,
    };
}

/// A block-device throttle for the BE groups (v2 `io.max`, v1 `blkio.throttle.*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoLimit {
    /// The block device (`"MAJOR:MINOR"` in JSON and TOML).
    pub device: DeviceId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
}

/// A CPU weight for one LC group (the `weights` policy with several critical groups).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LcGroupWeight {
    /// Group name as in `[[policy.weights.groups]] name`.
    pub name: String,
    /// cgroup path relative to the cgroup root.
    pub cgroup: GroupPath,
    pub cpu_weight: CpuWeight,
}

/// The CPUs one LC service (`[[lc]] name`) may run on, given by an arbitrating policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LcServiceCpus {
    /// `[[lc]] name`.
    pub name: String,
    /// cgroup path relative to the cgroup root (its cpuset is written).
    pub cgroup: GroupPath,
    pub cpus: CpuSet,
}

/// How the LC threads are treated (the mainline stand-ins for BVT warp). The LC is never
/// restricted: these only give it more.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LcTreatment {
    /// Pin the LC threads one per CPU onto these CPUs (round robin); `None` = leave affinity.
    pub pin_cpus: Option<CpuSet>,
    /// EEVDF slice request (`sched_setattr` `sched_runtime`) for LC threads, µs.
    pub slice_us: Option<u64>,
    /// Run LC threads SCHED_FIFO at this priority (1..99).
    pub fifo_priority: Option<u8>,
    /// CPU weight of the LC group.
    pub cpu_weight: Option<CpuWeight>,
}

/// The desired state of the BE groups (and LC treatment) after one decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Allocation {
    /// BE may run. `false` freezes the BE groups (cgroup freezer).
    pub be_enabled: bool,
    /// CPUs the BE groups may run on; `None` = unrestricted.
    pub be_cpus: Option<CpuSet>,
    /// BE CPU weight; `None` = original.
    pub be_cpu_weight: Option<CpuWeight>,
    /// BE groups as `cpu.idle` (SCHED_IDLE-like); `None` = original.
    pub be_cpu_idle: Option<bool>,
    /// BE CPU bandwidth as a percentage of one CPU (150 = 1.5 CPUs); `None` = unlimited.
    pub be_quota_pct: Option<f64>,
    /// CFS period for the quota, µs.
    pub be_quota_period_us: Option<u64>,
    /// LLC ways given to BE (resctrl L3 mask width); the LC gets the rest.
    pub be_llc_ways: Option<u32>,
    /// BE memory bandwidth throttle (resctrl MB), percent.
    pub be_mba_pct: Option<u32>,
    /// Maximum frequency of the BE CPUs (`scaling_max_freq`), kHz.
    pub be_freq_khz: Option<u64>,
    /// HTB `ceil` of the BE class, bytes/s.
    pub be_egress_ceil_bytes_per_s: Option<u64>,
    /// Block I/O throttles of the BE groups.
    pub be_io_limits: Vec<IoLimit>,
    /// BE memory limit (`memory.max` / `memory.limit_in_bytes`), bytes.
    pub be_memory_limit_bytes: Option<u64>,
    /// BE process limit (`pids.max` of each BE group: tasks, processes and threads);
    /// `None` = the groups' original. Set from `safety.be_pids_max` whatever the policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub be_pids_max: Option<u64>,
    /// `be_pids_max` is the default (no `safety.be_pids_max` given), not an operator's value:
    /// a BE group whose original `pids.max` is lower keeps its original (hostile pass 26's
    /// low: the default replaced an operator's lower limit on an existing group).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub be_pids_max_default: bool,
    /// Kill the BE processes now (low memory: freezing would not free their memory); the runtime
    /// restarts the configured BE commands with backoff once this is false again.
    pub be_kill: bool,
    /// Per-LC-group CPU weights (the `weights` policy).
    pub lc_groups: Vec<LcGroupWeight>,
    /// Per-LC-service CPU sets (the `multi` policy's arbitration between `[[lc]]` services,
    /// PARTIES' order); empty = the services' CPUs are left as they are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lc_services: Vec<LcServiceCpus>,
    /// LC thread treatment.
    pub lc: LcTreatment,
}

impl Default for Allocation {
    /// BE enabled with no limit: what the machine does without an agent.
    fn default() -> Self {
        Allocation {
            be_enabled: true,
            be_cpus: None,
            be_cpu_weight: None,
            be_cpu_idle: None,
            be_quota_pct: None,
            be_quota_period_us: None,
            be_llc_ways: None,
            be_mba_pct: None,
            be_freq_khz: None,
            be_egress_ceil_bytes_per_s: None,
            be_io_limits: Vec::new(),
            be_memory_limit_bytes: None,
            be_pids_max: None,
            be_pids_max_default: false,
            be_kill: false,
            lc_groups: Vec::new(),
            lc_services: Vec::new(),
            lc: LcTreatment::default(),
        }
    }
}

impl Allocation {
    /// BE unrestricted (the `none` policy).
    pub fn unrestricted() -> Self {
        Allocation::default()
    }

    /// BE frozen, every other field as given.
    pub fn disabled(mut self) -> Self {
        self.be_enabled = false;
        self
    }

    /// How much CPU BE may use, in CPUs, on a machine with `machine_cpus` CPUs: the smaller of the
    /// cpuset size and the quota; 0 when disabled. Used to tell growth from shrink.
    pub fn be_cpu_capacity(&self, machine_cpus: usize) -> f64 {
        if !self.be_enabled {
            return 0.0;
        }
        let by_set = self
            .be_cpus
            .as_ref()
            .map_or(machine_cpus as f64, |c| c.len() as f64);
        let by_quota = self.be_quota_pct.map_or(f64::INFINITY, |q| q / 100.0);
        by_set.min(by_quota)
    }

    /// True when `self` gives BE more of some resource than `prev` does (for the safety rule
    /// "stale latency → BE stops growing").
    pub fn grows_be_over(&self, prev: &Allocation, machine_cpus: usize) -> bool {
        if self.be_enabled && !prev.be_enabled {
            return true;
        }
        if !self.be_enabled {
            return false;
        }
        let more = |new: Option<f64>, old: Option<f64>| match (new, old) {
            (None, Some(_)) => true,
            (Some(n), Some(o)) => n > o,
            _ => false,
        };
        self.be_cpu_capacity(machine_cpus) > prev.be_cpu_capacity(machine_cpus)
            || !cpus_subset(self.be_cpus.as_ref(), prev.be_cpus.as_ref())
            || more(
                self.be_llc_ways.map(f64::from),
                prev.be_llc_ways.map(f64::from),
            )
            || more(
                self.be_mba_pct.map(f64::from),
                prev.be_mba_pct.map(f64::from),
            )
            || more(
                self.be_freq_khz.map(|v| v as f64),
                prev.be_freq_khz.map(|v| v as f64),
            )
            || more(
                self.be_egress_ceil_bytes_per_s.map(|v| v as f64),
                prev.be_egress_ceil_bytes_per_s.map(|v| v as f64),
            )
            || more(
                self.be_cpu_weight.map(|w| w.shares as f64),
                prev.be_cpu_weight.map(|w| w.shares as f64),
            )
            || (self.be_cpu_idle != Some(true) && prev.be_cpu_idle == Some(true))
    }
}

impl Allocation {
    /// `self` with every BE resource capped at what `prev` gave (shrinks pass, growth does not):
    /// the safety rule "unknown or stale LC latency → BE stops growing".
    pub fn limit_growth(&self, prev: &Allocation) -> Allocation {
        let mut out = self.clone();
        out.be_enabled = self.be_enabled && prev.be_enabled;
        if let Some(prev_cpus) = &prev.be_cpus {
            let cpus = self
                .be_cpus
                .as_ref()
                .map_or_else(|| prev_cpus.clone(), |c| c.intersection(prev_cpus));
            if cpus.is_empty() {
                out.be_enabled = false;
            } else {
                out.be_cpus = Some(cpus);
            }
        }
        out.be_quota_pct = min_limit(self.be_quota_pct, prev.be_quota_pct);
        if out.be_quota_pct.is_some() && out.be_quota_period_us.is_none() {
            out.be_quota_period_us = prev.be_quota_period_us;
        }
        out.be_llc_ways = min_limit(self.be_llc_ways, prev.be_llc_ways);
        out.be_mba_pct = min_limit(self.be_mba_pct, prev.be_mba_pct);
        out.be_freq_khz = min_limit(self.be_freq_khz, prev.be_freq_khz);
        out.be_egress_ceil_bytes_per_s = min_limit(
            self.be_egress_ceil_bytes_per_s,
            prev.be_egress_ceil_bytes_per_s,
        );
        out.be_cpu_weight = match (self.be_cpu_weight, prev.be_cpu_weight) {
            (Some(n), Some(p)) => Some(CpuWeight {
                shares: n.shares.min(p.shares),
                weight: n.weight.min(p.weight),
            }),
            (None, p) => p,
            (n, None) => n,
        };
        if prev.be_cpu_idle == Some(true) {
            out.be_cpu_idle = Some(true);
        }
        out
    }
}

/// The tighter of two limits, `None` being "no limit".
fn min_limit<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b < a { b } else { a }),
        (a, None) => a,
        (None, b) => b,
    }
}

/// `new ⊆ old` where `None` is "every CPU".
fn cpus_subset(new: Option<&CpuSet>, old: Option<&CpuSet>) -> bool {
    match (new, old) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(n), Some(o)) => n.is_subset(o),
    }
}

/// Formats CPU ids as a kernel cpulist ("0-3,6,8-9"); the input need not be sorted.
pub fn format_cpulist(cpus: &[u32]) -> String {
    cpus.iter().copied().collect::<CpuSet>().to_list()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulist_round_trip() {
        assert_eq!(format_cpulist(&[3, 0, 1, 2, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(format_cpulist(&[]), "");
    }

    #[test]
    fn growth_detection() {
        let small = Allocation {
            be_cpus: Some(CpuSet::from([1])),
            ..Allocation::default()
        };
        let big = Allocation {
            be_cpus: Some(CpuSet::from([0, 1])),
            ..Allocation::default()
        };
        assert!(big.grows_be_over(&small, 2));
        assert!(!small.grows_be_over(&big, 2));
        assert!(small.grows_be_over(&small.clone().disabled(), 2));
        assert!(!small.clone().disabled().grows_be_over(&small, 2));
        let quota = Allocation {
            be_quota_pct: Some(50.0),
            ..small.clone()
        };
        assert!(small.grows_be_over(&quota, 2));
        assert_eq!(quota.be_cpu_capacity(2), 0.5);
    }
}
