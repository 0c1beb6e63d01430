//! Temp-dir fakes of the kernel's file systems, and a [`FakeKernel`] I/O double that behaves like
//! cgroupfs where a plain directory cannot: mkdir populates the knob files, rmdir refuses
//! populated groups (EBUSY), writing a pid to `cgroup.procs` moves it, `cgroup.freeze` updates
//! `cgroup.events`, and chosen writes fail with a chosen errno (EINVAL, EBUSY, EACCES …).
#![allow(dead_code)]

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use headroom_host::{KnobIo, LinuxHost, RealIo};
use nix::errno::Errno;

/// A write that must fail: the path contains `suffix` (and, if set, the value equals `value`).
#[derive(Debug, Clone)]
pub struct Fault {
    pub suffix: String,
    pub value: Option<String>,
    pub errno: Errno,
}

/// The files a new group gets in one hierarchy.
#[derive(Debug, Clone)]
pub struct Template {
    pub mount: PathBuf,
    pub files: Vec<(String, String)>,
}

#[derive(Debug, Default)]
pub struct FakeKernel {
    pub templates: Vec<Template>,
    faults: Mutex<Vec<Fault>>,
    writes: Mutex<Vec<(PathBuf, String)>>,
    /// Reads answered from a script instead of the file: (path suffix, the answers in turn);
    /// once a script is used up the file is read.
    scripted: Mutex<Vec<(String, std::collections::VecDeque<String>)>>,
    pub io_calls: Mutex<usize>,
}

impl FakeKernel {
    pub fn fail(&self, suffix: &str, errno: Errno) {
        self.faults.lock().unwrap().push(Fault {
            suffix: suffix.to_owned(),
            value: None,
            errno,
        });
    }

    pub fn fail_value(&self, suffix: &str, value: &str, errno: Errno) {
        self.faults.lock().unwrap().push(Fault {
            suffix: suffix.to_owned(),
            value: Some(value.to_owned()),
            errno,
        });
    }

    /// The next reads of a path ending in `suffix` answer `answers`, one each, in turn: a file
    /// the kernel changes between two reads (a group's `cgroup.procs` as its processes die).
    pub fn script_reads(&self, suffix: &str, answers: &[&str]) {
        self.scripted.lock().unwrap().push((
            suffix.to_owned(),
            answers.iter().map(|a| (*a).to_owned()).collect(),
        ));
    }

    pub fn writes(&self) -> Vec<(PathBuf, String)> {
        self.writes.lock().unwrap().clone()
    }

    fn calls(&self) {
        *self.io_calls.lock().unwrap() += 1;
    }

    fn template_for(&self, path: &Path) -> Option<&Template> {
        self.templates
            .iter()
            .filter(|t| path.starts_with(&t.mount))
            .max_by_key(|t| t.mount.as_os_str().len())
    }

    fn fault(&self, path: &Path, value: &str) -> Option<Errno> {
        let p = path.to_string_lossy();
        self.faults
            .lock()
            .unwrap()
            .iter()
            .find(|f| p.contains(&f.suffix) && f.value.as_deref().is_none_or(|v| v == value))
            .map(|f| f.errno)
    }
}

fn errno(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn dirs_below(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                dirs_below(&e.path(), out);
            }
        }
    }
}

impl KnobIo for FakeKernel {
    fn read(&self, path: &Path) -> io::Result<String> {
        self.calls();
        let p = path.to_string_lossy();
        let mut scripted = self.scripted.lock().unwrap();
        if let Some((_, answers)) = scripted
            .iter_mut()
            .find(|(suffix, answers)| p.ends_with(suffix.as_str()) && !answers.is_empty())
        {
            return Ok(answers.pop_front().unwrap_or_default());
        }
        drop(scripted);
        RealIo.read(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        self.calls();
        if let Some(e) = self.fault(path, value) {
            return Err(errno(e));
        }
        self.writes
            .lock()
            .unwrap()
            .push((path.to_path_buf(), value.to_owned()));
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "cgroup.procs" || name == "tasks" {
            if !path.exists() {
                return Err(errno(Errno::ENOENT));
            }
            let pid = value.trim();
            if let Some(t) = self.template_for(path) {
                let mut all = Vec::new();
                dirs_below(&t.mount, &mut all);
                for d in all {
                    let f = d.join(name);
                    if let Ok(text) = fs::read_to_string(&f) {
                        let kept: Vec<&str> = text.lines().filter(|l| l.trim() != pid).collect();
                        let mut s = kept.join("\n");
                        if !s.is_empty() {
                            s.push('\n');
                        }
                        fs::write(&f, s)?;
                    }
                }
            }
            let mut text = fs::read_to_string(path)?;
            text.push_str(pid);
            text.push('\n');
            return fs::write(path, text);
        }
        RealIo.write(path, value)?;
        if name == "cgroup.freeze" {
            let events = path.with_file_name("cgroup.events");
            fs::write(events, format!("populated 0\nfrozen {}\n", value.trim()))?;
        }
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        self.calls();
        if let Some(e) = self.fault(path, "") {
            return Err(errno(e));
        }
        fs::create_dir(path)?;
        if let Some(t) = self.template_for(path) {
            for (file, content) in &t.files {
                fs::write(path.join(file), content)?;
            }
        }
        Ok(())
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.calls();
        if let Some(e) = self.fault(path, "") {
            return Err(errno(e));
        }
        let mut has_children = false;
        for e in fs::read_dir(path)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                has_children = true;
            }
        }
        let procs = fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
        if has_children || !procs.trim().is_empty() {
            return Err(errno(Errno::EBUSY));
        }
        for e in fs::read_dir(path)? {
            fs::remove_file(e?.path())?;
        }
        fs::remove_dir(path)
    }
}

/// A fake machine below a temp dir.
pub struct Fake {
    pub dir: tempfile::TempDir,
    pub kernel: Arc<FakeKernel>,
}

fn w(path: &Path, content: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

pub const V1_UNLIMITED: &str = "9223372036854771712";

impl Fake {
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn host(&self) -> LinuxHost {
        LinuxHost::with_io(self.root(), self.kernel.clone())
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel.trim_start_matches('/'))
    }

    pub fn write(&self, rel: &str, content: &str) {
        w(&self.path(rel), content);
    }

    pub fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.path(rel)).unwrap()
    }

    fn with_templates(templates: Vec<Template>, mountinfo: &str) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let templates: Vec<Template> = templates
            .into_iter()
            .map(|t| Template {
                mount: dir.path().join(t.mount.strip_prefix("/").unwrap()),
                files: t.files,
            })
            .collect();
        for t in &templates {
            for (file, content) in &t.files {
                w(&t.mount.join(file), content);
            }
        }
        let fake = Fake {
            dir,
            kernel: Arc::new(FakeKernel {
                templates,
                ..Default::default()
            }),
        };
        fake.write("/proc/self/mountinfo", mountinfo);
        fake
    }

    /// This CI machine's layout: v1 cpu, cpuacct, cpuset, memory, blkio, freezer, pids, devices,
    /// net_prio, plus an EMPTY cgroup2 at /sys/fs/cgroup/unified.
    pub fn v1() -> Fake {
        let common = [("cgroup.procs", ""), ("tasks", "")];
        let t = |name: &str, extra: &[(&str, &str)]| Template {
            mount: PathBuf::from(format!("/sys/fs/cgroup/{name}")),
            files: files(&[&common[..], extra].concat()),
        };
        let templates = vec![
            t(
                "cpu",
                &[
                    ("cpu.shares", "1024\n"),
                    ("cpu.idle", "0\n"),
                    ("cpu.cfs_quota_us", "-1\n"),
                    ("cpu.cfs_period_us", "100000\n"),
                    (
                        "cpu.stat",
                        "nr_periods 7\nnr_throttled 3\nthrottled_time 123456\n",
                    ),
                ],
            ),
            t("cpuacct", &[("cpuacct.usage", "987654321\n")]),
            t(
                "cpuset",
                &[
                    ("cpuset.cpus", "\n"),
                    ("cpuset.mems", "\n"),
                    ("cpuset.effective_cpus", "\n"),
                ],
            ),
            t(
                "memory",
                &[
                    ("memory.limit_in_bytes", &format!("{V1_UNLIMITED}\n")),
                    ("memory.soft_limit_in_bytes", &format!("{V1_UNLIMITED}\n")),
                    ("memory.usage_in_bytes", "4096\n"),
                    ("memory.failcnt", "2\n"),
                    (
                        "memory.oom_control",
                        "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
                    ),
                ],
            ),
            t(
                "blkio",
                &[
                    ("blkio.throttle.read_bps_device", ""),
                    ("blkio.throttle.write_bps_device", ""),
                    ("blkio.throttle.read_iops_device", ""),
                    ("blkio.throttle.write_iops_device", ""),
                    ("blkio.weight", "500\n"),
                ],
            ),
            t("freezer", &[("freezer.state", "THAWED\n")]),
            t("pids", &[]),
            t("net_prio", &[("net_prio.ifpriomap", "lo 0\neth0 0\n")]),
            t("net_cls", &[("net_cls.classid", "0\n")]),
        ];
        let mut mountinfo = String::from("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n");
        for (i, name) in [
            "cpu", "cpuacct", "cpuset", "memory", "blkio", "freezer", "pids", "net_prio", "net_cls",
        ]
        .iter()
        .enumerate()
        {
            mountinfo.push_str(&format!(
                "{} 31 0:{} / /sys/fs/cgroup/{name} rw,relatime - cgroup cgroup rw,{name}\n",
                40 + i,
                29 + i
            ));
        }
        mountinfo.push_str(
            "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n",
        );
        mountinfo
            .push_str("41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
        let fake = Fake::with_templates(templates, &mountinfo);
        fake.write("/sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n");
        fake.write("/sys/fs/cgroup/cpuset/cpuset.cpus", "0-3\n");
        fake.write("/sys/fs/cgroup/cpuset/cpuset.mems", "0\n");
        fake
    }

    /// Pure cgroup v2 (systemd style) at /sys/fs/cgroup.
    pub fn v2() -> Fake {
        let files = files(&[
            ("cgroup.controllers", "cpuset cpu io memory pids\n"),
            ("cgroup.subtree_control", "\n"),
            ("cgroup.procs", ""),
            ("cgroup.threads", ""),
            ("cgroup.freeze", "0\n"),
            ("cgroup.events", "populated 0\nfrozen 0\n"),
            ("cpu.weight", "100\n"),
            ("cpu.idle", "0\n"),
            ("cpu.max", "max 100000\n"),
            (
                "cpu.stat",
                "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 9\nnr_throttled 4\nthrottled_usec 77\n",
            ),
            ("cpu.pressure", "some avg10=1.50 avg60=0.50 avg300=0.10 total=12345\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
            ("cpuset.cpus", "\n"),
            ("cpuset.cpus.effective", "0-3\n"),
            ("cpuset.mems", "\n"),
            ("memory.max", "max\n"),
            ("memory.high", "max\n"),
            ("memory.current", "8192\n"),
            ("memory.events", "low 0\nhigh 5\nmax 2\noom 1\noom_kill 1\n"),
            ("io.max", ""),
            ("io.weight", "default 100\n"),
        ]);
        let templates = vec![Template {
            mount: PathBuf::from("/sys/fs/cgroup"),
            files,
        }];
        let mountinfo = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                         31 27 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        Fake::with_templates(templates, mountinfo)
    }
}
