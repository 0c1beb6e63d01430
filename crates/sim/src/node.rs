//! `impl Node for SimHost`: the agent's one ordered write path (`Controller::step` →
//! `Actuation`) writes the modelled server's knobs exactly as it writes cgroupfs on Linux; each
//! write lands in the model's [`Applied`](crate::host::Applied) state. Driven here: the BE groups'
//! cpuset, CPU weight, `cpu.idle`, quota, freezer and memory limit, the LC group's CPU weight, and
//! the BE CPUs' maximum frequency. Not driven (no resctrl, egress or block I/O on the model): LLC
//! ways, memory-bandwidth throttles, egress and I/O limits.

use std::collections::BTreeMap;
use std::time::Duration;

use headroom_control::actuation::{CgroupKnob, Knob, KnobValue, ManagedGroups};
use headroom_control::node::{Node, NodeError, NodeFacts};
use headroom_types::observation::Observation;
use headroom_types::resources::CpuQuota;
use headroom_types::GroupPath;

use crate::host::SimHost;

/// The LC group's path on a modelled server.
pub const LC_GROUP: &str = "headroom/lc";
/// The BE group's path on a modelled server.
pub const BE_GROUP: &str = "headroom/be";

/// The groups the agent manages on a modelled server.
pub fn sim_groups() -> ManagedGroups {
    ManagedGroups {
        lc: GroupPath::new(LC_GROUP).expect("valid group path"),
        be: vec![GroupPath::new(BE_GROUP).expect("valid group path")],
    }
}

fn bad(knob: &Knob, to: &KnobValue) -> NodeError {
    NodeError::new(knob.to_string(), format!("the model cannot take {to}"))
}

fn not_found(knob: &Knob) -> NodeError {
    NodeError {
        what: knob.to_string(),
        reason: "not modelled".into(),
        not_found: true,
    }
}

impl SimHost {
    fn is_be(&self, g: &GroupPath) -> bool {
        *g == BE_GROUP
    }

    fn is_lc(&self, g: &GroupPath) -> bool {
        *g == LC_GROUP
    }

    /// Sets what the sensors will report at the next [`Node::sense`]: the LC's arrival rate, the
    /// latency source's current window tail, and the peak the load fraction is relative to.
    pub fn set_inputs(&mut self, lc_qps: f64, latency_us: Option<f64>, peak_qps: f64) {
        self.inputs = (lc_qps, latency_us, peak_qps);
        self.dirty = true;
    }

    /// With several LC services: each one's signals for the next [`Node::sense`]
    /// (`obs.lc_groups`; the top-level fields keep [`SimHost::set_inputs`]'s).
    pub fn set_groups(&mut self, groups: Vec<headroom_types::observation::LcGroupObservation>) {
        self.groups = groups;
        self.dirty = true;
    }
}

impl Node for SimHost {
    fn facts(&self) -> &NodeFacts {
        &self.facts
    }

    fn sense(&mut self, _t: Duration) -> &Observation {
        if !self.dirty {
            return &self.obs;
        }
        self.dirty = false;
        let (qps, latency, peak) = self.inputs;
        let state = self.evaluate(qps);
        self.obs = self.observation(&state, latency, peak);
        if let Some(first) = self.groups.first() {
            // several services: the top-level fields repeat the first's (the agent's contract)
            self.obs.lc_qps = first.qps;
            self.obs.lc_load = first.load;
            self.obs.lc_latency_us = first.latency_us;
            self.obs.lc_latency_age_ms = first.latency_age_ms;
            self.obs.lc_groups.clone_from(&self.groups);
        }
        self.last = Some(state);
        &self.obs
    }

    fn read(&mut self, knob: &Knob) -> Result<KnobValue, NodeError> {
        let a = self.applied();
        match knob {
            Knob::Cgroup { group, knob: k } if self.is_be(group) => Ok(match k {
                CgroupKnob::CpusetCpus => KnobValue::Cpus(self.cpu_set(a.be_cpus)),
                CgroupKnob::CpuWeight => KnobValue::Weight(a.be_shares as u64),
                CgroupKnob::CpuIdle => KnobValue::Idle(a.be_idle),
                CgroupKnob::CpuQuota => KnobValue::Quota(CpuQuota {
                    quota_us: a.be_quota_cpus.map(|q| (q * 100_000.0).round() as u64),
                    period_us: 100_000,
                }),
                CgroupKnob::Frozen => KnobValue::Frozen(!a.be_enabled),
                CgroupKnob::MemoryMax => KnobValue::MemoryMax(self.be_memory_max),
                // Not modelled (the model's BE forks nothing): as a host without the pids
                // controller, the knob is not managed.
                CgroupKnob::PidsMax => return Err(not_found(knob)),
            }),
            Knob::Cgroup {
                group,
                knob: CgroupKnob::CpuWeight,
            } if self.is_lc(group) => Ok(KnobValue::Weight(a.lc_shares as u64)),
            Knob::MaxFreq { cpu } if *cpu < self.cores() => {
                Ok(KnobValue::Khz(self.cpu_khz[*cpu as usize]))
            }
            _ => Err(not_found(knob)),
        }
    }

    fn write(&mut self, knob: &Knob, _from: &KnobValue, to: &KnobValue) -> Result<(), NodeError> {
        match (knob, to) {
            (Knob::Cgroup { group, knob: k }, v) if self.is_be(group) => match (k, v) {
                (CgroupKnob::CpusetCpus, KnobValue::Cpus(cpus)) => self.set_be_cpus(cpus),
                (CgroupKnob::CpuWeight, KnobValue::Weight(w)) => {
                    self.applied_mut().be_shares = *w as f64
                }
                (CgroupKnob::CpuIdle, KnobValue::Idle(i)) => self.applied_mut().be_idle = *i,
                (CgroupKnob::CpuQuota, KnobValue::Quota(q)) => {
                    self.applied_mut().be_quota_cpus =
                        q.quota_us.map(|u| u as f64 / q.period_us.max(1) as f64)
                }
                (CgroupKnob::Frozen, KnobValue::Frozen(z)) => self.applied_mut().be_enabled = !z,
                (CgroupKnob::MemoryMax, KnobValue::MemoryMax(b)) => self.be_memory_max = *b,
                _ => return Err(bad(knob, to)),
            },
            (
                Knob::Cgroup {
                    group,
                    knob: CgroupKnob::CpuWeight,
                },
                KnobValue::Weight(w),
            ) if self.is_lc(group) => self.applied_mut().lc_shares = *w as f64,
            (Knob::MaxFreq { cpu }, KnobValue::Khz(k)) if *cpu < self.cores() => {
                self.cpu_khz[*cpu as usize] = *k;
                self.refresh_be_freq();
            }
            _ => return Err(bad(knob, to)),
        }
        Ok(())
    }
}

/// Every knob the model offers, with its value: for tests comparing it with a Linux host.
pub fn knob_table(host: &mut SimHost) -> BTreeMap<Knob, KnobValue> {
    let groups = sim_groups();
    let mut out = BTreeMap::new();
    for &k in CgroupKnob::ALL {
        let knob = Knob::cgroup(&groups.be[0], k);
        if let Ok(v) = host.read(&knob) {
            out.insert(knob, v);
        }
    }
    out
}
