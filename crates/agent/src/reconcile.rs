//! The reconciler: turns a desired [`Allocation`] into cgroup writes through the host layer.
//!
//! It writes only what differs from the groups' current values — what it last applied, and, on
//! a verifying pass, what it reads back (so drift made by others is found and repaired). Writes
//! go in a safe order: everything that takes from BE first (freeze, narrower cpuset, lower
//! quota/weight), then what the LC gains, then what BE gains, thawing last. A write that keeps
//! failing after [`WRITE_ATTEMPTS`] tries aborts the change and the writes already made are
//! undone in reverse order, so a group is never left half-way between two allocations.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use headroom_host::{Cgroups, Controller, CpuQuota, CpuSet, FreezeState, GroupPath, HostError};
use serde::{Deserialize, Serialize};

use crate::allocation::{Allocation, CpuWeight};

/// How often a failing write is tried before the change is rolled back.
pub const WRITE_ATTEMPTS: u32 = 3;
/// Pause between attempts (a busy cgroup, e.g. EBUSY during a migration, settles quickly).
const RETRY_PAUSE: Duration = Duration::from_micros(500);

/// One knob of one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    CpusetCpus,
    CpuWeight,
    CpuIdle,
    CpuQuota,
    Frozen,
    MemoryMax,
}

impl Knob {
    pub const ALL: &'static [Knob] = &[
        Knob::CpusetCpus,
        Knob::CpuWeight,
        Knob::CpuIdle,
        Knob::CpuQuota,
        Knob::Frozen,
        Knob::MemoryMax,
    ];

    fn controller(self) -> Controller {
        match self {
            Knob::CpusetCpus => Controller::Cpuset,
            Knob::CpuWeight | Knob::CpuIdle | Knob::CpuQuota => Controller::Cpu,
            Knob::Frozen => Controller::Freezer,
            Knob::MemoryMax => Controller::Memory,
        }
    }
}

/// A knob's value, in the kernel's native terms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KnobValue {
    /// A cpulist ("0-3,6").
    Cpus(String),
    /// Native weight (v1 shares, v2 cpu.weight).
    Weight(u64),
    Idle(bool),
    Quota(CpuQuota),
    Frozen(bool),
    /// Bytes; `None` = unlimited.
    MemoryMax(Option<u64>),
}

impl fmt::Display for KnobValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KnobValue::Cpus(c) => write!(f, "cpus {c}"),
            KnobValue::Weight(w) => write!(f, "weight {w}"),
            KnobValue::Idle(i) => write!(f, "idle {}", u8::from(*i)),
            KnobValue::Quota(q) => match q.quota_us {
                Some(us) => write!(f, "quota {us}/{}", q.period_us),
                None => write!(f, "quota max/{}", q.period_us),
            },
            KnobValue::Frozen(z) => f.write_str(if *z { "frozen" } else { "thawed" }),
            KnobValue::MemoryMax(Some(b)) => write!(f, "memory.max {b}"),
            KnobValue::MemoryMax(None) => f.write_str("memory.max unlimited"),
        }
    }
}

/// The values one group had before the agent touched it (restored by `ctl off`, `on_exit =
/// "restore"`, and for every allocation field that is `None`). A knob the host lacks is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSettings {
    pub values: BTreeMap<Knob, KnobValue>,
}

/// What the agent manages: the LC group and the BE groups (paths already validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedGroups {
    pub lc: GroupPath,
    pub be: Vec<GroupPath>,
}

/// A write that was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Write {
    pub group: String,
    pub knob: Knob,
    pub from: Option<KnobValue>,
    pub to: KnobValue,
}

/// The outcome of one successful reconciliation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    /// Writes in the order they were made.
    pub writes: Vec<Write>,
    /// Knobs found changed by someone else (and rewritten).
    pub drift: Vec<Write>,
    /// Write attempts that failed but succeeded on a retry.
    pub retries: u32,
}

/// A reconciliation that failed; the groups were rolled back.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("{0}")]
    Write(Box<WriteFailure>),
    #[error("reading {knob:?} of {group}: {source}")]
    Read {
        group: String,
        knob: Knob,
        #[source]
        source: Box<HostError>,
    },
}

/// A write that kept failing, and what happened to the writes made before it.
#[derive(Debug, thiserror::Error)]
#[error(
    "setting {knob:?} of {group} to {value} failed after {attempts} attempts: {source}; {rollback}"
)]
pub struct WriteFailure {
    pub group: String,
    pub knob: Knob,
    pub value: KnobValue,
    pub attempts: u32,
    #[source]
    pub source: HostError,
    pub rollback: RollbackOutcome,
}

/// How a rollback went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollbackOutcome {
    /// Nothing had been written yet.
    NothingToUndo,
    /// Every earlier write was undone.
    RolledBack(usize),
    /// Some undo writes failed too (named).
    Incomplete(Vec<String>),
}

impl fmt::Display for RollbackOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RollbackOutcome::NothingToUndo => f.write_str("nothing had been written"),
            RollbackOutcome::RolledBack(n) => write!(f, "rolled back {n} earlier write(s)"),
            RollbackOutcome::Incomplete(e) => write!(f, "rollback INCOMPLETE: {}", e.join("; ")),
        }
    }
}

type Key = (GroupPath, Knob);

/// Applies allocations to the managed groups.
#[derive(Debug)]
pub struct Reconciler {
    cgroups: Cgroups,
    groups: ManagedGroups,
    original: BTreeMap<GroupPath, GroupSettings>,
    /// What the reconciler believes is in the kernel (last applied or read back).
    current: BTreeMap<Key, KnobValue>,
    v2: bool,
}

impl Reconciler {
    /// Reads the groups' current values as their originals (a first start).
    pub fn attach(cgroups: Cgroups, groups: ManagedGroups) -> Result<Reconciler, ReconcileError> {
        let mut original = BTreeMap::new();
        let mut all = vec![groups.lc.clone()];
        all.extend(groups.be.iter().cloned());
        for g in &all {
            original.insert(g.clone(), read_settings(&cgroups, g)?);
        }
        Ok(Reconciler::with_original(cgroups, groups, original))
    }

    /// Uses originals captured earlier (a restart that found its state file).
    pub fn with_original(
        cgroups: Cgroups,
        groups: ManagedGroups,
        original: BTreeMap<GroupPath, GroupSettings>,
    ) -> Reconciler {
        let v2 = cgroups.backend(Controller::Cpu).is_ok_and(|b| b.is_v2());
        Reconciler {
            cgroups,
            groups,
            original,
            current: BTreeMap::new(),
            v2,
        }
    }

    pub fn groups(&self) -> &ManagedGroups {
        &self.groups
    }

    /// The settings captured before the agent's first write.
    pub fn original(&self) -> &BTreeMap<GroupPath, GroupSettings> {
        &self.original
    }

    /// The native target values of `allocation` (fields that are `None` → original values).
    pub fn target(&self, allocation: &Allocation) -> BTreeMap<Key, KnobValue> {
        let mut out = BTreeMap::new();
        for g in &self.groups.be {
            let Some(orig) = self.original.get(g) else {
                continue;
            };
            for (&knob, orig_value) in &orig.values {
                let value = match knob {
                    Knob::CpusetCpus => allocation.be_cpus.as_ref().map_or_else(
                        || orig_value.clone(),
                        |cpus| KnobValue::Cpus(crate::allocation::format_cpulist(cpus)),
                    ),
                    Knob::CpuWeight => allocation
                        .be_cpu_weight
                        .map_or_else(|| orig_value.clone(), |w| self.native_weight(w)),
                    Knob::CpuIdle => allocation
                        .be_cpu_idle
                        .map_or_else(|| orig_value.clone(), KnobValue::Idle),
                    Knob::CpuQuota => match allocation.be_quota_pct {
                        Some(pct) => {
                            let period = allocation
                                .be_quota_period_us
                                .unwrap_or(CpuQuota::DEFAULT_PERIOD_US);
                            let quota = (pct / 100.0 * period as f64).round().max(1000.0) as u64;
                            KnobValue::Quota(CpuQuota {
                                quota_us: Some(quota),
                                period_us: period,
                            })
                        }
                        None => orig_value.clone(),
                    },
                    Knob::Frozen => {
                        if allocation.be_enabled {
                            orig_value.clone()
                        } else {
                            KnobValue::Frozen(true)
                        }
                    }
                    Knob::MemoryMax => allocation
                        .be_memory_limit_bytes
                        .map_or_else(|| orig_value.clone(), |b| KnobValue::MemoryMax(Some(b))),
                };
                out.insert((g.clone(), knob), value);
            }
            // An idle group's weight is the kernel's: it holds it at the minimum (v1 cpu.shares
            // reads 3) and refuses writes (EINVAL), and clearing idle resets it to the default.
            // So the weight is managed only while the group is not idle.
            if out.get(&(g.clone(), Knob::CpuIdle)) == Some(&KnobValue::Idle(true)) {
                out.remove(&(g.clone(), Knob::CpuWeight));
            }
        }
        // The LC only ever gains: its weight, when the policy raises it.
        if let Some(orig) = self.original.get(&self.groups.lc) {
            if let Some(v) = orig.values.get(&Knob::CpuWeight) {
                let value = allocation
                    .lc
                    .cpu_weight
                    .map_or_else(|| v.clone(), |w| self.native_weight(w));
                out.insert((self.groups.lc.clone(), Knob::CpuWeight), value);
            }
        }
        out
    }

    /// The original values of every managed knob (the kill switch's target).
    pub fn original_target(&self) -> BTreeMap<Key, KnobValue> {
        let mut out = BTreeMap::new();
        for (g, s) in &self.original {
            if *g != self.groups.lc && !self.groups.be.contains(g) {
                continue;
            }
            for (k, v) in &s.values {
                if *g == self.groups.lc && *k != Knob::CpuWeight {
                    continue;
                }
                out.insert((g.clone(), *k), v.clone());
            }
        }
        out
    }

    fn native_weight(&self, w: CpuWeight) -> KnobValue {
        KnobValue::Weight(if self.v2 { w.weight } else { w.shares })
    }

    /// Brings the groups to `allocation`. With `verify`, every knob is read back first and
    /// drift is repaired; without, only differences from the last applied values are written.
    pub fn apply(
        &mut self,
        allocation: &Allocation,
        verify: bool,
    ) -> Result<ApplyReport, ReconcileError> {
        let target = self.target(allocation);
        self.apply_target(&target, verify)
    }

    /// Restores every managed knob to its original value.
    pub fn restore_original(&mut self) -> Result<ApplyReport, ReconcileError> {
        let target = self.original_target();
        self.apply_target(&target, true)
    }

    /// Like [`Reconciler::apply`] for an explicit set of knob values.
    pub fn apply_target(
        &mut self,
        target: &BTreeMap<Key, KnobValue>,
        verify: bool,
    ) -> Result<ApplyReport, ReconcileError> {
        let mut report = ApplyReport::default();
        let mut before: BTreeMap<Key, KnobValue> = BTreeMap::new();
        for key in target.keys() {
            let believed = self.current.get(key).cloned();
            let actual = match (&believed, verify) {
                (Some(v), false) => v.clone(),
                _ => read_knob(&self.cgroups, &key.0, key.1)?,
            };
            if let Some(b) = &believed {
                if *b != actual {
                    tracing::warn!(group = %key.0, knob = ?key.1, expected = %b, found = %actual,
                        "drift: changed by someone else; repairing");
                    report.drift.push(Write {
                        group: key.0.to_string(),
                        knob: key.1,
                        from: Some(b.clone()),
                        to: actual.clone(),
                    });
                }
            }
            before.insert(key.clone(), actual);
        }
        let mut changes: Vec<(Key, KnobValue, KnobValue)> = target
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), before[k].clone(), v.clone()))
            .collect();
        changes.sort_by_key(|(k, from, to)| {
            let (phase, knob) = self.order(k, from, to);
            // The kernel refuses a CPU weight write on an idle group (v1 cpu.shares: EINVAL),
            // so idle is cleared before any weight write and set after all of them.
            match to {
                KnobValue::Idle(false) => (1, 0, knob),
                KnobValue::Idle(true) => (3, 2, knob),
                _ => (phase, 1, knob),
            }
        });

        let mut done: Vec<(Key, KnobValue)> = Vec::new();
        for (key, from, to) in changes {
            match self.write_with_retry(&key, &to, &mut report.retries) {
                Ok(()) => {
                    tracing::info!(group = %key.0, knob = ?key.1, from = %from, to = %to, "write");
                    report.writes.push(Write {
                        group: key.0.to_string(),
                        knob: key.1,
                        from: Some(from.clone()),
                        to: to.clone(),
                    });
                    done.push((key, from));
                }
                Err((attempts, source)) => {
                    let rollback = self.roll_back(&done);
                    // What the kernel holds now: the values before this change (where the
                    // rollback worked); unknown knobs are re-read on the next pass.
                    for (k, v) in &before {
                        self.current.insert(k.clone(), v.clone());
                    }
                    if let RollbackOutcome::Incomplete(_) = rollback {
                        self.current.clear();
                    }
                    tracing::error!(group = %key.0, knob = ?key.1, value = %to, error = %source,
                        rollback = %rollback, "write failed");
                    return Err(ReconcileError::Write(Box::new(WriteFailure {
                        group: key.0.to_string(),
                        knob: key.1,
                        value: to,
                        attempts,
                        source,
                        rollback,
                    })));
                }
            }
        }
        // A knob left out of this target (an idle group's weight) may be changed by the kernel
        // meanwhile: forget it, so the next target holding it reads it back first.
        self.current.retain(|k, _| target.contains_key(k));
        for (k, v) in target {
            self.current.insert(k.clone(), v.clone());
        }
        Ok(report)
    }

    /// Sort key of a change: (phase, knob) where phase 0 = freeze, 1 = BE loses, 2 = LC gains,
    /// 3 = BE gains, 4 = thaw.
    fn order(&self, key: &Key, from: &KnobValue, to: &KnobValue) -> (u8, Knob) {
        if key.0 == self.groups.lc && !self.groups.be.contains(&key.0) {
            return (2, key.1);
        }
        let phase = match (from, to) {
            (_, KnobValue::Frozen(true)) => 0,
            (_, KnobValue::Frozen(false)) => 4,
            (KnobValue::Cpus(a), KnobValue::Cpus(b)) => {
                let (a, b) = (parse_cpus(a), parse_cpus(b));
                if b.iter().all(|c| a.contains(c)) || !a.iter().all(|c| b.contains(c)) {
                    1 // narrower, or a move (handled as a shrink: it takes CPUs away)
                } else {
                    3
                }
            }
            (KnobValue::Weight(a), KnobValue::Weight(b)) => {
                if b < a {
                    1
                } else {
                    3
                }
            }
            (_, KnobValue::Idle(true)) => 1,
            (_, KnobValue::Idle(false)) => 3,
            (KnobValue::Quota(a), KnobValue::Quota(b)) => {
                if quota_cpus(b) < quota_cpus(a) {
                    1
                } else {
                    3
                }
            }
            (KnobValue::MemoryMax(a), KnobValue::MemoryMax(b)) => {
                if b.unwrap_or(u64::MAX) < a.unwrap_or(u64::MAX) {
                    1
                } else {
                    3
                }
            }
            _ => 1,
        };
        (phase, key.1)
    }

    fn write_with_retry(
        &self,
        key: &Key,
        value: &KnobValue,
        retries: &mut u32,
    ) -> Result<(), (u32, HostError)> {
        let mut attempt = 1;
        loop {
            match write_knob(&self.cgroups, &key.0, value) {
                Ok(()) => return Ok(()),
                Err(e) if attempt >= WRITE_ATTEMPTS => return Err((attempt, e)),
                Err(e) => {
                    tracing::warn!(group = %key.0, knob = ?key.1, value = %value, error = %e,
                        attempt, "write failed; retrying");
                    *retries += 1;
                    attempt += 1;
                    std::thread::sleep(RETRY_PAUSE);
                }
            }
        }
    }

    fn roll_back(&self, done: &[(Key, KnobValue)]) -> RollbackOutcome {
        if done.is_empty() {
            return RollbackOutcome::NothingToUndo;
        }
        let mut failures = Vec::new();
        let mut ignored = 0;
        for (key, old) in done.iter().rev() {
            match self.write_with_retry(key, old, &mut ignored) {
                Ok(()) => tracing::info!(group = %key.0, knob = ?key.1, to = %old, "rolled back"),
                Err((_, e)) => failures.push(format!("{} {:?} -> {old}: {e}", key.0, key.1)),
            }
        }
        if failures.is_empty() {
            RollbackOutcome::RolledBack(done.len())
        } else {
            RollbackOutcome::Incomplete(failures)
        }
    }

    /// Forgets what was applied: the next pass reads every knob back.
    pub fn invalidate(&mut self) {
        self.current.clear();
    }
}

fn quota_cpus(q: &CpuQuota) -> f64 {
    q.quota_us
        .map_or(f64::INFINITY, |us| us as f64 / q.period_us.max(1) as f64)
}

fn parse_cpus(list: &str) -> Vec<usize> {
    CpuSet::parse_list(list)
        .map(|s| s.to_vec())
        .unwrap_or_default()
}

/// Reads the value of every knob the host offers for `group`.
pub fn read_settings(
    cgroups: &Cgroups,
    group: &GroupPath,
) -> Result<GroupSettings, ReconcileError> {
    let mut values = BTreeMap::new();
    for &knob in Knob::ALL {
        if !cgroups.has(knob.controller()) {
            continue;
        }
        match read_knob(cgroups, group, knob) {
            Ok(v) => {
                values.insert(knob, v);
            }
            // A knob file the kernel does not have (e.g. cpu.idle before 5.15) is not managed.
            Err(ReconcileError::Read { source, .. }) if source.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(GroupSettings { values })
}

/// Reads one knob.
pub fn read_knob(
    cgroups: &Cgroups,
    group: &GroupPath,
    knob: Knob,
) -> Result<KnobValue, ReconcileError> {
    let wrap = |source| ReconcileError::Read {
        group: group.to_string(),
        knob,
        source: Box::new(source),
    };
    Ok(match knob {
        Knob::CpusetCpus => {
            let cpus = cgroups.cpuset_cpus(group).map_err(wrap)?;
            // v2 shows an empty cpuset.cpus for "inherited": the effective set is the value.
            let cpus = if cpus.is_empty() {
                cgroups.cpuset_effective_cpus(group).map_err(wrap)?
            } else {
                cpus
            };
            KnobValue::Cpus(cpus.to_list())
        }
        Knob::CpuWeight => KnobValue::Weight(cgroups.cpu_weight(group).map_err(wrap)?),
        Knob::CpuIdle => KnobValue::Idle(cgroups.cpu_idle(group).map_err(wrap)?),
        Knob::CpuQuota => KnobValue::Quota(cgroups.cpu_quota(group).map_err(wrap)?),
        Knob::Frozen => {
            KnobValue::Frozen(cgroups.freeze_state(group).map_err(wrap)? != FreezeState::Thawed)
        }
        Knob::MemoryMax => KnobValue::MemoryMax(cgroups.memory_max(group).map_err(wrap)?),
    })
}

/// Writes one knob.
pub fn write_knob(
    cgroups: &Cgroups,
    group: &GroupPath,
    value: &KnobValue,
) -> Result<(), HostError> {
    match value {
        KnobValue::Cpus(list) => cgroups.set_cpuset_cpus(group, &CpuSet::parse_list(list)?),
        KnobValue::Weight(w) => {
            // Natively, without the host's v1→v2 mapping: the value is already native.
            cgroups.set_cpu_weight(group, *w).map(|_| ())
        }
        KnobValue::Idle(i) => cgroups.set_cpu_idle(group, *i),
        KnobValue::Quota(q) => cgroups.set_cpu_quota(group, *q),
        KnobValue::Frozen(true) => cgroups.freeze(group),
        KnobValue::Frozen(false) => cgroups.thaw(group),
        KnobValue::MemoryMax(b) => cgroups.set_memory_max(group, *b),
    }
}
