//! The one write path: every knob of every resource (cgroup knobs, block-I/O throttles, resctrl
//! schemata, frequency caps, the egress HTB) goes through [`Actuation::apply`], on a real host
//! or a simulated one ([`Node`]).
//!
//! An allocation becomes one plan: the knob values it asks for ([`target`]), minus what the
//! node already holds (what was last applied; on a verifying pass, what is read back, so drift
//! made by others is found and repaired), ordered by [`knob::phase`] — freeze first, everything
//! BE loses, what the LC gains, what BE gains, thaw last. A write that keeps failing after
//! [`WRITE_ATTEMPTS`] tries never blocks confinement: the plan's other writes that confine BE
//! (the freeze, a narrower cpuset, a lower quota, weight or cap) are still made and kept with
//! those already made, while the writes that give (to BE or to the LC) are skipped or undone
//! newest first, so BE holds no more than the smaller of the two allocations. Each knob's original value is
//! read before the agent's first write to it; [`Actuation::restore_original`] puts them all
//! back (`ctl off`, `on_exit = "restore"`) and they survive a restart in the state file.

mod apply_plan;
pub mod knob;
#[cfg(test)]
mod kubelet_tests;
#[cfg(test)]
mod lc_services_tests;
#[cfg(test)]
#[path = "mem_node_tests.rs"]
mod mem_node;
#[cfg(test)]
mod pids_tests;
mod release;
#[cfg(test)]
mod release_tests;
mod report;
pub mod target;

use std::collections::{BTreeMap, BTreeSet};

use crate::node::{Node, NodeError};
use headroom_types::allocation::Allocation;
use headroom_types::GroupPath;
pub use knob::{CgroupKnob, Knob, KnobValue, Phase};
pub use release::EarlierRole;
pub use report::{ActuationError, ApplyReport, RollbackOutcome, Write, WriteFailure};
pub use target::{ManagedGroups, TargetError, BE_RESCTRL_GROUP};

/// How often a failing write is tried before the plan is rolled back.
pub const WRITE_ATTEMPTS: u32 = 3;

/// The write path's memory of one node: originals, what it holds, what is unknown.
#[derive(Debug, Clone)]
pub struct Actuation {
    groups: ManagedGroups,
    /// Every LC service's group: `groups.lc` first, then the other `[[lc]]` services'.
    lc_groups: Vec<GroupPath>,
    /// LC groups whose cpuset an allocation's `lc_services` has set (restored with the rest).
    lc_cpusets: BTreeSet<GroupPath>,
    /// Each knob's value before the agent's first write to it.
    original: BTreeMap<Knob, KnobValue>,
    /// What the node holds, as far as the write path knows (last applied or read back).
    current: BTreeMap<Knob, KnobValue>,
    /// Knobs whose value is unknown (an undo failed): read back and rewritten next time.
    unknown: BTreeSet<Knob>,
    /// Write attempts that failed and then succeeded.
    retries: u64,
}

impl Actuation {
    /// Reads the originals of every knob the node has for the managed groups (a first start).
    pub fn attach(node: &mut dyn Node, groups: ManagedGroups) -> Result<Actuation, ActuationError> {
        Actuation::resume(node, groups, BTreeMap::new())
    }

    /// Takes originals captured by an earlier agent (its state file) and reads those it lacks.
    pub fn resume(
        node: &mut dyn Node,
        groups: ManagedGroups,
        original: BTreeMap<Knob, KnobValue>,
    ) -> Result<Actuation, ActuationError> {
        let mut a = Actuation {
            lc_groups: vec![groups.lc.clone()],
            lc_cpusets: BTreeSet::new(),
            groups,
            original,
            current: BTreeMap::new(),
            unknown: BTreeSet::new(),
            retries: 0,
        };
        a.read_missing_originals(node)?;
        Ok(a)
    }

    /// The other `[[lc]]` services' groups (several LC services): their originals are read
    /// (those an earlier agent recorded kept), so an arbitrating policy's per-service cpusets
    /// (`Allocation::lc_services`) go through this write path and are restored with the rest.
    pub fn with_lc_services(
        mut self,
        node: &mut dyn Node,
        more: &[GroupPath],
    ) -> Result<Actuation, ActuationError> {
        for g in more {
            if !self.lc_groups.contains(g) {
                self.lc_groups.push(g.clone());
            }
        }
        self.read_missing_originals(node)?;
        Ok(self)
    }

    /// Every LC service's group, the first (`groups().lc`) first.
    pub fn lc_groups(&self) -> &[GroupPath] {
        &self.lc_groups
    }

    fn read_missing_originals(&mut self, node: &mut dyn Node) -> Result<(), ActuationError> {
        let mut groups = self.lc_groups.clone();
        groups.extend(self.groups.be.iter().cloned());
        for g in &groups {
            for &k in CgroupKnob::ALL {
                let key = Knob::cgroup(g, k);
                // kubelet's weight (and no `cpu.idle` where it writes one): never managed.
                if self.original.contains_key(&key) || target::kubelet_knob(g, k) {
                    continue;
                }
                match node.read(&key) {
                    Ok(v) => {
                        self.original.insert(key, v);
                    }
                    // a knob file the node does not have (cpu.idle before 5.15) is not managed
                    Err(e) if e.not_found => {}
                    Err(source) => return Err(read_error(node, &key, source)),
                }
            }
        }
        let facts = node.facts().clone();
        if facts.l3.is_some() || facts.mb.is_some() {
            let default = Knob::Schemata {
                group: String::new(),
            };
            let be = Knob::Schemata {
                group: BE_RESCTRL_GROUP.to_string(),
            };
            if !self.original.contains_key(&default) {
                let read = match node.read(&default) {
                    Ok(KnobValue::Schemata(s)) => s,
                    Ok(other) => {
                        let reason = format!("unexpected value {other}");
                        return Err(read_error(node, &default, NodeError::new("", reason)));
                    }
                    Err(e) => return Err(read_error(node, &default, e)),
                };
                // Left by an agent that crashed: the default group's mask is not the original,
                // the whole cache and bandwidth are (resources not driven keep what they hold).
                let original = if facts.resctrl_leftover {
                    let mut full = target::unrestricted(&facts, &read);
                    if facts.l3.is_none() {
                        full.l3 = read.l3.clone();
                    }
                    if facts.mb.is_none() {
                        full.mb = read.mb.clone();
                    }
                    tracing::warn!("resctrl group {BE_RESCTRL_GROUP} left by an earlier agent: adopted; the default group's original is taken as the whole cache");
                    self.unknown.insert(be.clone());
                    self.unknown.insert(default.clone());
                    full
                } else {
                    read
                };
                self.original.insert(default, KnobValue::Schemata(original));
            }
            self.original.entry(be).or_insert(KnobValue::NoGroup);
        }
        if let Some(range) = &facts.freq_range {
            for &cpu in range.keys() {
                let key = Knob::MaxFreq { cpu };
                if let std::collections::btree_map::Entry::Vacant(slot) =
                    self.original.entry(key.clone())
                {
                    let v = node.read(&key).map_err(|e| read_error(node, &key, e))?;
                    slot.insert(v);
                }
            }
        }
        if facts.egress_link_bits.is_some() {
            self.original
                .entry(Knob::Egress)
                .or_insert(KnobValue::Htb(None));
        }
        Ok(())
    }

    pub fn groups(&self) -> &ManagedGroups {
        &self.groups
    }

    /// Each knob's value before the agent's first write to it.
    pub fn original(&self) -> &BTreeMap<Knob, KnobValue> {
        &self.original
    }

    /// What the write path believes the node holds.
    pub fn current(&self) -> &BTreeMap<Knob, KnobValue> {
        &self.current
    }

    /// Write attempts that failed and then succeeded, since start.
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// The knob values `allocation` asks for on `node` (`be_cpus`: where BE may run).
    pub fn target(
        &self,
        node: &dyn Node,
        allocation: &Allocation,
        be_cpus: &[u32],
    ) -> Result<BTreeMap<Knob, KnobValue>, ActuationError> {
        let current = |k: &Knob| self.current.get(k).cloned();
        let inputs = target::TargetInputs {
            groups: &self.groups,
            lc_groups: &self.lc_groups,
            lc_cpusets: &self.lc_cpusets,
            facts: node.facts(),
            original: &self.original,
            current: &current,
            be_cpus,
        };
        let mut t = target::target(allocation, &inputs)?;
        // A host-wide knob written earlier and not named now goes back to its original (a CPU
        // that left BE keeps no frequency cap). Cgroup knobs are always named, but for an idle
        // group's weight, which belongs to the kernel while the group is idle.
        let leaving: Vec<Knob> = self
            .current
            .keys()
            .chain(self.unknown.iter())
            .filter(|k| !matches!(k, Knob::Cgroup { .. }) && !t.contains_key(*k))
            .cloned()
            .collect();
        for k in leaving {
            if let Some(orig) = self.original.get(&k) {
                t.insert(k, orig.clone());
            }
        }
        Ok(t)
    }

    /// Brings the node to `allocation`. With `verify`, every knob is read back first and drift
    /// is repaired; without, only differences from the last applied values are written.
    pub fn apply(
        &mut self,
        node: &mut dyn Node,
        allocation: &Allocation,
        be_cpus: &[u32],
        verify: bool,
    ) -> Result<ApplyReport, ActuationError> {
        let target = self.target(node, allocation, be_cpus)?;
        let report = self.apply_target(node, &target, verify)?;
        // From now on these services' cpusets are the write path's: restored on exit, and
        // given back their original when a later allocation no longer names them.
        for s in &allocation.lc_services {
            if target.contains_key(&Knob::cgroup(&s.cgroup, CgroupKnob::CpusetCpus)) {
                self.lc_cpusets.insert(s.cgroup.clone());
            }
        }
        Ok(report)
    }

    /// The originals of every knob the agent manages (the kill switch's target).
    pub fn original_target(&self) -> BTreeMap<Knob, KnobValue> {
        self.original
            .iter()
            .filter(|(k, _)| match k {
                // The LC only ever had its weight raised, and a service its cpuset set by an
                // arbitrating policy.
                Knob::Cgroup { group, knob }
                    if self.lc_groups.contains(group) && !self.groups.be.contains(group) =>
                {
                    (*knob == CgroupKnob::CpuWeight && *group == self.groups.lc)
                        || (*knob == CgroupKnob::CpusetCpus && self.lc_cpusets.contains(group))
                }
                // Everything else, written by this agent or by one before it (a restart's
                // originals come from the state file); what already holds its original is
                // read and left alone.
                _ => true,
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Restores every managed knob to its original value, in the plan's order. Best effort: a
    /// knob that cannot be restored does not stop the others; each failure is named.
    pub fn restore_original(&mut self, node: &mut dyn Node) -> Result<ApplyReport, ActuationError> {
        let target = self.original_target();
        self.restore_knobs(node, &target)
    }

    /// Writes each knob of `target` (originals) that the node does not hold, in the plan's
    /// order; best effort, each failure named, a failed knob left unknown.
    fn restore_knobs(
        &mut self,
        node: &mut dyn Node,
        target: &BTreeMap<Knob, KnobValue>,
    ) -> Result<ApplyReport, ActuationError> {
        let mut report = ApplyReport::default();
        let mut failures = Vec::new();
        let mut changes = Vec::new();
        for (k, to) in target {
            match node.read(k) {
                Ok(from) if from == *to && !self.unknown.contains(k) => {
                    self.current.insert(k.clone(), from);
                }
                Ok(from) => changes.push((k.clone(), from, to.clone())),
                Err(e) if e.not_found => {}
                Err(e) => failures.push(format!("reading {}: {e}", node.describe(k))),
            }
        }
        self.sort(&mut changes);
        for (k, from, to) in changes {
            match self.write_with_retry(node, &k, &from, &to, &mut report.retries) {
                Ok(()) => {
                    tracing::info!(knob = %node.describe(&k), value = %to, "restored");
                    self.unknown.remove(&k);
                    self.current.insert(k.clone(), to.clone());
                    report.writes.push(Write {
                        knob: k,
                        from: Some(from),
                        to,
                    });
                }
                Err((_, e)) => {
                    failures.push(format!("{} to {to}: {e}", node.describe(&k)));
                    self.unknown.insert(k.clone());
                    self.current.remove(&k);
                }
            }
        }
        if failures.is_empty() {
            Ok(report)
        } else {
            Err(ActuationError::Restore(failures))
        }
    }

    /// Forgets what was applied: the next pass reads every knob back.
    pub fn invalidate(&mut self) {
        self.current.clear();
    }
}

fn read_error(node: &dyn Node, key: &Knob, source: NodeError) -> ActuationError {
    ActuationError::Read {
        what: node.describe(key),
        source,
    }
}
