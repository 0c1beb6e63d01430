//! The cpu (and cpuacct) controller: weights, `cpu.idle`, CFS bandwidth, usage, real-time budget.

use crate::error::{HostError, Result};
use headroom_types::values::GroupPath;

use super::{stat_field, Backend, Cgroups, Controller, KnobFile};

const CPU_IDLE: KnobFile = KnobFile::both(Controller::Cpu, "cpu.idle", "cpu.idle");
const CPU_RT_RUNTIME_US: KnobFile = KnobFile::v1_only(Controller::Cpu, "cpu.rt_runtime_us");
/// Cumulative CPU time: v1 in the cpuacct hierarchy, v2 a line of `cpu.stat`.
const CPU_USAGE: KnobFile = KnobFile::both(Controller::Cpuacct, "cpuacct.usage", "cpu.stat");
const CPU_STAT: KnobFile = KnobFile::both(Controller::Cpu, "cpu.stat", "cpu.stat");
const CPU_WEIGHT: KnobFile = KnobFile::both(Controller::Cpu, "cpu.shares", "cpu.weight");
/// CFS bandwidth: one file on v2 (`QUOTA|max PERIOD`), two on v1.
const CPU_MAX: KnobFile = KnobFile::v2_only(Controller::Cpu, "cpu.max");
const CPU_CFS_PERIOD_US: KnobFile = KnobFile::v1_only(Controller::Cpu, "cpu.cfs_period_us");
const CPU_CFS_QUOTA_US: KnobFile = KnobFile::v1_only(Controller::Cpu, "cpu.cfs_quota_us");

pub use headroom_types::resources::CpuQuota;

/// The kernel's bounds on a quota, checked before a write.
fn validate_quota(quota: &CpuQuota) -> Result<()> {
    if !(1000..=1_000_000).contains(&quota.period_us) {
        return Err(HostError::invalid(
            "cpu period",
            quota.period_us.to_string(),
            "must be within 1000..=1000000 µs",
        ));
    }
    if let Some(q) = quota.quota_us {
        if q < 1000 {
            return Err(HostError::invalid(
                "cpu quota",
                q.to_string(),
                "must be at least 1000 µs",
            ));
        }
    }
    Ok(())
}

/// CFS bandwidth throttling counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuThrottling {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
}

impl Cgroups {
    /// The native value `weight` becomes here: v1 `cpu.shares` = weight (2..=262144); v2
    /// `cpu.weight` = weight clamped to 1..=10000 with the v1 floor 2 mapped to the v2 floor 1,
    /// so Blagodurov's 10000:2 stays 10000:2 on v1 and becomes 10000:1 on v2 — never the
    /// 382:1 that a conversion through shares would give.
    pub fn native_cpu_weight(&self, weight: u64) -> Result<u64> {
        Ok(match self.backend(Controller::Cpu)? {
            Backend::V1(_) => weight.clamp(2, 262_144),
            Backend::V2(_) => {
                if weight <= 2 {
                    1
                } else {
                    weight.min(10_000)
                }
            }
        })
    }

    /// Writes the CPU weight natively (see [`Cgroups::native_cpu_weight`]); returns what was
    /// written. A weight of 0 is refused.
    pub fn set_cpu_weight(&self, group: &GroupPath, weight: u64) -> Result<u64> {
        if weight == 0 {
            return Err(HostError::invalid("cpu weight", "0", "must be at least 1"));
        }
        let native = self.native_cpu_weight(weight)?;
        let (_, path) = self.knob(&CPU_WEIGHT, group)?;
        self.knobs.write(&path, &native.to_string())?;
        Ok(native)
    }

    /// The native weight (`cpu.shares` on v1, `cpu.weight` on v2).
    pub fn cpu_weight(&self, group: &GroupPath) -> Result<u64> {
        let (_, path) = self.knob(&CPU_WEIGHT, group)?;
        self.knobs.read_u64(&path)
    }

    /// `cpu.rt_runtime_us` of a cgroup-v1 cpu group: the real-time budget its SCHED_FIFO/RR
    /// tasks may use per `cpu.rt_period_us`. `Ok(None)` where the knob does not exist (cgroup v2,
    /// or a kernel without CONFIG_RT_GROUP_SCHED: RT tasks are then allowed in any group).
    pub fn rt_runtime_us(&self, group: &GroupPath) -> Result<Option<i64>> {
        let path = match self.knob(&CPU_RT_RUNTIME_US, group) {
            Ok((false, path)) => path,
            Ok((true, _)) | Err(_) => return Ok(None),
        };
        if !path.exists() {
            return Ok(None);
        }
        self.knobs.read_i64(&path).map(Some)
    }

    /// Sets `cpu.rt_runtime_us` (v1 with RT group scheduling only; see
    /// [`Cgroups::rt_runtime_us`]). The kernel refuses (EBUSY/EINVAL) a budget larger than the
    /// parent's minus the siblings', and 0 while the group holds RT tasks.
    pub fn set_rt_runtime_us(&self, group: &GroupPath, runtime_us: i64) -> Result<()> {
        let (v2, path) = self.knob(&CPU_RT_RUNTIME_US, group)?;
        if v2 {
            return Err(HostError::unavailable(
                "cpu.rt_runtime_us",
                "cgroup v2 has no per-group real-time budget",
            ));
        }
        self.knobs.write(&path, &runtime_us.to_string())
    }

    /// `cpu.idle`: the group runs only when nothing else wants the CPU (SCHED_IDLE for groups).
    pub fn set_cpu_idle(&self, group: &GroupPath, idle: bool) -> Result<()> {
        let (_, path) = self.knob(&CPU_IDLE, group)?;
        self.knobs.write(&path, if idle { "1" } else { "0" })
    }

    pub fn cpu_idle(&self, group: &GroupPath) -> Result<bool> {
        let (_, path) = self.knob(&CPU_IDLE, group)?;
        Ok(self.knobs.read_u64(&path)? != 0)
    }

    /// CPU bandwidth limit (`cpu.max`, or `cpu.cfs_period_us` then `cpu.cfs_quota_us`).
    pub fn set_cpu_quota(&self, group: &GroupPath, quota: CpuQuota) -> Result<()> {
        validate_quota(&quota)?;
        let backend = self.backend(Controller::Cpu)?;
        let dir = group.dir_in(backend.mount());
        match backend {
            Backend::V2(_) => {
                let q = quota.quota_us.map_or("max".to_owned(), |q| q.to_string());
                self.knobs.write(
                    &dir.join(CPU_MAX.display_name()),
                    &format!("{q} {}", quota.period_us),
                )
            }
            Backend::V1(_) => {
                self.knobs.write(
                    &dir.join(CPU_CFS_PERIOD_US.display_name()),
                    &quota.period_us.to_string(),
                )?;
                let q = quota.quota_us.map_or("-1".to_owned(), |q| q.to_string());
                self.knobs
                    .write(&dir.join(CPU_CFS_QUOTA_US.display_name()), &q)
            }
        }
    }

    pub fn cpu_quota(&self, group: &GroupPath) -> Result<CpuQuota> {
        let backend = self.backend(Controller::Cpu)?;
        let dir = group.dir_in(backend.mount());
        match backend {
            Backend::V2(_) => {
                let path = dir.join(CPU_MAX.display_name());
                let text = self.knobs.read(&path)?;
                let mut parts = text.split_whitespace();
                let bad = || HostError::parse(&path, &text, "expected `QUOTA|max PERIOD`");
                let quota = match parts.next().ok_or_else(bad)? {
                    "max" => None,
                    q => Some(q.parse().map_err(|_| bad())?),
                };
                let period_us = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
                Ok(CpuQuota {
                    quota_us: quota,
                    period_us,
                })
            }
            Backend::V1(_) => {
                let period_us = self
                    .knobs
                    .read_u64(&dir.join(CPU_CFS_PERIOD_US.display_name()))?;
                let quota = self
                    .knobs
                    .read_i64(&dir.join(CPU_CFS_QUOTA_US.display_name()))?;
                Ok(CpuQuota {
                    quota_us: u64::try_from(quota).ok(),
                    period_us,
                })
            }
        }
    }

    /// Cumulative CPU time of the group in ns (`cpuacct.usage` / `cpu.stat usage_usec`).
    pub fn cpu_usage_ns(&self, group: &GroupPath) -> Result<u64> {
        let (v2, path) = self.knob(&CPU_USAGE, group)?;
        if v2 {
            let text = self.knobs.read(&path)?;
            Ok(stat_field(&path, &text, "usage_usec")? * 1000)
        } else {
            self.knobs.read_u64(&path)
        }
    }

    /// CFS bandwidth throttling counters (`cpu.stat`).
    pub fn cpu_throttling(&self, group: &GroupPath) -> Result<CpuThrottling> {
        let (v2, path) = self.knob(&CPU_STAT, group)?;
        let text = self.knobs.read(&path)?;
        Ok(CpuThrottling {
            nr_periods: stat_field(&path, &text, "nr_periods")?,
            nr_throttled: stat_field(&path, &text, "nr_throttled")?,
            throttled_ns: if v2 {
                stat_field(&path, &text, "throttled_usec")? * 1000
            } else {
                stat_field(&path, &text, "throttled_time")?
            },
        })
    }
}
