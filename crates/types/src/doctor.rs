//! `headroom doctor --json` (docs/architecture.md): produced by headroom-host.
//!
//! The keys of docs/architecture.md are a contract; fields beyond them (`via`, `net_cls`, `net_prio`, `cgroup_bpf`, `cgroup_psi`,
//! `meminfo`, `lc_latency_kernel`, `sched_fifo`, `cgroup_cpu_usage`, `topology`) are extensions and may be absent in older output.

use serde::{Deserialize, Serialize};

/// Whether one mechanism or sensor can be used here, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Availability {
    pub available: bool,
    /// Why it is missing: not root, not mounted, kernel lacks it, hardware lacks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The interface that serves it here (e.g. `v1 cpu.shares`); extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

impl Availability {
    pub fn yes(via: impl Into<String>) -> Self {
        Availability {
            available: true,
            reason: None,
            via: Some(via.into()),
        }
    }

    pub fn no(reason: impl Into<String>) -> Self {
        Availability {
            available: false,
            reason: Some(reason.into()),
            via: None,
        }
    }
}

/// The actuators of docs/architecture.md "Mechanisms and their kernel interfaces".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mechanisms {
    pub cpuset: Availability,
    pub cpu_weight: Availability,
    pub cpu_idle: Availability,
    pub cpu_quota: Availability,
    pub freeze: Availability,
    pub memory: Availability,
    pub io: Availability,
    pub sched_attr: Availability,
    pub resctrl_l3: Availability,
    pub resctrl_mba: Availability,
    pub rapl: Availability,
    pub cpufreq: Availability,
    pub tc_htb: Availability,
    /// Classifying BE egress by cgroup with v1 `net_cls` + the tc `cgroup` filter; extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_cls: Option<Availability>,
    /// Classifying BE egress by cgroup with v1 `net_prio` (priority = HTB class id; devices of
    /// the initial network namespace only); extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_prio: Option<Availability>,
    /// Classifying BE egress by cgroup with a cgroup BPF egress program on a cgroup2 directory
    /// (priority = HTB class id; any network namespace); extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_bpf: Option<Availability>,
    /// Bounding a BE's process count with `pids.max` (the pids controller); extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<Availability>,
}

impl Mechanisms {
    /// The availability of `m` (`None`: an extension this output does not carry).
    pub fn get(&self, m: crate::mechanism::Mechanism) -> Option<&Availability> {
        use crate::mechanism::Mechanism as M;
        match m {
            M::Cpuset => Some(&self.cpuset),
            M::CpuWeight => Some(&self.cpu_weight),
            M::CpuIdle => Some(&self.cpu_idle),
            M::CpuQuota => Some(&self.cpu_quota),
            M::Freeze => Some(&self.freeze),
            M::Memory => Some(&self.memory),
            M::Io => Some(&self.io),
            M::SchedAttr => Some(&self.sched_attr),
            M::ResctrlL3 => Some(&self.resctrl_l3),
            M::ResctrlMba => Some(&self.resctrl_mba),
            M::Rapl => Some(&self.rapl),
            M::Cpufreq => Some(&self.cpufreq),
            M::TcHtb => Some(&self.tc_htb),
            M::NetCls => self.net_cls.as_ref(),
            M::NetPrio => self.net_prio.as_ref(),
            M::CgroupBpf => self.cgroup_bpf.as_ref(),
            M::Pids => self.pids.as_ref(),
        }
    }

    /// Every mechanism this output carries, in [`Mechanism::ALL`](crate::mechanism::Mechanism::ALL) order.
    pub fn iter(&self) -> impl Iterator<Item = (crate::mechanism::Mechanism, &Availability)> {
        crate::mechanism::Mechanism::ALL
            .into_iter()
            .filter_map(|m| self.get(m).map(|a| (m, a)))
    }

    /// The mechanisms available here, as the set the policies read.
    pub fn available(&self) -> crate::mechanism::MechanismSet {
        let mut set = crate::mechanism::MechanismSet::none();
        for (m, a) in self.iter() {
            set.set(m, a.available);
        }
        set
    }
}

/// The sensors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sensors {
    pub proc_stat: Availability,
    pub schedstat: Availability,
    pub psi: Availability,
    pub resctrl_mon: Availability,
    /// Per-group PSI (cgroup v2 only); extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_psi: Option<Availability>,
    /// `MemAvailable` from /proc/meminfo; extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meminfo: Option<Availability>,
    /// Per-group CPU time (cpuacct.usage / cpu.stat); extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_cpu_usage: Option<Availability>,
    /// Event-driven idle sensing (the BPF idle program's threshold events); when absent or
    /// unavailable the agent polls; extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_events: Option<Availability>,
    /// Whether the agent may run SCHED_FIFO, and why not (RT group budget, capability,
    /// rlimit); a nicety, not a condition; extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sched_fifo: Option<Availability>,
    /// The passive kernel latency sensor (`[lc.latency] source = "kernel"`: BPF on
    /// tcp:tcp_probe, sock:sock_send_length, sock:inet_sock_set_state); when unavailable the
    /// reason names what is missing and the prober is the fallback; extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lc_latency_kernel: Option<Availability>,
}

/// CPU topology details; extension.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TopologyInfo {
    /// Online CPUs in kernel list syntax (`0-1`).
    pub cpus_online: String,
    /// SMT sibling groups (`["0,2", "1,3"]`).
    pub smt_siblings: Vec<String>,
}

/// The whole doctor report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Doctor {
    pub kernel: String,
    /// `v1`, `v2`, `hybrid` (or `none`).
    pub cgroup_mode: String,
    pub root: bool,
    pub cpus: usize,
    pub smt: bool,
    pub llc_bytes: Option<u64>,
    pub numa_nodes: usize,
    pub mechanisms: Mechanisms,
    pub sensors: Sensors,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologyInfo>,
}
