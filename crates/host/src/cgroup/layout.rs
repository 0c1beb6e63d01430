//! Which cgroup hierarchies this host has: v1, v2 or hybrid, and which one owns each controller.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::knob_io::under;

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

/// The first of `cgroup_root`'s `cpu` and `cpuset` v1 hierarchies and `cgroup_root` itself (a
/// cgroup2 mount) that is a cgroup hierarchy (it has `cgroup.procs`) this process may write:
/// where an agent could make its groups. `None`: nowhere.
pub fn writable_hierarchy(cgroup_root: &Path) -> Option<PathBuf> {
    [
        cgroup_root.join("cpu"),
        cgroup_root.join("cpuset"),
        cgroup_root.to_path_buf(),
    ]
    .into_iter()
    .find(|p| {
        p.join(super::PROCS).exists()
            && nix::unistd::access(p.as_path(), nix::unistd::AccessFlags::W_OK).is_ok()
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_hierarchy_is_one_with_cgroup_procs() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        assert_eq!(writable_hierarchy(r), None);
        std::fs::create_dir_all(r.join("cpu")).unwrap();
        assert_eq!(
            writable_hierarchy(r),
            None,
            "a directory is not a hierarchy"
        );
        std::fs::create_dir_all(r.join("cpuset")).unwrap();
        std::fs::write(r.join("cpuset/cgroup.procs"), "").unwrap();
        assert_eq!(writable_hierarchy(r), Some(r.join("cpuset")));
        std::fs::write(r.join("cpu/cgroup.procs"), "").unwrap();
        assert_eq!(writable_hierarchy(r), Some(r.join("cpu")), "cpu first");
    }
}
