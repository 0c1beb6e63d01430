//! A temp-dir fake of this CI machine's cgroup v1 layout, with an I/O double that populates new
//! groups with knob files (as cgroupfs does on mkdir) and fails chosen writes with a chosen
//! errno (a temp dir cannot refuse a value by itself, and root ignores file modes).
#![allow(dead_code)]

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use headroom_host::{KnobIo, LinuxHost, RealIo};

const CONTROLLERS: &[(&str, &[(&str, &str)])] = &[
    (
        "cpu",
        &[
            ("cpu.shares", "1024\n"),
            ("cpu.idle", "0\n"),
            ("cpu.cfs_quota_us", "-1\n"),
            ("cpu.cfs_period_us", "100000\n"),
            // RT group scheduling: a new group starts with no real-time budget
            ("cpu.rt_runtime_us", "0\n"),
            ("cpu.rt_period_us", "1000000\n"),
        ],
    ),
    ("cpuacct", &[("cpuacct.usage", "0\n")]),
    (
        "cpuset",
        &[
            ("cpuset.cpus", "\n"),
            ("cpuset.mems", "\n"),
            ("cpuset.effective_cpus", "\n"),
        ],
    ),
    (
        "memory",
        &[
            ("memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory.usage_in_bytes", "0\n"),
        ],
    ),
    ("freezer", &[("freezer.state", "THAWED\n")]),
];

#[derive(Debug, Default)]
pub struct FakeIo {
    root: PathBuf,
    /// (path suffix, errno) of writes that fail.
    faults: Mutex<Vec<(String, i32)>>,
    /// Every successful write, in order.
    pub writes: Mutex<Vec<(String, String)>>,
}

impl FakeIo {
    pub fn fail(&self, suffix: &str, errno: i32) {
        self.faults
            .lock()
            .unwrap()
            .push((suffix.to_string(), errno));
    }

    pub fn heal(&self) {
        self.faults.lock().unwrap().clear();
    }

    /// The writes since the last call, as (path below the cgroup mount root, value).
    pub fn take_writes(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.writes.lock().unwrap())
    }
}

impl KnobIo for FakeIo {
    fn read(&self, path: &Path) -> io::Result<String> {
        RealIo.read(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        let p = path.to_string_lossy().to_string();
        if let Some((_, e)) = self
            .faults
            .lock()
            .unwrap()
            .iter()
            .find(|(s, _)| p.ends_with(s.as_str()))
        {
            return Err(io::Error::from_raw_os_error(*e));
        }
        RealIo.write(path, value)?;
        let rel = path
            .strip_prefix(self.root.join("sys/fs/cgroup"))
            .map(|r| r.display().to_string())
            .unwrap_or(p);
        self.writes.lock().unwrap().push((rel, value.to_string()));
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)?;
        for (name, files) in CONTROLLERS {
            if path.starts_with(self.root.join("sys/fs/cgroup").join(name)) {
                for (f, content) in *files {
                    fs::write(path.join(f), content)?;
                }
                fs::write(path.join("cgroup.procs"), "")?;
                fs::write(path.join("tasks"), "")?;
            }
        }
        Ok(())
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }
}

/// A fake machine: 4 CPUs, cgroup v1 hierarchies below a temp dir.
pub struct Fake {
    pub dir: tempfile::TempDir,
    pub io: Arc<FakeIo>,
}

impl Fake {
    pub fn v1() -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let mut mountinfo = String::from("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n");
        for (i, (name, files)) in CONTROLLERS.iter().enumerate() {
            let mount = root.join("sys/fs/cgroup").join(name);
            fs::create_dir_all(&mount).unwrap();
            for (f, content) in *files {
                fs::write(mount.join(f), content).unwrap();
            }
            fs::write(mount.join("cgroup.procs"), "").unwrap();
            fs::write(mount.join("tasks"), "").unwrap();
            mountinfo.push_str(&format!(
                "{} 31 0:{} / /sys/fs/cgroup/{name} rw,relatime - cgroup cgroup rw,{name}\n",
                40 + i,
                29 + i
            ));
        }
        // the root's budget as the kernel's default sched_rt_runtime_us gives it
        fs::write(root.join("sys/fs/cgroup/cpu/cpu.rt_runtime_us"), "950000\n").unwrap();
        fs::write(root.join("sys/fs/cgroup/cpuset/cpuset.cpus"), "0-3\n").unwrap();
        fs::write(root.join("sys/fs/cgroup/cpuset/cpuset.mems"), "0\n").unwrap();
        fs::create_dir_all(root.join("proc/self")).unwrap();
        fs::write(root.join("proc/self/mountinfo"), mountinfo).unwrap();
        let io = Arc::new(FakeIo {
            root: root.clone(),
            ..Default::default()
        });
        Fake { dir, io }
    }

    pub fn host(&self) -> LinuxHost {
        LinuxHost::with_io(self.dir.path(), self.io.clone())
    }

    /// Content of a knob, e.g. `knob("cpuset", "hr/be", "cpuset.cpus")`, trimmed.
    pub fn knob(&self, controller: &str, group: &str, file: &str) -> String {
        fs::read_to_string(self.path(controller, group, file))
            .unwrap()
            .trim()
            .to_string()
    }

    pub fn set_knob(&self, controller: &str, group: &str, file: &str, value: &str) {
        fs::write(self.path(controller, group, file), value).unwrap();
    }

    pub fn path(&self, controller: &str, group: &str, file: &str) -> PathBuf {
        self.dir
            .path()
            .join("sys/fs/cgroup")
            .join(controller)
            .join(group)
            .join(file)
    }
}

/// The one write path over a fake host's cgroups (no resctrl, cpufreq or egress there).
#[allow(dead_code)]
pub struct Plan {
    pub node: headroom_agent::linux_node::LinuxNode,
    pub act: headroom_control::actuation::Actuation,
}

#[allow(dead_code)]
impl Plan {
    pub fn attach(host: &LinuxHost, groups: headroom_control::actuation::ManagedGroups) -> Plan {
        let cgroups = host.cgroups().unwrap();
        let mut node = headroom_agent::linux_node::LinuxNode::probe(host, cgroups, &[]);
        let act = headroom_control::actuation::Actuation::attach(&mut node, groups).unwrap();
        Plan { node, act }
    }

    /// The groups `hr/lc` and `hr/be` made in `fake` (the writes that took forgotten), and the
    /// write path over them.
    pub fn on_hr(fake: &Fake) -> Plan {
        let cgroups = fake.host().cgroups().unwrap();
        let lc = headroom_types::GroupPath::new("hr/lc").unwrap();
        let be = headroom_types::GroupPath::new("hr/be").unwrap();
        cgroups.create(&lc).unwrap();
        cgroups.create(&be).unwrap();
        fake.io.take_writes();
        Plan::attach(
            &fake.host(),
            headroom_control::actuation::ManagedGroups { lc, be: vec![be] },
        )
    }

    pub fn apply(
        &mut self,
        a: &headroom_types::allocation::Allocation,
        verify: bool,
    ) -> Result<headroom_control::actuation::ApplyReport, headroom_control::actuation::ActuationError>
    {
        self.act.apply(&mut self.node, a, &[], verify)
    }

    pub fn restore_original(
        &mut self,
    ) -> Result<headroom_control::actuation::ApplyReport, headroom_control::actuation::ActuationError>
    {
        self.act.restore_original(&mut self.node)
    }
}
