//! The one write path over every resource of a fake machine: resctrl (11 ways, MBA, two
//! domains), cpufreq on CPUs 0-3, a v1 blkio/freezer/cpuset tree, egress through a recording
//! `tc`. Only what differs is written, in the plan's order; a failed write keeps BE confined and
//! undoes what gave; the originals come back.

mod ticks;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use headroom_host::tc::RecordingTc;
use headroom_host::{KnobIo, LinuxHost, RealIo};
use headroom_types::GroupPath;

use super::LinuxNode;
use headroom_control::actuation::{Actuation, ActuationError, ManagedGroups, RollbackOutcome};
use headroom_control::policy::Mechanism;
use headroom_types::allocation::{Allocation, IoLimit};
use headroom_types::CpuSet;

/// A temp-dir stand-in for the kernel's files: schemata and v1 throttle files keep one
/// line per resource / device (as the kernel does), a resctrl `tasks` write adds a task,
/// mkdir populates a group like resctrl and cgroupfs do, and chosen writes fail (EBUSY).
#[derive(Debug)]
struct FakeKernel {
    root: PathBuf,
    /// (path suffix, failures left; u32::MAX = for ever).
    faults: Mutex<Vec<(String, u32)>>,
    /// Successful writes: (path below the root, value).
    writes: Mutex<Vec<(String, String)>>,
}

impl FakeKernel {
    fn fail(&self, suffix: &str, times: u32) {
        self.faults
            .lock()
            .unwrap()
            .push((suffix.to_string(), times));
    }

    fn heal(&self) {
        self.faults.lock().unwrap().clear();
    }

    /// The writes to files ending in `suffix` since the last call (others are kept).
    fn take(&self, suffix: &str) -> Vec<String> {
        let mut all = self.writes.lock().unwrap();
        let (mine, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|(p, _)| p.ends_with(suffix));
        *all = rest;
        mine.into_iter().map(|(_, v)| v).collect()
    }

    fn merge(old: &str, new: &str, key: impl Fn(&str) -> String, remove: bool) -> String {
        let mut lines: Vec<String> = old
            .lines()
            .filter(|l| !l.trim().is_empty() && key(l) != key(new))
            .map(str::to_string)
            .collect();
        if !remove {
            lines.push(new.trim().to_string());
        }
        lines.sort();
        lines.iter().map(|l| format!("{l}\n")).collect()
    }
}

impl KnobIo for FakeKernel {
    fn read(&self, path: &Path) -> io::Result<String> {
        RealIo.read(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        let shown = path.to_string_lossy().to_string();
        for (suffix, left) in self.faults.lock().unwrap().iter_mut() {
            if *left > 0 && shown.ends_with(suffix.as_str()) {
                if *left != u32::MAX {
                    *left -= 1;
                }
                return Err(io::Error::from_raw_os_error(libc::EBUSY));
            }
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let old = || std::fs::read_to_string(path);
        let content = if name == "schemata" {
            let key = |l: &str| l.split(':').next().unwrap_or("").trim().to_string();
            Self::merge(&old()?, value, key, false)
        } else if name.starts_with("blkio.throttle.") {
            let key = |l: &str| l.split_whitespace().next().unwrap_or("").to_string();
            let remove = value.split_whitespace().nth(1) == Some("0");
            Self::merge(&old()?, value, key, remove)
        } else if name == "tasks" && shown.contains("resctrl") {
            format!("{}{}\n", old()?, value.trim())
        } else {
            value.to_string()
        };
        RealIo.write(path, &content)?;
        let rel = path.strip_prefix(&self.root).unwrap_or(path);
        self.writes
            .lock()
            .unwrap()
            .push((rel.display().to_string(), value.trim().to_string()));
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)?;
        if path.starts_with(self.root.join("sys/fs/resctrl")) {
            std::fs::write(path.join("schemata"), "L3:0=7ff;1=7ff\nMB:0=100;1=100\n")?;
            std::fs::write(path.join("tasks"), "")?;
        } else if path.starts_with(self.root.join("sys/fs/cgroup")) {
            for f in BLKIO_FILES.iter().chain(&["tasks", "cgroup.procs"]) {
                std::fs::write(path.join(f), "")?;
            }
            std::fs::write(path.join("freezer.state"), "THAWED\n")?;
            std::fs::write(path.join("cpuset.cpus"), "0-3\n")?;
            std::fs::write(path.join("cpuset.mems"), "0\n")?;
        }
        Ok(())
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }
}

const BLKIO_FILES: &[&str] = &[
    "blkio.throttle.read_bps_device",
    "blkio.throttle.write_bps_device",
    "blkio.throttle.read_iops_device",
    "blkio.throttle.write_iops_device",
];

fn put(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

struct Machine {
    dir: tempfile::TempDir,
    kernel: Arc<FakeKernel>,
    tc: Arc<RecordingTc>,
}

impl Machine {
    fn new(leftover: bool) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (f, v) in [
            ("cbm_mask", "7ff"),
            ("min_cbm_bits", "1"),
            ("num_closids", "16"),
            ("shareable_bits", "0"),
        ] {
            put(root, &format!("sys/fs/resctrl/info/L3/{f}"), v);
        }
        for (f, v) in [
            ("bandwidth_gran", "10"),
            ("min_bandwidth", "10"),
            ("num_closids", "8"),
            ("delay_linear", "1"),
        ] {
            put(root, &format!("sys/fs/resctrl/info/MB/{f}"), v);
        }
        put(
            root,
            "sys/fs/resctrl/schemata",
            "L3:0=7ff;1=7ff\nMB:0=100;1=100\n",
        );
        put(root, "sys/fs/resctrl/tasks", "1\n2\n");
        if leftover {
            put(
                root,
                "sys/fs/resctrl/headroom-be/schemata",
                "L3:0=700;1=700\nMB:0=40;1=40\n",
            );
            put(root, "sys/fs/resctrl/headroom-be/tasks", "");
            // the crashed agent had narrowed the LC's mask
            put(
                root,
                "sys/fs/resctrl/schemata",
                "L3:0=ff;1=ff\nMB:0=100;1=100\n",
            );
        }
        for cpu in 0..4 {
            for (f, v) in [
                ("cpuinfo_min_freq", "800000"),
                ("cpuinfo_max_freq", "3000000"),
                ("scaling_max_freq", "3000000"),
                ("scaling_cur_freq", "2400000"),
            ] {
                put(
                    root,
                    &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/{f}"),
                    v,
                );
            }
        }
        put(root, "sys/fs/cgroup/tree/tasks", "");
        put(root, "sys/fs/cgroup/tree/cpuset.cpus", "0-3\n");
        put(root, "sys/fs/cgroup/tree/cpuset.mems", "0\n");
        put(root, "sys/fs/cgroup/tree/freezer.state", "THAWED\n");
        put(root, "sys/fs/cgroup/tree/cgroup.procs", "");
        put(
            root,
            "proc/self/mountinfo",
            "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
             40 31 0:29 / /sys/fs/cgroup/tree rw,relatime - cgroup cgroup rw,blkio,freezer,cpuset\n",
        );
        let kernel = Arc::new(FakeKernel {
            root: root.to_path_buf(),
            faults: Mutex::new(Vec::new()),
            writes: Mutex::new(Vec::new()),
        });
        let m = Machine {
            dir,
            kernel,
            tc: Arc::new(RecordingTc::new()),
        };
        let cg = m.host().cgroups().unwrap();
        cg.create(&be_group()).unwrap();
        cg.create(&GroupPath::new("hr/lc").unwrap()).unwrap();
        m.kernel.take("");
        m
    }

    fn host(&self) -> LinuxHost {
        LinuxHost::with_io(self.dir.path(), self.kernel.clone())
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(rel))
            .unwrap()
            .trim()
            .to_string()
    }

    fn freq(&self, cpu: usize) -> String {
        self.read(&format!(
            "sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_max_freq"
        ))
    }

    /// Every actuator on, egress through the recording `tc`.
    fn node(&self) -> (LinuxNode, Actuation) {
        let host = self.host();
        let mut node = LinuxNode::probe(&host, host.cgroups().unwrap(), &[0, 1, 2, 3])
            .with_io()
            .with_egress_runner(self.tc.clone(), "eth0", 10_000_000_000)
            .unwrap();
        let groups = ManagedGroups {
            lc: GroupPath::new("hr/lc").unwrap(),
            be: vec![be_group()],
        };
        let act = Actuation::attach(&mut node, groups).unwrap();
        (node, act)
    }

    /// (file below the root, value) of every write since the last call.
    fn writes(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.kernel.writes.lock().unwrap())
    }
}

fn be_group() -> GroupPath {
    GroupPath::new("hr/be").unwrap()
}

/// BE on CPUs 2-3, top 3 ways, 40% memory bandwidth, 1.6 GHz, 1 Gbit/s egress, 10 MB/s writes.
fn restricted() -> Allocation {
    Allocation {
        be_enabled: true,
        be_cpus: Some(CpuSet::from([2, 3])),
        be_llc_ways: Some(3),
        be_mba_pct: Some(40),
        be_freq_khz: Some(1_600_000),
        be_egress_ceil_bytes_per_s: Some(125_000_000),
        be_io_limits: vec![IoLimit {
            device: "254:0".parse().unwrap(),
            read_bps: None,
            write_bps: Some(10_000_000),
            read_iops: None,
            write_iops: None,
        }],
        ..Allocation::default()
    }
}

#[test]
fn every_resource_is_written_once_then_only_what_changes() {
    let m = Machine::new(false);
    let (mut node, mut act) = m.node();
    assert_eq!(
        node.active(),
        [
            Mechanism::ResctrlL3,
            Mechanism::ResctrlMba,
            Mechanism::Cpufreq,
            Mechanism::TcHtb,
            Mechanism::Io,
        ],
        "{:?}",
        node.disabled()
    );
    let r = act.apply(&mut node, &restricted(), &[2, 3], true).unwrap();
    // cpuset + 2 schemata + 2 CPUs' caps + the HTB tree + the io throttle
    assert_eq!(r.writes.len(), 7, "{:#?}", r.writes);
    assert_eq!(
        m.read("sys/fs/resctrl/schemata"),
        "L3:0=ff;1=ff\nMB:0=100;1=100"
    );
    assert_eq!(
        m.read("sys/fs/resctrl/headroom-be/schemata"),
        "L3:0=700;1=700\nMB:0=40;1=40"
    );
    assert_eq!(
        (m.freq(2), m.freq(3), m.freq(0)),
        ("1600000".into(), "1600000".into(), "3000000".into())
    );
    assert_eq!(
        m.read("sys/fs/cgroup/tree/hr/be/blkio.throttle.write_bps_device"),
        "254:0 10000000"
    );
    assert!(
        m.tc.calls()
            .iter()
            .any(|c| c.contains("classid 1:20 htb rate 1000000000bit ceil 1000000000bit")),
        "{:?}",
        m.tc.calls()
    );
    m.writes();
    let calls = m.tc.calls().len();
    // the same allocation again, verified: nothing is written
    assert!(act
        .apply(&mut node, &restricted(), &[2, 3], true)
        .unwrap()
        .writes
        .is_empty());
    assert!(m.writes().is_empty());
    assert_eq!(m.tc.calls().len(), calls);
    // BE grows to 5 ways and leaves CPU 3: the LC's mask narrows before BE's widens, CPU 3 gets
    // its original cap back
    let mut grown = restricted();
    grown.be_cpus = Some(CpuSet::from([2]));
    grown.be_llc_ways = Some(5);
    act.apply(&mut node, &grown, &[2], false).unwrap();
    let files: Vec<String> = m.writes().into_iter().map(|(p, _)| p).collect();
    let pos = |f: &str| {
        files
            .iter()
            .position(|p| p == f)
            .unwrap_or_else(|| panic!("{f} in {files:?}"))
    };
    assert!(
        pos("sys/fs/resctrl/schemata") < pos("sys/fs/resctrl/headroom-be/schemata"),
        "{files:?}"
    );
    assert!(
        pos("sys/fs/cgroup/tree/hr/be/cpuset.cpus") < pos("sys/fs/resctrl/headroom-be/schemata"),
        "{files:?}"
    );
    assert_eq!(m.freq(3), "3000000");
    assert_eq!(
        m.read("sys/fs/resctrl/schemata"),
        "L3:0=3f;1=3f\nMB:0=100;1=100"
    );
}

/// The order the issue asks for: on a tick that disables BE, BE is frozen before it gets
/// anything back — its cache ways, memory bandwidth, frequency, egress and io limits all widen
/// after the freeze, and the LC's mask grows back before BE's group does.
#[test]
fn a_disable_tick_freezes_be_before_any_resource_widens() {
    let m = Machine::new(false);
    let (mut node, mut act) = m.node();
    act.apply(&mut node, &restricted(), &[2, 3], true).unwrap();
    m.writes();
    let disabled = Allocation {
        be_cpus: Some(CpuSet::from([2, 3])),
        ..Allocation::default().disabled()
    };
    let r = act.apply(&mut node, &disabled, &[2, 3], false).unwrap();
    let files: Vec<String> = m.writes().into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        files.first().map(String::as_str),
        Some("sys/fs/cgroup/tree/hr/be/freezer.state"),
        "{files:?}"
    );
    let kinds = |f: &str| files.iter().filter(|p| p.contains(f)).count();
    // every resource was touched: cache ways and bandwidth (both groups), two CPUs' caps, io
    for (file, n) in [
        ("resctrl/schemata", 2),
        ("headroom-be/schemata", 2),
        ("scaling_max_freq", 2),
        ("blkio.throttle", 1),
    ] {
        assert!(kinds(file) >= n, "{file}: {files:?}");
    }
    let lc_mask = files
        .iter()
        .position(|p| p == "sys/fs/resctrl/schemata")
        .unwrap();
    let be_mask = files
        .iter()
        .position(|p| p == "sys/fs/resctrl/headroom-be/schemata")
        .unwrap();
    assert!(lc_mask < be_mask, "{files:?}");
    assert_eq!(m.read("sys/fs/cgroup/tree/hr/be/freezer.state"), "FROZEN");
    assert_eq!((m.freq(2), m.freq(3)), ("3000000".into(), "3000000".into()));
    // the egress tree stays, at the whole link
    assert!(
        m.tc.calls().last().unwrap().contains("ceil 10000000000bit"),
        "{:?}",
        m.tc.calls()
    );
    let phases: Vec<_> = r.writes.iter().map(|w| w.to.clone()).collect();
    assert_eq!(
        phases.first(),
        Some(&headroom_control::actuation::KnobValue::Frozen(true))
    );
}

#[test]
fn restore_puts_every_original_back_and_removes_the_resctrl_group() {
    let m = Machine::new(false);
    let (mut node, mut act) = m.node();
    act.apply(&mut node, &restricted(), &[2, 3], true).unwrap();
    act.restore_original(&mut node).unwrap();
    assert_eq!(
        m.read("sys/fs/resctrl/schemata"),
        "L3:0=7ff;1=7ff\nMB:0=100;1=100"
    );
    assert!(!m.dir.path().join("sys/fs/resctrl/headroom-be").exists());
    assert_eq!((m.freq(2), m.freq(3)), ("3000000".into(), "3000000".into()));
    assert_eq!(
        m.read("sys/fs/cgroup/tree/hr/be/blkio.throttle.write_bps_device"),
        ""
    );
    assert_eq!(m.read("sys/fs/cgroup/tree/hr/be/cpuset.cpus"), "0-3");
    assert!(
        m.tc.calls().last().unwrap().contains("del"),
        "{:?}",
        m.tc.calls()
    );
}

#[test]
fn a_write_that_keeps_failing_keeps_be_confined_and_undoes_what_gave() {
    let m = Machine::new(false);
    let (mut node, mut act) = m.node();
    m.kernel.fail("scaling_max_freq", u32::MAX);
    let err = act
        .apply(&mut node, &restricted(), &[2, 3], true)
        .unwrap_err();
    let ActuationError::Write(f) = err else {
        panic!("{err}")
    };
    assert_eq!(f.attempts, headroom_control::actuation::WRITE_ATTEMPTS);
    assert!(f.what.ends_with("scaling_max_freq"), "{}", f.what);
    // What takes from BE stays (its cpuset, its egress and disk caps); what gives waits (BE's
    // own resctrl group), and the LC's mask, narrowed only to make room for it, is put back.
    assert!(!f.kept.is_empty(), "{f}");
    assert!(
        matches!(f.rollback, RollbackOutcome::RolledBack(n) if n > 0),
        "{}",
        f.rollback
    );
    assert_eq!(m.read("sys/fs/cgroup/tree/hr/be/cpuset.cpus"), "2-3");
    assert!(!m.dir.path().join("sys/fs/resctrl/headroom-be").exists());
    assert_eq!(
        m.read("sys/fs/resctrl/schemata"),
        "L3:0=7ff;1=7ff\nMB:0=100;1=100"
    );
    assert!(
        m.tc.calls()
            .iter()
            .any(|c| c.contains("ceil 1000000000bit")),
        "{:?}",
        m.tc.calls()
    );
    m.kernel.heal();
    // and the next pass carries it out whole
    act.apply(&mut node, &restricted(), &[2, 3], false).unwrap();
    assert_eq!(m.freq(2), "1600000");
    assert_eq!(
        m.read("sys/fs/resctrl/schemata"),
        "L3:0=ff;1=ff\nMB:0=100;1=100"
    );
}

#[test]
fn a_failing_write_is_retried() {
    let m = Machine::new(false);
    let (mut node, mut act) = m.node();
    m.kernel.fail("headroom-be/schemata", 2);
    let r = act.apply(&mut node, &restricted(), &[2, 3], true).unwrap();
    assert_eq!(r.retries, 2);
    assert_eq!(
        m.read("sys/fs/resctrl/headroom-be/schemata"),
        "L3:0=700;1=700\nMB:0=40;1=40"
    );
}

#[test]
fn a_group_left_by_a_crashed_agent_is_adopted_and_the_whole_cache_restored() {
    let m = Machine::new(true);
    let (mut node, mut act) = m.node();
    act.restore_original(&mut node).unwrap();
    assert_eq!(
        m.read("sys/fs/resctrl/schemata"),
        "L3:0=7ff;1=7ff\nMB:0=100;1=100"
    );
    assert!(!m.dir.path().join("sys/fs/resctrl/headroom-be").exists());
}

#[test]
fn originals_survive_a_restart() {
    let m = Machine::new(false);
    let (mut node, mut act) = m.node();
    act.apply(&mut node, &restricted(), &[2, 3], true).unwrap();
    let saved = act.original().clone();
    // a new agent on the same machine: the kernel holds BE's caps, the state file the originals
    let (mut node2, _) = m.node();
    let groups = act.groups().clone();
    let mut again = Actuation::resume(&mut node2, groups, saved).unwrap();
    again.restore_original(&mut node2).unwrap();
    assert_eq!((m.freq(2), m.freq(3)), ("3000000".into(), "3000000".into()));
    assert_eq!(
        m.read("sys/fs/resctrl/schemata"),
        "L3:0=7ff;1=7ff\nMB:0=100;1=100"
    );
}
