//! [`LinuxHost`]: the entry point. Everything it touches lives below `root` ("/" in production,
//! a temp dir in tests).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cgroup::{CgroupLayout, Cgroups, Controller};
use crate::error::{HostError, IoOp, Result};
use crate::knob_io::{under, CachedIo, KnobIo, Knobs};
use crate::power::{CpuFreq, Rapl};
use crate::resctrl::Resctrl;
use crate::sensors::{
    parse_meminfo, parse_proc_net_dev, parse_psi, CpuIdleSampler, MemInfo, NetDevStats,
    ProcStatReader, Psi, PsiResource, SchedstatReader,
};
use crate::topology::Topology;

/// The Linux host below a file-system root.
#[derive(Debug, Clone)]
pub struct LinuxHost {
    root: PathBuf,
    knobs: Knobs,
}

impl LinuxHost {
    /// A host rooted at `root` with real file I/O.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LinuxHost::with_io(root, Arc::new(CachedIo::default()))
    }

    /// The machine itself (`/`).
    pub fn system() -> Self {
        LinuxHost::new("/")
    }

    /// A host whose knob reads/writes go through `io` (tests inject EINVAL/EBUSY with this).
    pub fn with_io(root: impl Into<PathBuf>, io: Arc<dyn KnobIo>) -> Self {
        LinuxHost {
            root: root.into(),
            knobs: Knobs::new(io),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `root` joined with a system path such as `/proc/stat`.
    pub fn path(&self, system_path: &str) -> PathBuf {
        under(&self.root, system_path)
    }

    /// The cgroup mounts, from `<root>/proc/self/mountinfo`.
    pub fn cgroup_layout(&self) -> Result<CgroupLayout> {
        let mountinfo = self.knobs.read(&self.path("/proc/self/mountinfo"))?;
        let provisional = CgroupLayout::from_mountinfo(&self.root, &mountinfo, None);
        let controllers = match &provisional.v2 {
            Some(mount) => self.knobs.read(&mount.join("cgroup.controllers")).ok(),
            None => None,
        };
        Ok(CgroupLayout::from_mountinfo(
            &self.root,
            &mountinfo,
            controllers.as_deref(),
        ))
    }

    /// The cgroup API over the detected layout.
    pub fn cgroups(&self) -> Result<Cgroups> {
        Ok(Cgroups::new(self.cgroup_layout()?, self.knobs.clone()))
    }

    /// resctrl at `<root>/sys/fs/resctrl`.
    pub fn resctrl(&self) -> Resctrl {
        Resctrl::new(self.path("/sys/fs/resctrl"), self.knobs.clone())
    }

    /// RAPL through `<root>/sys/class/powercap`.
    pub fn rapl(&self) -> Rapl {
        Rapl::new(self.path("/sys/class/powercap"), self.knobs.clone())
    }

    /// cpufreq through `<root>/sys/devices/system/cpu`.
    pub fn cpufreq(&self) -> CpuFreq {
        CpuFreq::new(self.path("/sys/devices/system/cpu"), self.knobs.clone())
    }

    pub fn topology(&self) -> Result<Topology> {
        Topology::read(&self.root)
    }

    /// Kernel release (`<root>/proc/sys/kernel/osrelease`).
    pub fn kernel_release(&self) -> Result<String> {
        self.knobs
            .read_trimmed(&self.path("/proc/sys/kernel/osrelease"))
    }

    /// The CPU's model name (the first `model name` of `<root>/proc/cpuinfo`).
    pub fn cpu_model(&self) -> Result<String> {
        let path = self.path("/proc/cpuinfo");
        let text = self.knobs.read(&path)?;
        text.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .ok_or_else(|| HostError::parse(&path, "", "no `model name` line"))
    }

    /// The host's name (`<root>/proc/sys/kernel/hostname`).
    pub fn hostname(&self) -> Result<String> {
        self.knobs
            .read_trimmed(&self.path("/proc/sys/kernel/hostname"))
    }

    /// Every online CPU's cumulative times now (`<root>/proc/stat`), read once.
    pub fn cpu_times(&self) -> Result<Vec<crate::sensors::CpuTimes>> {
        let mut reader = crate::sensors::ProcStatReader::open(&self.root)?;
        Ok(reader.read()?.to_vec())
    }

    /// The controllers the kernel offers (`/proc/cgroups`): name → (hierarchy id, enabled).
    /// Hierarchy 0 means bound to cgroup2 or not mounted anywhere.
    pub fn kernel_cgroup_controllers(&self) -> Result<BTreeMap<String, (u32, bool)>> {
        let path = self.path("/proc/cgroups");
        let text = self.knobs.read(&path)?;
        let mut out = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 4 {
                continue;
            }
            let hierarchy = f[1]
                .parse()
                .map_err(|_| HostError::parse(&path, &text, "bad hierarchy id"))?;
            out.insert(f[0].to_owned(), (hierarchy, f[3] == "1"));
        }
        Ok(out)
    }

    /// Mounts a v1 controller that the kernel has but nobody mounted (e.g. `net_prio` for egress
    /// classification) at `<root>/sys/fs/cgroup/<name>`; returns the mount point. Already mounted:
    /// returns where. Needs root; the caller unmounts with [`LinuxHost::unmount_v1_controller`].
    pub fn mount_v1_controller(&self, controller: Controller) -> Result<PathBuf> {
        let layout = self.cgroup_layout()?;
        if let Some(existing) = layout.v1.get(&controller) {
            return Ok(existing.clone());
        }
        let name = controller.v1_name();
        let kernel = self.kernel_cgroup_controllers()?;
        match kernel.get(name) {
            None => {
                return Err(HostError::unavailable(
                    format!("cgroup controller {name}"),
                    "kernel lacks it (not in /proc/cgroups)",
                ))
            }
            Some((_, false)) => {
                return Err(HostError::unavailable(
                    format!("cgroup controller {name}"),
                    "disabled on the kernel command line (cgroup_disable=)",
                ))
            }
            Some(_) => {}
        }
        let target = self.path(&format!("/sys/fs/cgroup/{name}"));
        if !target.is_dir() {
            std::fs::create_dir(&target)
                .map_err(|e| HostError::io(IoOp::CreateDir, &target, None, e))?;
        }
        nix::mount::mount(
            Some("cgroup"),
            &target,
            Some("cgroup"),
            nix::mount::MsFlags::empty(),
            Some(name),
        )
        .map_err(|errno| HostError::Syscall {
            call: "mount",
            target: target.display().to_string(),
            value: format!("-t cgroup -o {name}"),
            source: std::io::Error::from_raw_os_error(errno as i32),
        })?;
        Ok(target)
    }

    /// Unmounts a v1 hierarchy mounted by [`LinuxHost::mount_v1_controller`] and removes its
    /// mount point. Its groups must have been removed first.
    pub fn unmount_v1_controller(&self, controller: Controller) -> Result<()> {
        let layout = self.cgroup_layout()?;
        let Some(mount) = layout.v1.get(&controller) else {
            return Ok(());
        };
        nix::mount::umount(mount).map_err(|errno| HostError::Syscall {
            call: "umount",
            target: mount.display().to_string(),
            value: controller.v1_name().to_owned(),
            source: std::io::Error::from_raw_os_error(errno as i32),
        })?;
        std::fs::remove_dir(mount).map_err(|e| HostError::io(IoOp::RemoveDir, mount, None, e))
    }

    /// Thread ids of `pid`.
    pub fn threads(&self, pid: i32) -> Result<Vec<i32>> {
        crate::sched::threads(&self.root, pid)
    }

    /// A reusable `/proc/stat` reader.
    pub fn proc_stat(&self) -> Result<ProcStatReader> {
        ProcStatReader::open(&self.root)
    }

    /// A per-CPU idle-fraction sampler over `/proc/stat`.
    pub fn idle_sampler(&self) -> Result<CpuIdleSampler> {
        CpuIdleSampler::open(&self.root)
    }

    /// A reusable schedstat reader of one thread.
    pub fn schedstat(&self, pid: i32, tid: i32) -> Result<SchedstatReader> {
        SchedstatReader::open(&self.root, pid, tid)
    }

    /// System-wide PSI (`/proc/pressure/<resource>`).
    pub fn psi(&self, resource: PsiResource) -> Result<Psi> {
        let path = self.path(&format!("/proc/pressure/{}", resource.name()));
        let text = self.knobs.read(&path)?;
        parse_psi(&path, &text)
    }

    /// `/proc/meminfo` (MemTotal, MemFree, MemAvailable).
    pub fn meminfo(&self) -> Result<MemInfo> {
        let path = self.path("/proc/meminfo");
        let text = self.knobs.read(&path)?;
        parse_meminfo(&path, &text)
    }

    /// Counters of a network device (`/sys/class/net/D/statistics`, else `/proc/net/dev`).
    pub fn net_dev(&self, device: &str) -> Result<NetDevStats> {
        if device.is_empty() || device.contains(['/', '\0']) || device == "." || device == ".." {
            return Err(HostError::invalid(
                "network device",
                device,
                "not a valid interface name",
            ));
        }
        let stats = self.path(&format!("/sys/class/net/{device}/statistics"));
        if stats.is_dir() {
            return Ok(NetDevStats {
                rx_bytes: self.knobs.read_u64(&stats.join("rx_bytes"))?,
                rx_packets: self.knobs.read_u64(&stats.join("rx_packets"))?,
                tx_bytes: self.knobs.read_u64(&stats.join("tx_bytes"))?,
                tx_packets: self.knobs.read_u64(&stats.join("tx_packets"))?,
            });
        }
        let path = self.path("/proc/net/dev");
        let text = self.knobs.read(&path)?;
        parse_proc_net_dev(&path, &text, device)
    }
}
