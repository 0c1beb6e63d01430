//! LC thread treatment (`[lc.threads]`, the allocation's `lc`): pin the LC threads one per CPU
//! (round robin over `pin_cpus`), and give them SCHED_FIFO or an EEVDF slice request — the
//! mainline stand-ins for BVT warp. Threads appear and go; each new thread is treated once, and
//! all are treated again when the treatment changes. The LC is only ever given more.
//!
//! Everything is undone on exit and by the kill switch ([`LcThreads::restore`]): each thread's
//! affinity and scheduling policy as they were before the agent's first change (kept in the
//! state file, so a restarted agent does not mistake its own pinning for the original), and the
//! real-time budgets raised so SCHED_FIFO is allowed in the LC's cgroup-v1 cpu group.

use std::collections::{BTreeMap, BTreeSet};

use headroom_host::sched::{self, SchedPolicy};
use headroom_host::Cgroups;
use headroom_types::{CpuSet, GroupPath};
use serde::{Deserialize, Serialize};

use headroom_types::allocation::LcTreatment;

/// A thread's settings before the agent first changed them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadOriginal {
    /// CPUs it was allowed on.
    pub cpus: CpuSet,
    /// Its scheduling policy (`None`: one the agent cannot set back, e.g. SCHED_DEADLINE —
    /// such threads are never given a new policy).
    pub policy: Option<SchedPolicy>,
    /// Its start time (clock ticks after boot, `/proc/<tid>/stat`): a thread id is a number
    /// the kernel hands out again once the thread has exited, and the settings are put back
    /// only on the thread they were taken from (hostile pass 36: `restore` set a later,
    /// unrelated process's affinity and took its SCHED_FIFO away). `None` in a state file
    /// written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<u64>,
}

/// The start time of thread `tid` (`None` when it is gone). The sched calls act on this host's
/// threads, so its `/proc` is read.
fn thread_started(tid: i32) -> Option<u64> {
    let tid = u32::try_from(tid).ok()?;
    headroom_host::pids::start_time(std::path::Path::new("/"), tid)
}

/// What [`LcThreads`] changed, for the state file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LcThreadsState {
    /// Thread id → settings before the agent's first change.
    pub originals: BTreeMap<i32, ThreadOriginal>,
    /// cgroup-v1 `cpu.rt_runtime_us` the agent raised: (group, original), ancestors first.
    pub rt_budgets: Vec<(GroupPath, i64)>,
}

/// Applies an [`LcTreatment`] to the threads of the LC group.
#[derive(Debug, Default)]
pub struct LcThreads {
    /// Per LC group (one per `[[lc]]` service): the threads treated and the treatment given.
    groups: BTreeMap<GroupPath, (BTreeSet<i32>, Option<LcTreatment>)>,
    state: LcThreadsState,
    /// Errors so far (a thread may exit between listing and treating it).
    pub errors: u64,
}

impl LcThreads {
    /// Starts from what an earlier agent recorded (its originals stay the originals).
    pub fn from_state(state: LcThreadsState) -> LcThreads {
        LcThreads {
            state,
            ..LcThreads::default()
        }
    }

    /// What to keep in the state file.
    pub fn state(&self) -> &LcThreadsState {
        &self.state
    }

    /// Treats the LC group's threads not treated yet; returns how many were treated now.
    pub fn apply(&mut self, cgroups: &Cgroups, lc: &GroupPath, treatment: &LcTreatment) -> usize {
        // Each LC service's group keeps its own treated threads and treatment.
        let (mut treated, mut last) = self.groups.remove(lc).unwrap_or_default();
        let done = self.apply_to(cgroups, lc, treatment, &mut treated, &mut last);
        self.groups.insert(lc.clone(), (treated, last));
        done
    }

    fn apply_to(
        &mut self,
        cgroups: &Cgroups,
        lc: &GroupPath,
        treatment: &LcTreatment,
        treated: &mut BTreeSet<i32>,
        last: &mut Option<LcTreatment>,
    ) -> usize {
        let wants_something = treatment.pin_cpus.as_ref().is_some_and(|c| !c.is_empty())
            || treatment.fifo_priority.is_some()
            || treatment.slice_us.is_some();
        if last.as_ref() != Some(treatment) {
            treated.clear();
            *last = Some(treatment.clone());
        }
        if !wants_something {
            return 0;
        }
        if treatment.fifo_priority.is_some() {
            if let Err(e) = self.ensure_rt_budget(cgroups, lc) {
                self.error(0, "giving the LC group a real-time budget for", &e);
            }
        }
        let tids = match cgroups.threads(lc) {
            Ok(t) => t,
            Err(e) => {
                self.error(0, "listing the threads of the LC group for", &e);
                return 0;
            }
        };
        treated.retain(|t| tids.contains(t));
        let mut done = 0;
        for (i, &tid) in tids.iter().enumerate() {
            if treated.contains(&tid) {
                continue;
            }
            let started = thread_started(tid);
            // An original taken from an earlier thread with this number (it exited, and the
            // number was reused) is not this thread's.
            let known = self
                .state
                .originals
                .get(&tid)
                .is_some_and(|o| o.started.is_none() || o.started == started);
            if !known {
                let cpus = match sched::affinity(tid) {
                    Ok(set) => set,
                    Err(e) => {
                        self.error(tid, "reading the affinity of", &e);
                        continue;
                    }
                };
                let policy = sched::sched(tid).ok().and_then(|a| a.policy());
                self.state.originals.insert(
                    tid,
                    ThreadOriginal {
                        cpus,
                        policy,
                        started,
                    },
                );
            }
            if let Some(cpus) = treatment.pin_cpus.as_ref().filter(|c| !c.is_empty()) {
                let cpu = cpus.iter().nth(i % cpus.len()).unwrap_or_default();
                let set = CpuSet::from([cpu]);
                if let Err(e) = sched::set_affinity(tid, &set) {
                    self.error(tid, "pinning", &e);
                    continue;
                }
            }
            let settable = self
                .state
                .originals
                .get(&tid)
                .is_some_and(|o| o.policy.is_some());
            let policy = match (treatment.fifo_priority, treatment.slice_us) {
                (Some(p), _) => Some(SchedPolicy::Fifo {
                    priority: u32::from(p),
                }),
                (None, Some(us)) => Some(SchedPolicy::Other {
                    nice: sched::sched(tid).map_or(0, |a| a.nice),
                    slice_ns: Some(us * 1000),
                }),
                (None, None) => None,
            };
            if let (Some(policy), true) = (policy, settable) {
                if let Err(e) = sched::set_sched(tid, policy) {
                    self.error(tid, "setting the scheduling policy of", &e);
                    continue;
                }
            }
            tracing::info!(tid, ?treatment, "LC thread treated");
            treated.insert(tid);
            done += 1;
        }
        done
    }

    /// On a cgroup-v1 host with RT group scheduling, a group whose `cpu.rt_runtime_us` is 0
    /// refuses SCHED_FIFO tasks (EINVAL): give the LC group and each ancestor at 0 the budget
    /// its parent can spare (the parent's budget minus what its other children hold), top down.
    pub fn ensure_rt_budget(
        &mut self,
        cgroups: &Cgroups,
        lc: &GroupPath,
    ) -> Result<(), headroom_host::HostError> {
        let mut chain = vec![lc.clone()];
        while let Some(p) = chain.last().and_then(GroupPath::parent) {
            if p.is_root() {
                break;
            }
            chain.push(p);
        }
        chain.reverse();
        for group in chain {
            let Some(current) = cgroups.rt_runtime_us(&group)? else {
                return Ok(()); // no per-group RT budget on this host: nothing to do
            };
            if current != 0 {
                continue;
            }
            let parent = group.parent().unwrap_or_else(GroupPath::root);
            let Some(parent_budget) = cgroups.rt_runtime_us(&parent)? else {
                return Ok(());
            };
            let mut siblings = 0i64;
            for child in cgroups.children(&parent)? {
                if child != group {
                    siblings += cgroups.rt_runtime_us(&child)?.unwrap_or(0).max(0);
                }
            }
            let spare = if parent_budget < 0 {
                // -1: unlimited parent (root with RT throttling off)
                950_000
            } else {
                parent_budget - siblings
            };
            if spare <= 0 {
                return Err(headroom_host::HostError::invalid(
                    "cpu.rt_runtime_us",
                    format!("{parent_budget} in {parent} minus {siblings} held by siblings"),
                    format!("no real-time budget left for {group}"),
                ));
            }
            let spare = set_rt_budget_retrying(cgroups, &group, spare)?;
            tracing::info!(group = %group, runtime_us = spare, "real-time budget given to the LC group chain");
            self.state.rt_budgets.push((group.clone(), current));
        }
        Ok(())
    }

    /// Puts every treated thread's affinity and policy back, then the real-time budgets
    /// (children first). Threads that have exited are skipped, and so is a thread id now
    /// naming a thread that started later (the number reused). Returns the threads restored.
    pub fn restore(&mut self, cgroups: Option<&Cgroups>) -> usize {
        let mut restored = 0;
        for (&tid, original) in &self.state.originals {
            if original.started.is_some() && thread_started(tid) != original.started {
                continue;
            }
            let mut ok = true;
            if let Some(policy) = original.policy {
                ok &= sched::set_sched(tid, policy).is_ok();
            }
            if !original.cpus.is_empty() {
                ok &= sched::set_affinity(tid, &original.cpus).is_ok();
            }
            if ok {
                restored += 1;
            }
        }
        self.state.originals.clear();
        if let Some(cg) = cgroups {
            for (group, original) in self.state.rt_budgets.drain(..).rev() {
                let restored = cg.set_rt_runtime_us(&group, original);
                if let Err(e) = restored {
                    tracing::warn!(group = %group, original, error = %e, "restoring cpu.rt_runtime_us failed");
                }
            }
        }
        self.groups.clear();
        restored
    }

    fn error(&mut self, tid: i32, what: &str, e: &dyn std::fmt::Display) {
        self.errors += 1;
        if self.errors.is_power_of_two() {
            tracing::warn!(tid, error = %e, "{what} an LC thread failed");
        }
    }
}

/// Writes `spare` to the group's `cpu.rt_runtime_us`, retried: the kernel counts the budget of a
/// group being removed (a previous agent's, just rmdir'd) until it is freed, so a budget that
/// adds up on paper can be refused (EINVAL) for a moment. Tries the same value for ~0.5 s, then
/// halves it (some budget lets the LC's FIFO threads in; none refuses them) down to 1/16.
fn set_rt_budget_retrying(
    cgroups: &Cgroups,
    group: &GroupPath,
    spare: i64,
) -> Result<i64, headroom_host::HostError> {
    let mut value = spare;
    let mut tries = 0;
    loop {
        match cgroups.set_rt_runtime_us(group, value) {
            Ok(()) => return Ok(value),
            Err(e) if value > spare / 16 => {
                tries += 1;
                if tries >= 5 {
                    value /= 2;
                }
                tracing::debug!(group = %group, runtime_us = value, error = %e, "cpu.rt_runtime_us refused; retrying");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}
