//! The memory controller: limits, usage, and OOM events.

use std::path::Path;

use crate::error::{HostError, Result};
use headroom_types::values::GroupPath;

use super::{stat_field, Cgroups, Controller, KnobFile};

const MEMORY_CURRENT: KnobFile = KnobFile::both(
    Controller::Memory,
    "memory.usage_in_bytes",
    "memory.current",
);
const MEMORY_EVENTS: KnobFile =
    KnobFile::both(Controller::Memory, "memory.failcnt", "memory.events");
const MEMORY_HIGH: KnobFile = KnobFile::both(
    Controller::Memory,
    "memory.soft_limit_in_bytes",
    "memory.high",
);
const MEMORY_MAX: KnobFile =
    KnobFile::both(Controller::Memory, "memory.limit_in_bytes", "memory.max");

/// v1 reports "no limit" as a page-aligned huge number.
const V1_UNLIMITED_FLOOR: u64 = 1 << 62;

/// Memory limit events (v1 has fewer counters: the missing ones are `None`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryEvents {
    pub low: Option<u64>,
    pub high: Option<u64>,
    /// Times the hard limit was hit (v1: `memory.failcnt`).
    pub max: u64,
    pub oom: Option<u64>,
    pub oom_kill: u64,
}

impl Cgroups {
    /// Hard memory limit in bytes (`None` = unlimited): `memory.max` / `memory.limit_in_bytes`.
    pub fn set_memory_max(&self, group: &GroupPath, bytes: Option<u64>) -> Result<()> {
        let (v2, path) = self.knob(&MEMORY_MAX, group)?;
        self.knobs.write(&path, &memory_value(v2, bytes))
    }

    pub fn memory_max(&self, group: &GroupPath) -> Result<Option<u64>> {
        let (_, path) = self.knob(&MEMORY_MAX, group)?;
        self.read_memory_value(&path)
    }

    /// Throttling threshold (`memory.high`; v1 approximates it with `memory.soft_limit_in_bytes`,
    /// which only acts under global memory pressure).
    pub fn set_memory_high(&self, group: &GroupPath, bytes: Option<u64>) -> Result<()> {
        let (v2, path) = self.knob(&MEMORY_HIGH, group)?;
        self.knobs.write(&path, &memory_value(v2, bytes))
    }

    pub fn memory_high(&self, group: &GroupPath) -> Result<Option<u64>> {
        let (_, path) = self.knob(&MEMORY_HIGH, group)?;
        self.read_memory_value(&path)
    }

    fn read_memory_value(&self, path: &Path) -> Result<Option<u64>> {
        let text = self.knobs.read(path)?;
        match text.trim() {
            "max" => Ok(None),
            "-1" => Ok(None),
            v => {
                let bytes: u64 = v
                    .parse()
                    .map_err(|_| HostError::parse(path, &text, "expected bytes or `max`"))?;
                Ok(if bytes >= V1_UNLIMITED_FLOOR {
                    None
                } else {
                    Some(bytes)
                })
            }
        }
    }

    /// Current memory use in bytes (`memory.usage_in_bytes` / `memory.current`).
    pub fn memory_usage(&self, group: &GroupPath) -> Result<u64> {
        let (_, path) = self.knob(&MEMORY_CURRENT, group)?;
        self.knobs.read_u64(&path)
    }

    /// Limit events (`memory.events`; v1: `memory.failcnt` and `memory.oom_control`).
    pub fn memory_events(&self, group: &GroupPath) -> Result<MemoryEvents> {
        let (v2, path) = self.knob(&MEMORY_EVENTS, group)?;
        if v2 {
            let text = self.knobs.read(&path)?;
            Ok(MemoryEvents {
                low: Some(stat_field(&path, &text, "low")?),
                high: Some(stat_field(&path, &text, "high")?),
                max: stat_field(&path, &text, "max")?,
                oom: Some(stat_field(&path, &text, "oom")?),
                oom_kill: stat_field(&path, &text, "oom_kill")?,
            })
        } else {
            let max = self.knobs.read_u64(&path)?;
            let oom_path = path.with_file_name("memory.oom_control");
            let oom = self.knobs.read(&oom_path)?;
            Ok(MemoryEvents {
                low: None,
                high: None,
                max,
                oom: None,
                oom_kill: stat_field(&oom_path, &oom, "oom_kill")?,
            })
        }
    }
}

fn memory_value(v2: bool, bytes: Option<u64>) -> String {
    match (v2, bytes) {
        (_, Some(b)) => b.to_string(),
        (true, None) => "max".to_owned(),
        (false, None) => "-1".to_owned(),
    }
}
