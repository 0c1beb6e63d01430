//! Every setting the agent writes, on every resource, as one key type and one value type, with
//! the rule that orders a change: what takes from BE first, what the LC gains next, what BE
//! gains last.

use std::fmt;

use headroom_types::resources::{CpuQuota, IoLimits, Schemata};
use headroom_types::{CpuSet, DeviceId, GroupPath};
use serde::{Deserialize, Serialize};

/// One cgroup knob of one group (each is one file on v2, one or two files of one v1 hierarchy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupKnob {
    CpusetCpus,
    CpuWeight,
    CpuIdle,
    CpuQuota,
    Frozen,
    MemoryMax,
    /// `pids.max`: the most tasks a BE group may hold (BE groups only; never the LC's).
    PidsMax,
}

impl CgroupKnob {
    pub const ALL: &'static [CgroupKnob] = &[
        CgroupKnob::CpusetCpus,
        CgroupKnob::CpuWeight,
        CgroupKnob::CpuIdle,
        CgroupKnob::CpuQuota,
        CgroupKnob::Frozen,
        CgroupKnob::MemoryMax,
        CgroupKnob::PidsMax,
    ];

    /// The knob's name as configs and traces spell it.
    pub fn label(self) -> &'static str {
        match self {
            CgroupKnob::CpusetCpus => "cpuset_cpus",
            CgroupKnob::CpuWeight => "cpu_weight",
            CgroupKnob::CpuIdle => "cpu_idle",
            CgroupKnob::CpuQuota => "cpu_quota",
            CgroupKnob::Frozen => "frozen",
            CgroupKnob::MemoryMax => "memory_max",
            CgroupKnob::PidsMax => "pids_max",
        }
    }
}

/// Anything the agent writes: the key of the one write path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Knob {
    /// A cgroup knob of a managed group.
    Cgroup { group: GroupPath, knob: CgroupKnob },
    /// One BE group's throttles of one block device (`io.max`, `blkio.throttle.*`).
    Io { group: GroupPath, device: DeviceId },
    /// A resctrl group's schemata by name (`""` = the default group, where the LC runs).
    Schemata { group: String },
    /// A CPU's `scaling_max_freq`.
    MaxFreq { cpu: u32 },
    /// The HTB tree on the egress device (its BE class ceil).
    Egress,
}

impl Knob {
    /// What kind of knob, without naming the group: a trace's label.
    pub fn kind_label(&self) -> &'static str {
        match self {
            Knob::Cgroup { knob, .. } => knob.label(),
            Knob::Io { .. } => "io",
            Knob::Schemata { .. } => "schemata",
            Knob::MaxFreq { .. } => "max_freq",
            Knob::Egress => "egress",
        }
    }

    pub fn cgroup(group: &GroupPath, knob: CgroupKnob) -> Knob {
        Knob::Cgroup {
            group: group.clone(),
            knob,
        }
    }
}

impl fmt::Display for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Knob::Cgroup { group, knob } => write!(f, "{knob:?} of {group}"),
            Knob::Io { group, device } => write!(f, "io limits of {group} for device {device}"),
            Knob::Schemata { group } if group.is_empty() => f.write_str("resctrl default schemata"),
            Knob::Schemata { group } => write!(f, "resctrl schemata of {group}"),
            Knob::MaxFreq { cpu } => write!(f, "cpu{cpu} scaling_max_freq"),
            Knob::Egress => f.write_str("egress HTB"),
        }
    }
}

/// A knob's value, in the kernel's native terms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KnobValue {
    /// A CPU set; empty is a v2 group inheriting its parent's CPUs (the file reads back "").
    /// Stored as the kernel's list string (`"0-3,6"`), as state files have always held it.
    Cpus(#[serde(serialize_with = "cpus_as_list")] CpuSet),
    /// Native weight (v1 shares, v2 cpu.weight).
    Weight(u64),
    Idle(bool),
    Quota(CpuQuota),
    Frozen(bool),
    /// Bytes; `None` = unlimited.
    MemoryMax(Option<u64>),
    /// Tasks (processes and threads); `None` = `max`, unlimited.
    PidsMax(Option<u64>),
    Io(IoLimits),
    Schemata(Schemata),
    /// A resctrl group that does not exist (a BE group's value before the agent made it).
    NoGroup,
    Khz(u64),
    /// BE class ceil, bits/s; `None` = no HTB tree (the device's own root qdisc).
    Htb(Option<u64>),
}

impl fmt::Display for KnobValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |x: Option<u64>| x.map_or("max".to_string(), |x| x.to_string());
        match self {
            KnobValue::Cpus(c) => write!(f, "cpus {c}"),
            KnobValue::Weight(w) => write!(f, "weight {w}"),
            KnobValue::Idle(i) => write!(f, "idle {}", u8::from(*i)),
            KnobValue::Quota(q) => write!(f, "quota {}/{}", opt(q.quota_us), q.period_us),
            KnobValue::Frozen(z) => f.write_str(if *z { "frozen" } else { "thawed" }),
            KnobValue::MemoryMax(b) => write!(f, "memory.max {}", opt(*b)),
            KnobValue::PidsMax(n) => write!(f, "pids.max {}", opt(*n)),
            KnobValue::Io(l) => write!(
                f,
                "rbps={} wbps={} riops={} wiops={}",
                opt(l.read_bps),
                opt(l.write_bps),
                opt(l.read_iops),
                opt(l.write_iops)
            ),
            KnobValue::Schemata(s) => {
                let lines: Vec<String> = s.to_lines().iter().map(|l| format!("{l:?}")).collect();
                f.write_str(&lines.join(" "))
            }
            KnobValue::NoGroup => f.write_str("no group"),
            KnobValue::Khz(k) => write!(f, "{k} kHz"),
            KnobValue::Htb(Some(bits)) => write!(f, "BE class ceil {bits}bit"),
            KnobValue::Htb(None) => f.write_str("no HTB tree"),
        }
    }
}

/// Where a change goes in the one ordered plan. BE loses everything first (frozen before
/// anything else), then the LC gains, then BE gains, thawing last: at no instant between two
/// writes does BE hold more than either the old or the new allocation gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Freeze,
    /// `cpu.idle` cleared before any weight write (the kernel refuses a weight on an idle group).
    ClearIdle,
    Shrink,
    LcGains,
    BeGains,
    /// `cpu.idle` set after every weight write.
    SetIdle,
    Thaw,
}

/// The phase of changing `knob` from `from` to `to`. `lc_side` is true for the LC's own knobs
/// (its cgroup weight, the default resctrl group's mask): the LC only ever gains, unless BE is
/// given a part of what the LC held (cache ways), which then goes before BE takes it.
pub fn phase(lc_side: bool, from: &KnobValue, to: &KnobValue) -> Phase {
    match to {
        KnobValue::Frozen(true) => return Phase::Freeze,
        KnobValue::Frozen(false) => return Phase::Thaw,
        KnobValue::Idle(false) => return Phase::ClearIdle,
        KnobValue::Idle(true) => return Phase::SetIdle,
        _ => {}
    }
    if narrows(from, to) {
        Phase::Shrink
    } else if lc_side {
        Phase::LcGains
    } else {
        Phase::BeGains
    }
}

/// Whether `from` → `to` takes something away from the group that holds it. A change that
/// moves a cpuset (neither a subset nor a superset) counts as taking: CPUs are taken away.
pub fn narrows(from: &KnobValue, to: &KnobValue) -> bool {
    let less = |a: Option<u64>, b: Option<u64>| b.unwrap_or(u64::MAX) < a.unwrap_or(u64::MAX);
    match (from, to) {
        // "" is a v2 cpuset inheriting every CPU of its parent: any list narrows it.
        (KnobValue::Cpus(_), KnobValue::Cpus(b)) if b.is_empty() => false,
        (KnobValue::Cpus(a), KnobValue::Cpus(_)) if a.is_empty() => true,
        (KnobValue::Cpus(a), KnobValue::Cpus(b)) => !a.is_subset(b),
        (KnobValue::Weight(a), KnobValue::Weight(b)) => b < a,
        (KnobValue::Quota(a), KnobValue::Quota(b)) => quota_cpus(b) < quota_cpus(a),
        (KnobValue::MemoryMax(a), KnobValue::MemoryMax(b)) => less(*a, *b),
        (KnobValue::PidsMax(a), KnobValue::PidsMax(b)) => less(*a, *b),
        (KnobValue::Io(a), KnobValue::Io(b)) => {
            less(a.read_bps, b.read_bps)
                || less(a.write_bps, b.write_bps)
                || less(a.read_iops, b.read_iops)
                || less(a.write_iops, b.write_iops)
        }
        (KnobValue::Schemata(a), KnobValue::Schemata(b)) => {
            let fewer_ways =
                a.l3.iter()
                    .any(|(d, old)| b.l3.get(d).is_some_and(|m| old & !m != 0));
            let less_bw =
                b.mb.iter()
                    .any(|(d, p)| a.mb.get(d).is_some_and(|old| p < old));
            fewer_ways || less_bw
        }
        // A group made from nothing gives; a group removed takes (its tasks fall back to
        // the default group, which the plan has already made whole).
        (KnobValue::NoGroup, _) => false,
        (_, KnobValue::NoGroup) => false,
        (KnobValue::Khz(a), KnobValue::Khz(b)) => b < a,
        (KnobValue::Htb(a), KnobValue::Htb(b)) => less(*a, *b),
        _ => true,
    }
}

fn cpus_as_list<S: serde::Serializer>(cpus: &CpuSet, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&cpus.to_list())
}

fn quota_cpus(q: &CpuQuota) -> f64 {
    q.quota_us
        .map_or(f64::INFINITY, |us| us as f64 / q.period_us.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_set_is_kept_as_a_set_and_stored_as_the_kernel_list() {
        let v = KnobValue::Cpus(CpuSet::from([0, 1, 2, 5]));
        // The state file has always held the list string; both forms read back.
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(json, r#"{"cpus":"0-2,5"}"#);
        assert_eq!(serde_json::from_str::<KnobValue>(&json).unwrap(), v);
        let array: KnobValue = serde_json::from_str(r#"{"cpus":[0,1,2,5]}"#).unwrap();
        assert_eq!(array, v);
        let inherit: KnobValue = serde_json::from_str(r#"{"cpus":""}"#).unwrap();
        assert_eq!(inherit, KnobValue::Cpus(CpuSet::new()));
        assert_eq!(v.to_string(), "cpus 0-2,5");
    }

    #[test]
    fn a_cpuset_narrows_when_it_loses_a_cpu() {
        let cpus = |c: &[u32]| KnobValue::Cpus(CpuSet::from(c));
        assert!(!narrows(&cpus(&[0, 1]), &cpus(&[0, 1, 2])));
        assert!(narrows(&cpus(&[0, 1, 2]), &cpus(&[1, 2])));
        assert!(
            narrows(&cpus(&[0, 1]), &cpus(&[1, 2])),
            "a move takes CPU 0"
        );
        // Empty is "inherit every CPU of the parent" on v2.
        assert!(narrows(&cpus(&[]), &cpus(&[1])));
        assert!(!narrows(&cpus(&[1]), &cpus(&[])));
    }

    #[test]
    fn a_pids_limit_is_a_shrink_and_lifting_it_a_gain() {
        let pids = |n: Option<u64>| KnobValue::PidsMax(n);
        assert!(narrows(&pids(None), &pids(Some(64))));
        assert!(narrows(&pids(Some(128)), &pids(Some(64))));
        assert!(!narrows(&pids(Some(64)), &pids(None)));
        assert_eq!(phase(false, &pids(None), &pids(Some(64))), Phase::Shrink);
        assert_eq!(pids(Some(64)).to_string(), "pids.max 64");
    }
}
