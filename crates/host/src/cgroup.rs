//! Cgroups: mode detection from mountinfo, and one API over the v1 and v2 backends.
//!
//! A group has ONE logical path ([`GroupPath`]). On v1 it exists once per managed hierarchy
//! (cpu, cpuacct, cpuset, memory, blkio, freezer, net_cls when mounted); on v2 it is one directory
//! whose parents delegate the needed controllers through `cgroup.subtree_control`. Each knob is a
//! function of the group's directory in the hierarchy that owns its controller, so a hybrid host
//! (v1 controllers plus a cgroup2 mount) resolves every controller on its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::cpuset::CpuSet;
use crate::error::{HostError, Result};
use crate::group_path::GroupPath;
use crate::knob_io::{under, Knobs};
use crate::sensors::{parse_psi, Psi, PsiResource};

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

/// How cgroups are mounted on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    /// Only v1 controller hierarchies.
    V1,
    /// Only the unified hierarchy.
    V2,
    /// v1 controller hierarchies plus a cgroup2 mount (often empty of controllers).
    Hybrid,
    /// No cgroup file system mounted.
    None,
}

impl CgroupMode {
    /// `v1`, `v2`, `hybrid` or `none` (the doctor JSON value).
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupMode::V1 => "v1",
            CgroupMode::V2 => "v2",
            CgroupMode::Hybrid => "hybrid",
            CgroupMode::None => "none",
        }
    }
}

impl fmt::Display for CgroupMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The controllers headroom manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Controller {
    Cpu,
    Cpuacct,
    Cpuset,
    Memory,
    /// `blkio` on v1, `io` on v2.
    Io,
    Freezer,
    NetCls,
    Pids,
    /// v1 `net_prio`: per-device `skb->priority` for a group's sockets, which HTB uses to
    /// classify directly when the priority names one of its classes.
    NetPrio,
}

impl Controller {
    /// Every controller, in the order groups are created in.
    pub const ALL: &'static [Controller] = &[
        Controller::Cpu,
        Controller::Cpuacct,
        Controller::Cpuset,
        Controller::Memory,
        Controller::Io,
        Controller::Freezer,
        Controller::NetCls,
        Controller::Pids,
        Controller::NetPrio,
    ];

    /// The name in a v1 mount's options.
    pub fn v1_name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Cpuset => "cpuset",
            Controller::Memory => "memory",
            Controller::Io => "blkio",
            Controller::Freezer => "freezer",
            Controller::NetCls => "net_cls",
            Controller::Pids => "pids",
            Controller::NetPrio => "net_prio",
        }
    }

    /// The name in v2 `cgroup.controllers`; `None` for what v2 has as core files (freezer,
    /// cpuacct → `cpu.stat`) or lacks (net_cls).
    pub fn v2_name(self) -> Option<&'static str> {
        match self {
            Controller::Cpu => Some("cpu"),
            Controller::Cpuset => Some("cpuset"),
            Controller::Memory => Some("memory"),
            Controller::Io => Some("io"),
            Controller::Pids => Some("pids"),
            Controller::Cpuacct
            | Controller::Freezer
            | Controller::NetCls
            | Controller::NetPrio => None,
        }
    }

    fn from_v1_name(name: &str) -> Option<Controller> {
        Controller::ALL
            .iter()
            .copied()
            .find(|c| c.v1_name() == name)
    }
}

impl fmt::Display for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.v1_name())
    }
}

/// Which hierarchy serves a controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A v1 hierarchy mounted at this path (below the host root).
    V1(PathBuf),
    /// The unified hierarchy mounted at this path (below the host root).
    V2(PathBuf),
}

impl Backend {
    pub fn mount(&self) -> &Path {
        match self {
            Backend::V1(p) | Backend::V2(p) => p,
        }
    }

    pub fn is_v2(&self) -> bool {
        matches!(self, Backend::V2(_))
    }
}

/// The cgroup mounts found in `<root>/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    pub mode: CgroupMode,
    /// v1 hierarchy mount point (below the host root) per controller.
    pub v1: BTreeMap<Controller, PathBuf>,
    /// The cgroup2 mount point (below the host root), if any.
    pub v2: Option<PathBuf>,
    /// The controllers the cgroup2 root offers (`cgroup.controllers`).
    pub v2_controllers: Vec<String>,
}

/// Controllers that make a cgroup2 mount usable for control; an empty v2 (hybrid hosts) is not.
const V2_CONTROL: [&str; 4] = ["cpu", "cpuset", "memory", "io"];

impl CgroupLayout {
    /// Parses mountinfo text; `root` is prefixed to every mount point. `v2_controllers` is the
    /// content of the cgroup2 root's `cgroup.controllers`.
    pub fn from_mountinfo(root: &Path, mountinfo: &str, v2_controllers: Option<&str>) -> Self {
        let mut v1 = BTreeMap::new();
        let mut v2 = None;
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let left: Vec<&str> = left.split_whitespace().collect();
            let right: Vec<&str> = right.split_whitespace().collect();
            if left.len() < 5 || right.is_empty() {
                continue;
            }
            let mount_point = under(root, &unescape_mount(left[4]));
            match right[0] {
                "cgroup2" => {
                    v2.get_or_insert(mount_point);
                }
                "cgroup" => {
                    let options = right.get(2).copied().unwrap_or("");
                    for option in options.split(',') {
                        if let Some(controller) = Controller::from_v1_name(option) {
                            v1.entry(controller).or_insert_with(|| mount_point.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        let v2_controllers: Vec<String> = match (&v2, v2_controllers) {
            (Some(_), Some(text)) => text.split_whitespace().map(str::to_owned).collect(),
            _ => Vec::new(),
        };
        let mode = match (v1.is_empty(), v2.is_some()) {
            (false, false) => CgroupMode::V1,
            (true, true) => CgroupMode::V2,
            (false, true) => CgroupMode::Hybrid,
            (true, false) => CgroupMode::None,
        };
        CgroupLayout {
            mode,
            v1,
            v2,
            v2_controllers,
        }
    }

    /// True when the cgroup2 mount offers at least one resource controller.
    pub fn v2_usable(&self) -> bool {
        self.v2.is_some()
            && self
                .v2_controllers
                .iter()
                .any(|c| V2_CONTROL.contains(&c.as_str()))
    }

    /// The hierarchy that serves `controller`: its v1 hierarchy if mounted, else cgroup2 when it
    /// offers the controller (freezer and cpuacct are core v2 files, usable when v2 is usable).
    pub fn backend(&self, controller: Controller) -> Option<Backend> {
        if let Some(mount) = self.v1.get(&controller) {
            return Some(Backend::V1(mount.clone()));
        }
        let mount = self.v2.as_ref()?;
        if !self.v2_usable() {
            return None;
        }
        match controller.v2_name() {
            Some(name) if self.v2_controllers.iter().any(|c| c == name) => {
                Some(Backend::V2(mount.clone()))
            }
            Some(_) => None,
            None => match controller {
                Controller::Freezer | Controller::Cpuacct => Some(Backend::V2(mount.clone())),
                _ => None,
            },
        }
    }

    /// Why `controller` has no backend (for errors and doctor).
    pub fn missing_reason(&self, controller: Controller) -> String {
        match (self.v2.is_some(), self.v2_usable()) {
            (true, false) if self.v1.is_empty() => format!(
                "no v1 {} hierarchy and the cgroup2 mount has no controllers enabled",
                controller.v1_name()
            ),
            (true, false) => format!(
                "no v1 {} hierarchy mounted (the cgroup2 mount is empty of controllers)",
                controller.v1_name()
            ),
            (true, true) => format!(
                "cgroup2 does not offer {} and no v1 hierarchy has it",
                controller.v1_name()
            ),
            (false, _) => format!(
                "no v1 {} hierarchy mounted and no cgroup2",
                controller.v1_name()
            ),
        }
    }
}

/// Mount points in mountinfo escape space, tab, newline and backslash as octal.
fn unescape_mount(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// CPU bandwidth: `quota_us` of CPU time per `period_us` (`None` = unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

    fn validate(&self) -> Result<()> {
        if !(1000..=1_000_000).contains(&self.period_us) {
            return Err(HostError::invalid(
                "cpu period",
                self.period_us.to_string(),
                "must be within 1000..=1000000 µs",
            ));
        }
        if let Some(q) = self.quota_us {
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
}

/// Freezer state read back from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FreezeState {
    Thawed,
    Freezing,
    Frozen,
}

/// A block device number.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct DeviceId {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl std::str::FromStr for DeviceId {
    type Err = HostError;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || HostError::invalid("device number", s, "expected MAJOR:MINOR");
        let (major, minor) = s.trim().split_once(':').ok_or_else(bad)?;
        Ok(DeviceId {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
        })
    }
}

/// Disk throttles of one device (`None` = unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IoLimits {
    pub read_bps: Option<u64>,
    pub write_bps: Option<u64>,
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
}

/// CFS bandwidth throttling counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuThrottling {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
}

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

/// v1 reports "no limit" as a page-aligned huge number.
const V1_UNLIMITED_FLOOR: u64 = 1 << 62;

/// The cgroup API over whichever backends this host has.
#[derive(Debug, Clone)]
pub struct Cgroups {
    layout: CgroupLayout,
    knobs: Knobs,
}

/// How long freeze/thaw waits for the state to settle.
const FREEZE_SETTLE: Duration = Duration::from_secs(2);

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

    fn knob(
        &self,
        controller: Controller,
        group: &GroupPath,
        v1_file: &str,
        v2_file: &str,
    ) -> Result<(bool, PathBuf)> {
        let backend = self.backend(controller)?;
        let dir = group.dir_in(backend.mount());
        Ok(match backend {
            Backend::V1(_) => (false, dir.join(v1_file)),
            Backend::V2(_) => (true, dir.join(v2_file)),
        })
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
                    Ok(()) => {}
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

    /// Enables in `dir`'s `cgroup.subtree_control` every managed controller it offers.
    fn v2_delegate(&self, dir: &Path) -> Result<()> {
        let offered = self.knobs.read(&dir.join("cgroup.controllers"))?;
        let enabled = self.knobs.read(&dir.join("cgroup.subtree_control"))?;
        let wanted: Vec<&str> = offered
            .split_whitespace()
            .filter(|c| ["cpu", "cpuset", "memory", "io", "pids"].contains(c))
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
        self.knobs
            .write(&dir.join("cgroup.subtree_control"), &value)
    }

    /// The child groups of `group` (from its first hierarchy).
    pub fn children(&self, group: &GroupPath) -> Result<Vec<GroupPath>> {
        let Some((_, dir)) = self.group_dirs(group).into_iter().next() else {
            return Ok(Vec::new());
        };
        self.knobs
            .list_dirs(&dir)?
            .iter()
            .map(|name| group.join(name))
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
            let file = if backend.is_v2() {
                "cgroup.freeze"
            } else {
                "freezer.state"
            };
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
            let pids = match self.read_pids(&dir.join("cgroup.procs")) {
                Ok(pids) => pids,
                // Not a cgroup directory (a fake tree): nothing to move.
                Err(e) if e.is_not_found() => Vec::new(),
                Err(e) => return Err(e),
            };
            for pid in pids {
                match self
                    .knobs
                    .write(&target.join("cgroup.procs"), &pid.to_string())
                {
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

    fn read_pids(&self, path: &Path) -> Result<Vec<i32>> {
        let text = self.knobs.read(path)?;
        text.split_whitespace()
            .map(|t| {
                t.parse()
                    .map_err(|_| HostError::parse(path, &text, "expected one pid per line"))
            })
            .collect()
    }

    /// Moves process `pid` with all its threads into `group` in every hierarchy.
    pub fn move_process(&self, group: &GroupPath, pid: i32) -> Result<()> {
        for (_, dir) in self.group_dirs(group) {
            self.knobs
                .write(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Where a process is in each hierarchy `group` spans — the directories, below each
    /// mount, that the lines of its `/proc/<pid>/cgroup` (`proc_cgroup`) name. A hierarchy
    /// the text does not mention is left out.
    pub fn process_dirs(&self, group: &GroupPath, proc_cgroup: &str) -> Vec<PathBuf> {
        let lines: Vec<(&str, &str)> = proc_cgroup
            .lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ':');
                let _id = parts.next()?;
                Some((parts.next()?, parts.next()?))
            })
            .collect();
        let mut out = Vec::new();
        for (backend, _) in self.group_dirs(group) {
            let path = match &backend {
                Backend::V2(_) => lines.iter().find(|(c, _)| c.is_empty()).map(|(_, p)| *p),
                Backend::V1(mount) => Controller::ALL
                    .iter()
                    .find(|c| {
                        self.layout
                            .backend(**c)
                            .as_ref()
                            .is_some_and(|b| b.mount() == mount)
                    })
                    .and_then(|c| {
                        lines
                            .iter()
                            .find(|(list, _)| list.split(',').any(|n| n == c.v1_name()))
                            .map(|(_, p)| *p)
                    }),
            };
            if let Some(p) = path {
                out.push(backend.mount().join(p.trim_start_matches('/')));
            }
        }
        out
    }

    /// Moves a process into the group directory `dir` (one of [`Cgroups::process_dirs`]).
    pub fn move_process_to_dir(&self, dir: &Path, pid: i32) -> Result<()> {
        self.knobs
            .write(&dir.join("cgroup.procs"), &pid.to_string())
    }

    /// Moves one thread into `group` (v1 `tasks` in every hierarchy; v2 `cgroup.threads`, which
    /// only works inside threaded subtrees).
    pub fn move_thread(&self, group: &GroupPath, tid: i32) -> Result<()> {
        for (backend, dir) in self.group_dirs(group) {
            let file = if backend.is_v2() {
                "cgroup.threads"
            } else {
                "tasks"
            };
            self.knobs.write(&dir.join(file), &tid.to_string())?;
        }
        Ok(())
    }

    /// The processes in `group` (from its first hierarchy).
    pub fn procs(&self, group: &GroupPath) -> Result<Vec<i32>> {
        match self.group_dirs(group).into_iter().next() {
            Some((_, dir)) => self.read_pids(&dir.join("cgroup.procs")),
            None => Err(HostError::unavailable(
                "cgroups",
                "no usable cgroup hierarchy",
            )),
        }
    }

    /// The threads in `group` (v1 `tasks`, v2 `cgroup.threads`).
    pub fn threads(&self, group: &GroupPath) -> Result<Vec<i32>> {
        match self.group_dirs(group).into_iter().next() {
            Some((Backend::V1(_), dir)) => self.read_pids(&dir.join("tasks")),
            Some((Backend::V2(_), dir)) => self.read_pids(&dir.join("cgroup.threads")),
            None => Err(HostError::unavailable(
                "cgroups",
                "no usable cgroup hierarchy",
            )),
        }
    }

    // ---- cpuset ----------------------------------------------------------------------------

    /// Sets `cpuset.cpus`. An empty set is refused (freeze the group instead).
    pub fn set_cpuset_cpus(&self, group: &GroupPath, cpus: &CpuSet) -> Result<()> {
        if cpus.is_empty() {
            return Err(HostError::invalid(
                "cpuset",
                "",
                "an empty cpuset is refused; freeze the group instead",
            ));
        }
        let (_, path) = self.knob(Controller::Cpuset, group, "cpuset.cpus", "cpuset.cpus")?;
        self.knobs.write(&path, &cpus.to_list())
    }

    /// `cpuset.cpus` as configured (v2: empty means inherited).
    pub fn cpuset_cpus(&self, group: &GroupPath) -> Result<CpuSet> {
        let (_, path) = self.knob(Controller::Cpuset, group, "cpuset.cpus", "cpuset.cpus")?;
        self.read_cpuset(&path)
    }

    /// `cpuset.effective_cpus` (what the kernel really grants).
    pub fn cpuset_effective_cpus(&self, group: &GroupPath) -> Result<CpuSet> {
        let (_, path) = self.knob(
            Controller::Cpuset,
            group,
            "cpuset.effective_cpus",
            "cpuset.cpus.effective",
        )?;
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
        let (_, path) = self.knob(Controller::Cpuset, group, "cpuset.mems", "cpuset.mems")?;
        self.knobs.write(&path, &mems.to_list())
    }

    pub fn cpuset_mems(&self, group: &GroupPath) -> Result<CpuSet> {
        let (_, path) = self.knob(Controller::Cpuset, group, "cpuset.mems", "cpuset.mems")?;
        self.read_cpuset(&path)
    }

    fn read_cpuset(&self, path: &Path) -> Result<CpuSet> {
        let text = self.knobs.read(path)?;
        CpuSet::parse_list(&text).map_err(|e| HostError::parse(path, &text, e.to_string()))
    }

    // ---- cpu -------------------------------------------------------------------------------

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
        let (_, path) = self.knob(Controller::Cpu, group, "cpu.shares", "cpu.weight")?;
        self.knobs.write(&path, &native.to_string())?;
        Ok(native)
    }

    /// The native weight (`cpu.shares` on v1, `cpu.weight` on v2).
    pub fn cpu_weight(&self, group: &GroupPath) -> Result<u64> {
        let (_, path) = self.knob(Controller::Cpu, group, "cpu.shares", "cpu.weight")?;
        self.knobs.read_u64(&path)
    }

    /// `cpu.rt_runtime_us` of a cgroup-v1 cpu group: the real-time budget its SCHED_FIFO/RR
    /// tasks may use per `cpu.rt_period_us`. `Ok(None)` where the knob does not exist (cgroup v2,
    /// or a kernel without CONFIG_RT_GROUP_SCHED: RT tasks are then allowed in any group).
    pub fn rt_runtime_us(&self, group: &GroupPath) -> Result<Option<i64>> {
        let path = match self.knob(Controller::Cpu, group, "cpu.rt_runtime_us", "") {
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
        let (v2, path) = self.knob(Controller::Cpu, group, "cpu.rt_runtime_us", "")?;
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
        let (_, path) = self.knob(Controller::Cpu, group, "cpu.idle", "cpu.idle")?;
        self.knobs.write(&path, if idle { "1" } else { "0" })
    }

    pub fn cpu_idle(&self, group: &GroupPath) -> Result<bool> {
        let (_, path) = self.knob(Controller::Cpu, group, "cpu.idle", "cpu.idle")?;
        Ok(self.knobs.read_u64(&path)? != 0)
    }

    /// CPU bandwidth limit (`cpu.max`, or `cpu.cfs_period_us` then `cpu.cfs_quota_us`).
    pub fn set_cpu_quota(&self, group: &GroupPath, quota: CpuQuota) -> Result<()> {
        quota.validate()?;
        let backend = self.backend(Controller::Cpu)?;
        let dir = group.dir_in(backend.mount());
        match backend {
            Backend::V2(_) => {
                let q = quota.quota_us.map_or("max".to_owned(), |q| q.to_string());
                self.knobs
                    .write(&dir.join("cpu.max"), &format!("{q} {}", quota.period_us))
            }
            Backend::V1(_) => {
                self.knobs
                    .write(&dir.join("cpu.cfs_period_us"), &quota.period_us.to_string())?;
                let q = quota.quota_us.map_or("-1".to_owned(), |q| q.to_string());
                self.knobs.write(&dir.join("cpu.cfs_quota_us"), &q)
            }
        }
    }

    pub fn cpu_quota(&self, group: &GroupPath) -> Result<CpuQuota> {
        let backend = self.backend(Controller::Cpu)?;
        let dir = group.dir_in(backend.mount());
        match backend {
            Backend::V2(_) => {
                let path = dir.join("cpu.max");
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
                let period_us = self.knobs.read_u64(&dir.join("cpu.cfs_period_us"))?;
                let quota = self.knobs.read_i64(&dir.join("cpu.cfs_quota_us"))?;
                Ok(CpuQuota {
                    quota_us: u64::try_from(quota).ok(),
                    period_us,
                })
            }
        }
    }

    /// Cumulative CPU time of the group in ns (`cpuacct.usage` / `cpu.stat usage_usec`).
    pub fn cpu_usage_ns(&self, group: &GroupPath) -> Result<u64> {
        let (v2, path) = self.knob(Controller::Cpuacct, group, "cpuacct.usage", "cpu.stat")?;
        if v2 {
            let text = self.knobs.read(&path)?;
            Ok(stat_field(&path, &text, "usage_usec")? * 1000)
        } else {
            self.knobs.read_u64(&path)
        }
    }

    /// CFS bandwidth throttling counters (`cpu.stat`).
    pub fn cpu_throttling(&self, group: &GroupPath) -> Result<CpuThrottling> {
        let (v2, path) = self.knob(Controller::Cpu, group, "cpu.stat", "cpu.stat")?;
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

    // ---- freezer ---------------------------------------------------------------------------

    /// Freezes the group and waits until the kernel reports it frozen.
    pub fn freeze(&self, group: &GroupPath) -> Result<()> {
        self.set_frozen(group, true)
    }

    /// Kills every process of `group` and of the groups below it, in every hierarchy: v2
    /// `cgroup.kill` where the kernel has it (5.14+), else SIGKILL to each process (forked
    /// children too), thawing a frozen group so the signals are delivered, until the groups are
    /// empty or [`KILL_SETTLE`] has passed. Returns how many processes were found to kill.
    pub fn kill_all(&self, group: &GroupPath) -> Result<usize> {
        let dirs: Vec<PathBuf> = self
            .group_dirs(group)
            .into_iter()
            .map(|(_, d)| d)
            .filter(|d| d.is_dir())
            .collect();
        let pids = |dirs: &[PathBuf]| -> BTreeSet<i32> {
            let mut out = BTreeSet::new();
            for d in dirs {
                for sub in walk_dirs(d) {
                    if let Ok(p) = self.read_pids(&sub.join("cgroup.procs")) {
                        out.extend(p);
                    }
                }
            }
            out
        };
        let found = pids(&dirs);
        if found.is_empty() {
            return Ok(0);
        }
        if let Some(kill) = dirs
            .iter()
            .map(|d| d.join("cgroup.kill"))
            .find(|p| p.exists())
        {
            self.knobs.write(&kill, "1")?;
        }
        let start = Instant::now();
        loop {
            let left = pids(&dirs);
            if left.is_empty() {
                return Ok(found.len());
            }
            for &pid in &left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            // A frozen task takes SIGKILL only once thawed.
            if self
                .freeze_state(group)
                .is_ok_and(|st| st != FreezeState::Thawed)
            {
                let _ = self.thaw(group);
            }
            if start.elapsed() > KILL_SETTLE {
                return Err(HostError::Timeout {
                    path: dirs[0].join("cgroup.procs"),
                    expected: "no process".into(),
                    last: format!("{} left: {left:?}", left.len()),
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Thaws the group and waits until the kernel reports it thawed.
    pub fn thaw(&self, group: &GroupPath) -> Result<()> {
        self.set_frozen(group, false)
    }

    fn set_frozen(&self, group: &GroupPath, frozen: bool) -> Result<()> {
        let (v2, path) = self.knob(Controller::Freezer, group, "freezer.state", "cgroup.freeze")?;
        let value = match (v2, frozen) {
            (true, true) => "1",
            (true, false) => "0",
            (false, true) => "FROZEN",
            (false, false) => "THAWED",
        };
        self.knobs.write(&path, value)?;
        let want = if frozen {
            FreezeState::Frozen
        } else {
            FreezeState::Thawed
        };
        let start = Instant::now();
        loop {
            let state = self.freeze_state(group)?;
            if state == want {
                return Ok(());
            }
            if start.elapsed() > FREEZE_SETTLE {
                return Err(HostError::Timeout {
                    path,
                    expected: format!("{want:?}"),
                    last: format!("{state:?}"),
                    waited_ms: start.elapsed().as_millis() as u64,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The freezer state (v1 `freezer.state`; v2 `cgroup.freeze` + `cgroup.events frozen`).
    pub fn freeze_state(&self, group: &GroupPath) -> Result<FreezeState> {
        let (v2, path) = self.knob(Controller::Freezer, group, "freezer.state", "cgroup.freeze")?;
        if v2 {
            let wanted = self.knobs.read_u64(&path)? != 0;
            let events_path = path.with_file_name("cgroup.events");
            let events = self.knobs.read(&events_path)?;
            let frozen = stat_field(&events_path, &events, "frozen")? != 0;
            Ok(match (wanted, frozen) {
                (true, true) => FreezeState::Frozen,
                (true, false) => FreezeState::Freezing,
                (false, _) => FreezeState::Thawed,
            })
        } else {
            let text = self.knobs.read(&path)?;
            match text.trim() {
                "THAWED" => Ok(FreezeState::Thawed),
                "FREEZING" => Ok(FreezeState::Freezing),
                "FROZEN" => Ok(FreezeState::Frozen),
                _ => Err(HostError::parse(
                    &path,
                    &text,
                    "expected THAWED, FREEZING or FROZEN",
                )),
            }
        }
    }

    // ---- memory ----------------------------------------------------------------------------

    /// Hard memory limit in bytes (`None` = unlimited): `memory.max` / `memory.limit_in_bytes`.
    pub fn set_memory_max(&self, group: &GroupPath, bytes: Option<u64>) -> Result<()> {
        let (v2, path) = self.knob(
            Controller::Memory,
            group,
            "memory.limit_in_bytes",
            "memory.max",
        )?;
        self.knobs.write(&path, &memory_value(v2, bytes))
    }

    pub fn memory_max(&self, group: &GroupPath) -> Result<Option<u64>> {
        let (_, path) = self.knob(
            Controller::Memory,
            group,
            "memory.limit_in_bytes",
            "memory.max",
        )?;
        self.read_memory_value(&path)
    }

    /// Throttling threshold (`memory.high`; v1 approximates it with `memory.soft_limit_in_bytes`,
    /// which only acts under global memory pressure).
    pub fn set_memory_high(&self, group: &GroupPath, bytes: Option<u64>) -> Result<()> {
        let (v2, path) = self.knob(
            Controller::Memory,
            group,
            "memory.soft_limit_in_bytes",
            "memory.high",
        )?;
        self.knobs.write(&path, &memory_value(v2, bytes))
    }

    pub fn memory_high(&self, group: &GroupPath) -> Result<Option<u64>> {
        let (_, path) = self.knob(
            Controller::Memory,
            group,
            "memory.soft_limit_in_bytes",
            "memory.high",
        )?;
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
        let (_, path) = self.knob(
            Controller::Memory,
            group,
            "memory.usage_in_bytes",
            "memory.current",
        )?;
        self.knobs.read_u64(&path)
    }

    /// Limit events (`memory.events`; v1: `memory.failcnt` and `memory.oom_control`).
    pub fn memory_events(&self, group: &GroupPath) -> Result<MemoryEvents> {
        let (v2, path) = self.knob(Controller::Memory, group, "memory.failcnt", "memory.events")?;
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

    // ---- io --------------------------------------------------------------------------------

    /// Disk throttles for one device (`io.max` / `blkio.throttle.*_device`).
    pub fn set_io_limits(
        &self,
        group: &GroupPath,
        device: DeviceId,
        limits: IoLimits,
    ) -> Result<()> {
        let backend = self.backend(Controller::Io)?;
        let dir = group.dir_in(backend.mount());
        match backend {
            Backend::V2(_) => {
                let f = |v: Option<u64>| v.map_or("max".to_owned(), |v| v.to_string());
                let value = format!(
                    "{device} rbps={} wbps={} riops={} wiops={}",
                    f(limits.read_bps),
                    f(limits.write_bps),
                    f(limits.read_iops),
                    f(limits.write_iops)
                );
                self.knobs.write(&dir.join("io.max"), &value)
            }
            Backend::V1(_) => {
                for (file, value) in v1_io_files(&limits) {
                    // 0 removes a v1 throttle.
                    self.knobs
                        .write(&dir.join(file), &format!("{device} {}", value.unwrap_or(0)))?;
                }
                Ok(())
            }
        }
    }

    /// The throttles set for `device` (all `None` when it has none).
    pub fn io_limits(&self, group: &GroupPath, device: DeviceId) -> Result<IoLimits> {
        let backend = self.backend(Controller::Io)?;
        let dir = group.dir_in(backend.mount());
        let mut limits = IoLimits::default();
        match backend {
            Backend::V2(_) => {
                let path = dir.join("io.max");
                let text = self.knobs.read(&path)?;
                for line in text.lines() {
                    let mut parts = line.split_whitespace();
                    let Some(dev) = parts.next() else { continue };
                    if dev.parse::<DeviceId>().ok() != Some(device) {
                        continue;
                    }
                    for kv in parts {
                        let (k, v) = kv
                            .split_once('=')
                            .ok_or_else(|| HostError::parse(&path, &text, "expected KEY=VALUE"))?;
                        let value = match v {
                            "max" => None,
                            n => Some(n.parse().map_err(|_| {
                                HostError::parse(&path, &text, "expected a number or `max`")
                            })?),
                        };
                        match k {
                            "rbps" => limits.read_bps = value,
                            "wbps" => limits.write_bps = value,
                            "riops" => limits.read_iops = value,
                            "wiops" => limits.write_iops = value,
                            _ => {}
                        }
                    }
                }
            }
            Backend::V1(_) => {
                let files = v1_io_files(&IoLimits::default());
                let mut values = [None; 4];
                for (slot, (file, _)) in values.iter_mut().zip(files) {
                    let path = dir.join(file);
                    let text = self.knobs.read(&path)?;
                    for line in text.lines() {
                        let mut parts = line.split_whitespace();
                        let (Some(dev), Some(v)) = (parts.next(), parts.next()) else {
                            continue;
                        };
                        if dev.parse::<DeviceId>().ok() == Some(device) {
                            let v: u64 = v.parse().map_err(|_| {
                                HostError::parse(&path, &text, "expected `MAJ:MIN N`")
                            })?;
                            *slot = (v > 0).then_some(v);
                        }
                    }
                }
                [
                    limits.read_bps,
                    limits.write_bps,
                    limits.read_iops,
                    limits.write_iops,
                ] = values;
            }
        }
        Ok(limits)
    }

    /// Proportional disk weight, written natively: v2 `io.weight` "default W" (1..=10000); v1
    /// `blkio.weight` (10..=1000) or, with BFQ, `blkio.bfq.weight` (1..=1000).
    pub fn set_io_weight(&self, group: &GroupPath, weight: u64) -> Result<()> {
        let backend = self.backend(Controller::Io)?;
        let dir = group.dir_in(backend.mount());
        match backend {
            Backend::V2(_) => self
                .knobs
                .write(&dir.join("io.weight"), &format!("default {weight}")),
            Backend::V1(_) => self
                .knobs
                .write(&self.v1_io_weight_file(&dir), &weight.to_string()),
        }
    }

    pub fn io_weight(&self, group: &GroupPath) -> Result<u64> {
        let backend = self.backend(Controller::Io)?;
        let dir = group.dir_in(backend.mount());
        let path = match backend {
            Backend::V2(_) => dir.join("io.weight"),
            Backend::V1(_) => self.v1_io_weight_file(&dir),
        };
        let text = self.knobs.read(&path)?;
        let value = text
            .lines()
            .find_map(|l| {
                l.strip_prefix("default ")
                    .or_else(|| (!l.contains(' ')).then_some(l))
            })
            .ok_or_else(|| HostError::parse(&path, &text, "expected a weight"))?;
        value
            .trim()
            .parse()
            .map_err(|_| HostError::parse(&path, &text, "expected a weight"))
    }

    fn v1_io_weight_file(&self, dir: &Path) -> PathBuf {
        let bfq = dir.join("blkio.bfq.weight");
        if !dir.join("blkio.weight").exists() && bfq.exists() {
            bfq
        } else {
            dir.join("blkio.weight")
        }
    }

    // ---- net_cls ---------------------------------------------------------------------------

    /// Tags the group's sockets with a tc class id (v1 `net_cls.classid`, `major << 16 | minor`).
    pub fn set_net_classid(&self, group: &GroupPath, classid: u32) -> Result<()> {
        let path = self.v1_only(Controller::NetCls, group, "net_cls.classid")?;
        self.knobs.write(&path, &classid.to_string())
    }

    pub fn net_classid(&self, group: &GroupPath) -> Result<u32> {
        let path = self.v1_only(Controller::NetCls, group, "net_cls.classid")?;
        let text = self.knobs.read(&path)?;
        text.trim()
            .parse()
            .map_err(|_| HostError::parse(&path, &text, "expected a class id"))
    }

    /// Sets the `skb->priority` of the group's sockets on `device` (v1 `net_prio.ifpriomap`).
    /// With a tc class id as the priority (`HtbConfig::be_classid()`), HTB puts the traffic in that
    /// class without any filter: cgroup classification on kernels without `cls_cgroup`. The device
    /// is resolved in the writer's network namespace.
    pub fn set_net_prio(&self, group: &GroupPath, device: &str, priority: u32) -> Result<()> {
        if device.is_empty() || device.contains([' ', '/', '\n', '\0']) {
            return Err(HostError::invalid(
                "network device",
                device,
                "not a valid interface name",
            ));
        }
        let path = self.v1_only(Controller::NetPrio, group, "net_prio.ifpriomap")?;
        self.knobs.write(&path, &format!("{device} {priority}"))
    }

    /// The group's per-device priorities (`net_prio.ifpriomap`).
    pub fn net_prio(&self, group: &GroupPath) -> Result<Vec<(String, u32)>> {
        let path = self.v1_only(Controller::NetPrio, group, "net_prio.ifpriomap")?;
        let text = self.knobs.read(&path)?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let mut parts = line.split_whitespace();
                match (parts.next(), parts.next().and_then(|p| p.parse().ok())) {
                    (Some(dev), Some(prio)) => Ok((dev.to_owned(), prio)),
                    _ => Err(HostError::parse(
                        &path,
                        &text,
                        "expected `DEVICE PRIORITY` lines",
                    )),
                }
            })
            .collect()
    }

    fn v1_only(&self, controller: Controller, group: &GroupPath, file: &str) -> Result<PathBuf> {
        match self.layout.v1.get(&controller) {
            Some(mount) => Ok(group.dir_in(mount).join(file)),
            None => Err(HostError::unavailable(
                format!("cgroup controller {controller}"),
                format!("no v1 {controller} hierarchy mounted"),
            )),
        }
    }

    // ---- pressure --------------------------------------------------------------------------

    /// Per-group pressure stall information (v2 only: `cpu.pressure`, …).
    pub fn psi(&self, group: &GroupPath, resource: PsiResource) -> Result<Psi> {
        let Some(mount) = self.layout.v2.as_ref().filter(|_| self.layout.v2_usable()) else {
            return Err(HostError::unavailable(
                "per-group PSI",
                "needs the cgroup2 hierarchy with controllers (this host controls groups through v1)",
            ));
        };
        let path = group
            .dir_in(mount)
            .join(format!("{}.pressure", resource.name()));
        let text = self.knobs.read(&path)?;
        parse_psi(&path, &text)
    }
}

fn v1_io_files(limits: &IoLimits) -> [(&'static str, Option<u64>); 4] {
    [
        ("blkio.throttle.read_bps_device", limits.read_bps),
        ("blkio.throttle.write_bps_device", limits.write_bps),
        ("blkio.throttle.read_iops_device", limits.read_iops),
        ("blkio.throttle.write_iops_device", limits.write_iops),
    ]
}

fn memory_value(v2: bool, bytes: Option<u64>) -> String {
    match (v2, bytes) {
        (_, Some(b)) => b.to_string(),
        (true, None) => "max".to_owned(),
        (false, None) => "-1".to_owned(),
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
