//! Who is in a group, and moving processes and threads into one: `cgroup.procs`, `tasks`,
//! `cgroup.threads`, and where a process is in each hierarchy.

use std::path::{Path, PathBuf};

use headroom_types::values::GroupPath;

use super::{walk_dirs, Backend, Cgroups, Controller, PROCS, TASKS, THREADS};
use crate::error::{HostError, Result};

impl Cgroups {
    pub(super) fn read_pids(&self, path: &Path) -> Result<Vec<i32>> {
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
        self.refuse_thread_id(pid)?;
        for (_, dir) in self.group_dirs(group) {
            self.knobs.write(&dir.join(PROCS), &pid.to_string())?;
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
        self.refuse_thread_id(pid)?;
        self.knobs.write(&dir.join(PROCS), &pid.to_string())
    }

    /// A number written to `cgroup.procs` that names a thread moves that thread's whole
    /// process: a pid configured, read from a pid file or recorded that now names another
    /// process's thread (pid numbers wrap) moved that process (this VM's PID 1 once: hostile
    /// pass 33). Refused where `/proc/<n>/status` says so; where it cannot be read (gone, or a
    /// fake kernel) the write decides.
    fn refuse_thread_id(&self, n: i32) -> Result<()> {
        let status = Path::new("/proc").join(n.to_string()).join("status");
        let Ok(text) = self.knobs.io.read(&status) else {
            return Ok(());
        };
        let tgid = text
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse::<i32>().ok());
        match tgid {
            Some(process) if process != n => Err(HostError::invalid(
                "pid",
                n.to_string(),
                format!("names a thread of process {process}, not a process: moving it would move all of process {process}"),
            )),
            _ => Ok(()),
        }
    }

    /// Moves one thread into `group` (v1 `tasks` in every hierarchy; v2 `cgroup.threads`, which
    /// only works inside threaded subtrees).
    pub fn move_thread(&self, group: &GroupPath, tid: i32) -> Result<()> {
        for (backend, dir) in self.group_dirs(group) {
            let file = if backend.is_v2() { THREADS } else { TASKS };
            self.knobs.write(&dir.join(file), &tid.to_string())?;
        }
        Ok(())
    }

    /// Every process of `group` and of the groups below it, in every hierarchy: the processes
    /// [`Cgroups::kill_all`] kills. [`Cgroups::procs`] reads one hierarchy, but on cgroup v1 a
    /// process may sit in a group in some hierarchies only (`cgexec -g memory:<group>`); a
    /// set of processes to spare read from one hierarchy missed it, and the kill, which reads
    /// them all, took it (seventh hostile pass).
    pub fn procs_below(&self, group: &GroupPath) -> std::collections::BTreeSet<i32> {
        let mut out = std::collections::BTreeSet::new();
        for (_, dir) in self.group_dirs(group) {
            if !dir.is_dir() {
                continue;
            }
            for sub in walk_dirs(&dir) {
                if let Ok(p) = self.read_pids(&sub.join(PROCS)) {
                    out.extend(p);
                }
            }
        }
        out
    }

    /// The processes in one group directory `dir` (of any hierarchy).
    pub fn procs_in_dir(&self, dir: &Path) -> Result<Vec<i32>> {
        self.read_pids(&dir.join(PROCS))
    }

    /// The processes in `group` (from its first hierarchy).
    pub fn procs(&self, group: &GroupPath) -> Result<Vec<i32>> {
        match self.group_dirs(group).into_iter().next() {
            Some((_, dir)) => self.read_pids(&dir.join(PROCS)),
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
            Some((Backend::V2(_), dir)) => self.read_pids(&dir.join(THREADS)),
            None => Err(HostError::unavailable(
                "cgroups",
                "no usable cgroup hierarchy",
            )),
        }
    }
}
