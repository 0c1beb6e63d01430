//! The real host behind the [`Node`] seam: cgroup knobs (v1 or v2), block-I/O throttles,
//! resctrl (Intel RDT, Heracles Alg. 2), the BE CPUs' `scaling_max_freq` (Alg. 3) and the
//! egress HTB tree (Alg. 4), each only where its mechanism exists and `[actuators]` leaves it
//! on; the others are listed with the reason ([`LinuxNode::disabled`]) and the policies' parts
//! for them stay off ([`LinuxNode::limit_mechanisms`]).
//!
//! resctrl layout: BE threads go into one control group, `headroom-be`, whose L3 mask holds the
//! BE's ways (the top ones, Heracles' partition); the LC keeps the default group, whose mask is
//! set to the complementary low ways. MB throttles only the BE group. BE threads come and go,
//! so the runtime re-assigns them ([`LinuxNode::assign_be_tasks`]) every slow pass.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_host::power::CpuFreq;
use headroom_host::resctrl::Resctrl;
use headroom_host::tc::{Egress, HtbConfig, SystemTc, TcRunner};
use headroom_host::{Cgroups, Controller, FreezerKeyHold, HostError, LinuxHost};

use crate::sensors::Sensors;
use headroom_control::actuation::target::BE_RESCTRL_GROUP;
use headroom_control::config::Config;
use headroom_control::node::{NodeError, NodeFacts};
use headroom_control::policy::{Mechanism, Mechanisms};
use headroom_types::observation::Observation;

mod knob_io;
#[cfg(test)]
mod tests;

/// Pause between attempts of a failing write (EBUSY during a migration settles quickly).
const RETRY_PAUSE: Duration = Duration::from_micros(500);

/// A `tc` runner shared with whoever made it (tests keep a handle to read its calls).
#[derive(Debug, Clone)]
struct SharedTc(Arc<dyn TcRunner>);

impl TcRunner for SharedTc {
    fn run(&self, args: &[String]) -> Result<String, HostError> {
        self.0.run(args)
    }
}

struct EgressPart {
    egress: Egress<SharedTc>,
    htb: HtbConfig,
    /// The BE class ceil the tree holds (`None`: no tree): tc state is not read back.
    installed: Option<u64>,
}

/// A Linux host under the agent's control.
pub struct LinuxNode {
    cgroups: Cgroups,
    resctrl: Option<Resctrl>,
    cpufreq: Option<CpuFreq>,
    egress: Option<EgressPart>,
    io_v1: bool,
    facts: NodeFacts,
    /// Optional actuators that do not run here, with the reason.
    disabled: Vec<(Mechanism, String)>,
    sensors: Option<Sensors>,
    started: Instant,
    blank: Observation,
    /// When the agent last started freezing each group (see `knob_io::FREEZE_VERIFY_GRACE`).
    freezing: std::sync::Mutex<BTreeMap<headroom_types::GroupPath, Instant>>,
    /// An empty v1 freezer group held frozen while the agent runs, so a BE freeze does not
    /// patch kernel text (see `headroom_host::FreezerKeyHold`); dropped with the node.
    freezer_key: Option<FreezerKeyHold>,
}

impl std::fmt::Debug for LinuxNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinuxNode")
            .field("facts", &self.facts)
            .field("disabled", &self.disabled)
            .finish()
    }
}

impl LinuxNode {
    /// The cgroup knobs of `cgroups`, and which of resctrl and cpufreq `host` offers for `cpus`
    /// (egress and io are added by [`LinuxNode::with_egress`] / [`LinuxNode::with_io`]).
    /// Never fails and writes nothing: a missing mechanism disables its part only.
    pub fn probe(host: &LinuxHost, cgroups: Cgroups, cpus: &[u32]) -> LinuxNode {
        let mut disabled: Vec<(Mechanism, String)> = Vec::new();
        let mut facts = NodeFacts {
            v2_weights: cgroups.backend(Controller::Cpu).is_ok_and(|b| b.is_v2()),
            ..NodeFacts::default()
        };
        let resctrl = host.resctrl();
        let resctrl = match resctrl.info() {
            Ok(info) if info.l3.is_some() || info.mb.is_some() => {
                if info.l3.is_none() {
                    disabled.push((
                        Mechanism::ResctrlL3,
                        "no L3 allocation (CAT) in resctrl/info".into(),
                    ));
                }
                if info.mb.is_none() {
                    disabled.push((
                        Mechanism::ResctrlMba,
                        "no MB allocation (MBA) in resctrl/info".into(),
                    ));
                }
                facts.l3 = info.l3;
                facts.mb = info.mb;
                facts.resctrl_leftover = resctrl.dir().join(BE_RESCTRL_GROUP).is_dir();
                Some(resctrl)
            }
            Ok(_) => {
                let reason = "resctrl offers neither L3 nor MB allocation".to_string();
                disabled.push((Mechanism::ResctrlL3, reason.clone()));
                disabled.push((Mechanism::ResctrlMba, reason));
                None
            }
            Err(e) => {
                disabled.push((Mechanism::ResctrlL3, e.to_string()));
                disabled.push((Mechanism::ResctrlMba, e.to_string()));
                None
            }
        };
        let cpufreq = host.cpufreq();
        let mut range = BTreeMap::new();
        let mut missing = cpus.is_empty().then(|| "no CPUs".to_string());
        for &cpu in cpus {
            match cpufreq.info(cpu as usize) {
                Ok(info) if cpufreq.available(cpu as usize) => {
                    range.insert(cpu, (info.cpuinfo_min_khz, info.cpuinfo_max_khz));
                }
                _ => {
                    missing = Some(format!(
                        "{} missing (no cpufreq driver: common in VMs)",
                        cpufreq
                            .cpu_dir()
                            .join(format!("cpu{cpu}/cpufreq/scaling_max_freq"))
                            .display()
                    ));
                    break;
                }
            }
        }
        let cpufreq = match missing {
            None => {
                facts.freq_range = Some(range);
                Some(cpufreq)
            }
            Some(reason) => {
                disabled.push((Mechanism::Cpufreq, reason));
                None
            }
        };
        LinuxNode {
            cgroups,
            resctrl,
            cpufreq,
            egress: None,
            io_v1: false,
            facts,
            disabled,
            sensors: None,
            started: Instant::now(),
            blank: Observation::default(),
            freezing: std::sync::Mutex::default(),
            freezer_key: None,
        }
    }

    /// Everything the agent's config asks for, on what `host` offers: `[actuators]` turns
    /// optional actuators off, `[egress] device` turns egress on. Each reason an actuator does
    /// not run is logged once, here. Fails only on a bad `[egress]` (device or link rate).
    pub fn from_config(
        host: &LinuxHost,
        cgroups: Cgroups,
        config: &Config,
        cpus: &[u32],
    ) -> Result<LinuxNode, NodeError> {
        let mut n = LinuxNode::probe(host, cgroups, cpus);
        let switches = &config.actuators;
        if !switches.resctrl && n.resctrl.is_some() {
            n.resctrl = None;
            n.facts.l3 = None;
            n.facts.mb = None;
            n.disable(
                Mechanism::ResctrlL3,
                "turned off by actuators.resctrl = false",
            );
            n.disable(
                Mechanism::ResctrlMba,
                "turned off by actuators.resctrl = false",
            );
        }
        if !switches.cpufreq && n.cpufreq.is_some() {
            n.cpufreq = None;
            n.facts.freq_range = None;
            n.disable(
                Mechanism::Cpufreq,
                "turned off by actuators.cpufreq = false",
            );
        }
        if switches.io {
            n = n.with_io();
        } else {
            n.disable(Mechanism::Io, "turned off by actuators.io = false");
        }
        if config.egress.device.is_empty() {
            n.disable(Mechanism::TcHtb, "no [egress] device configured");
        } else {
            n = n.with_egress(host, &config.egress.device, config.egress.link_mbit)?;
        }
        for (name, reason) in &n.disabled {
            tracing::info!(actuator = name.name(), reason = %reason, "actuator not available here");
        }
        for name in n.active() {
            tracing::info!(actuator = name.name(), "actuator on");
        }
        Ok(n)
    }

    fn disable(&mut self, name: Mechanism, reason: &str) {
        self.disabled.retain(|(n, _)| *n != name);
        self.disabled.push((name, reason.to_string()));
    }

    /// Throttles the BE groups' block I/O (`be_io_limits`) where the io controller exists.
    pub fn with_io(mut self) -> Self {
        match self.cgroups.backend(Controller::Io) {
            Ok(backend) => {
                self.disabled.retain(|(n, _)| *n != Mechanism::Io);
                self.io_v1 = !backend.is_v2();
                self.facts.io = true;
            }
            Err(e) => self.disable(Mechanism::Io, &e.to_string()),
        }
        self
    }

    /// Takes over egress shaping of `device`; `link_mbit` 0 = `/sys/class/net/<device>/speed`.
    pub fn with_egress(
        self,
        host: &LinuxHost,
        device: &str,
        link_mbit: u64,
    ) -> Result<Self, NodeError> {
        let mbit = if link_mbit > 0 {
            link_mbit
        } else {
            headroom_host::net::link_speed_mbit(host.root(), device).map_err(|e| {
                NodeError::new("egress.link_mbit = 0", format!("{e}: set egress.link_mbit"))
            })?
        };
        self.with_egress_runner(
            Arc::new(SystemTc::new()),
            device,
            mbit.saturating_mul(1_000_000),
        )
    }

    /// Egress shaping of `device` through `runner` (a namespace's `tc`, or a test double).
    pub fn with_egress_runner(
        mut self,
        runner: Arc<dyn TcRunner>,
        device: &str,
        link_bits_per_s: u64,
    ) -> Result<Self, NodeError> {
        let egress = Egress::new(SharedTc(runner), device)
            .map_err(|e| NodeError::new(format!("egress.device = {device:?}"), e.to_string()))?;
        if link_bits_per_s == 0 {
            return Err(NodeError::new(
                "egress.link_mbit = 0",
                "the link rate must be positive",
            ));
        }
        self.disabled.retain(|(n, _)| *n != Mechanism::TcHtb);
        self.facts.egress_link_bits = Some(link_bits_per_s);
        self.egress = Some(EgressPart {
            egress,
            htb: HtbConfig::new(link_bits_per_s, link_bits_per_s),
            installed: None,
        });
        Ok(self)
    }

    /// Senses through `sensors` from now on (time zero: `started`).
    /// Holds the v1 freezer's static key on while the node lives, so a BE freeze or thaw costs
    /// a counter bump instead of patching kernel text on every CPU (~100 µs of the reaction on
    /// a 2-vCPU VM). Without it the agent works the same, slower: a failure is logged only.
    pub fn keep_freezer_fast(&mut self) {
        match self.cgroups.hold_freezer_key() {
            Ok(hold) => {
                if let Some(h) = &hold {
                    tracing::debug!(dir = %h.dir().display(), "holding the freezer's static key on");
                }
                self.freezer_key = hold;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not hold the freezer key group; freezes stay slower")
            }
        }
    }

    pub fn set_sensors(&mut self, sensors: Sensors, started: Instant) {
        self.sensors = Some(sensors);
        self.started = started;
    }

    pub fn sensors(&self) -> Option<&Sensors> {
        self.sensors.as_ref()
    }

    pub fn sensors_mut(&mut self) -> Option<&mut Sensors> {
        self.sensors.as_mut()
    }

    pub fn cgroups(&self) -> &Cgroups {
        &self.cgroups
    }

    /// The BE HTB class id when egress is shaped (for the BE groups' BPF classifier).
    pub fn egress_be_classid(&self) -> Option<u32> {
        self.egress.as_ref().map(|e| e.htb.be_classid())
    }

    /// The egress link rate in bits/s (0 where egress is not shaped).
    pub fn facts_link_bits(&self) -> u64 {
        self.facts.egress_link_bits.unwrap_or(0)
    }

    /// Names of the optional actuators that run.
    pub fn active(&self) -> Vec<Mechanism> {
        self.active_flags()
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| n)
            .collect()
    }

    /// Each optional actuator and whether it runs here.
    fn active_flags(&self) -> [(Mechanism, bool); 5] {
        [
            (Mechanism::ResctrlL3, self.facts.l3.is_some()),
            (Mechanism::ResctrlMba, self.facts.mb.is_some()),
            (Mechanism::Cpufreq, self.cpufreq.is_some()),
            (Mechanism::TcHtb, self.egress.is_some()),
            (Mechanism::Io, self.facts.io),
        ]
    }

    /// Optional actuators that do not run here, with the reason.
    pub fn disabled(&self) -> &[(Mechanism, String)] {
        &self.disabled
    }

    /// Turns off the policies' parts for mechanisms this node does not drive.
    pub fn limit_mechanisms(&self, m: &mut Mechanisms) {
        for (mechanism, runs) in self.active_flags() {
            m.limit(mechanism, runs);
        }
    }

    /// The LLC's ways (for the policies' `MachineInfo::llc_ways`).
    pub fn llc_ways(&self) -> Option<u32> {
        self.facts.l3.as_ref().map(|l3| l3.ways())
    }

    /// Moves the BE threads `tids` into the BE resctrl group (they appear over time); returns
    /// how many were moved. A thread that exited meanwhile is skipped. Nothing happens before
    /// the group exists (the first allocation with ways or MBA makes it).
    pub fn assign_be_tasks(&mut self, tids: &[i32]) -> Result<usize, NodeError> {
        let Some(r) = self.resctrl.as_ref() else {
            return Ok(0);
        };
        let group = knob_io::be_resctrl_group();
        let tasks = r.dir().join(BE_RESCTRL_GROUP).join("tasks");
        if !r.dir().join(BE_RESCTRL_GROUP).is_dir() {
            return Ok(0);
        }
        let what = || tasks.display().to_string();
        let present = r
            .tasks(&group)
            .map_err(|e| NodeError::new(what(), e.to_string()))?;
        let mut moved = 0;
        for &tid in tids.iter().filter(|t| !present.contains(t)) {
            match r.add_task(&group, tid) {
                Ok(()) => moved += 1,
                Err(e) if e.errno() == Some(nix::errno::Errno::ESRCH) => {}
                Err(e) => return Err(NodeError::new(what(), format!("adding {tid}: {e}"))),
            }
        }
        Ok(moved)
    }
}
