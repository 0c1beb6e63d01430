//! The cpuset controller: which CPUs and memory nodes a group may use.

use std::path::Path;

use crate::error::{HostError, Result};
use headroom_types::values::CpuSet;
use headroom_types::values::GroupPath;

use super::{Cgroups, Controller, KnobFile};

const CPUSET_CPUS: KnobFile = KnobFile::both(Controller::Cpuset, "cpuset.cpus", "cpuset.cpus");
const CPUSET_CPUS_EFFECTIVE: KnobFile = KnobFile::both(
    Controller::Cpuset,
    "cpuset.effective_cpus",
    "cpuset.cpus.effective",
);
/// The v1 file of [`CPUSET_CPUS`].
const V1_CPUS: &str = "cpuset.cpus";
/// How deep below a group [`Cgroups::set_cpuset_cpus`] makes v1 groups follow it.
const MAX_FOLLOW_DEPTH: usize = 8;
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
        let (v2, path) = self.knob(&CPUSET_CPUS, group)?;
        if v2 {
            // Groups below follow in the kernel (their effective cpusets).
            return self.knobs.write(&path, &cpus.to_list());
        }
        // v1: a child's CPUs must stay within its parent's (a narrower parent is EBUSY while a
        // child uses more), and children do not follow their parent as on v2 — kubelet's pod
        // groups under the BestEffort parent keep their own cpuset.cpus. So the groups below
        // follow here: one that had its parent's CPUs takes the new ones, a narrower one keeps
        // what it can of its own (its CPUs within the new set; the new set where none are).
        match (self.read_cpuset(&path), path.parent()) {
            (Ok(old), Some(dir)) => self.follow_v1(dir, &old, cpus, 0),
            // unreadable: the write says what is wrong, naming path and value
            _ => self.knobs.write(&path, &cpus.to_list()),
        }
    }

    /// Sets the v1 group at `dir` from `old` to `new` CPUs, its descendants following: narrowed
    /// before it when it shrinks, widened after it when it grows, through the union when neither.
    fn follow_v1(&self, dir: &Path, old: &CpuSet, new: &CpuSet, depth: usize) -> Result<()> {
        let file = dir.join(V1_CPUS);
        if !new.is_subset(old) && !old.is_subset(new) {
            let union = old.union(new);
            self.follow_v1(dir, old, &union, depth)?;
            return self.follow_v1(dir, &union, new, depth);
        }
        // kubelet's tree is a few levels deep; a bound keeps a loop of links from recursing.
        let children = if depth < MAX_FOLLOW_DEPTH && old != new {
            self.knobs.list_dirs(dir)?
        } else {
            Vec::new()
        };
        if depth >= MAX_FOLLOW_DEPTH && old != new && new.is_subset(old) {
            self.refuse_unfollowed_nest(dir, new, depth)?;
        }
        let mut plan = Vec::new();
        for name in children {
            let child = dir.join(&name);
            let Ok(mine) = self.read_cpuset(&child.join(V1_CPUS)) else {
                continue; // gone meanwhile, or not a group
            };
            let next = if mine.is_empty() {
                mine.clone() // runs nothing, fits anywhere
            } else if mine == *old {
                new.clone()
            } else {
                let kept = mine.intersection(new);
                if kept.is_empty() {
                    new.clone()
                } else {
                    kept
                }
            };
            if next != mine {
                plan.push((child, mine, next));
            }
        }
        let shrinking = new.is_subset(old);
        if shrinking {
            for (child, mine, next) in &plan {
                self.follow_v1(child, mine, next, depth + 1)?;
            }
        }
        if old != new || depth == 0 {
            self.knobs.write(&file, &new.to_list())?;
        }
        if !shrinking {
            for (child, mine, next) in &plan {
                self.follow_v1(child, mine, next, depth + 1)?;
            }
        }
        Ok(())
    }

    /// At the follow's depth bound, a group below `dir` holding CPUs outside `new` would make
    /// the kernel refuse narrowing `dir` (EBUSY) on every try: refused here by name instead,
    /// saying the depth and why BE stays frozen (a nest of nine groups below BE kept it frozen
    /// with a repeated bare EBUSY, hostile pass 13). The freeze itself is the safe side.
    fn refuse_unfollowed_nest(&self, dir: &Path, new: &CpuSet, depth: usize) -> Result<()> {
        for name in self.knobs.list_dirs(dir).unwrap_or_default() {
            let child = dir.join(&name);
            let Ok(mine) = self.read_cpuset(&child.join(V1_CPUS)) else {
                continue;
            };
            if !mine.is_subset(new) {
                return Err(HostError::invalid(
                    "cpuset nest",
                    child.display().to_string(),
                    format!(
                        "a v1 cpuset group {} levels below the group being narrowed holds CPUs {} \
                         outside {}: groups are followed {MAX_FOLLOW_DEPTH} levels deep at most, \
                         and the kernel refuses to narrow its parent while it holds them (EBUSY), \
                         so BE stays frozen until this nest is made shallower or this group's \
                         cpuset.cpus is narrowed",
                        depth + 1,
                        mine.to_list(),
                        new.to_list()
                    ),
                ));
            }
        }
        Ok(())
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
