//! The mechanisms headroom can act through, named once: `doctor` reports each one's
//! availability, the policies see which ones they may use, and the actuators say which run
//! (and why not) — all with this enum and its snake_case names.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One actuation mechanism (docs/architecture.md "Mechanisms and their kernel interfaces").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    Cpuset,
    CpuWeight,
    CpuIdle,
    CpuQuota,
    Freeze,
    Memory,
    Io,
    SchedAttr,
    ResctrlL3,
    ResctrlMba,
    Rapl,
    Cpufreq,
    TcHtb,
    NetCls,
    NetPrio,
    CgroupBpf,
    /// `pids.max` on the BE groups (the pids controller): a BE's process count bounded.
    Pids,
}

impl Mechanism {
    pub const ALL: [Mechanism; 17] = [
        Mechanism::Cpuset,
        Mechanism::CpuWeight,
        Mechanism::CpuIdle,
        Mechanism::CpuQuota,
        Mechanism::Freeze,
        Mechanism::Memory,
        Mechanism::Io,
        Mechanism::SchedAttr,
        Mechanism::ResctrlL3,
        Mechanism::ResctrlMba,
        Mechanism::Rapl,
        Mechanism::Cpufreq,
        Mechanism::TcHtb,
        Mechanism::NetCls,
        Mechanism::NetPrio,
        Mechanism::CgroupBpf,
        Mechanism::Pids,
    ];

    /// The name in `doctor --json`, the decision log and `ctl status`.
    pub const fn name(self) -> &'static str {
        match self {
            Mechanism::Cpuset => "cpuset",
            Mechanism::CpuWeight => "cpu_weight",
            Mechanism::CpuIdle => "cpu_idle",
            Mechanism::CpuQuota => "cpu_quota",
            Mechanism::Freeze => "freeze",
            Mechanism::Memory => "memory",
            Mechanism::Io => "io",
            Mechanism::SchedAttr => "sched_attr",
            Mechanism::ResctrlL3 => "resctrl_l3",
            Mechanism::ResctrlMba => "resctrl_mba",
            Mechanism::Rapl => "rapl",
            Mechanism::Cpufreq => "cpufreq",
            Mechanism::TcHtb => "tc_htb",
            Mechanism::NetCls => "net_cls",
            Mechanism::NetPrio => "net_prio",
            Mechanism::CgroupBpf => "cgroup_bpf",
            Mechanism::Pids => "pids",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which mechanisms a policy may use. Serialized as `{name: bool}` (the machine sidecar's
/// form since the first release); a name missing from the input counts as available, as the
/// old struct's defaults did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MechanismSet(u32);

impl MechanismSet {
    /// Everything available (tests and simulation); the agent fills it from `doctor`.
    pub const fn all() -> Self {
        MechanismSet((1 << Mechanism::ALL.len()) - 1)
    }

    /// Nothing available: start from this and switch on what `doctor` found.
    pub const fn none() -> Self {
        MechanismSet(0)
    }

    pub const fn has(self, m: Mechanism) -> bool {
        self.0 & (1 << m as u32) != 0
    }

    pub fn set(&mut self, m: Mechanism, available: bool) {
        if available {
            self.0 |= 1 << m as u32;
        } else {
            self.0 &= !(1 << m as u32);
        }
    }

    /// Keeps `m` only if it is also `available` (an actuator that does not run here).
    pub fn limit(&mut self, m: Mechanism, available: bool) {
        let keep = self.has(m) && available;
        self.set(m, keep);
    }

    pub fn iter(self) -> impl Iterator<Item = Mechanism> {
        Mechanism::ALL.into_iter().filter(move |m| self.has(*m))
    }
}

impl Default for MechanismSet {
    fn default() -> Self {
        MechanismSet::all()
    }
}

impl Serialize for MechanismSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let map: BTreeMap<&str, bool> = Mechanism::ALL
            .into_iter()
            .map(|m| (m.name(), self.has(m)))
            .collect();
        map.serialize(s)
    }
}

impl<'de> Deserialize<'de> for MechanismSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, bool>::deserialize(d)?;
        let mut set = MechanismSet::all();
        for (name, on) in map {
            let m = Mechanism::from_name(&name).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "unknown mechanism {name:?} (known: {})",
                    Mechanism::ALL.map(Mechanism::name).join(", ")
                ))
            })?;
            set.set(m, on);
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        for m in Mechanism::ALL {
            assert_eq!(Mechanism::from_name(m.name()), Some(m));
            let json = serde_json::to_string(&m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.name()));
        }
        let mut names: Vec<_> = Mechanism::ALL.map(Mechanism::name).to_vec();
        names.dedup();
        assert_eq!(names.len(), Mechanism::ALL.len());
    }

    #[test]
    fn a_set_reads_the_old_struct_of_bools_and_defaults_missing_names_to_available() {
        let set: MechanismSet =
            serde_json::from_str(r#"{"cpuset": true, "resctrl_l3": false, "cpu_idle": false}"#)
                .unwrap();
        assert!(set.has(Mechanism::Cpuset));
        assert!(!set.has(Mechanism::ResctrlL3));
        assert!(!set.has(Mechanism::CpuIdle));
        assert!(set.has(Mechanism::TcHtb), "missing = available");
        let back: MechanismSet =
            serde_json::from_str(&serde_json::to_string(&set).unwrap()).unwrap();
        assert_eq!(back, set);
        assert!(
            serde_json::from_str::<MechanismSet>(r#"{"warp_drive": true}"#)
                .unwrap_err()
                .to_string()
                .contains("warp_drive")
        );
    }

    #[test]
    fn limit_only_narrows() {
        let mut s = MechanismSet::none();
        s.limit(Mechanism::Io, true);
        assert!(!s.has(Mechanism::Io));
        let mut s = MechanismSet::all();
        s.limit(Mechanism::Io, false);
        assert!(!s.has(Mechanism::Io));
        assert_eq!(s.iter().count(), Mechanism::ALL.len() - 1);
    }
}
