//! An [`Allocation`] in the kernel's terms: the value every knob should hold, on every
//! resource (cgroup knobs of the LC and BE groups, block-I/O throttles, resctrl schemata, the BE
//! CPUs' frequency caps, the egress HTB ceil). Pure: what the node holds comes in as arguments.

use std::collections::{BTreeMap, BTreeSet};

use headroom_types::resources::{top_ways_mask, CpuQuota, IoLimits, Schemata};
use headroom_types::{DeviceId, GroupPath};

use super::knob::{CgroupKnob, Knob, KnobValue};
use crate::node::NodeFacts;
use headroom_types::allocation::{Allocation, CpuWeight};

/// The resctrl control group BE runs in.
pub const BE_RESCTRL_GROUP: &str = "headroom-be";

/// What the LC and BE groups are (paths validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedGroups {
    pub lc: GroupPath,
    pub be: Vec<GroupPath>,
}

/// An allocation value this node cannot take (nothing was written).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct TargetError {
    pub what: String,
    pub reason: String,
}

/// Everything `target` needs besides the allocation.
pub struct TargetInputs<'a> {
    pub groups: &'a ManagedGroups,
    /// Every LC service's group (`groups.lc` first, then the other `[[lc]]` services').
    pub lc_groups: &'a [GroupPath],
    /// LC groups whose cpuset the write path has driven (an `lc_services` entry named them):
    /// one no longer named goes back to its original.
    pub lc_cpusets: &'a BTreeSet<GroupPath>,
    pub facts: &'a NodeFacts,
    /// Each knob's value before the agent's first write (cgroup knobs: those the node has).
    pub original: &'a BTreeMap<Knob, KnobValue>,
    /// What the node holds, as far as the write path knows.
    pub current: &'a dyn Fn(&Knob) -> Option<KnobValue>,
    /// CPUs BE may run on (frequency caps apply to these).
    pub be_cpus: &'a [u32],
}

/// The knob values `allocation` asks for. A knob named here whose original is unknown (a block
/// device named for the first time) is read, as its original, before anything is written.
pub fn target(
    allocation: &Allocation,
    inputs: &TargetInputs<'_>,
) -> Result<BTreeMap<Knob, KnobValue>, TargetError> {
    let mut out = BTreeMap::new();
    cgroup_knobs(allocation, inputs, &mut out);
    lc_cpusets(allocation, inputs, &mut out)?;
    io_limits(allocation, inputs, &mut out)?;
    schemata(allocation, inputs, &mut out)?;
    max_freq(allocation, inputs, &mut out);
    egress(allocation, inputs, &mut out);
    Ok(out)
}

/// Whether kubelet writes `group`'s CPU weight: every group at or below its pods root
/// (`kubepods` with the cgroupfs driver, `kubepods.slice` with systemd, under any
/// `--cgroup-root`) — the root, the QoS parents (`besteffort`, `burstable`), each pod's and
/// container's group. The agent neither writes nor repairs the weight there, and never sets
/// `cpu.idle` there: kubelet fails to restart when `cpu.idle` makes the BestEffort parent's
/// weight unwritable (koordinator#2732), and a repaired weight is a tug-of-war with kubelet.
/// Such a group is confined by the knobs kubelet leaves alone (cpuset, quota, freeze, memory;
/// docs/kubernetes.md).
pub fn kubelet_owns_weight(group: &GroupPath) -> bool {
    group
        .as_str()
        .split('/')
        .any(|c| c == "kubepods" || c == "kubepods.slice")
}

/// Weight, idle and `pids.max`: the knobs [`kubelet_owns_weight`] keeps from the agent. A
/// pod's `pids.max` is kubelet's (`podPidsLimit`, and `pid` in `--system-reserved` /
/// `--kube-reserved` for the pods root): the agent leaves it as kubelet wrote it, so a BE pod's
/// process count is bounded by kubelet's `podPidsLimit` or not at all (docs/kubernetes.md).
pub fn kubelet_knob(group: &GroupPath, knob: CgroupKnob) -> bool {
    matches!(
        knob,
        CgroupKnob::CpuWeight | CgroupKnob::CpuIdle | CgroupKnob::PidsMax
    ) && kubelet_owns_weight(group)
}

/// A BE group's `pids.max` for the allocation's `limit`: an operator's value as given; the
/// default (no `safety.be_pids_max`) never above the group's original, so a lower limit an
/// operator set on an existing group stays (hostile pass 26's low: 100 became 8192).
fn be_pids_max(a: &Allocation, orig: &KnobValue, limit: u64) -> u64 {
    match orig {
        KnobValue::PidsMax(Some(o)) if a.be_pids_max_default => limit.min(*o),
        _ => limit,
    }
}

/// What the start says of a BE group's process limit (`original`: its `pids.max` before the
/// agent's writes, `None` where unread or absent), for the limit `limit` the config gives
/// every BE group (`default`: no `safety.be_pids_max`). Pure: the caller reads and logs.
pub fn pids_note(
    group: &GroupPath,
    original: Option<Option<u64>>,
    limit: Option<u64>,
    default: bool,
) -> Option<PidsNote> {
    let original = original?;
    if kubelet_knob(group, CgroupKnob::PidsMax) {
        return original.is_none().then(|| PidsNote::KubeletUnbounded {
            group: group.clone(),
        });
    }
    match (original, limit) {
        (Some(o), Some(l)) if default && o < l => Some(PidsNote::KeepsLower {
            group: group.clone(),
            original: o,
            default: l,
        }),
        _ => None,
    }
}

/// A line the start says of a BE group's process limit ([`pids_note`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PidsNote {
    /// The default limit is above the group's own: the group keeps its own.
    KeepsLower {
        group: GroupPath,
        original: u64,
        default: u64,
    },
    /// A group under kubelet's pods root (its `pids.max` kubelet's) with no limit: BE pods
    /// there are bounded only by kubelet's `podPidsLimit`, unset by default.
    KubeletUnbounded { group: GroupPath },
}

impl std::fmt::Display for PidsNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PidsNote::KeepsLower {
                group,
                original,
                default,
            } => write!(
                f,
                "BE group {group} keeps its own pids.max {original}, below the default \
                 safety.be_pids_max {default} (a value given in the config is taken as given)"
            ),
            PidsNote::KubeletUnbounded { group } => write!(
                f,
                "BE group {group} lies under kubelet's pods root and its pids.max is max: \
                 kubelet owns it, so BE pods there may fork without bound; set kubelet's \
                 podPidsLimit (docs/kubernetes.md)"
            ),
        }
    }
}

fn native_weight(facts: &NodeFacts, w: CpuWeight) -> KnobValue {
    KnobValue::Weight(if facts.v2_weights { w.weight } else { w.shares })
}

fn cgroup_knobs(a: &Allocation, i: &TargetInputs<'_>, out: &mut BTreeMap<Knob, KnobValue>) {
    for g in &i.groups.be {
        for &knob in CgroupKnob::ALL {
            let key = Knob::cgroup(g, knob);
            let Some(orig) = i.original.get(&key) else {
                continue; // the node lacks it: not managed
            };
            if kubelet_knob(g, knob) {
                // kubelet's (an original only from an older agent's state file): held at it.
                out.insert(key, orig.clone());
                continue;
            }
            let value = match knob {
                CgroupKnob::CpusetCpus => {
                    a.be_cpus.as_ref().map(|cpus| KnobValue::Cpus(cpus.clone()))
                }
                CgroupKnob::CpuWeight => a.be_cpu_weight.map(|w| native_weight(i.facts, w)),
                CgroupKnob::CpuIdle => a.be_cpu_idle.map(KnobValue::Idle),
                CgroupKnob::CpuQuota => a.be_quota_pct.map(|pct| {
                    let period = a.be_quota_period_us.unwrap_or(CpuQuota::DEFAULT_PERIOD_US);
                    let quota = (pct / 100.0 * period as f64).round().max(1000.0) as u64;
                    KnobValue::Quota(CpuQuota {
                        quota_us: Some(quota),
                        period_us: period,
                    })
                }),
                // Enabled is thawed, whatever the group held at start: a group someone left
                // frozen kept its original (FROZEN) while "enabled", so BE never ran while
                // `ctl status` said it did (fifth hostile pass). Restore still puts it back.
                CgroupKnob::Frozen => Some(KnobValue::Frozen(!a.be_enabled)),
                CgroupKnob::MemoryMax => a
                    .be_memory_limit_bytes
                    .map(|b| KnobValue::MemoryMax(Some(b))),
                // BE groups only: the LC's `pids.max` is never in the target.
                CgroupKnob::PidsMax => a
                    .be_pids_max
                    .map(|n| KnobValue::PidsMax(Some(be_pids_max(a, orig, n)))),
            };
            out.insert(key, value.unwrap_or_else(|| orig.clone()));
        }
        // An idle group's weight is the kernel's: it holds it at the minimum (v1 cpu.shares
        // reads 3) and refuses writes (EINVAL), and clearing idle resets it to the default.
        // So the weight is managed only while the group is not idle.
        if out.get(&Knob::cgroup(g, CgroupKnob::CpuIdle)) == Some(&KnobValue::Idle(true)) {
            out.remove(&Knob::cgroup(g, CgroupKnob::CpuWeight));
        }
    }
    // The LC only ever gains: its weight, when the policy raises it.
    let lc = Knob::cgroup(&i.groups.lc, CgroupKnob::CpuWeight);
    if let Some(orig) = i.original.get(&lc) {
        let value = match a.lc.cpu_weight {
            Some(w) if !kubelet_owns_weight(&i.groups.lc) => native_weight(i.facts, w),
            _ => orig.clone(),
        };
        out.insert(lc, value);
    }
}

/// Each LC service's cpuset, where an arbitrating policy gives one (`lc_services`); a group
/// driven before and not named now gets its original back. Only the agent's own LC groups.
fn lc_cpusets(
    a: &Allocation,
    i: &TargetInputs<'_>,
    out: &mut BTreeMap<Knob, KnobValue>,
) -> Result<(), TargetError> {
    for s in &a.lc_services {
        if !i.lc_groups.contains(&s.cgroup) || i.groups.be.contains(&s.cgroup) {
            return Err(TargetError {
                what: format!("lc_services[{:?}].cgroup = {:?}", s.name, s.cgroup.as_str()),
                reason: "not an LC group this agent manages".into(),
            });
        }
        let key = Knob::cgroup(&s.cgroup, CgroupKnob::CpusetCpus);
        if !i.original.contains_key(&key) {
            continue; // no cpuset controller here: not managed
        }
        if s.cpus.is_empty() {
            return Err(TargetError {
                what: format!("lc_services[{:?}].cpus = \"\"", s.name),
                reason: "an LC service needs at least one CPU".into(),
            });
        }
        out.insert(key, KnobValue::Cpus(s.cpus.clone()));
    }
    for g in i.lc_cpusets {
        let key = Knob::cgroup(g, CgroupKnob::CpusetCpus);
        if let (false, Some(orig)) = (out.contains_key(&key), i.original.get(&key)) {
            out.insert(key, orig.clone());
        }
    }
    Ok(())
}

fn io_limits(
    a: &Allocation,
    i: &TargetInputs<'_>,
    out: &mut BTreeMap<Knob, KnobValue>,
) -> Result<(), TargetError> {
    if !i.facts.io {
        return Ok(());
    }
    for limit in &a.be_io_limits {
        let device: DeviceId = limit.device;
        let value = IoLimits {
            read_bps: limit.read_bps,
            write_bps: limit.write_bps,
            read_iops: limit.read_iops,
            write_iops: limit.write_iops,
        };
        for g in &i.groups.be {
            out.insert(
                Knob::Io {
                    group: g.clone(),
                    device,
                },
                KnobValue::Io(value),
            );
        }
    }
    Ok(())
}

fn schemata(
    a: &Allocation,
    i: &TargetInputs<'_>,
    out: &mut BTreeMap<Knob, KnobValue>,
) -> Result<(), TargetError> {
    let (l3, mb) = (i.facts.l3.as_ref(), i.facts.mb.as_ref());
    if l3.is_none() && mb.is_none() {
        return Ok(());
    }
    let ways = a.be_llc_ways.filter(|_| a.be_enabled && l3.is_some());
    let mba = a.be_mba_pct.filter(|_| a.be_enabled && mb.is_some());
    let default_key = Knob::Schemata {
        group: String::new(),
    };
    let be_key = Knob::Schemata {
        group: BE_RESCTRL_GROUP.to_string(),
    };
    let be_exists = matches!((i.current)(&be_key), Some(KnobValue::Schemata(_)));
    if ways.is_none() && mba.is_none() && !be_exists {
        return Ok(());
    }
    if let Some((w, l3)) = ways.zip(l3) {
        let total = l3.ways();
        if w == 0 || w >= total {
            return Err(TargetError {
                what: format!("be_llc_ways = {w}"),
                reason: format!(
                    "BE needs 1..{total} of the {total} ways: the LC keeps at least one"
                ),
            });
        }
    }
    // Read at attach (the whole cache where an earlier agent's group was left behind).
    let Some(KnobValue::Schemata(original)) = i.original.get(&default_key).cloned() else {
        return Ok(());
    };
    let mut be = unrestricted(i.facts, &original);
    let mut lc = original.clone();
    if let Some((w, l3)) = ways.zip(l3) {
        let be_mask = top_ways_mask(l3, w);
        for d in original.l3.keys() {
            be.l3.insert(*d, be_mask);
            lc.l3.insert(*d, l3.cbm_mask & !be_mask);
        }
    }
    if let Some((pct, mb)) = mba.zip(mb) {
        let pct = pct.clamp(mb.min_bandwidth, 100);
        for d in original.mb.keys() {
            be.mb.insert(*d, pct);
        }
    }
    out.insert(default_key, KnobValue::Schemata(lc));
    out.insert(be_key, KnobValue::Schemata(be));
    Ok(())
}

/// The schemata of a group that restricts nothing, over the domains of `domains`.
pub fn unrestricted(facts: &NodeFacts, domains: &Schemata) -> Schemata {
    let mut s = Schemata::default();
    if let Some(l3) = &facts.l3 {
        for &d in domains.l3.keys() {
            s.l3.insert(d, l3.cbm_mask);
        }
    }
    if facts.mb.is_some() {
        for &d in domains.mb.keys() {
            s.mb.insert(d, 100);
        }
    }
    s
}

fn max_freq(a: &Allocation, i: &TargetInputs<'_>, out: &mut BTreeMap<Knob, KnobValue>) {
    let Some(range) = &i.facts.freq_range else {
        return;
    };
    let Some(khz) = a.be_freq_khz.filter(|_| a.be_enabled) else {
        return;
    };
    for &cpu in i.be_cpus {
        if let Some(&(lo, hi)) = range.get(&cpu) {
            out.insert(Knob::MaxFreq { cpu }, KnobValue::Khz(khz.clamp(lo, hi)));
        }
    }
}

fn egress(a: &Allocation, i: &TargetInputs<'_>, out: &mut BTreeMap<Knob, KnobValue>) {
    let Some(link) = i.facts.egress_link_bits else {
        return;
    };
    let installed = matches!((i.current)(&Knob::Egress), Some(KnobValue::Htb(Some(_))));
    match a.be_egress_ceil_bytes_per_s {
        Some(bytes) => {
            let bits = bytes.saturating_mul(8).clamp(8, link);
            out.insert(Knob::Egress, KnobValue::Htb(Some(bits)));
        }
        // the tree stays once installed: "no limit" is the whole link
        None if installed => {
            out.insert(Knob::Egress, KnobValue::Htb(Some(link)));
        }
        None => {}
    }
}
