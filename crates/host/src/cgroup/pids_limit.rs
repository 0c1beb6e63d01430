//! The pids controller: a group's process limit (`pids.max`, the same name on v1 and v2) and
//! its count (`pids.current`).

use std::path::Path;

use crate::error::{HostError, Result};
use headroom_types::values::GroupPath;

use super::{Cgroups, Controller, KnobFile};

const PIDS_MAX: KnobFile = KnobFile::both(Controller::Pids, "pids.max", "pids.max");
const PIDS_CURRENT: KnobFile = KnobFile::both(Controller::Pids, "pids.current", "pids.current");

impl Cgroups {
    /// The most tasks (processes and threads) `group` and its descendants may hold
    /// (`pids.max`; `None` = `max`, no limit). A fork past it fails with EAGAIN.
    pub fn set_pids_max(&self, group: &GroupPath, limit: Option<u64>) -> Result<()> {
        let (_, path) = self.knob(&PIDS_MAX, group)?;
        let value = limit.map_or_else(|| "max".to_owned(), |n| n.to_string());
        self.knobs.write(&path, &value)
    }

    pub fn pids_max(&self, group: &GroupPath) -> Result<Option<u64>> {
        let (_, path) = self.knob(&PIDS_MAX, group)?;
        let text = self.knobs.read(&path)?;
        parse_pids_max(&path, &text)
    }

    /// The tasks `group` and its descendants hold now (`pids.current`).
    pub fn pids_current(&self, group: &GroupPath) -> Result<u64> {
        let (_, path) = self.knob(&PIDS_CURRENT, group)?;
        self.knobs.read_u64(&path)
    }
}

fn parse_pids_max(path: &Path, text: &str) -> Result<Option<u64>> {
    match text.trim() {
        "max" => Ok(None),
        v => v
            .parse()
            .map(Some)
            .map_err(|_| HostError::parse(path, text, "expected a count or `max`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_max_reads_a_count_or_max() {
        let p = Path::new("pids.max");
        assert_eq!(parse_pids_max(p, "max\n").unwrap(), None);
        assert_eq!(parse_pids_max(p, "64\n").unwrap(), Some(64));
        assert!(parse_pids_max(p, "lots").is_err());
    }
}
