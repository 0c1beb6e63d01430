//! The cpuset controller: which CPUs and memory nodes a group may use.

use std::path::Path;

use crate::cpuset::CpuSet;
use crate::error::{HostError, Result};
use crate::group_path::GroupPath;

use super::{Cgroups, Controller, KnobFile};

const CPUSET_CPUS: KnobFile = KnobFile::both(Controller::Cpuset, "cpuset.cpus", "cpuset.cpus");
const CPUSET_CPUS_EFFECTIVE: KnobFile = KnobFile::both(
    Controller::Cpuset,
    "cpuset.effective_cpus",
    "cpuset.cpus.effective",
);
const CPUSET_MEMS: KnobFile = KnobFile::both(Controller::Cpuset, "cpuset.mems", "cpuset.mems");

impl Cgroups {
    /// Sets `cpuset.cpus`. An empty set is refused (freeze the group instead).
    pub fn set_cpuset_cpus(&self, group: &GroupPath, cpus: &CpuSet) -> Result<()> {
        if cpus.is_empty() {
            return Err(HostError::invalid(
                "cpuset",
                "",
                "an empty cpuset is refused; freeze the group instead",
            ));
        }
        let (_, path) = self.knob(&CPUSET_CPUS, group)?;
        self.knobs.write(&path, &cpus.to_list())
    }

    /// Clears a v2 `cpuset.cpus` back to "inherit the parent's CPUs" (an empty value); v1 has no
    /// such state (an empty v1 cpuset runs nothing), so it is refused there.
    pub fn inherit_cpuset_cpus(&self, group: &GroupPath) -> Result<()> {
        let (v2, path) = self.knob(&CPUSET_CPUS, group)?;
        if !v2 {
            return Err(HostError::invalid(
                "cpuset",
                "",
                "v1 has no inherited cpuset: an empty one runs nothing",
            ));
        }
        // A newline, not "": an empty write_all makes no write(2) at all.
        self.knobs.write(&path, "\n")
    }

    /// `cpuset.cpus` as configured (v2: empty means inherited).
    pub fn cpuset_cpus(&self, group: &GroupPath) -> Result<CpuSet> {
        let (_, path) = self.knob(&CPUSET_CPUS, group)?;
        self.read_cpuset(&path)
    }

    /// `cpuset.effective_cpus` (what the kernel really grants).
    pub fn cpuset_effective_cpus(&self, group: &GroupPath) -> Result<CpuSet> {
        let (_, path) = self.knob(&CPUSET_CPUS_EFFECTIVE, group)?;
        self.read_cpuset(&path)
    }

    /// Sets `cpuset.mems` (memory nodes).
    pub fn set_cpuset_mems(&self, group: &GroupPath, mems: &CpuSet) -> Result<()> {
        if mems.is_empty() {
            return Err(HostError::invalid(
                "cpuset mems",
                "",
                "an empty node set is refused",
            ));
        }
        let (_, path) = self.knob(&CPUSET_MEMS, group)?;
        self.knobs.write(&path, &mems.to_list())
    }

    pub fn cpuset_mems(&self, group: &GroupPath) -> Result<CpuSet> {
        let (_, path) = self.knob(&CPUSET_MEMS, group)?;
        self.read_cpuset(&path)
    }

    fn read_cpuset(&self, path: &Path) -> Result<CpuSet> {
        let text = self.knobs.read(path)?;
        CpuSet::parse_list(&text).map_err(|e| HostError::parse(path, &text, e.to_string()))
    }
}
