//! Power: RAPL energy and power limits through powercap, and per-CPU frequency caps through
//! cpufreq.

use std::path::{Path, PathBuf};

use crate::error::{HostError, Result};
use crate::knob_io::Knobs;

/// One RAPL zone (`intel-rapl:0`, `intel-rapl:0:0`, …).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RaplZone {
    /// Directory name (`intel-rapl:0`).
    pub id: String,
    /// The zone's `name` (`package-0`, `core`, `dram`, …).
    pub name: String,
    pub dir: PathBuf,
    /// Where `energy_uj` wraps back to zero.
    pub max_energy_range_uj: u64,
}

/// A power limit of a zone (`constraint_N_*`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PowerConstraint {
    pub index: u32,
    pub name: String,
    pub power_limit_uw: u64,
    pub time_window_us: Option<u64>,
}

/// Energy consumed between two `energy_uj` readings, across at most one wrap-around.
pub fn energy_delta_uj(previous: u64, current: u64, max_energy_range_uj: u64) -> u64 {
    if current >= previous {
        current - previous
    } else {
        max_energy_range_uj.saturating_sub(previous) + current
    }
}

/// `<root>/sys/class/powercap`.
#[derive(Debug, Clone)]
pub struct Rapl {
    dir: PathBuf,
    knobs: Knobs,
}

impl Rapl {
    pub(crate) fn new(dir: PathBuf, knobs: Knobs) -> Self {
        Rapl { dir, knobs }
    }

    /// The RAPL zones (`intel-rapl:*`, sub-zones included), sorted by id.
    pub fn zones(&self) -> Result<Vec<RaplZone>> {
        if !self.dir.is_dir() {
            return Err(HostError::unavailable(
                "RAPL",
                format!("{} does not exist (kernel without CONFIG_POWERCAP / intel_rapl, or a VM without RAPL MSRs)", self.dir.display()),
            ));
        }
        let mut zones = Vec::new();
        for id in self.knobs.list_dirs(&self.dir).unwrap_or_default() {
            if !id.starts_with("intel-rapl:") {
                continue;
            }
            let dir = self.dir.join(&id);
            zones.push(RaplZone {
                name: self.knobs.read_trimmed(&dir.join("name"))?,
                max_energy_range_uj: self.knobs.read_u64(&dir.join("max_energy_range_uj"))?,
                id,
                dir,
            });
        }
        // sysfs lists sub-zones as links; also walk nested directories of a real tree.
        if zones.is_empty() {
            return Err(HostError::unavailable(
                "RAPL",
                format!("no intel-rapl:* zone in {}", self.dir.display()),
            ));
        }
        Ok(zones)
    }

    /// The zone's cumulative energy counter (µJ, wraps at `max_energy_range_uj`).
    pub fn energy_uj(&self, zone: &RaplZone) -> Result<u64> {
        self.knobs.read_u64(&zone.dir.join("energy_uj"))
    }

    /// The zone's power limits.
    pub fn constraints(&self, zone: &RaplZone) -> Result<Vec<PowerConstraint>> {
        let mut out = Vec::new();
        for index in 0..8u32 {
            let limit = zone.dir.join(format!("constraint_{index}_power_limit_uw"));
            if !limit.exists() {
                break;
            }
            out.push(PowerConstraint {
                index,
                name: self
                    .knobs
                    .read_trimmed(&zone.dir.join(format!("constraint_{index}_name")))
                    .unwrap_or_default(),
                power_limit_uw: self.knobs.read_u64(&limit)?,
                time_window_us: self
                    .knobs
                    .read_u64(&zone.dir.join(format!("constraint_{index}_time_window_us")))
                    .ok(),
            });
        }
        Ok(out)
    }

    /// Sets a power limit (µW).
    pub fn set_power_limit_uw(
        &self,
        zone: &RaplZone,
        constraint: u32,
        microwatts: u64,
    ) -> Result<()> {
        let path = zone
            .dir
            .join(format!("constraint_{constraint}_power_limit_uw"));
        self.knobs.write(&path, &microwatts.to_string())
    }
}

/// Frequency facts of one CPU (kHz).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuFreqInfo {
    pub cpu: usize,
    pub cpuinfo_min_khz: u64,
    pub cpuinfo_max_khz: u64,
    pub scaling_max_khz: u64,
    pub scaling_cur_khz: Option<u64>,
    /// Empty when the driver (intel_pstate, amd-pstate) takes any value in range.
    pub available_khz: Vec<u64>,
}

/// `<root>/sys/devices/system/cpu/cpuN/cpufreq`.
#[derive(Debug, Clone)]
pub struct CpuFreq {
    cpu_dir: PathBuf,
    knobs: Knobs,
}

impl CpuFreq {
    pub(crate) fn new(cpu_dir: PathBuf, knobs: Knobs) -> Self {
        CpuFreq { cpu_dir, knobs }
    }

    fn dir(&self, cpu: usize) -> PathBuf {
        self.cpu_dir.join(format!("cpu{cpu}/cpufreq"))
    }

    /// True when CPU `cpu` has a cpufreq policy.
    pub fn available(&self, cpu: usize) -> bool {
        self.dir(cpu).join("scaling_max_freq").exists()
    }

    pub fn info(&self, cpu: usize) -> Result<CpuFreqInfo> {
        let dir = self.dir(cpu);
        if !dir.is_dir() {
            return Err(HostError::unavailable(
                format!("cpufreq for CPU {cpu}"),
                format!(
                    "{} does not exist (no cpufreq driver: common in VMs)",
                    dir.display()
                ),
            ));
        }
        let available_khz = match self.knobs.read(&dir.join("scaling_available_frequencies")) {
            Ok(text) => {
                let path = dir.join("scaling_available_frequencies");
                let mut v = text
                    .split_whitespace()
                    .map(|f| {
                        f.parse()
                            .map_err(|_| HostError::parse(&path, &text, "expected kHz values"))
                    })
                    .collect::<Result<Vec<u64>>>()?;
                v.sort_unstable();
                v
            }
            Err(e) if e.is_not_found() => Vec::new(),
            Err(e) => return Err(e),
        };
        Ok(CpuFreqInfo {
            cpu,
            cpuinfo_min_khz: self.knobs.read_u64(&dir.join("cpuinfo_min_freq"))?,
            cpuinfo_max_khz: self.knobs.read_u64(&dir.join("cpuinfo_max_freq"))?,
            scaling_max_khz: self.knobs.read_u64(&dir.join("scaling_max_freq"))?,
            scaling_cur_khz: self.knobs.read_u64(&dir.join("scaling_cur_freq")).ok(),
            available_khz,
        })
    }

    /// Caps CPU `cpu` at `khz`; refused outside the CPU's `cpuinfo_min..=cpuinfo_max`.
    pub fn set_max_khz(&self, cpu: usize, khz: u64) -> Result<()> {
        let dir = self.dir(cpu);
        let min = self.knobs.read_u64(&dir.join("cpuinfo_min_freq"))?;
        let max = self.knobs.read_u64(&dir.join("cpuinfo_max_freq"))?;
        if !(min..=max).contains(&khz) {
            return Err(HostError::invalid(
                "frequency cap",
                format!("{khz} kHz"),
                format!("CPU {cpu} supports {min}..={max} kHz"),
            ));
        }
        self.knobs
            .write(&dir.join("scaling_max_freq"), &khz.to_string())
    }

    pub fn max_khz(&self, cpu: usize) -> Result<u64> {
        self.knobs.read_u64(&self.dir(cpu).join("scaling_max_freq"))
    }

    pub fn cur_khz(&self, cpu: usize) -> Result<u64> {
        self.knobs.read_u64(&self.dir(cpu).join("scaling_cur_freq"))
    }

    /// The cpufreq directory root (for doctor).
    pub fn cpu_dir(&self) -> &Path {
        &self.cpu_dir
    }
}
