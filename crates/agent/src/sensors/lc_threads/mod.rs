//! LC thread treatment (`[lc.threads]`, the allocation's `lc`): pin the LC threads one per CPU
//! (round robin over `pin_cpus`), and give them SCHED_FIFO or an EEVDF slice request — the
//! mainline stand-ins for BVT warp. Threads appear and go; each new thread is treated once, and
//! all are treated again when the treatment changes. The LC is only ever given more.
//!
//! Everything is undone on exit and by the kill switch ([`LcThreads::restore`]): each thread's
//! affinity and scheduling policy as they were before the agent's first change (kept in the
//! state file, so a restarted agent does not mistake its own pinning for the original), and the
//! real-time budgets raised so SCHED_FIFO is allowed in the LC's cgroup-v1 cpu group. A thread
//! or process an LC thread creates starts with its creator's settings, the agent's pin
//! included: its original is its creator's.

use std::collections::{BTreeMap, BTreeSet};

use headroom_host::sched::{self, SchedPolicy};
use headroom_host::Cgroups;
use headroom_types::{CpuSet, GroupPath};
use serde::{Deserialize, Serialize};

use headroom_types::allocation::LcTreatment;

mod rt_budget;

/// How often the start times of the treated threads are read again (a number the kernel
/// handed out again, to a restarted LC, names a thread not treated yet), and how many at most
/// each time: reading every thread's `/proc/<tid>/stat` at each pass (every 100 ms) cost a
/// 1000-thread LC ~7% of a core.
const VERIFY_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);
const VERIFY_MAX: usize = 256;

/// One LC group's threads as treated so far.
#[derive(Debug, Default)]
struct GroupThreads {
    /// Thread id → its start time, for the threads treated with `last`.
    treated: BTreeMap<i32, Option<u64>>,
    last: Option<LcTreatment>,
    /// When start times were last read again, and the thread id to go on from.
    verified: Option<std::time::Instant>,
    verify_from: i32,
}

impl GroupThreads {
    /// The treated threads whose start time is read again now (up to [`VERIFY_MAX`] once per
    /// [`VERIFY_PERIOD`], in turn).
    fn due_for_verifying(&mut self) -> BTreeSet<i32> {
        if self.verified.is_some_and(|t| t.elapsed() < VERIFY_PERIOD) {
            return BTreeSet::new();
        }
        self.verified = Some(std::time::Instant::now());
        let from = self.verify_from;
        let due: Vec<i32> = (self.treated.range(from..).map(|(&t, _)| t))
            .chain(self.treated.range(..from).map(|(&t, _)| t))
            .take(VERIFY_MAX)
            .collect();
        self.verify_from = due.last().map_or(0, |t| t.saturating_add(1));
        due.into_iter().collect()
    }
}

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
    /// The process the thread belongs to (its thread group id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<u32>,
    /// What the agent set on it last: a thread created by this one starts with these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given: Option<Given>,
}

/// What the agent set on a thread.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Given {
    /// The CPUs it was pinned to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<CpuSet>,
    /// The scheduling policy it was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<SchedPolicy>,
}

/// How many forks up [`LcThreads::uninherited`] looks for the thread that passed its settings on.
const LINEAGE_MAX: usize = 8;

/// The start time of thread `tid` (`None` when it is gone). The sched calls act on this host's
/// threads, so its `/proc` is read.
fn thread_started(tid: i32) -> Option<u64> {
    let tid = u32::try_from(tid).ok()?;
    headroom_host::pids::start_time(std::path::Path::new("/"), tid)
}

/// The process thread `tid` belongs to (`None` when it is gone).
fn process_of(tid: i32) -> Option<u32> {
    headroom_host::pids::thread_group(std::path::Path::new("/"), u32::try_from(tid).ok()?)
}

/// `process` and the processes it was forked from, nearest first (up to [`LINEAGE_MAX`]).
fn lineage(process: Option<u32>) -> Vec<u32> {
    let mut out: Vec<u32> = process.into_iter().collect();
    while let Some(&p) = out.last() {
        match headroom_host::pids::parent(std::path::Path::new("/"), p) {
            Some(parent) if parent > 1 && out.len() < LINEAGE_MAX => out.push(parent),
            _ => break,
        }
    }
    out
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
    /// Per LC group (one per `[[lc]]` service): the threads treated (id → start time: a
    /// number handed out again, to a restarted LC, names a thread not treated yet) and the
    /// treatment given.
    groups: BTreeMap<GroupPath, GroupThreads>,
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

    /// Treats the LC group's threads not treated yet; returns how many records changed (threads
    /// treated now, records of exited threads dropped).
    pub fn apply(&mut self, cgroups: &Cgroups, lc: &GroupPath, treatment: &LcTreatment) -> usize {
        // Each LC service's group keeps its own treated threads and treatment. Its first pass
        // (also a restarted agent's, with an earlier agent's records) looks at every record.
        let (mut group, mut forgotten) = match self.groups.remove(lc) {
            Some(group) => (group, 0),
            None => (GroupThreads::default(), self.forget_gone(None)),
        };
        let (done, left) = self.apply_to(cgroups, lc, treatment, &mut group);
        self.groups.insert(lc.clone(), group);
        forgotten += self.forget_gone(Some(&left));
        done + forgotten
    }

    /// Drops the records of threads that have exited (among `candidates`; `None`: all), so
    /// that an LC starting a thread per connection does not grow them (and the state file)
    /// without end; returns how many. A record stays while its process runs and no other
    /// record of it holds the same settings: a thread its thread created may have inherited
    /// what the agent gave it.
    fn forget_gone(&mut self, candidates: Option<&BTreeSet<i32>>) -> usize {
        let originals = &self.state.originals;
        let gone: BTreeSet<i32> = originals
            .iter()
            .filter(|(tid, _)| candidates.is_none_or(|c| c.contains(tid)))
            .filter(|(&tid, o)| o.started.is_some() && thread_started(tid) != o.started)
            .map(|(&tid, _)| tid)
            .collect();
        if gone.is_empty() {
            return 0;
        }
        let mut kept: Vec<&ThreadOriginal> = originals
            .iter()
            .filter(|(tid, _)| !gone.contains(tid))
            .map(|(_, o)| o)
            .collect();
        let mut forget = Vec::new();
        for (&tid, o) in originals.iter().filter(|(tid, _)| gone.contains(tid)) {
            let same = kept.iter().any(|k| {
                k.process == o.process
                    && k.cpus == o.cpus
                    && k.policy == o.policy
                    && k.given == o.given
            });
            if same || !o.process.is_some_and(|p| self.process_runs(p)) {
                forget.push(tid);
            } else {
                kept.push(o);
            }
        }
        for tid in &forget {
            self.state.originals.remove(tid);
        }
        forget.len()
    }

    /// Whether `process` runs, and is the one the records of its number were taken from.
    fn process_runs(&self, process: u32) -> bool {
        !headroom_host::pids::is_gone(std::path::Path::new("/"), process)
            && !self.records_of(process).is_empty()
    }

    /// Treats the group's new threads; returns how many, and the treated threads that left
    /// the group (exited, or moved out).
    fn apply_to(
        &mut self,
        cgroups: &Cgroups,
        lc: &GroupPath,
        treatment: &LcTreatment,
        group: &mut GroupThreads,
    ) -> (usize, BTreeSet<i32>) {
        let wants_something = treatment.pin_cpus.as_ref().is_some_and(|c| !c.is_empty())
            || treatment.fifo_priority.is_some()
            || treatment.slice_us.is_some();
        if group.last.as_ref() != Some(treatment) {
            group.treated.clear();
            group.last = Some(treatment.clone());
        }
        if !wants_something {
            return (0, BTreeSet::new());
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
                return (0, BTreeSet::new());
            }
        };
        let listed: BTreeSet<i32> = tids.iter().copied().collect();
        let left: BTreeSet<i32> = (group.treated.keys())
            .filter(|t| !listed.contains(t))
            .copied()
            .collect();
        group.treated.retain(|t, _| listed.contains(t));
        let verify = group.due_for_verifying();
        let treated = &mut group.treated;
        let todo: Vec<(usize, i32, Option<u64>)> = tids
            .iter()
            .enumerate()
            .map(|(i, &tid)| {
                let started = match treated.get(&tid) {
                    Some(&known) if !verify.contains(&tid) => known,
                    _ => thread_started(tid),
                };
                (i, tid, started)
            })
            .filter(|(_, tid, started)| treated.get(tid) != Some(started))
            .collect();
        // Every original of this listing is read before anything is given in it: these threads
        // all existed before this pass's changes, so none inherited them (hostile pass 39: a
        // thread the LC had pinned itself onto the CPU given to its main thread just before was
        // taken as inheriting it, and `restore` overrode the LC's own pin).
        for &(_, tid, started) in &todo {
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
                let process = process_of(tid);
                let (cpus, policy) = self.uninherited(process, cpus, policy);
                self.state.originals.insert(
                    tid,
                    ThreadOriginal {
                        cpus,
                        policy,
                        started,
                        process,
                        given: None,
                    },
                );
            }
        }
        let mut done = 0;
        for (i, tid, started) in todo {
            let known = self
                .state
                .originals
                .get(&tid)
                .is_some_and(|o| o.started.is_none() || o.started == started);
            if !known {
                continue; // its settings could not be read: nothing is changed on it
            }
            if let Some(cpus) = treatment.pin_cpus.as_ref().filter(|c| !c.is_empty()) {
                let cpu = cpus.iter().nth(i % cpus.len()).unwrap_or_default();
                let set = CpuSet::from([cpu]);
                if let Err(e) = sched::set_affinity(tid, &set) {
                    self.error(tid, "pinning", &e);
                    continue;
                }
                if let Some(given) = self.given(tid) {
                    given.cpus = Some(set);
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
                if let Some(given) = self.given(tid) {
                    given.policy = Some(policy);
                }
            }
            tracing::info!(tid, ?treatment, "LC thread treated");
            treated.insert(tid, started);
            done += 1;
        }
        (done, left)
    }

    /// What the agent gave thread `tid` (`None` when it has no original recorded: then the
    /// agent changes nothing on it).
    fn given(&mut self, tid: i32) -> Option<&mut Given> {
        let original = self.state.originals.get_mut(&tid)?;
        Some(original.given.get_or_insert_with(Given::default))
    }

    /// The recorded threads of `process` (the leader first), when the record is of this
    /// process and not of an earlier one with its number (its leader's start time).
    fn records_of(&self, process: u32) -> Vec<&ThreadOriginal> {
        let leader = i32::try_from(process).ok();
        if let Some(o) = leader.and_then(|l| self.state.originals.get(&l)) {
            if o.started.is_some() && leader.and_then(thread_started) != o.started {
                return Vec::new();
            }
        }
        let mut records: Vec<(bool, &ThreadOriginal)> = self
            .state
            .originals
            .iter()
            .filter(|(_, o)| o.process == Some(process))
            .map(|(&tid, o)| (Some(tid) != leader, o))
            .collect();
        records.sort_by_key(|(not_leader, _)| *not_leader);
        records.into_iter().map(|(_, o)| o).collect()
    }

    /// A thread's settings before the agent's first change, from what it holds when the agent
    /// first reaches it: where they equal what the agent gave a thread of its own process, or
    /// of a process it was forked from, the thread inherited them when it was created (the
    /// kernel copies the creator's affinity and policy), and that thread's original is its
    /// original too. Hostile pass 37: a thread the LC started after its main thread was pinned
    /// kept the pin after `ctl off` and `restore`.
    fn uninherited(
        &self,
        process: Option<u32>,
        cpus: CpuSet,
        policy: Option<SchedPolicy>,
    ) -> (CpuSet, Option<SchedPolicy>) {
        let mut cpus_from = None;
        let mut policy_from = None;
        for p in lineage(process) {
            for o in self.records_of(p) {
                let Some(given) = &o.given else { continue };
                if cpus_from.is_none() && given.cpus.as_ref() == Some(&cpus) {
                    cpus_from = Some(o.cpus.clone());
                }
                if policy_from.is_none() && given.policy.is_some() && given.policy == policy {
                    policy_from = Some(o.policy);
                }
            }
            if cpus_from.is_some() && policy_from.is_some() {
                break;
            }
        }
        (cpus_from.unwrap_or(cpus), policy_from.unwrap_or(policy))
    }

    /// The threads of the recorded processes, and of the processes they forked, that the agent
    /// never reached (created since its last pass, or never in the LC group) but that inherited
    /// what it gave their creator: each with the settings to put back.
    fn inherited_unrecorded(&self) -> Vec<(i32, ThreadOriginal)> {
        let root = std::path::Path::new("/");
        let processes: BTreeSet<u32> = self
            .state
            .originals
            .values()
            .filter_map(|o| o.process)
            .filter(|&p| !self.records_of(p).is_empty())
            .flat_map(|p| headroom_host::pids::descendants(root, p))
            .collect();
        let mut out = Vec::new();
        for process in processes {
            let Ok(tids) = sched::threads(root, process as i32) else {
                continue;
            };
            for tid in tids {
                let started = thread_started(tid);
                let recorded = self
                    .state
                    .originals
                    .get(&tid)
                    .is_some_and(|o| o.started.is_none() || o.started == started);
                if recorded {
                    continue;
                }
                let Ok(cpus) = sched::affinity(tid) else {
                    continue;
                };
                let policy = sched::sched(tid).ok().and_then(|a| a.policy());
                let (was_cpus, was_policy) = self.uninherited(Some(process), cpus.clone(), policy);
                if was_cpus != cpus || was_policy != policy {
                    let original = ThreadOriginal {
                        cpus: if was_cpus != cpus {
                            was_cpus
                        } else {
                            CpuSet::default()
                        },
                        policy: if was_policy != policy {
                            was_policy
                        } else {
                            None
                        },
                        started,
                        process: Some(process),
                        given: None,
                    };
                    out.push((tid, original));
                }
            }
        }
        out
    }

    /// Puts every treated thread's affinity and policy back, and those of the threads that
    /// inherited them from a treated thread, then the real-time budgets (children first).
    /// Threads that have exited are skipped, and so is a thread id now naming a thread that
    /// started later (the number reused). Returns the threads restored.
    pub fn restore(&mut self, cgroups: Option<&Cgroups>) -> usize {
        let recorded: Vec<_> = self
            .state
            .originals
            .iter()
            .map(|(&t, o)| (t, o.clone()))
            .collect();
        let mut restored = put_back(recorded);
        // The inheriting threads are looked for once their creators are back: a thread created
        // while this runs, by a creator not yet put back, inherits the pin (hostile pass 39: one
        // listed before the creators were put back kept SCHED_FIFO on the pinned CPU).
        for _ in 0..RESTORE_ROUNDS {
            let inherited = self.inherited_unrecorded();
            if inherited.is_empty() {
                break;
            }
            restored += put_back(inherited);
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

/// How many times [`LcThreads::restore`] looks again for threads that inherited the agent's
/// settings (each look puts back the creators of the next).
const RESTORE_ROUNDS: usize = 4;

/// Puts back each thread's settings (skipping a number now naming a later thread); returns how
/// many threads were put back.
fn put_back(threads: Vec<(i32, ThreadOriginal)>) -> usize {
    let mut restored = 0;
    for (tid, original) in threads {
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
    restored
}
