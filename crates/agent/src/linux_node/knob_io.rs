//! The [`Node`] side of the real host: reading and writing each knob (cgroup files, resctrl
//! masks, frequency caps, egress classes, io throttles) with the retry pause and BE kill.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use headroom_host::resctrl::ResctrlGroup;
use headroom_host::{Controller, FreezeState, HostError};
use headroom_types::GroupPath;

use super::{LinuxNode, RETRY_PAUSE};
use crate::publish::reaction_log::phase;

/// How long a group may read FREEZING after the agent's freeze before a read-back counts it as
/// not frozen (and the plan writes FROZEN again, reported as drift): the freeze write returns
/// as soon as BE is confined, FROZEN follows once every task is in the refrigerator.
const FREEZE_VERIFY_GRACE: Duration = Duration::from_secs(1);
use headroom_control::actuation::knob::{CgroupKnob, Knob, KnobValue};
use headroom_control::actuation::target::BE_RESCTRL_GROUP;
use headroom_control::node::{Node, NodeError, NodeFacts};
use headroom_types::observation::Observation;

/// The controller (v1 hierarchy) a cgroup knob lives in.
fn controller_of(knob: CgroupKnob) -> Controller {
    match knob {
        CgroupKnob::CpusetCpus => Controller::Cpuset,
        CgroupKnob::CpuWeight | CgroupKnob::CpuIdle | CgroupKnob::CpuQuota => Controller::Cpu,
        CgroupKnob::Frozen => Controller::Freezer,
        CgroupKnob::MemoryMax => Controller::Memory,
        CgroupKnob::PidsMax => Controller::Pids,
    }
}

impl LinuxNode {
    fn unsupported(&self, knob: &Knob) -> NodeError {
        NodeError::new(self.describe(knob), "not driven on this host")
    }

    fn freezing_since(&self) -> std::sync::MutexGuard<'_, BTreeMap<GroupPath, Instant>> {
        self.freezing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `group` counts as frozen: FROZEN, or FREEZING within [`FREEZE_VERIFY_GRACE`] of
    /// the agent's own freeze. FREEZING longer (a task that cannot reach the refrigerator), or
    /// FREEZING the agent did not start, reads as not frozen, so the plan writes FROZEN again.
    fn frozen(&self, group: &GroupPath) -> Result<bool, HostError> {
        let state = self.cgroups.freeze_state(group)?;
        let mut since = self.freezing_since();
        if state != FreezeState::Freezing {
            since.remove(group);
            return Ok(state == FreezeState::Frozen);
        }
        match since.get(group) {
            Some(t) if t.elapsed() < FREEZE_VERIFY_GRACE => Ok(true),
            started => {
                tracing::warn!(group = %group, since_ms = started.map(|t| t.elapsed().as_millis() as u64),
                    "freezer still FREEZING: freezing again");
                Ok(false)
            }
        }
    }

    fn read_cgroup(&self, group: &GroupPath, knob: CgroupKnob) -> Result<KnobValue, HostError> {
        let cg = &self.cgroups;
        Ok(match knob {
            // v2 shows an empty cpuset.cpus for "inherit the parent's CPUs" (kubelet's QoS
            // parents): kept as "" so a restore gives the group back its inheritance, not the
            // list the parent had at the time.
            CgroupKnob::CpusetCpus => KnobValue::Cpus(cg.cpuset_cpus(group)?),
            CgroupKnob::CpuWeight => KnobValue::Weight(cg.cpu_weight(group)?),
            CgroupKnob::CpuIdle => KnobValue::Idle(cg.cpu_idle(group)?),
            CgroupKnob::CpuQuota => KnobValue::Quota(cg.cpu_quota(group)?),
            CgroupKnob::Frozen => KnobValue::Frozen(self.frozen(group)?),
            CgroupKnob::MemoryMax => KnobValue::MemoryMax(cg.memory_max(group)?),
            CgroupKnob::PidsMax => KnobValue::PidsMax(cg.pids_max(group)?),
        })
    }

    fn write_cgroup(&self, group: &GroupPath, value: &KnobValue) -> Result<(), HostError> {
        let cg = &self.cgroups;
        match value {
            KnobValue::Cpus(list) if list.is_empty() => match cg.inherit_cpuset_cpus(group) {
                // Kernels before 6.x refuse to empty a populated v2 cpuset (ENOSPC): the
                // nearest thing is the parent's CPUs now, said loudly.
                Err(e) if e.errno() == Some(nix::errno::Errno::ENOSPC) => {
                    let parent = group.parent().unwrap_or_else(GroupPath::root);
                    let cpus = cg.cpuset_effective_cpus(&parent)?;
                    tracing::warn!(group = %group, cpus = %cpus.to_list(),
                        "the kernel refuses an empty cpuset.cpus for a populated group (ENOSPC): restored the parent's CPUs instead of inheriting them");
                    cg.set_cpuset_cpus(group, &cpus)
                }
                other => other,
            },
            KnobValue::Cpus(cpus) => cg.set_cpuset_cpus(group, cpus),
            // Natively, without the host's v1→v2 mapping: the value is already native.
            KnobValue::Weight(w) => cg.set_cpu_weight(group, *w).map(|_| ()),
            KnobValue::Idle(i) => cg.set_cpu_idle(group, *i),
            KnobValue::Quota(q) => cg.set_cpu_quota(group, *q),
            KnobValue::Frozen(true) => {
                // Confined once the write returns; FROZEN is verified on the read-backs.
                cg.start_freeze(group)?;
                self.freezing_since().insert(group.clone(), Instant::now());
                Ok(())
            }
            KnobValue::Frozen(false) => cg.thaw(group),
            KnobValue::MemoryMax(b) => cg.set_memory_max(group, *b),
            KnobValue::PidsMax(n) => cg.set_pids_max(group, *n),
            other => Err(HostError::invalid(
                "cgroup knob value",
                other.to_string(),
                "not a cgroup value",
            )),
        }
    }
}

pub(super) fn be_resctrl_group() -> ResctrlGroup {
    ResctrlGroup::new(BE_RESCTRL_GROUP).expect("a valid resctrl group name")
}

fn resctrl_group(name: &str) -> ResctrlGroup {
    if name.is_empty() {
        ResctrlGroup::default_group()
    } else {
        be_resctrl_group()
    }
}

impl LinuxNode {
    fn read_knob(&mut self, knob: &Knob) -> Result<KnobValue, NodeError> {
        let with_what = |e: HostError| NodeError {
            not_found: e.is_not_found(),
            what: self.describe(knob),
            reason: e.to_string(),
        };
        match knob {
            // A controller this host lacks: the knob is not managed (as a missing file).
            Knob::Cgroup { knob: k, .. } if !self.cgroups.has(controller_of(*k)) => {
                Err(NodeError {
                    not_found: true,
                    ..self.unsupported(knob)
                })
            }
            Knob::Cgroup { group, knob: k } => self.read_cgroup(group, *k).map_err(with_what),
            Knob::Io { group, device } if self.facts.io => self
                .cgroups
                .io_limits(group, *device)
                .map(KnobValue::Io)
                .map_err(with_what),
            Knob::Schemata { group } => {
                let r = self
                    .resctrl
                    .as_ref()
                    .ok_or_else(|| self.unsupported(knob))?;
                if !group.is_empty() && !r.dir().join(group).is_dir() {
                    return Ok(KnobValue::NoGroup);
                }
                r.schemata(&resctrl_group(group))
                    .map(KnobValue::Schemata)
                    .map_err(with_what)
            }
            Knob::MaxFreq { cpu } => {
                let f = self
                    .cpufreq
                    .as_ref()
                    .ok_or_else(|| self.unsupported(knob))?;
                f.max_khz(*cpu as usize)
                    .map(KnobValue::Khz)
                    .map_err(with_what)
            }
            Knob::Egress => {
                let e = self.egress.as_ref().ok_or_else(|| self.unsupported(knob))?;
                Ok(KnobValue::Htb(e.installed))
            }
            Knob::Io { .. } => Err(self.unsupported(knob)),
        }
    }

    fn write_knob(
        &mut self,
        knob: &Knob,
        from: &KnobValue,
        to: &KnobValue,
    ) -> Result<(), NodeError> {
        // The reaction's path: the file is named only when the write fails (naming it costs
        // a few allocations and path joins).
        if let Knob::Cgroup { group, .. } = knob {
            return self.write_cgroup(group, to).map_err(|e| NodeError {
                not_found: e.is_not_found(),
                what: self.describe(knob),
                reason: e.to_string(),
            });
        }
        let what = self.describe(knob);
        let with_what = |e: HostError| NodeError {
            not_found: e.is_not_found(),
            what: what.clone(),
            reason: e.to_string(),
        };
        match (knob, to) {
            (Knob::Io { group, device }, KnobValue::Io(limits)) if self.facts.io => self
                .cgroups
                .set_io_limits(group, *device, *limits)
                .map_err(with_what),
            (Knob::Schemata { group }, value) => {
                let r = self
                    .resctrl
                    .as_ref()
                    .ok_or_else(|| self.unsupported(knob))?;
                let g = resctrl_group(group);
                match value {
                    KnobValue::NoGroup if !group.is_empty() => {
                        r.remove_group(&g).map_err(with_what)
                    }
                    KnobValue::Schemata(s) => {
                        r.create_group(&g).map_err(with_what)?;
                        r.set_schemata(&g, s).map_err(with_what)
                    }
                    _ => Err(self.unsupported(knob)),
                }
            }
            (Knob::MaxFreq { cpu }, KnobValue::Khz(khz)) => {
                let f = self
                    .cpufreq
                    .as_ref()
                    .ok_or_else(|| self.unsupported(knob))?;
                f.set_max_khz(*cpu as usize, *khz).map_err(with_what)
            }
            (Knob::Egress, KnobValue::Htb(ceil)) => {
                let e = self
                    .egress
                    .as_mut()
                    .ok_or_else(|| NodeError::new(&what, "no egress"))?;
                let result = match (from, ceil) {
                    (_, None) => e.egress.teardown(),
                    (KnobValue::Htb(Some(_)), Some(bits)) => e.egress.set_be_ceil(&e.htb, *bits),
                    (_, Some(bits)) => {
                        let mut htb = e.htb;
                        htb.be_ceil_bits_per_s = *bits;
                        e.egress.setup(&htb)
                    }
                };
                result.map_err(with_what)?;
                e.installed = *ceil;
                Ok(())
            }
            _ => Err(self.unsupported(knob)),
        }
    }
}

impl Node for LinuxNode {
    fn facts(&self) -> &NodeFacts {
        &self.facts
    }

    fn sense(&mut self, t: Duration) -> &Observation {
        let obs = match self.sensors.as_mut() {
            Some(s) => s.sample(self.started + t),
            None => &self.blank,
        };
        phase::sensed();
        obs
    }

    fn observed(&mut self, _t: Duration) -> &Observation {
        match self.sensors.as_ref() {
            Some(s) => s.last(),
            None => &self.blank,
        }
    }

    fn read(&mut self, knob: &Knob) -> Result<KnobValue, NodeError> {
        let started = phase::begin();
        let value = self.read_knob(knob);
        phase::read_done(started);
        value
    }

    fn write(&mut self, knob: &Knob, from: &KnobValue, to: &KnobValue) -> Result<(), NodeError> {
        let started = phase::begin();
        let done = self.write_knob(knob, from, to);
        phase::write_done(started, knob.kind_label());
        done
    }

    fn retry_pause(&mut self) {
        std::thread::sleep(RETRY_PAUSE);
    }

    /// SIGKILLs every process of the BE groups, thawing frozen ones so the signal is delivered.
    fn kill_be(&mut self, groups: &[GroupPath]) -> usize {
        let mut killed = 0;
        for g in groups {
            let procs = self.cgroups.procs(g).unwrap_or_default();
            if procs.is_empty() {
                continue;
            }
            tracing::warn!(group = %g, processes = procs.len(), "be_kill: killing BE processes");
            killed += crate::supervisor::kill_group(&self.cgroups, g);
        }
        killed
    }

    fn describe(&self, knob: &Knob) -> String {
        match knob {
            Knob::Cgroup { group, knob } => {
                let dirs = self.cgroups.group_dirs(group);
                let file = match knob {
                    CgroupKnob::CpusetCpus => "cpuset.cpus",
                    CgroupKnob::CpuWeight if self.facts.v2_weights => "cpu.weight",
                    CgroupKnob::CpuWeight => "cpu.shares",
                    CgroupKnob::CpuIdle => "cpu.idle",
                    CgroupKnob::CpuQuota if self.facts.v2_weights => "cpu.max",
                    CgroupKnob::CpuQuota => "cpu.cfs_quota_us",
                    CgroupKnob::Frozen if self.facts.v2_weights => "cgroup.freeze",
                    CgroupKnob::Frozen => "freezer.state",
                    CgroupKnob::MemoryMax if self.facts.v2_weights => "memory.max",
                    CgroupKnob::MemoryMax => "memory.limit_in_bytes",
                    CgroupKnob::PidsMax => "pids.max",
                };
                let controller = controller_of(*knob);
                let dir = self.cgroups.backend(controller).ok().and_then(|b| {
                    dirs.iter()
                        .find(|(d, _)| d.mount() == b.mount())
                        .map(|(_, p)| p.join(file))
                });
                match dir {
                    Some(p) => p.display().to_string(),
                    None => format!("{file} of {group}"),
                }
            }
            Knob::Io { group, device } => {
                let file = if self.io_v1 {
                    "blkio.throttle.*_device"
                } else {
                    "io.max"
                };
                format!("{file} of {group} for device {device}")
            }
            Knob::Schemata { group } => match &self.resctrl {
                Some(r) => r.dir().join(group).join("schemata").display().to_string(),
                None => knob.to_string(),
            },
            Knob::MaxFreq { cpu } => match &self.cpufreq {
                Some(f) => f
                    .cpu_dir()
                    .join(format!("cpu{cpu}/cpufreq/scaling_max_freq"))
                    .display()
                    .to_string(),
                None => knob.to_string(),
            },
            Knob::Egress => match &self.egress {
                Some(e) => format!("tc HTB on dev {}", e.egress.device()),
                None => knob.to_string(),
            },
        }
    }
}
