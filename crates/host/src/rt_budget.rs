//! The real-time budget this process runs under: the kernel's global share
//! (`sched_rt_runtime_us / sched_rt_period_us`) and, on cgroup v1 with real-time group
//! scheduling, its `cpu` group's (`cpu.rt_runtime_us / cpu.rt_period_us`; a new group's runtime
//! is 0, so SCHED_FIFO is refused there). The group is found through `/proc/self/cgroup` and
//! the cpu hierarchy's mount point in `/proc/self/mountinfo`, not a guessed path.

use std::path::{Path, PathBuf};

use crate::cgroup::{CgroupLayout, Controller};
use crate::knob_io::under;

/// What the real-time throttle allows this process, as shares of a CPU's time (0..=1; 1 where
/// a runtime of -1 says no limit).
#[derive(Debug, Clone, PartialEq)]
pub struct RtBudget {
    /// The kernel-wide share, if readable.
    pub global: Option<f64>,
    /// The process's v1 `cpu` group, if it has one with real-time group scheduling.
    pub group_dir: Option<PathBuf>,
    /// That group's share.
    pub group: Option<f64>,
    /// That group's `cpu.rt_runtime_us` as read (0: no real-time time at all).
    pub group_runtime_us: Option<i64>,
}

impl RtBudget {
    /// This process's budget on the host at `root` (`/` for the live host).
    pub fn of_this_process(root: &Path) -> RtBudget {
        let global = share(
            &under(root, "/proc/sys/kernel/sched_rt_runtime_us"),
            &under(root, "/proc/sys/kernel/sched_rt_period_us"),
        );
        let group_dir = v1_cpu_group(root);
        let (group, group_runtime_us) = match &group_dir {
            Some(dir) => (
                share(
                    &dir.join("cpu.rt_runtime_us"),
                    &dir.join("cpu.rt_period_us"),
                ),
                read_number(&dir.join("cpu.rt_runtime_us")).map(|v| v as i64),
            ),
            None => (None, None),
        };
        RtBudget {
            global,
            group_dir,
            group,
            group_runtime_us,
        }
    }
}

fn read_number(path: &Path) -> Option<f64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// runtime / period from two files; a runtime of -1 (no limit) is 1.0.
fn share(runtime: &Path, period: &Path) -> Option<f64> {
    let (r, p) = (read_number(runtime)?, read_number(period)?);
    if r < 0.0 {
        return Some(1.0);
    }
    (p > 0.0).then(|| (r / p).clamp(0.0, 1.0))
}

/// The process's v1 `cpu` group directory, where the cpu hierarchy is mounted and the group
/// has a real-time budget file.
fn v1_cpu_group(root: &Path) -> Option<PathBuf> {
    let cgroup = std::fs::read_to_string(under(root, "/proc/self/cgroup")).ok()?;
    let path = cgroup_path_of(&cgroup, "cpu")?;
    let mountinfo = std::fs::read_to_string(under(root, "/proc/self/mountinfo")).ok()?;
    let layout = CgroupLayout::from_mountinfo(root, &mountinfo, None);
    let dir = layout
        .v1
        .get(&Controller::Cpu)?
        .join(path.trim_start_matches('/'));
    dir.join("cpu.rt_runtime_us").exists().then_some(dir)
}

/// Makes (or reuses) the v1 `cpu` group `name` at the top of the cpu hierarchy mounted on the
/// host at `root`, with no real-time time (`cpu.rt_runtime_us` = 0), so SCHED_FIFO is refused
/// to whatever runs in it: its directory, or `None` where no v1 cpu hierarchy with real-time
/// group scheduling is mounted.
pub fn no_rt_group(root: &Path, name: &str) -> crate::error::Result<Option<PathBuf>> {
    let Ok(mountinfo) = std::fs::read_to_string(under(root, "/proc/self/mountinfo")) else {
        return Ok(None);
    };
    let layout = CgroupLayout::from_mountinfo(root, &mountinfo, None);
    let Some(mount) = layout.v1.get(&Controller::Cpu) else {
        return Ok(None);
    };
    if !mount.join("cpu.rt_runtime_us").exists() {
        return Ok(None);
    }
    let dir = mount.join(name);
    match std::fs::create_dir(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(crate::error::HostError::io(
                crate::error::IoOp::CreateDir,
                &dir,
                None,
                e,
            ))
        }
        _ => {}
    }
    let budget = dir.join("cpu.rt_runtime_us");
    std::fs::write(&budget, "0").map_err(|e| {
        crate::error::HostError::io(crate::error::IoOp::Write, &budget, Some("0"), e)
    })?;
    Ok(Some(dir))
}

/// The path of the v1 hierarchy holding `controller` in `/proc/PID/cgroup` text.
fn cgroup_path_of<'a>(text: &'a str, controller: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_runtime_over_period_and_no_limit_is_one() {
        let d = tempfile::tempdir().unwrap();
        let (r, p) = (d.path().join("r"), d.path().join("p"));
        std::fs::write(&p, "1000000\n").unwrap();
        std::fs::write(&r, "950000\n").unwrap();
        assert_eq!(share(&r, &p), Some(0.95));
        std::fs::write(&r, "-1\n").unwrap();
        assert_eq!(share(&r, &p), Some(1.0));
        std::fs::write(&r, "0\n").unwrap();
        assert_eq!(share(&r, &p), Some(0.0));
        assert_eq!(share(&d.path().join("missing"), &p), None);
    }

    #[test]
    fn the_group_is_found_through_the_processs_cgroup_and_the_cpu_mount() {
        // A host root with the cpu hierarchy mounted where no default path guesses it.
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let write = |p: &str, text: &str| {
            let path = r.join(p.trim_start_matches('/'));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("/proc/sys/kernel/sched_rt_runtime_us", "950000\n");
        write("/proc/sys/kernel/sched_rt_period_us", "1000000\n");
        write(
            "/proc/self/cgroup",
            "5:memory:/x\n4:cpu,cpuacct:/jobs/a\n0::/\n",
        );
        write(
            "/proc/self/mountinfo",
            "30 25 0:26 / /mnt/cg/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n",
        );
        write("/mnt/cg/cpu,cpuacct/jobs/a/cpu.rt_runtime_us", "0\n");
        write("/mnt/cg/cpu,cpuacct/jobs/a/cpu.rt_period_us", "1000000\n");
        let b = RtBudget::of_this_process(r);
        assert_eq!(b.global, Some(0.95));
        assert_eq!(
            b.group_dir.as_deref(),
            Some(r.join("mnt/cg/cpu,cpuacct/jobs/a").as_path())
        );
        assert_eq!((b.group, b.group_runtime_us), (Some(0.0), Some(0)));
    }

    #[test]
    fn without_a_v1_cpu_group_only_the_global_share_is_known() {
        let root = tempfile::tempdir().unwrap();
        let b = RtBudget::of_this_process(root.path());
        assert_eq!(
            b,
            RtBudget {
                global: None,
                group_dir: None,
                group: None,
                group_runtime_us: None
            }
        );
    }

    #[test]
    fn a_no_rt_group_is_made_under_the_mounted_cpu_hierarchy_with_no_rt_time() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // No v1 cpu hierarchy: nothing made.
        assert_eq!(no_rt_group(r, "hr-no-rt").unwrap(), None);
        std::fs::create_dir_all(r.join("proc/self")).unwrap();
        std::fs::write(
            r.join("proc/self/mountinfo"),
            "30 25 0:26 / /mnt/cg/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n",
        )
        .unwrap();
        let mount = r.join("mnt/cg/cpu,cpuacct");
        std::fs::create_dir_all(&mount).unwrap();
        // Mounted without real-time group scheduling: nothing made.
        assert_eq!(no_rt_group(r, "hr-no-rt").unwrap(), None);
        std::fs::write(mount.join("cpu.rt_runtime_us"), "950000\n").unwrap();
        let dir = no_rt_group(r, "hr-no-rt").unwrap().unwrap();
        assert_eq!(dir, mount.join("hr-no-rt"));
        assert_eq!(
            std::fs::read_to_string(dir.join("cpu.rt_runtime_us")).unwrap(),
            "0"
        );
        // Made again: reused.
        assert_eq!(no_rt_group(r, "hr-no-rt").unwrap(), Some(dir));
    }
}
