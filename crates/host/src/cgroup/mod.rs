//! Cgroups: mode detection from mountinfo, and one API over the v1 and v2 backends.
//!
//! A group has ONE logical path ([`GroupPath`]). On v1 it exists once per managed hierarchy
//! (cpu, cpuacct, cpuset, memory, blkio, freezer, net_cls when mounted); on v2 it is one directory
//! whose parents delegate the needed controllers through `cgroup.subtree_control`. Each knob is a
//! function of the group's directory in the hierarchy that owns its controller, so a hybrid host
//! (v1 controllers plus a cgroup2 mount) resolves every controller on its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;

use crate::error::{HostError, Result};
use crate::knob_io::Knobs;
use headroom_types::values::GroupPath;

mod cpu;
mod cpuset;
mod freezer;
mod freezer_key;
mod io;
mod knob_file;
mod layout;
mod membership;
mod memory;
mod net;
mod pids_limit;
mod pressure;

pub use cpu::{CpuQuota, CpuThrottling};
pub use freezer::FreezeState;
pub use freezer_key::{FreezerKeyHold, FREEZER_KEY_PREFIX};
pub use io::{DeviceId, IoLimits};
pub use knob_file::KnobFile;
pub use layout::{writable_hierarchy, Backend, CgroupLayout, CgroupMode, Controller};
pub use memory::MemoryEvents;

/// The core interface files every group has, whatever its controllers (cgroup-v2.rst "Core
/// Interface Files"; v1 has `cgroup.procs` too).
pub(crate) const PROCS: &str = "cgroup.procs";
pub(crate) const THREADS: &str = "cgroup.threads";
pub(crate) const KILL: &str = "cgroup.kill";
pub(crate) const EVENTS: &str = "cgroup.events";
const CONTROLLERS: &str = "cgroup.controllers";
/// v1's per-thread membership file (v2 uses `cgroup.threads` inside threaded subtrees).
const TASKS: &str = "tasks";
const SUBTREE_CONTROL: &str = "cgroup.subtree_control";
/// v2: `domain`, or a threaded kind (`threaded`, `domain threaded`, `domain invalid`).
const CGROUP_TYPE: &str = "cgroup.type";
/// The v2 controllers the agent delegates down to its groups.
const MANAGED_V2: [&str; 5] = ["cpu", "cpuset", "memory", "io", "pids"];

/// How long [`Cgroups::kill_all`] waits for killed processes to leave their groups.
pub const KILL_SETTLE: Duration = Duration::from_secs(5);

/// `dir` and every directory below it (a group and its descendants).
fn walk_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if let Ok(rd) = std::fs::read_dir(&out[i]) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
        i += 1;
    }
    out
}

/// The cgroup API over whichever backends this host has.
#[derive(Debug, Clone)]
pub struct Cgroups {
    layout: CgroupLayout,
    knobs: Knobs,
}

impl Cgroups {
    pub(crate) fn new(layout: CgroupLayout, knobs: Knobs) -> Self {
        Cgroups { layout, knobs }
    }

    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    pub fn mode(&self) -> CgroupMode {
        self.layout.mode
    }

    /// The hierarchy serving `controller`, or why there is none.
    pub fn backend(&self, controller: Controller) -> Result<Backend> {
        self.layout.backend(controller).ok_or_else(|| {
            HostError::unavailable(
                format!("cgroup controller {controller}"),
                self.layout.missing_reason(controller),
            )
        })
    }

    /// True when `controller` can be used.
    pub fn has(&self, controller: Controller) -> bool {
        self.layout.backend(controller).is_some()
    }

    /// Every hierarchy directory `group` lives in (one per distinct v1 mount, plus v2 if used).
    pub fn group_dirs(&self, group: &GroupPath) -> Vec<(Backend, PathBuf)> {
        let mut out: Vec<(Backend, PathBuf)> = Vec::new();
        for &controller in Controller::ALL {
            if let Some(backend) = self.layout.backend(controller) {
                if !out.iter().any(|(b, _)| b == &backend) {
                    let dir = group.dir_in(backend.mount());
                    out.push((backend, dir));
                }
            }
        }
        // A controller-less cgroup2 (hybrid hosts) only holds groups made for cgroup BPF by
        // `ensure_v2_group`; once there they are moved into and removed like the others.
        if let Some(v2) = &self.layout.v2 {
            if !group.is_root() && !out.iter().any(|(b, _)| b.is_v2()) {
                let dir = group.dir_in(v2);
                if dir.is_dir() {
                    out.push((Backend::V2(v2.clone()), dir));
                }
            }
        }
        out
    }

    /// The group's directory in the cgroup2 hierarchy, created (with its ancestors) if missing,
    /// even when cgroup2 offers no controllers: cgroup BPF programs (the egress classifier of
    /// [`crate::bpf`]) attach there. From then on the group's processes move there too.
    pub fn ensure_v2_group(&self, group: &GroupPath) -> Result<PathBuf> {
        let Some(v2) = &self.layout.v2 else {
            return Err(HostError::unavailable(
                "cgroup2",
                "no cgroup2 file system mounted",
            ));
        };
        if group.is_root() {
            return Ok(v2.clone());
        }
        for level in group.lineage() {
            let dir = level.dir_in(v2);
            if dir.is_dir() {
                continue;
            }
            match self.knobs.create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.errno() == Some(Errno::EEXIST) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(group.dir_in(v2))
    }

    /// The path of `file` for `group` in the hierarchy that owns its controller, and whether
    /// that hierarchy is v2; a knob that backend lacks is refused by name.
    fn knob(&self, file: &KnobFile, group: &GroupPath) -> Result<(bool, PathBuf)> {
        let backend = self.backend(file.controller)?;
        let v2 = backend.is_v2();
        let name = file.name(v2).ok_or_else(|| {
            HostError::unavailable(
                file.display_name(),
                format!("cgroup {} has no such knob", if v2 { "v2" } else { "v1" }),
            )
        })?;
        Ok((v2, group.dir_in(backend.mount()).join(name)))
    }

    /// The path of a knob file of `controller` for `group` (for logging and tests).
    pub fn knob_path(
        &self,
        controller: Controller,
        group: &GroupPath,
        file: &str,
    ) -> Result<PathBuf> {
        Ok(group.dir_in(self.backend(controller)?.mount()).join(file))
    }

    /// True when the group exists in every hierarchy it needs.
    pub fn exists(&self, group: &GroupPath) -> bool {
        let dirs = self.group_dirs(group);
        !dirs.is_empty() && dirs.iter().all(|(_, d)| d.is_dir())
    }

    /// Creates `group` and its missing ancestors in every managed hierarchy (idempotent). v1
    /// cpuset levels get their parent's `cpuset.cpus`/`cpuset.mems` (a new v1 cpuset is empty and
    /// refuses tasks); on v2 each ancestor delegates the controllers it offers.
    pub fn create(&self, group: &GroupPath) -> Result<()> {
        self.create_noting(group, &mut Vec::new())
    }

    /// [`Cgroups::create`], noting in `made` each directory it made (ancestors first), also
    /// when it fails part-way: a group that existed in some hierarchies only (made there by
    /// an operator) is made in the others, and only those directories are the maker's to
    /// remove ([`Cgroups::remove_made_dir`]).
    pub fn create_noting(&self, group: &GroupPath, made: &mut Vec<PathBuf>) -> Result<()> {
        if group.is_root() {
            return Err(HostError::invalid(
                "cgroup path",
                "/",
                "the root group cannot be created",
            ));
        }
        let dirs = self.group_dirs(group);
        if dirs.is_empty() {
            return Err(HostError::unavailable(
                "cgroups",
                format!("no usable cgroup hierarchy ({} mode)", self.layout.mode),
            ));
        }
        if let Some((dir, kind)) = self.not_domain(group) {
            return Err(HostError::invalid(
                "cgroup",
                dir.display().to_string(),
                not_domain_reason(&dir, &kind),
            ));
        }
        for (backend, _) in &dirs {
            for level in group.lineage() {
                let dir = level.dir_in(backend.mount());
                let parent = level
                    .parent()
                    .unwrap_or_else(GroupPath::root)
                    .dir_in(backend.mount());
                if backend.is_v2() {
                    self.v2_delegate(&parent)?;
                }
                if dir.is_dir() {
                    continue;
                }
                match self.knobs.create_dir(&dir) {
                    Ok(()) => made.push(dir.clone()),
                    Err(e) if e.errno() == Some(Errno::EEXIST) => {}
                    Err(e) => return Err(e),
                }
                let is_cpuset = self
                    .layout
                    .v1
                    .get(&Controller::Cpuset)
                    .map(PathBuf::as_path)
                    == Some(backend.mount());
                if !backend.is_v2() && is_cpuset {
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        let mine = self.knobs.read_trimmed(&dir.join(file))?;
                        if mine.is_empty() {
                            let parents = self.knobs.read_trimmed(&parent.join(file))?;
                            self.knobs.write(&dir.join(file), &parents)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The deepest level of `group` (v2; of those that exist) whose `cgroup.type` is not
    /// `domain`, with its type. The agent's groups must be domains: a threaded one refuses
    /// the memory and io controllers (the kernel's bare EOPNOTSUPP on `subtree_control` was
    /// all a start said, tenth hostile pass) and takes threads, not processes.
    pub fn not_domain(&self, group: &GroupPath) -> Option<(PathBuf, String)> {
        self.group_dirs(group)
            .iter()
            .filter(|(backend, _)| backend.is_v2())
            .find_map(|(backend, _)| {
                group.lineage().into_iter().rev().find_map(|level| {
                    let dir = level.dir_in(backend.mount());
                    let kind = self.knobs.read(&dir.join(CGROUP_TYPE)).ok()?;
                    let kind = kind.trim();
                    (kind != "domain").then(|| (dir, kind.to_string()))
                })
            })
    }

    /// Whether a level of `group` (v2) is no longer given a managed controller its parent
    /// offers: someone wrote `-cpuset` to a `cgroup.subtree_control` above it (systemd, an
    /// operator). Its knob files are gone then, and the kernel no longer confines the group by
    /// them (tenth hostile pass: BE ran on every CPU while the agent reported cpus 1).
    /// [`Cgroups::create`] delegates them again. False on v1 and where a file cannot be read.
    pub fn delegation_lost(&self, group: &GroupPath) -> bool {
        self.group_dirs(group)
            .iter()
            .filter(|(backend, _)| backend.is_v2())
            .any(|(backend, _)| {
                group.lineage().into_iter().any(|level| {
                    let parent = level
                        .parent()
                        .unwrap_or_else(GroupPath::root)
                        .dir_in(backend.mount());
                    let (Ok(offered), Ok(enabled)) = (
                        self.knobs.read(&parent.join(CONTROLLERS)),
                        self.knobs.read(&parent.join(SUBTREE_CONTROL)),
                    ) else {
                        return false;
                    };
                    offered
                        .split_whitespace()
                        .filter(|c| MANAGED_V2.contains(c))
                        .any(|c| {
                            !enabled
                                .split_whitespace()
                                .any(|e| e.trim_start_matches('+') == c)
                        })
                })
            })
    }

    /// Enables in `dir`'s `cgroup.subtree_control` every managed controller it offers.
    fn v2_delegate(&self, dir: &Path) -> Result<()> {
        let offered = self.knobs.read(&dir.join(CONTROLLERS))?;
        let enabled = self.knobs.read(&dir.join(SUBTREE_CONTROL))?;
        let wanted: Vec<&str> = offered
            .split_whitespace()
            .filter(|c| MANAGED_V2.contains(c))
            .filter(|c| !enabled.split_whitespace().any(|e| e == *c))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let value = wanted
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        self.knobs.write(&dir.join(SUBTREE_CONTROL), &value)
    }

    /// The child groups of `group` (from its first hierarchy).
    pub fn children(&self, group: &GroupPath) -> Result<Vec<GroupPath>> {
        let Some((_, dir)) = self.group_dirs(group).into_iter().next() else {
            return Ok(Vec::new());
        };
        self.knobs
            .list_dirs(&dir)?
            .iter()
            .map(|name| group.join(name).map_err(HostError::from))
            .collect()
    }

    /// Removes `group` and all its descendants (children first) from every hierarchy, after
    /// thawing it and moving its processes to the parent (v1) or the root (v2). Missing groups
    /// are fine: removal is idempotent, so it can run from a Drop guard.
    pub fn remove(&self, group: &GroupPath) -> Result<()> {
        if group.is_root() {
            return Err(HostError::invalid(
                "cgroup path",
                "/",
                "the root group cannot be removed",
            ));
        }
        for (backend, dir) in self.group_dirs(group) {
            self.remove_in(&backend, group, &dir)?;
        }
        Ok(())
    }

    /// Removes `dir`, one directory [`Cgroups::create_noting`] made for `group` or one of its
    /// ancestors (in one hierarchy), when it holds no process and no child group: nothing is
    /// moved, thawed or removed below it. `Ok(false)` when it stays (busy, or not such a
    /// directory); `Ok(true)` when it is gone (or was).
    pub fn remove_made_dir(&self, group: &GroupPath, dir: &Path) -> Result<bool> {
        let ours = group.lineage().iter().any(|level| {
            self.group_dirs(level)
                .iter()
                .any(|(b, _)| level.dir_in(b.mount()) == dir)
        });
        if !ours {
            return Ok(false);
        }
        if !dir.is_dir() {
            return Ok(true);
        }
        let busy = !self.knobs.list_dirs(dir)?.is_empty()
            || match self.read_pids(&dir.join(PROCS)) {
                Ok(pids) => !pids.is_empty(),
                Err(e) if e.is_not_found() => false,
                Err(e) => return Err(e),
            };
        if busy {
            return Ok(false);
        }
        match self.knobs.remove_dir(dir) {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(true),
            Err(e) if e.errno() == Some(Errno::EBUSY) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn remove_in(&self, backend: &Backend, group: &GroupPath, dir: &Path) -> Result<()> {
        if !dir.is_dir() {
            return Ok(());
        }
        for name in self.knobs.list_dirs(dir)? {
            let child = group.join(&name)?;
            self.remove_in(backend, &child, &dir.join(&name))?;
        }
        let freezer_mount = self.layout.backend(Controller::Freezer);
        if freezer_mount.as_ref() == Some(backend) {
            let file = freezer::FREEZE
                .name(backend.is_v2())
                .unwrap_or(freezer::FREEZE.display_name());
            if dir.join(file).exists() {
                let value = if backend.is_v2() { "0" } else { "THAWED" };
                self.knobs.write(&dir.join(file), value)?;
            }
        }
        let target = if backend.is_v2() {
            backend.mount().to_path_buf()
        } else {
            group
                .parent()
                .unwrap_or_else(GroupPath::root)
                .dir_in(backend.mount())
        };
        // Processes can exit or fork while we move them: a few rounds, then rmdir decides.
        let mut last_err = None;
        for attempt in 0..50 {
            let pids = match self.read_pids(&dir.join(PROCS)) {
                Ok(pids) => pids,
                // Not a cgroup directory (a fake tree): nothing to move.
                Err(e) if e.is_not_found() => Vec::new(),
                Err(e) => return Err(e),
            };
            for pid in pids {
                match self.knobs.write(&target.join(PROCS), &pid.to_string()) {
                    Ok(()) => {}
                    Err(e) if e.errno() == Some(Errno::ESRCH) => {}
                    Err(e) => return Err(e),
                }
            }
            match self.knobs.remove_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(()),
                Err(e) if e.errno() == Some(Errno::EBUSY) => {
                    last_err = Some(e);
                    std::thread::sleep(Duration::from_millis(2 + attempt));
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| {
            HostError::invalid("cgroup", dir.display().to_string(), "could not be removed")
        }))
    }
}

/// The value of `key` in a flat-keyed file (`key value` per line: cpu.stat, memory.events, …).
pub(crate) fn stat_field(path: &Path, text: &str, key: &str) -> Result<u64> {
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if parts.next() == Some(key) {
            return parts
                .next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| HostError::parse(path, text, format!("bad value for `{key}`")));
        }
    }
    Err(HostError::parse(path, text, format!("no `{key}` line")))
}

/// Why a group with a level that is not a domain is refused (by [`Cgroups::create`], and by
/// the agent's start before anything is made).
pub fn not_domain_reason(dir: &Path, kind: &str) -> String {
    format!(
        "threaded cgroups are not supported: {} has cgroup.type = {kind} (give the agent groups \
         that are domains, outside any threaded subtree)",
        dir.display()
    )
}
