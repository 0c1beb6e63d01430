//! The freezer: freeze, thaw, and kill every process of a group.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{HostError, Result};
use headroom_types::values::GroupPath;

use super::{
    stat_field, walk_dirs, Cgroups, Controller, KnobFile, EVENTS, KILL, KILL_SETTLE, PROCS,
};

pub(super) const FREEZE: KnobFile =
    KnobFile::both(Controller::Freezer, "freezer.state", "cgroup.freeze");

/// How long freeze/thaw waits for the state to settle.
const FREEZE_SETTLE: Duration = Duration::from_secs(2);

/// Freezer state read back from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FreezeState {
    Thawed,
    Freezing,
    Frozen,
}

impl Cgroups {
    /// Freezes the group and waits until the kernel reports it frozen.
    pub fn freeze(&self, group: &GroupPath) -> Result<()> {
        self.set_frozen(group, true)
    }

    /// Starts freezing the group and returns without waiting for FROZEN: BE is confined once
    /// this write has returned. The kernel marks every task for freezing during the write (v1
    /// `freezer.state` FROZEN, v2 `cgroup.freeze` 1) and kicks the running ones; a task then
    /// enters the refrigerator on its way back to user space and never runs user code again,
    /// while a sleeping task is frozen when it wakes. The state reads FREEZING until the last
    /// task is in — that can take a scheduling latency (a woken task waiting for a busy CPU:
    /// milliseconds), so a caller on the fast path verifies FROZEN later ([`Cgroups::freeze_state`])
    /// and writes again if it never gets there. The freeze is kernel state: it goes on if the
    /// caller dies.
    pub fn start_freeze(&self, group: &GroupPath) -> Result<()> {
        let (v2, path) = self.knob(&FREEZE, group)?;
        self.knobs.write(&path, if v2 { "1" } else { "FROZEN" })
    }

    /// Kills every process of `group` and of the groups below it, in every hierarchy: the group
    /// frozen first (where it has a freezer), so no process forks between the read of the
    /// groups and its kill (a BE forking as fast as it is killed could outrun the poll: pass
    /// 25's low); then v2 `cgroup.kill` where the kernel has it (5.14+), else SIGKILL to each
    /// process (forked children too); then thawed, so the signals are delivered, and polled
    /// until the groups are empty or [`KILL_SETTLE`] has passed: [`HostError::Timeout`] then,
    /// naming the group's `cgroup.procs` and the processes left. The group ends frozen or
    /// thawed as it was before. Returns how many processes were found to kill.
    pub fn kill_all(&self, group: &GroupPath) -> Result<usize> {
        self.kill_all_except(group, &BTreeSet::new())
    }

    /// [`Cgroups::kill_all`], sparing the processes in `keep` (never `cgroup.kill` then, which
    /// would take them too): an agent's BE group may hold processes it did not launch.
    pub fn kill_all_except(&self, group: &GroupPath, keep: &BTreeSet<i32>) -> Result<usize> {
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
                    if let Ok(p) = self.read_pids(&sub.join(PROCS)) {
                        out.extend(p.into_iter().filter(|p| !keep.contains(p)));
                    }
                }
            }
            out
        };
        if pids(&dirs).is_empty() {
            return Ok(0);
        }
        // The group is put back as it was once the kill is done: a group that ran thawed must
        // not stay frozen with what `keep` spared (v2 kills a frozen task, so the poll can find
        // the group empty before any thaw), and a frozen one (BE held off) must not stay thawed.
        let was_thawed = self
            .freeze_state(group)
            .ok()
            .map(|st| st == FreezeState::Thawed);
        // (a freeze that does not settle — a task in a long uninterruptible sleep — or a host
        // without a freezer: killed as it runs, as before)
        let _ = self.freeze(group);
        let killed = self.kill_frozen(group, &dirs, keep, pids);
        let _ = match was_thawed {
            Some(true) => self.thaw(group),
            Some(false) => self.freeze(group),
            None => Ok(()),
        };
        killed
    }

    /// [`Cgroups::kill_all_except`]'s kill of a group just frozen: SIGKILL to each process
    /// (`cgroup.kill` where nothing is spared), thawed while any is left, polled until none is.
    fn kill_frozen(
        &self,
        group: &GroupPath,
        dirs: &[PathBuf],
        keep: &BTreeSet<i32>,
        pids: impl Fn(&[PathBuf]) -> BTreeSet<i32>,
    ) -> Result<usize> {
        let found = pids(dirs);
        for &pid in &found {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        if let Some(kill) = dirs
            .iter()
            .map(|d| d.join(KILL))
            .find(|p| keep.is_empty() && p.exists())
        {
            self.knobs.write(&kill, "1")?;
        }
        let start = Instant::now();
        loop {
            let left = pids(dirs);
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
                    path: dirs[0].join(PROCS),
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
        let (v2, path) = self.knob(&FREEZE, group)?;
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
        let (v2, path) = self.knob(&FREEZE, group)?;
        if v2 {
            let wanted = self.knobs.read_u64(&path)? != 0;
            let events_path = path.with_file_name(EVENTS);
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
}
