//! kubelet's pod cgroups: the path of a pod's group from its QoS class and UID in either cgroup
//! driver's layout (pure), and which layout a node has (one directory listing).

use std::path::{Path, PathBuf};

use headroom_types::discovery::{LayoutChoice, PodQos};
use headroom_types::GroupPath;
use serde::{Deserialize, Serialize};

/// kubelet's cgroup driver, which names the pod groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KubeletLayout {
    /// `kubepods/burstable/pod<uid>` (cgroup v1 and v2).
    Cgroupfs,
    /// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice`.
    Systemd,
}

impl KubeletLayout {
    /// The top group kubelet puts every pod under.
    pub fn top(self) -> &'static str {
        match self {
            KubeletLayout::Cgroupfs => "kubepods",
            KubeletLayout::Systemd => "kubepods.slice",
        }
    }

    /// The BestEffort parent: every BestEffort pod lies below it (the BE group).
    pub fn besteffort_parent(self) -> GroupPath {
        let p = match self {
            KubeletLayout::Cgroupfs => "kubepods/besteffort",
            KubeletLayout::Systemd => "kubepods.slice/kubepods-besteffort.slice",
        };
        GroupPath::new(p).expect("a constant relative path")
    }

    /// The pod's group relative to the cgroup root. `None` when the UID holds anything but
    /// ASCII letters, digits and `-` (it becomes a directory name: no `/`, `.` or `_`).
    pub fn pod_cgroup(self, qos: PodQos, uid: &str) -> Option<GroupPath> {
        if uid.is_empty() || !uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return None;
        }
        let path = match self {
            KubeletLayout::Cgroupfs => match qos {
                PodQos::Guaranteed => format!("kubepods/pod{uid}"),
                PodQos::Burstable => format!("kubepods/burstable/pod{uid}"),
                PodQos::BestEffort => format!("kubepods/besteffort/pod{uid}"),
            },
            KubeletLayout::Systemd => {
                // systemd reserves `-` in a unit name for the slice hierarchy.
                let u = uid.replace('-', "_");
                match qos {
                    PodQos::Guaranteed => format!("kubepods.slice/kubepods-pod{u}.slice"),
                    PodQos::Burstable => format!(
                        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice"
                    ),
                    PodQos::BestEffort => format!(
                        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice"
                    ),
                }
            }
        };
        GroupPath::new(&path).ok()
    }
}

/// The layout to use: the fixed one, or the one found under `cgroup_root`.
pub fn resolve(choice: LayoutChoice, cgroup_root: &Path) -> Option<KubeletLayout> {
    match choice {
        LayoutChoice::Auto => detect(cgroup_root),
        LayoutChoice::Cgroupfs => Some(KubeletLayout::Cgroupfs),
        LayoutChoice::Systemd => Some(KubeletLayout::Systemd),
    }
}

/// The directories a group path lives in: the root itself (cgroup v2, or a single v1 hierarchy
/// given as the root) and each v1 hierarchy below it (`cpu`, `cpu,cpuacct`, `systemd`, ...).
pub fn hierarchies(cgroup_root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![cgroup_root.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(cgroup_root) {
        let mut subs: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .map(|e| e.path())
            .filter(|p| !is_kubelet_top(p))
            .collect();
        subs.sort();
        dirs.extend(subs);
    }
    dirs
}

fn is_kubelet_top(p: &Path) -> bool {
    matches!(
        p.file_name().and_then(|n| n.to_str()),
        Some("kubepods") | Some("kubepods.slice")
    )
}

/// The layout kubelet made under `cgroup_root`: `kubepods.slice` (systemd) or `kubepods`
/// (cgroupfs) in the root or any v1 hierarchy. `None` before kubelet made either.
pub fn detect(cgroup_root: &Path) -> Option<KubeletLayout> {
    let dirs = hierarchies(cgroup_root);
    [KubeletLayout::Systemd, KubeletLayout::Cgroupfs]
        .into_iter()
        .find(|l| dirs.iter().any(|d| d.join(l.top()).is_dir()))
}

/// Whether `group` exists under `cgroup_root` (in the root or in any v1 hierarchy).
pub fn group_exists(cgroup_root: &Path, group: &GroupPath) -> bool {
    hierarchies(cgroup_root)
        .iter()
        .any(|d| group.dir_in(d).is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

    #[test]
    fn cgroupfs_paths_for_every_qos_class() {
        let l = KubeletLayout::Cgroupfs;
        assert_eq!(
            l.pod_cgroup(PodQos::Guaranteed, UID).unwrap(),
            "kubepods/pod0a1b2c3d-4e5f-6789-abcd-ef0123456789"
        );
        assert_eq!(
            l.pod_cgroup(PodQos::Burstable, UID).unwrap(),
            "kubepods/burstable/pod0a1b2c3d-4e5f-6789-abcd-ef0123456789"
        );
        assert_eq!(
            l.pod_cgroup(PodQos::BestEffort, UID).unwrap(),
            "kubepods/besteffort/pod0a1b2c3d-4e5f-6789-abcd-ef0123456789"
        );
        assert_eq!(l.besteffort_parent(), "kubepods/besteffort");
    }

    #[test]
    fn systemd_paths_for_every_qos_class_with_underscored_uid() {
        let l = KubeletLayout::Systemd;
        let u = "0a1b2c3d_4e5f_6789_abcd_ef0123456789";
        assert_eq!(
            l.pod_cgroup(PodQos::Guaranteed, UID).unwrap(),
            format!("kubepods.slice/kubepods-pod{u}.slice").as_str()
        );
        assert_eq!(
            l.pod_cgroup(PodQos::Burstable, UID).unwrap(),
            format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice")
                .as_str()
        );
        assert_eq!(
            l.pod_cgroup(PodQos::BestEffort, UID).unwrap(),
            format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice")
                .as_str()
        );
        assert_eq!(
            l.besteffort_parent(),
            "kubepods.slice/kubepods-besteffort.slice"
        );
    }

    #[test]
    fn a_uid_that_is_not_a_plain_name_gets_no_path() {
        for bad in ["", "../x", "a/b", "a.b", "a_b", "x y"] {
            for l in [KubeletLayout::Cgroupfs, KubeletLayout::Systemd] {
                assert_eq!(l.pod_cgroup(PodQos::Burstable, bad), None, "{bad:?}");
            }
        }
    }

    #[test]
    fn detects_the_layout_in_the_root_or_a_v1_hierarchy() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(detect(t.path()), None);
        std::fs::create_dir_all(t.path().join("cpu,cpuacct/kubepods/burstable")).unwrap();
        assert_eq!(detect(t.path()), Some(KubeletLayout::Cgroupfs));

        let v2 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(v2.path().join("kubepods.slice")).unwrap();
        assert_eq!(detect(v2.path()), Some(KubeletLayout::Systemd));
        assert_eq!(
            resolve(LayoutChoice::Cgroupfs, v2.path()),
            Some(KubeletLayout::Cgroupfs)
        );
        assert_eq!(
            resolve(LayoutChoice::Auto, v2.path()),
            Some(KubeletLayout::Systemd)
        );
    }

    #[test]
    fn a_group_exists_in_any_hierarchy() {
        let t = tempfile::tempdir().unwrap();
        let g = KubeletLayout::Cgroupfs
            .pod_cgroup(PodQos::Burstable, UID)
            .unwrap();
        assert!(!group_exists(t.path(), &g));
        std::fs::create_dir_all(g.dir_in(&t.path().join("cpu"))).unwrap();
        assert!(group_exists(t.path(), &g));
    }
}
