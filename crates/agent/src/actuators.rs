//! Actuators beyond the cgroup knobs the reconciler drives — the allocation fields
//! `be_llc_ways` / `be_mba_pct` (Intel RDT through resctrl, Heracles Alg. 2), `be_freq_khz`
//! (the BE CPUs' `scaling_max_freq`, Alg. 3), `be_egress_ceil_bytes_per_s` (the BE class of an
//! HTB tree, Alg. 4) and `be_io_limits` (`io.max` / `blkio.throttle.*`, PerfIso's I/O limits).
//!
//! Each sub-actuator exists only where its mechanism does (and `[actuators]` leaves it on); the
//! others are listed with the reason ([`Actuators::disabled`]) and the policies' parts for them
//! stay off ([`Actuators::limit_mechanisms`]).
//!
//! Like the reconciler: every setting's original is read before the agent's first write to it,
//! only settings that differ from what was last applied are written, a failing write is tried
//! [`WRITE_ATTEMPTS`] times, and when it keeps failing the writes already made for the same
//! allocation are undone newest first, so the kernel is never left half-way between two
//! allocations. [`Actuators::restore`] puts every original back (`ctl off`, `on_exit`).
//!
//! resctrl layout: BE threads go into one control group, `headroom-be`, whose L3 mask holds the
//! BE's ways (the top ones, Heracles' partition); the LC keeps the default group, whose mask is
//! set to the complementary low ways. Writes that narrow a mask go first, so the two never share
//! a way, not even between two writes. MB throttles only the BE group. BE threads come and go,
//! so the runtime re-assigns them ([`Actuators::assign_be_tasks`]) every slow pass.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use headroom_host::power::CpuFreq;
use headroom_host::resctrl::{top_ways_mask, L3Info, MbInfo, Resctrl, ResctrlGroup, Schemata};
use headroom_host::tc::{Egress, HtbConfig, SystemTc, TcRunner};
use headroom_host::{Cgroups, Controller, DeviceId, GroupPath, HostError, IoLimits, LinuxHost};

use crate::allocation::{Allocation, IoLimit};
use crate::config::Config;
use crate::policy::Mechanisms;
use crate::reconcile::{RollbackOutcome, WRITE_ATTEMPTS};

/// The resctrl control group BE runs in.
pub const BE_RESCTRL_GROUP: &str = "headroom-be";

/// Sub-actuator names (the `doctor` / `Mechanisms` names of their mechanisms).
pub const RESCTRL_L3: &str = "resctrl_l3";
pub const RESCTRL_MBA: &str = "resctrl_mba";
pub const CPUFREQ: &str = "cpufreq";
pub const TC_HTB: &str = "tc_htb";
pub const IO: &str = "io";

/// Pause between attempts of a failing write.
const RETRY_PAUSE: Duration = Duration::from_micros(500);

/// Errors of the extra actuators; each names the file (or command) and the value.
#[derive(Debug, thiserror::Error)]
pub enum ActuatorError {
    /// A write kept failing; what happened to the writes made before it is in the failure.
    #[error("{0}")]
    Write(Box<ActuatorWriteFailure>),
    /// An original value could not be read (nothing was written).
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: HostError,
    },
    /// An allocation or configuration value this host cannot take (nothing was written).
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
    /// Some originals could not be put back (each named); the others were.
    #[error("restoring originals: {}", .0.join("; "))]
    Restore(Vec<String>),
}

/// A write that kept failing, and what happened to the writes made before it.
#[derive(Debug, thiserror::Error)]
#[error("setting {what} to {value} failed after {attempts} attempts: {source}; {rollback}")]
pub struct ActuatorWriteFailure {
    /// The file or command (`/sys/fs/resctrl/headroom-be/schemata`, `tc HTB on dev eth0`, …).
    pub what: String,
    pub value: String,
    pub attempts: u32,
    #[source]
    pub source: HostError,
    pub rollback: RollbackOutcome,
}

/// One thing the extra actuators write.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Setting {
    /// A resctrl group's schemata by group name (`""` = the default group).
    Schemata(String),
    /// A CPU's `scaling_max_freq`.
    MaxFreq(usize),
    /// The HTB tree on the egress device (its BE class ceil).
    Htb,
    /// One BE group's throttles of one block device.
    Io(GroupPath, DeviceId),
}

/// A setting's value, in the kernel's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Schemata(Schemata),
    Khz(u64),
    /// BE class ceil, bits/s; `None` = no HTB tree (the device's own root qdisc).
    Htb(Option<u64>),
    Io(IoLimits),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Schemata(s) => {
                let lines: Vec<String> = s.to_lines().iter().map(|l| format!("{l:?}")).collect();
                f.write_str(&lines.join(" "))
            }
            Value::Khz(k) => write!(f, "{k} kHz"),
            Value::Htb(Some(bits)) => write!(f, "BE class 1:20 ceil {bits}bit"),
            Value::Htb(None) => f.write_str("no HTB tree"),
            Value::Io(l) => {
                let v = |x: Option<u64>| x.map_or("max".to_string(), |x| x.to_string());
                write!(
                    f,
                    "rbps={} wbps={} riops={} wiops={}",
                    v(l.read_bps),
                    v(l.write_bps),
                    v(l.read_iops),
                    v(l.write_iops)
                )
            }
        }
    }
}

impl Value {
    /// Whether going `from` → `self` takes something from BE (or from the LC's default group
    /// mask): those writes go first.
    fn restricts(&self, from: &Value) -> bool {
        match (from, self) {
            (Value::Schemata(a), Value::Schemata(b)) => {
                b.l3.iter()
                    .all(|(d, m)| a.l3.get(d).is_none_or(|old| m & !old == 0))
            }
            (Value::Khz(a), Value::Khz(b)) => b < a,
            (Value::Htb(a), Value::Htb(b)) => b.unwrap_or(u64::MAX) < a.unwrap_or(u64::MAX),
            (Value::Io(a), Value::Io(b)) => {
                let tighter = |old: Option<u64>, new: Option<u64>| {
                    new.unwrap_or(u64::MAX) < old.unwrap_or(u64::MAX)
                };
                tighter(a.read_bps, b.read_bps)
                    || tighter(a.write_bps, b.write_bps)
                    || tighter(a.read_iops, b.read_iops)
                    || tighter(a.write_iops, b.write_iops)
            }
            _ => true,
        }
    }
}

struct ResctrlPart {
    resctrl: Resctrl,
    group: ResctrlGroup,
    /// `None` when L3 allocation is missing here or turned off.
    l3: Option<L3Info>,
    /// `None` when MB allocation is missing here or turned off.
    mb: Option<MbInfo>,
    /// The BE group exists because of this agent (or a previous run of it): removed by restore.
    owned: bool,
    /// The BE group was found at start (left by an agent that crashed): the default group's
    /// schemata are then not the originals, the whole cache and bandwidth are.
    leftover: bool,
}

impl ResctrlPart {
    fn be_key(&self) -> Setting {
        Setting::Schemata(self.group.as_str().to_string())
    }

    fn group_of(&self, name: &str) -> ResctrlGroup {
        if name.is_empty() {
            ResctrlGroup::default_group()
        } else {
            self.group.clone()
        }
    }

    /// The schemata of a group that restricts nothing (a new group's), over `domains`.
    fn unrestricted(&self, domains: &Schemata) -> Schemata {
        let mut s = Schemata::default();
        if let Some(l3) = &self.l3 {
            for &d in domains.l3.keys() {
                s.l3.insert(d, l3.cbm_mask);
            }
        }
        if self.mb.is_some() {
            for &d in domains.mb.keys() {
                s.mb.insert(d, 100);
            }
        }
        s
    }
}

struct FreqPart {
    cpufreq: CpuFreq,
    /// CPU → (cpuinfo_min, cpuinfo_max) kHz, read once.
    range: BTreeMap<usize, (u64, u64)>,
}

struct EgressPart {
    egress: Egress<SharedTc>,
    htb: HtbConfig,
}

struct IoPart {
    cgroups: Cgroups,
    groups: Vec<GroupPath>,
    /// v1 spreads one device's throttles over four files (a change can be half-made).
    v1: bool,
}

/// A `tc` runner shared with whoever made it (tests keep a handle to read its calls).
#[derive(Debug, Clone)]
struct SharedTc(Arc<dyn TcRunner>);

impl TcRunner for SharedTc {
    fn run(&self, args: &[String]) -> Result<String, HostError> {
        self.0.run(args)
    }
}

/// The extra actuators of one agent (resctrl, cpufreq, egress HTB, block I/O throttles).
pub struct Actuators {
    resctrl: Option<ResctrlPart>,
    freq: Option<FreqPart>,
    egress: Option<EgressPart>,
    io: Option<IoPart>,
    /// Each setting's value before the agent's first write to it (kept across `restore`).
    original: BTreeMap<Setting, Value>,
    /// What the agent last wrote and the kernel took (settings never written are absent).
    applied: BTreeMap<Setting, Value>,
    /// Settings whose kernel value is unknown (an undo failed): rewritten on the next pass.
    unknown: BTreeSet<Setting>,
    /// Sub-actuators that do not run here, with the reason.
    disabled: Vec<(&'static str, String)>,
    /// Attempts that failed but succeeded on a retry.
    retries: u64,
    /// The fields of the allocation applied last (an unchanged one costs a comparison only).
    last_asked: Option<Asked>,
}

/// The allocation fields these actuators act on.
#[derive(Debug, Clone, PartialEq)]
struct Asked {
    be_enabled: bool,
    be_llc_ways: Option<u32>,
    be_mba_pct: Option<u32>,
    be_freq_khz: Option<u64>,
    be_egress_ceil_bytes_per_s: Option<u64>,
    be_io_limits: Vec<IoLimit>,
    be_cpus: Vec<u32>,
}

impl Asked {
    fn new(a: &Allocation, be_cpus: &[u32]) -> Asked {
        Asked {
            be_enabled: a.be_enabled,
            be_llc_ways: a.be_llc_ways,
            be_mba_pct: a.be_mba_pct,
            be_freq_khz: a.be_freq_khz,
            be_egress_ceil_bytes_per_s: a.be_egress_ceil_bytes_per_s,
            be_io_limits: a.be_io_limits.clone(),
            be_cpus: be_cpus.to_vec(),
        }
    }

    fn same(&self, a: &Allocation, be_cpus: &[u32]) -> bool {
        self.be_enabled == a.be_enabled
            && self.be_llc_ways == a.be_llc_ways
            && self.be_mba_pct == a.be_mba_pct
            && self.be_freq_khz == a.be_freq_khz
            && self.be_egress_ceil_bytes_per_s == a.be_egress_ceil_bytes_per_s
            && self.be_io_limits == a.be_io_limits
            && self.be_cpus == be_cpus
    }
}

impl fmt::Debug for Actuators {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Actuators")
            .field("active", &self.active())
            .field("applied", &self.applied)
            .field("disabled", &self.disabled)
            .finish()
    }
}

impl Actuators {
    /// Finds which of resctrl and cpufreq `host` offers for `cpus` (egress and io are added by
    /// [`Actuators::with_egress`] / [`Actuators::with_io`]). Never fails and writes nothing:
    /// a missing mechanism disables its part only.
    pub fn probe(host: &LinuxHost, cpus: &[u32]) -> Actuators {
        let mut disabled: Vec<(&'static str, String)> = Vec::new();
        let resctrl = host.resctrl();
        let resctrl = match resctrl.info() {
            Ok(info) if info.l3.is_some() || info.mb.is_some() => {
                if info.l3.is_none() {
                    disabled.push((RESCTRL_L3, "no L3 allocation (CAT) in resctrl/info".into()));
                }
                if info.mb.is_none() {
                    disabled.push((RESCTRL_MBA, "no MB allocation (MBA) in resctrl/info".into()));
                }
                match ResctrlGroup::new(BE_RESCTRL_GROUP) {
                    Ok(group) => {
                        let leftover = resctrl.dir().join(group.as_str()).is_dir();
                        Some(ResctrlPart {
                            resctrl,
                            group,
                            l3: info.l3,
                            mb: info.mb,
                            owned: leftover,
                            leftover,
                        })
                    }
                    Err(e) => {
                        disabled.push((RESCTRL_L3, e.to_string()));
                        disabled.push((RESCTRL_MBA, e.to_string()));
                        None
                    }
                }
            }
            Ok(_) => {
                let reason = "resctrl offers neither L3 nor MB allocation".to_string();
                disabled.push((RESCTRL_L3, reason.clone()));
                disabled.push((RESCTRL_MBA, reason));
                None
            }
            Err(e) => {
                disabled.push((RESCTRL_L3, e.to_string()));
                disabled.push((RESCTRL_MBA, e.to_string()));
                None
            }
        };
        let cpufreq = host.cpufreq();
        let missing = cpus.iter().find(|&&c| !cpufreq.available(c as usize));
        let freq = match (missing, cpus.is_empty()) {
            (None, false) => Some(FreqPart {
                cpufreq,
                range: BTreeMap::new(),
            }),
            _ => {
                let cpu = missing.copied().unwrap_or(0);
                disabled.push((
                    CPUFREQ,
                    format!(
                        "{} missing (no cpufreq driver: common in VMs)",
                        cpufreq
                            .cpu_dir()
                            .join(format!("cpu{cpu}/cpufreq/scaling_max_freq"))
                            .display()
                    ),
                ));
                None
            }
        };
        let mut a = Actuators {
            resctrl,
            freq,
            egress: None,
            io: None,
            original: BTreeMap::new(),
            applied: BTreeMap::new(),
            unknown: BTreeSet::new(),
            disabled,
            retries: 0,
            last_asked: None,
        };
        if let Some(r) = &a.resctrl {
            if r.leftover {
                tracing::warn!(group = %r.group, "resctrl group left by an earlier agent: adopted; the default group's original is taken as the whole cache");
                a.unknown.insert(r.be_key());
            }
        }
        a
    }

    /// Everything the agent's config asks for, on what `host` offers: `[actuators]` turns
    /// sub-actuators off, `[egress] device` turns egress on, io throttles go to `be_groups`.
    /// Each reason a sub-actuator does not run is logged once, here. Fails only on a bad
    /// `[egress]` (the device or its link rate).
    pub fn from_config(
        host: &LinuxHost,
        config: &Config,
        cgroups: Option<&Cgroups>,
        be_groups: &[GroupPath],
        cpus: &[u32],
    ) -> Result<Actuators, ActuatorError> {
        let mut a = Actuators::probe(host, cpus);
        let switches = &config.actuators;
        if !switches.resctrl && a.resctrl.is_some() {
            a.resctrl = None;
            a.disable(RESCTRL_L3, "turned off by actuators.resctrl = false");
            a.disable(RESCTRL_MBA, "turned off by actuators.resctrl = false");
        }
        if !switches.cpufreq && a.freq.is_some() {
            a.freq = None;
            a.disable(CPUFREQ, "turned off by actuators.cpufreq = false");
        }
        match (switches.io, cgroups) {
            (false, _) => a.disable(IO, "turned off by actuators.io = false"),
            (true, Some(cg)) => a = a.with_io(cg.clone(), be_groups.to_vec()),
            (true, None) => a.disable(IO, "no cgroup hierarchy"),
        }
        if config.egress.device.is_empty() {
            a.disable(TC_HTB, "no [egress] device configured");
        } else {
            a = a.with_egress(host, &config.egress.device, config.egress.link_mbit)?;
        }
        for (name, reason) in &a.disabled {
            tracing::info!(actuator = name, reason = %reason, "actuator not available here");
        }
        for name in a.active() {
            tracing::info!(actuator = name, "actuator on");
        }
        Ok(a)
    }

    fn disable(&mut self, name: &'static str, reason: &str) {
        self.disabled.retain(|(n, _)| *n != name);
        self.disabled.push((name, reason.to_string()));
    }

    /// Throttles the BE groups' block I/O (`be_io_limits`) where the io controller exists.
    pub fn with_io(mut self, cgroups: Cgroups, be_groups: Vec<GroupPath>) -> Self {
        match cgroups.backend(Controller::Io) {
            Ok(backend) => {
                self.disabled.retain(|(n, _)| *n != IO);
                self.io = Some(IoPart {
                    v1: !backend.is_v2(),
                    cgroups,
                    groups: be_groups,
                });
            }
            Err(e) => self.disable(IO, &e.to_string()),
        }
        self
    }

    /// Takes over egress shaping of `device` (`[egress]`); `link_mbit` 0 = the device's
    /// `/sys/class/net/<device>/speed`.
    pub fn with_egress(
        self,
        host: &LinuxHost,
        device: &str,
        link_mbit: u64,
    ) -> Result<Self, ActuatorError> {
        let mbit = if link_mbit > 0 {
            link_mbit
        } else {
            let path = host.root().join(format!("sys/class/net/{device}/speed"));
            let text = std::fs::read_to_string(&path).map_err(|e| ActuatorError::Invalid {
                what: format!("egress.link_mbit = 0 and {}", path.display()),
                reason: format!("{e}: set egress.link_mbit"),
            })?;
            match text.trim().parse::<i64>() {
                Ok(v) if v > 0 => v as u64,
                _ => {
                    return Err(ActuatorError::Invalid {
                        what: format!(
                            "egress.link_mbit = 0 and {} = {:?}",
                            path.display(),
                            text.trim()
                        ),
                        reason: "no link speed (virtual device?): set egress.link_mbit".into(),
                    })
                }
            }
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
    ) -> Result<Self, ActuatorError> {
        let egress = Egress::new(SharedTc(runner), device).map_err(|e| ActuatorError::Invalid {
            what: format!("egress.device = {device:?}"),
            reason: e.to_string(),
        })?;
        if link_bits_per_s == 0 {
            return Err(ActuatorError::Invalid {
                what: "egress.link_mbit = 0".into(),
                reason: "the link rate must be positive".into(),
            });
        }
        self.disabled.retain(|(n, _)| *n != TC_HTB);
        self.egress = Some(EgressPart {
            egress,
            htb: HtbConfig::new(link_bits_per_s, link_bits_per_s),
        });
        Ok(self)
    }

    /// The BE HTB class id when egress is shaped (for the BE groups' BPF classifier).
    pub fn egress_be_classid(&self) -> Option<u32> {
        self.egress.as_ref().map(|e| e.htb.be_classid())
    }

    /// Whether L3 ways, MB throttling and frequency caps are actuated here.
    pub fn available(&self) -> (bool, bool, bool) {
        let r = self.resctrl.as_ref();
        (
            r.is_some_and(|r| r.l3.is_some()),
            r.is_some_and(|r| r.mb.is_some()),
            self.freq.is_some(),
        )
    }

    /// Names of the sub-actuators that run.
    pub fn active(&self) -> Vec<&'static str> {
        let (l3, mb, freq) = self.available();
        [
            (RESCTRL_L3, l3),
            (RESCTRL_MBA, mb),
            (CPUFREQ, freq),
            (TC_HTB, self.egress.is_some()),
            (IO, self.io.is_some()),
        ]
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| n)
        .collect()
    }

    /// Turns off the policies' parts for mechanisms no sub-actuator drives here.
    pub fn limit_mechanisms(&self, m: &mut Mechanisms) {
        let (l3, mb, freq) = self.available();
        m.resctrl_l3 &= l3;
        m.resctrl_mba &= mb;
        m.cpufreq &= freq;
        m.tc_htb &= self.egress.is_some();
        m.io &= self.io.is_some();
    }

    /// The LLC's ways (for the policies' `MachineInfo::llc_ways`).
    pub fn llc_ways(&self) -> Option<u32> {
        self.resctrl
            .as_ref()
            .and_then(|r| r.l3.as_ref())
            .map(L3Info::ways)
    }

    /// Sub-actuators that do not run here, with the reason (for `ctl status` and the log).
    pub fn disabled(&self) -> &[(&'static str, String)] {
        &self.disabled
    }

    /// Write attempts that failed and then succeeded on a retry.
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// What `ctl status` can show: the sub-actuators on, those off with the reason, and the
    /// values written (by file).
    pub fn status_json(&self) -> serde_json::Value {
        let applied: serde_json::Map<String, serde_json::Value> = self
            .applied
            .iter()
            .map(|(s, v)| (self.describe(s), serde_json::Value::String(v.to_string())))
            .collect();
        serde_json::json!({
            "active": self.active(),
            "disabled": self.disabled.iter().map(|(n, r)| serde_json::json!({"actuator": n, "reason": r})).collect::<Vec<_>>(),
            "applied": applied,
        })
    }

    /// Brings the extra mechanisms to `allocation`, writing only what changed. `be_cpus` are
    /// the CPUs BE may run on (the frequency cap applies to them only). Returns the number of
    /// writes; on error nothing of this allocation is left applied (see [`ActuatorError`]).
    pub fn apply(
        &mut self,
        allocation: &Allocation,
        be_cpus: &[u32],
    ) -> Result<usize, ActuatorError> {
        // the runtime calls this every tick (1 ms): an unchanged allocation costs a comparison
        if self.unknown.is_empty()
            && self
                .last_asked
                .as_ref()
                .is_some_and(|l| l.same(allocation, be_cpus))
        {
            return Ok(0);
        }
        self.last_asked = None;
        let mut desired = BTreeMap::new();
        self.desire_resctrl(allocation, &mut desired)?;
        self.desire_freq(allocation, be_cpus, &mut desired)?;
        self.desire_egress(allocation, &mut desired);
        self.desire_io(&allocation.be_io_limits, &mut desired)?;
        let writes = self.transition(desired)?;
        self.last_asked = Some(Asked::new(allocation, be_cpus));
        Ok(writes)
    }

    /// Moves the BE threads `tids` into the BE resctrl group (they appear over time); returns
    /// how many were moved. A thread that exited meanwhile is skipped. Nothing happens before
    /// the group exists (the first allocation with ways or MBA makes it).
    pub fn assign_be_tasks(&mut self, tids: &[i32]) -> Result<usize, ActuatorError> {
        let Some(r) = self.resctrl.as_ref() else {
            return Ok(0);
        };
        if !r.owned {
            return Ok(0);
        }
        let present = r.resctrl.tasks(&r.group).map_err(|e| ActuatorError::Read {
            what: r
                .resctrl
                .dir()
                .join(r.group.as_str())
                .join("tasks")
                .display()
                .to_string(),
            source: e,
        })?;
        let mut moved = 0;
        for &tid in tids.iter().filter(|t| !present.contains(t)) {
            match r.resctrl.add_task(&r.group, tid) {
                Ok(()) => moved += 1,
                Err(e) if e.errno() == Some(nix::errno::Errno::ESRCH) => {}
                Err(e) => {
                    return Err(ActuatorError::Write(Box::new(ActuatorWriteFailure {
                        what: r
                            .resctrl
                            .dir()
                            .join(r.group.as_str())
                            .join("tasks")
                            .display()
                            .to_string(),
                        value: tid.to_string(),
                        attempts: 1,
                        source: e,
                        rollback: RollbackOutcome::NothingToUndo,
                    })))
                }
            }
        }
        Ok(moved)
    }

    /// Puts every original back — the default group's schemata, each CPU's cap, the device's
    /// own qdisc, the BE groups' throttles — and removes the BE resctrl group (its threads fall
    /// back to the default group). Best effort: a failure does not stop the other restores;
    /// the failed ones are named and retried by the next `restore`.
    pub fn restore(&mut self) -> Result<(), ActuatorError> {
        self.last_asked = None;
        let be_key = self.resctrl.as_ref().map(ResctrlPart::be_key);
        let settings: BTreeSet<Setting> = self
            .applied
            .keys()
            .chain(self.unknown.iter())
            .filter(|s| Some(*s) != be_key.as_ref())
            .cloned()
            .collect();
        let mut changes: Vec<(Setting, Value, Value)> = settings
            .into_iter()
            .filter_map(|s| {
                let to = self.original.get(&s)?.clone();
                let from = self.current(&s).unwrap_or_else(|| to.clone());
                (self.unknown.contains(&s) || from != to).then_some((s, from, to))
            })
            .collect();
        changes.sort_by_key(|(s, from, to)| (!to.restricts(from), s.clone()));
        let mut failures = Vec::new();
        for (s, from, to) in changes {
            match self.write_with_retry(&s, &from, &to) {
                Ok(()) => {
                    self.unknown.remove(&s);
                    tracing::info!(setting = %self.describe(&s), value = %to, "restored");
                }
                Err((_, e)) => {
                    failures.push(format!("{} to {to}: {e}", self.describe(&s)));
                    self.unknown.insert(s.clone());
                }
            }
            self.applied.remove(&s);
        }
        if let Some(r) = self.resctrl.as_mut() {
            if r.owned {
                let mut result = r.resctrl.remove_group(&r.group);
                for _ in 1..WRITE_ATTEMPTS {
                    if result.is_ok() {
                        break;
                    }
                    std::thread::sleep(RETRY_PAUSE);
                    result = r.resctrl.remove_group(&r.group);
                }
                let dir = r.resctrl.dir().join(r.group.as_str());
                match result {
                    Ok(()) => {
                        r.owned = false;
                        let key = r.be_key();
                        self.applied.remove(&key);
                        self.unknown.remove(&key);
                        tracing::info!(group = %dir.display(), "resctrl group removed");
                    }
                    Err(e) => failures.push(format!("removing {}: {e}", dir.display())),
                }
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(ActuatorError::Restore(failures))
        }
    }

    // ---- what an allocation asks for --------------------------------------------------------

    /// What the kernel holds, as far as the agent knows.
    fn current(&self, s: &Setting) -> Option<Value> {
        self.applied
            .get(s)
            .or_else(|| self.original.get(s))
            .cloned()
    }

    /// Settings of one kind (`matches`) written earlier or in an unknown state.
    fn leaving<'a>(
        &'a self,
        matches: impl Fn(&Setting) -> bool + 'a,
    ) -> impl Iterator<Item = Setting> + 'a {
        self.applied
            .keys()
            .chain(self.unknown.iter())
            .filter(move |s| matches(s))
            .cloned()
    }

    fn desire_resctrl(
        &mut self,
        allocation: &Allocation,
        desired: &mut BTreeMap<Setting, Value>,
    ) -> Result<(), ActuatorError> {
        let Some(r) = self.resctrl.as_ref() else {
            return Ok(());
        };
        let ways = allocation
            .be_llc_ways
            .filter(|_| allocation.be_enabled && r.l3.is_some());
        let mba = allocation
            .be_mba_pct
            .filter(|_| allocation.be_enabled && r.mb.is_some());
        let default_key = Setting::Schemata(String::new());
        let be_key = r.be_key();
        if ways.is_none() && mba.is_none() && !r.owned {
            return Ok(());
        }
        if let Some((w, l3)) = ways.zip(r.l3.as_ref()) {
            let total = l3.ways();
            if w == 0 || w >= total {
                return Err(ActuatorError::Invalid {
                    what: format!("be_llc_ways = {w}"),
                    reason: format!(
                        "BE needs 1..{total} of the {total} ways: the LC keeps at least one"
                    ),
                });
            }
        }
        if !self.original.contains_key(&default_key) {
            let default = ResctrlGroup::default_group();
            let read = r
                .resctrl
                .schemata(&default)
                .map_err(|e| ActuatorError::Read {
                    what: r.resctrl.dir().join("schemata").display().to_string(),
                    source: e,
                })?;
            let original = if r.leftover {
                let mut full = r.unrestricted(&read);
                // resources this agent does not drive keep what they hold
                if r.l3.is_none() {
                    full.l3 = read.l3.clone();
                }
                if r.mb.is_none() {
                    full.mb = read.mb.clone();
                }
                full
            } else {
                read
            };
            self.original
                .insert(default_key.clone(), Value::Schemata(original));
        }
        let Some(Value::Schemata(original)) = self.original.get(&default_key).cloned() else {
            return Ok(());
        };
        let unrestricted = r.unrestricted(&original);
        self.original
            .entry(be_key.clone())
            .or_insert_with(|| Value::Schemata(unrestricted.clone()));
        let mut be = unrestricted;
        let mut lc = original.clone();
        if let Some((w, l3)) = ways.zip(r.l3.as_ref()) {
            let be_mask = top_ways_mask(l3, w);
            for d in original.l3.keys() {
                be.l3.insert(*d, be_mask);
                lc.l3.insert(*d, l3.cbm_mask & !be_mask);
            }
        }
        if let Some((pct, mb)) = mba.zip(r.mb.as_ref()) {
            let pct = pct.clamp(mb.min_bandwidth, 100);
            for d in original.mb.keys() {
                be.mb.insert(*d, pct);
            }
        }
        desired.insert(default_key, Value::Schemata(lc));
        desired.insert(be_key, Value::Schemata(be));
        Ok(())
    }

    fn desire_freq(
        &mut self,
        allocation: &Allocation,
        be_cpus: &[u32],
        desired: &mut BTreeMap<Setting, Value>,
    ) -> Result<(), ActuatorError> {
        let Some(f) = self.freq.as_mut() else {
            return Ok(());
        };
        let read_err = |f: &FreqPart, cpu: usize, e: HostError| ActuatorError::Read {
            what: f
                .cpufreq
                .cpu_dir()
                .join(format!("cpu{cpu}/cpufreq"))
                .display()
                .to_string(),
            source: e,
        };
        if let Some(khz) = allocation.be_freq_khz.filter(|_| allocation.be_enabled) {
            for &cpu in be_cpus {
                let cpu = cpu as usize;
                let key = Setting::MaxFreq(cpu);
                if !self.original.contains_key(&key) {
                    let orig = f.cpufreq.max_khz(cpu).map_err(|e| read_err(f, cpu, e))?;
                    self.original.insert(key.clone(), Value::Khz(orig));
                }
                if !f.range.contains_key(&cpu) {
                    let info = f.cpufreq.info(cpu).map_err(|e| read_err(f, cpu, e))?;
                    f.range
                        .insert(cpu, (info.cpuinfo_min_khz, info.cpuinfo_max_khz));
                }
                let (lo, hi) = f.range[&cpu];
                desired.insert(key, Value::Khz(khz.clamp(lo, hi)));
            }
        }
        let leaving: Vec<Setting> = self
            .leaving(|s| matches!(s, Setting::MaxFreq(_)))
            .filter(|s| !desired.contains_key(s))
            .collect();
        for s in leaving {
            if let Some(orig) = self.original.get(&s) {
                desired.insert(s, orig.clone());
            }
        }
        Ok(())
    }

    fn desire_egress(&mut self, allocation: &Allocation, desired: &mut BTreeMap<Setting, Value>) {
        let Some(e) = self.egress.as_ref() else {
            return;
        };
        let link = e.htb.link_bits_per_s;
        self.original.insert(Setting::Htb, Value::Htb(None));
        let installed = matches!(self.current(&Setting::Htb), Some(Value::Htb(Some(_))))
            || self.unknown.contains(&Setting::Htb);
        match allocation.be_egress_ceil_bytes_per_s {
            Some(bytes) => {
                let bits = bytes.saturating_mul(8).clamp(8, link);
                desired.insert(Setting::Htb, Value::Htb(Some(bits)));
            }
            // the tree stays once installed: "no limit" is the whole link
            None if installed => {
                desired.insert(Setting::Htb, Value::Htb(Some(link)));
            }
            None => {}
        }
    }

    fn desire_io(
        &mut self,
        limits: &[IoLimit],
        desired: &mut BTreeMap<Setting, Value>,
    ) -> Result<(), ActuatorError> {
        let Some(io) = self.io.as_ref() else {
            return Ok(());
        };
        for (i, limit) in limits.iter().enumerate() {
            let device: DeviceId =
                limit
                    .device
                    .parse()
                    .map_err(|e: HostError| ActuatorError::Invalid {
                        what: format!("be_io_limits[{i}].device = {:?}", limit.device),
                        reason: e.to_string(),
                    })?;
            let value = IoLimits {
                read_bps: limit.read_bps,
                write_bps: limit.write_bps,
                read_iops: limit.read_iops,
                write_iops: limit.write_iops,
            };
            for g in &io.groups {
                let key = Setting::Io(g.clone(), device);
                if !self.original.contains_key(&key) {
                    let orig =
                        io.cgroups
                            .io_limits(g, device)
                            .map_err(|e| ActuatorError::Read {
                                what: format!("io limits of {g} for device {device}"),
                                source: e,
                            })?;
                    self.original.insert(key.clone(), Value::Io(orig));
                }
                desired.insert(key, Value::Io(value));
            }
        }
        let leaving: Vec<Setting> = self
            .leaving(|s| matches!(s, Setting::Io(..)))
            .filter(|s| !desired.contains_key(s))
            .collect();
        for s in leaving {
            if let Some(orig) = self.original.get(&s) {
                desired.insert(s, orig.clone());
            }
        }
        Ok(())
    }

    // ---- writing ---------------------------------------------------------------------------

    /// Writes the settings of `desired` that differ from what the kernel holds: restricting
    /// writes first; a write that keeps failing undoes the ones made before it.
    fn transition(&mut self, desired: BTreeMap<Setting, Value>) -> Result<usize, ActuatorError> {
        let mut changes: Vec<(Setting, Value, Value)> = desired
            .into_iter()
            .filter_map(|(s, to)| {
                let from = self.current(&s).unwrap_or_else(|| to.clone());
                (self.unknown.contains(&s) || from != to).then_some((s, from, to))
            })
            .collect();
        changes.sort_by_key(|(s, from, to)| (!to.restricts(from), s.clone()));
        let mut done: Vec<(Setting, Value)> = Vec::new();
        for (s, from, to) in changes {
            match self.write_with_retry(&s, &from, &to) {
                Ok(()) => {
                    tracing::info!(setting = %self.describe(&s), from = %from, to = %to, "write");
                    self.applied.insert(s.clone(), to);
                    self.unknown.remove(&s);
                    done.push((s, from));
                }
                Err((attempts, source)) => {
                    let rollback = self.roll_back(&s, &from, &to, done);
                    let failure = ActuatorWriteFailure {
                        what: self.describe(&s),
                        value: to.to_string(),
                        attempts,
                        source,
                        rollback,
                    };
                    tracing::error!(error = %failure, "actuator write failed");
                    return Err(ActuatorError::Write(Box::new(failure)));
                }
            }
        }
        Ok(done.len())
    }

    /// Undoes `done` newest first, and the failed write itself where it can be half-made (two
    /// schemata lines, four v1 throttle files, a partly built HTB tree).
    fn roll_back(
        &mut self,
        failed: &Setting,
        failed_from: &Value,
        failed_to: &Value,
        done: Vec<(Setting, Value)>,
    ) -> RollbackOutcome {
        let mut errors = Vec::new();
        if self.can_be_half_made(failed, failed_from, failed_to) {
            match self.write_with_retry(failed, failed_to, failed_from) {
                Ok(()) => {
                    self.applied.insert(failed.clone(), failed_from.clone());
                }
                Err((_, e)) => {
                    errors.push(format!(
                        "{} back to {failed_from}: {e}",
                        self.describe(failed)
                    ));
                    self.unknown.insert(failed.clone());
                }
            }
        }
        let undone = done.len();
        for (s, from) in done.into_iter().rev() {
            let now = self
                .applied
                .get(&s)
                .cloned()
                .unwrap_or_else(|| from.clone());
            match self.write_with_retry(&s, &now, &from) {
                Ok(()) => {
                    self.applied.insert(s, from);
                }
                Err((_, e)) => {
                    errors.push(format!("{} back to {from}: {e}", self.describe(&s)));
                    self.unknown.insert(s);
                }
            }
        }
        if !errors.is_empty() {
            RollbackOutcome::Incomplete(errors)
        } else if undone == 0 {
            RollbackOutcome::NothingToUndo
        } else {
            RollbackOutcome::RolledBack(undone)
        }
    }

    fn can_be_half_made(&self, s: &Setting, from: &Value, to: &Value) -> bool {
        match (s, to) {
            (Setting::Schemata(_), Value::Schemata(v)) => !v.l3.is_empty() && !v.mb.is_empty(),
            (Setting::Io(..), _) => self.io.as_ref().is_some_and(|io| io.v1),
            (Setting::Htb, _) => matches!(from, Value::Htb(None)),
            _ => false,
        }
    }

    fn write_with_retry(
        &mut self,
        s: &Setting,
        from: &Value,
        to: &Value,
    ) -> Result<(), (u32, HostError)> {
        let mut attempt = 1;
        loop {
            match self.write(s, from, to) {
                Ok(()) => return Ok(()),
                Err(e) if attempt < WRITE_ATTEMPTS => {
                    tracing::debug!(setting = %self.describe(s), value = %to, error = %e, attempt, "write failed; retrying");
                    self.retries += 1;
                    attempt += 1;
                    std::thread::sleep(RETRY_PAUSE);
                }
                Err(e) => return Err((attempt, e)),
            }
        }
    }

    fn write(&mut self, s: &Setting, from: &Value, to: &Value) -> Result<(), HostError> {
        let unsupported = || {
            HostError::invalid(
                "actuator setting",
                format!("{s:?} = {to:?}"),
                "not driven on this host",
            )
        };
        match (s, to) {
            (Setting::Schemata(name), Value::Schemata(schemata)) => {
                let r = self.resctrl.as_mut().ok_or_else(unsupported)?;
                let group = r.group_of(name);
                if !name.is_empty() {
                    r.resctrl.create_group(&group)?;
                    r.owned = true;
                }
                r.resctrl.set_schemata(&group, schemata)
            }
            (Setting::MaxFreq(cpu), Value::Khz(khz)) => {
                let f = self.freq.as_ref().ok_or_else(unsupported)?;
                f.cpufreq.set_max_khz(*cpu, *khz)
            }
            (Setting::Htb, Value::Htb(ceil)) => {
                let e = self.egress.as_ref().ok_or_else(unsupported)?;
                match (from, ceil) {
                    (_, None) => e.egress.teardown(),
                    (Value::Htb(Some(_)), Some(bits)) => e.egress.set_be_ceil(&e.htb, *bits),
                    (_, Some(bits)) => {
                        let mut htb = e.htb;
                        htb.be_ceil_bits_per_s = *bits;
                        e.egress.setup(&htb)
                    }
                }
            }
            (Setting::Io(group, device), Value::Io(limits)) => {
                let io = self.io.as_ref().ok_or_else(unsupported)?;
                io.cgroups.set_io_limits(group, *device, *limits)
            }
            _ => Err(unsupported()),
        }
    }

    /// The file or command a setting is written to.
    fn describe(&self, s: &Setting) -> String {
        match s {
            Setting::Schemata(name) => match &self.resctrl {
                Some(r) if name.is_empty() => {
                    r.resctrl.dir().join("schemata").display().to_string()
                }
                Some(r) => r
                    .resctrl
                    .dir()
                    .join(name)
                    .join("schemata")
                    .display()
                    .to_string(),
                None => format!("resctrl schemata of {name:?}"),
            },
            Setting::MaxFreq(cpu) => match &self.freq {
                Some(f) => f
                    .cpufreq
                    .cpu_dir()
                    .join(format!("cpu{cpu}/cpufreq/scaling_max_freq"))
                    .display()
                    .to_string(),
                None => format!("cpu{cpu}/cpufreq/scaling_max_freq"),
            },
            Setting::Htb => match &self.egress {
                Some(e) => format!("tc HTB on dev {}", e.egress.device()),
                None => "tc HTB".to_string(),
            },
            Setting::Io(group, device) => {
                let file = if self.io.as_ref().is_some_and(|io| io.v1) {
                    "blkio.throttle.*_device"
                } else {
                    "io.max"
                };
                format!("{file} of {group} for device {device}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    use headroom_host::tc::RecordingTc;
    use headroom_host::{KnobIo, RealIo};

    /// A temp-dir stand-in for the kernel's files: schemata and v1 throttle files keep one
    /// line per resource / device (as the kernel does), a resctrl `tasks` write adds a task,
    /// mkdir populates a group like resctrl and cgroupfs do, and chosen writes fail (EBUSY).
    #[derive(Debug)]
    struct FakeKernel {
        root: PathBuf,
        /// (path suffix, failures left; u32::MAX = for ever).
        faults: Mutex<Vec<(String, u32)>>,
        /// Successful writes: (path below the root, value).
        writes: Mutex<Vec<(String, String)>>,
    }

    impl FakeKernel {
        fn fail(&self, suffix: &str, times: u32) {
            self.faults
                .lock()
                .unwrap()
                .push((suffix.to_string(), times));
        }

        fn heal(&self) {
            self.faults.lock().unwrap().clear();
        }

        /// The writes to files ending in `suffix` since the last call (others are kept).
        fn take(&self, suffix: &str) -> Vec<String> {
            let mut all = self.writes.lock().unwrap();
            let (mine, rest): (Vec<_>, Vec<_>) =
                all.drain(..).partition(|(p, _)| p.ends_with(suffix));
            *all = rest;
            mine.into_iter().map(|(_, v)| v).collect()
        }

        fn merge(old: &str, new: &str, key: impl Fn(&str) -> String, remove: bool) -> String {
            let mut lines: Vec<String> = old
                .lines()
                .filter(|l| !l.trim().is_empty() && key(l) != key(new))
                .map(str::to_string)
                .collect();
            if !remove {
                lines.push(new.trim().to_string());
            }
            lines.sort();
            lines.iter().map(|l| format!("{l}\n")).collect()
        }
    }

    impl KnobIo for FakeKernel {
        fn read(&self, path: &Path) -> io::Result<String> {
            RealIo.read(path)
        }

        fn write(&self, path: &Path, value: &str) -> io::Result<()> {
            let shown = path.to_string_lossy().to_string();
            for (suffix, left) in self.faults.lock().unwrap().iter_mut() {
                if *left > 0 && shown.ends_with(suffix.as_str()) {
                    if *left != u32::MAX {
                        *left -= 1;
                    }
                    return Err(io::Error::from_raw_os_error(libc::EBUSY));
                }
            }
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let old = || std::fs::read_to_string(path);
            let content = if name == "schemata" {
                let key = |l: &str| l.split(':').next().unwrap_or("").trim().to_string();
                Self::merge(&old()?, value, key, false)
            } else if name.starts_with("blkio.throttle.") {
                let key = |l: &str| l.split_whitespace().next().unwrap_or("").to_string();
                let remove = value.split_whitespace().nth(1) == Some("0");
                Self::merge(&old()?, value, key, remove)
            } else if name == "tasks" && shown.contains("resctrl") {
                format!("{}{}\n", old()?, value.trim())
            } else {
                value.to_string()
            };
            RealIo.write(path, &content)?;
            let rel = path.strip_prefix(&self.root).unwrap_or(path);
            self.writes
                .lock()
                .unwrap()
                .push((rel.display().to_string(), value.trim().to_string()));
            Ok(())
        }

        fn create_dir(&self, path: &Path) -> io::Result<()> {
            std::fs::create_dir(path)?;
            if path.starts_with(self.root.join("sys/fs/resctrl")) {
                std::fs::write(path.join("schemata"), "L3:0=7ff;1=7ff\nMB:0=100;1=100\n")?;
                std::fs::write(path.join("tasks"), "")?;
            } else if path.starts_with(self.root.join("sys/fs/cgroup")) {
                for f in BLKIO_FILES.iter().chain(&["tasks", "cgroup.procs"]) {
                    std::fs::write(path.join(f), "")?;
                }
            }
            Ok(())
        }

        fn remove_dir(&self, path: &Path) -> io::Result<()> {
            std::fs::remove_dir_all(path)
        }
    }

    const BLKIO_FILES: &[&str] = &[
        "blkio.throttle.read_bps_device",
        "blkio.throttle.write_bps_device",
        "blkio.throttle.read_iops_device",
        "blkio.throttle.write_iops_device",
    ];

    /// A machine with resctrl (11 ways, MBA, two domains), cpufreq on CPUs 0-3 (0.8-3 GHz, no
    /// cap) and a v1 blkio hierarchy holding the BE group `hr/be`.
    struct Machine {
        dir: tempfile::TempDir,
        kernel: Arc<FakeKernel>,
    }

    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    impl Machine {
        fn new() -> Machine {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path();
            for (f, v) in [
                ("cbm_mask", "7ff"),
                ("min_cbm_bits", "1"),
                ("num_closids", "16"),
                ("shareable_bits", "0"),
            ] {
                put(root, &format!("sys/fs/resctrl/info/L3/{f}"), v);
            }
            for (f, v) in [
                ("bandwidth_gran", "10"),
                ("min_bandwidth", "10"),
                ("num_closids", "8"),
                ("delay_linear", "1"),
            ] {
                put(root, &format!("sys/fs/resctrl/info/MB/{f}"), v);
            }
            put(
                root,
                "sys/fs/resctrl/schemata",
                "L3:0=7ff;1=7ff\nMB:0=100;1=100\n",
            );
            put(root, "sys/fs/resctrl/tasks", "1\n2\n");
            for cpu in 0..4 {
                for (f, v) in [
                    ("cpuinfo_min_freq", "800000"),
                    ("cpuinfo_max_freq", "3000000"),
                    ("scaling_max_freq", "3000000"),
                    ("scaling_cur_freq", "2400000"),
                ] {
                    put(
                        root,
                        &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/{f}"),
                        v,
                    );
                }
            }
            for f in BLKIO_FILES.iter().chain(&["tasks", "cgroup.procs"]) {
                put(root, &format!("sys/fs/cgroup/blkio/{f}"), "");
            }
            put(
                root,
                "proc/self/mountinfo",
                "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                 40 31 0:29 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n",
            );
            let kernel = Arc::new(FakeKernel {
                root: root.to_path_buf(),
                faults: Mutex::new(Vec::new()),
                writes: Mutex::new(Vec::new()),
            });
            let m = Machine { dir, kernel };
            m.host().cgroups().unwrap().create(&be_group()).unwrap();
            m.kernel.take("");
            m
        }

        fn host(&self) -> LinuxHost {
            LinuxHost::with_io(self.dir.path(), self.kernel.clone())
        }

        fn read(&self, rel: &str) -> String {
            std::fs::read_to_string(self.dir.path().join(rel))
                .unwrap()
                .trim()
                .to_string()
        }

        fn freq(&self, cpu: usize) -> String {
            self.read(&format!(
                "sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_max_freq"
            ))
        }

        /// Every sub-actuator on, egress through a recording `tc`.
        fn actuators(&self) -> (Actuators, Arc<RecordingTc>) {
            let host = self.host();
            let tc = Arc::new(RecordingTc::new());
            let a = Actuators::probe(&host, &[0, 1, 2, 3])
                .with_io(host.cgroups().unwrap(), vec![be_group()])
                .with_egress_runner(tc.clone(), "eth0", 10_000_000_000)
                .unwrap();
            (a, tc)
        }
    }

    fn be_group() -> GroupPath {
        GroupPath::new("hr/be").unwrap()
    }

    fn io_limit(write_bps: u64) -> IoLimit {
        IoLimit {
            device: "254:0".into(),
            read_bps: None,
            write_bps: Some(write_bps),
            read_iops: None,
            write_iops: None,
        }
    }

    /// BE: top 3 ways, 40% memory bandwidth, 1.6 GHz, 1 Gbit/s egress, 10 MB/s writes.
    fn restricted() -> Allocation {
        Allocation {
            be_llc_ways: Some(3),
            be_mba_pct: Some(40),
            be_freq_khz: Some(1_600_000),
            be_egress_ceil_bytes_per_s: Some(125_000_000),
            be_io_limits: vec![io_limit(10_000_000)],
            ..Allocation::default()
        }
    }

    #[test]
    fn writes_every_field_once_then_only_what_changes() {
        let m = Machine::new();
        let (mut a, tc) = m.actuators();
        assert_eq!(
            a.active(),
            [RESCTRL_L3, RESCTRL_MBA, CPUFREQ, TC_HTB, IO],
            "{:?}",
            a.disabled()
        );
        // 2 schemata + 2 CPUs + the HTB tree + the io throttle
        assert_eq!(a.apply(&restricted(), &[2, 3]).unwrap(), 6);
        // BE takes ways from the LC: both masks narrow, the LC's (default group) first
        assert_eq!(
            m.kernel.take("resctrl/schemata"),
            ["L3:0=ff;1=ff", "MB:0=100;1=100"]
        );
        assert_eq!(
            m.kernel.take("headroom-be/schemata"),
            ["L3:0=700;1=700", "MB:0=40;1=40"]
        );
        assert_eq!(
            (m.freq(2).as_str(), m.freq(3).as_str()),
            ("1600000", "1600000")
        );
        assert_eq!(m.freq(0), "3000000");
        assert_eq!(
            m.read("sys/fs/cgroup/blkio/hr/be/blkio.throttle.write_bps_device"),
            "254:0 10000000"
        );
        assert!(
            tc.calls()
                .iter()
                .any(|c| c.contains("classid 1:20 htb rate 1000000000bit ceil 1000000000bit")),
            "{:?}",
            tc.calls()
        );

        // the same allocation again: nothing is written
        let (files, commands) = (m.kernel.writes.lock().unwrap().len(), tc.calls().len());
        assert_eq!(a.apply(&restricted(), &[2, 3]).unwrap(), 0);
        assert_eq!(m.kernel.writes.lock().unwrap().len(), files);
        assert_eq!(tc.calls().len(), commands);

        // only the frequency moves: only the two CPUs' caps are written
        let mut slower = restricted();
        slower.be_freq_khz = Some(1_200_000);
        m.kernel.take("");
        assert_eq!(a.apply(&slower, &[2, 3]).unwrap(), 2);
        let written: Vec<String> = m.kernel.take("");
        assert_eq!(written, ["1200000", "1200000"]);
        assert_eq!(tc.calls().len(), commands);

        // BE grows to 5 ways and leaves CPU 3: BE's mask widens after the LC's narrows, and
        // CPU 3 gets its original cap back
        let mut grown = slower.clone();
        grown.be_llc_ways = Some(5);
        assert_eq!(a.apply(&grown, &[2]).unwrap(), 3);
        let order: Vec<String> = m
            .kernel
            .writes
            .lock()
            .unwrap()
            .iter()
            .map(|(p, _)| p.clone())
            .collect();
        assert_eq!(
            order,
            [
                "sys/fs/resctrl/schemata",
                "sys/fs/resctrl/schemata",
                "sys/fs/resctrl/headroom-be/schemata",
                "sys/fs/resctrl/headroom-be/schemata",
                "sys/devices/system/cpu/cpu3/cpufreq/scaling_max_freq",
            ]
        );
        assert_eq!(m.freq(3), "3000000");
        assert_eq!(
            m.read("sys/fs/resctrl/schemata"),
            "L3:0=3f;1=3f\nMB:0=100;1=100"
        );
    }

    #[test]
    fn restore_puts_every_original_back_and_removes_the_resctrl_group() {
        let m = Machine::new();
        let (mut a, tc) = m.actuators();
        a.apply(&restricted(), &[2, 3]).unwrap();
        // egress back to "no limit": the tree stays, BE may use the whole link
        let mut open = restricted();
        open.be_egress_ceil_bytes_per_s = None;
        assert_eq!(a.apply(&open, &[2, 3]).unwrap(), 1);
        assert!(tc.calls().last().unwrap().contains("ceil 10000000000bit"));
        assert!(m.dir.path().join("sys/fs/resctrl/headroom-be").is_dir());

        a.restore().unwrap();
        assert_eq!(
            m.read("sys/fs/resctrl/schemata"),
            "L3:0=7ff;1=7ff\nMB:0=100;1=100"
        );
        assert!(!m.dir.path().join("sys/fs/resctrl/headroom-be").exists());
        assert_eq!(
            (m.freq(2).as_str(), m.freq(3).as_str()),
            ("3000000", "3000000")
        );
        assert_eq!(
            m.read("sys/fs/cgroup/blkio/hr/be/blkio.throttle.write_bps_device"),
            ""
        );
        assert_eq!(tc.calls().last().unwrap(), "qdisc del dev eth0 root");
        // a second restore has nothing left to do
        m.kernel.take("");
        let commands = tc.calls().len();
        a.restore().unwrap();
        assert!(m.kernel.take("").is_empty());
        assert_eq!(tc.calls().len(), commands);
        // and actuating again starts from the same originals (the group is made anew)
        assert_eq!(a.apply(&restricted(), &[2]).unwrap(), 5);
        assert!(m.dir.path().join("sys/fs/resctrl/headroom-be").is_dir());
        a.restore().unwrap();
        assert_eq!(m.freq(2), "3000000");
    }

    #[test]
    fn a_failing_second_write_rolls_back_the_first() {
        let m = Machine::new();
        let (mut a, _tc) = m.actuators();
        let caps = Allocation {
            be_freq_khz: Some(1_600_000),
            ..Allocation::default()
        };
        // CPU 2's cap is written, CPU 3's keeps failing: CPU 2 goes back to its original
        m.kernel.fail("cpu3/cpufreq/scaling_max_freq", u32::MAX);
        let err = a.apply(&caps, &[2, 3]).unwrap_err().to_string();
        assert!(
            err.contains("cpu3/cpufreq/scaling_max_freq to 1600000 kHz failed after 3 attempts"),
            "{err}"
        );
        assert!(err.contains("rolled back 1 earlier write"), "{err}");
        assert_eq!(
            m.kernel.take("cpu2/cpufreq/scaling_max_freq"),
            ["1600000", "3000000"]
        );
        assert_eq!(m.freq(2), "3000000");
        // nothing was recorded as applied: once the file takes writes, both are written
        m.kernel.heal();
        assert_eq!(a.apply(&caps, &[2, 3]).unwrap(), 2);
        assert_eq!(
            (m.freq(2).as_str(), m.freq(3).as_str()),
            ("1600000", "1600000")
        );

        // resctrl: the LC's mask is narrowed first; when BE's group refuses its schemata (three
        // times) the LC gets its whole cache back
        m.kernel.fail("headroom-be/schemata", WRITE_ATTEMPTS);
        let ways = Allocation {
            be_llc_ways: Some(4),
            be_freq_khz: Some(1_600_000),
            ..Allocation::default()
        };
        let err = a.apply(&ways, &[2, 3]).unwrap_err().to_string();
        assert!(err.contains("headroom-be/schemata"), "{err}");
        assert!(err.contains("rolled back 1 earlier write"), "{err}");
        assert_eq!(
            m.read("sys/fs/resctrl/schemata"),
            "L3:0=7ff;1=7ff\nMB:0=100;1=100"
        );
        m.kernel.heal();
        assert_eq!(a.apply(&ways, &[2, 3]).unwrap(), 2);
        assert_eq!(
            m.read("sys/fs/resctrl/schemata"),
            "L3:0=7f;1=7f\nMB:0=100;1=100"
        );
    }

    #[test]
    fn a_failing_write_is_retried_up_to_three_times() {
        let m = Machine::new();
        let (mut a, _tc) = m.actuators();
        let limits = Allocation {
            be_io_limits: vec![io_limit(5_000_000)],
            ..Allocation::default()
        };
        // two EBUSYs, then the write goes through
        m.kernel.fail("blkio.throttle.read_bps_device", 2);
        assert_eq!(a.apply(&limits, &[]).unwrap(), 1);
        assert_eq!(a.retries(), 2);
        assert_eq!(
            m.read("sys/fs/cgroup/blkio/hr/be/blkio.throttle.write_bps_device"),
            "254:0 5000000"
        );
        // three: given up, and the half-made v1 change (four files) is undone
        m.kernel.fail("blkio.throttle.write_iops_device", 3);
        let err = a
            .apply(
                &Allocation {
                    be_io_limits: vec![io_limit(7_000_000)],
                    ..Allocation::default()
                },
                &[],
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("failed after 3 attempts"), "{err}");
        assert!(err.contains("of hr/be for device 254:0"), "{err}");
        assert_eq!(
            m.read("sys/fs/cgroup/blkio/hr/be/blkio.throttle.write_bps_device"),
            "254:0 5000000"
        );
        // a device that leaves the list gets its original throttles back
        assert_eq!(a.apply(&Allocation::default(), &[]).unwrap(), 1);
        assert_eq!(
            m.read("sys/fs/cgroup/blkio/hr/be/blkio.throttle.write_bps_device"),
            ""
        );
    }

    #[test]
    fn a_missing_mechanism_disables_only_its_sub_actuator() {
        let m = Machine::new();
        std::fs::remove_dir_all(m.dir.path().join("sys/devices/system/cpu/cpu1/cpufreq")).unwrap();
        let (mut a, _tc) = m.actuators();
        assert_eq!(a.active(), [RESCTRL_L3, RESCTRL_MBA, TC_HTB, IO]);
        let reason = &a.disabled().iter().find(|(n, _)| *n == CPUFREQ).unwrap().1;
        assert!(
            reason.contains("cpu1/cpufreq/scaling_max_freq missing"),
            "{reason}"
        );
        let status = a.status_json();
        assert_eq!(status["disabled"][0]["actuator"], CPUFREQ);
        // the frequency field is ignored, the rest is written
        assert_eq!(a.apply(&restricted(), &[2, 3]).unwrap(), 4);
        assert_eq!(m.freq(2), "3000000");
        assert_eq!(
            m.read("sys/fs/resctrl/headroom-be/schemata"),
            "L3:0=700;1=700\nMB:0=40;1=40"
        );
        let mut mech = Mechanisms::default();
        a.limit_mechanisms(&mut mech);
        assert!(mech.resctrl_l3 && mech.resctrl_mba && mech.io && mech.tc_htb && !mech.cpufreq);
        a.restore().unwrap();

        // no resctrl at all: both of its parts are off, with the reason
        let bare = Machine::new();
        std::fs::remove_dir_all(bare.dir.path().join("sys/fs/resctrl")).unwrap();
        let (a, _tc) = bare.actuators();
        assert_eq!(a.active(), [CPUFREQ, TC_HTB, IO]);
        let reason = &a
            .disabled()
            .iter()
            .find(|(n, _)| *n == RESCTRL_L3)
            .unwrap()
            .1;
        assert!(reason.contains("not mounted"), "{reason}");

        // the config turns parts off, and no [egress] device means no egress
        let config = Config::from_toml_str(
            "[lc]\nname = \"x\"\ncgroup = \"hr/lc\"\n[lc.slo]\ntarget_us = 500\n[policy]\nkind = \"none\"\n[actuators]\nresctrl = false\nio = false\n",
        )
        .unwrap();
        let host = m.host();
        let a = Actuators::from_config(
            &host,
            &config,
            host.cgroups().ok().as_ref(),
            &[be_group()],
            &[0],
        )
        .unwrap();
        assert_eq!(a.active(), [CPUFREQ]);
        let reasons: BTreeMap<&str, &str> =
            a.disabled().iter().map(|(n, r)| (*n, r.as_str())).collect();
        assert_eq!(
            reasons[RESCTRL_L3],
            "turned off by actuators.resctrl = false"
        );
        assert_eq!(reasons[IO], "turned off by actuators.io = false");
        assert_eq!(reasons[TC_HTB], "no [egress] device configured");
    }

    #[test]
    fn be_tasks_are_moved_into_the_resctrl_group() {
        let m = Machine::new();
        let (mut a, _tc) = m.actuators();
        // no group before the first allocation that restricts BE's cache or bandwidth
        assert_eq!(a.assign_be_tasks(&[101, 102]).unwrap(), 0);
        assert!(!m.dir.path().join("sys/fs/resctrl/headroom-be").exists());
        a.apply(
            &Allocation {
                be_mba_pct: Some(50),
                ..Allocation::default()
            },
            &[],
        )
        .unwrap();
        assert_eq!(a.assign_be_tasks(&[101, 102]).unwrap(), 2);
        assert_eq!(m.read("sys/fs/resctrl/headroom-be/tasks"), "101\n102");
        // threads come and go: only the new one is written
        m.kernel.take("");
        assert_eq!(a.assign_be_tasks(&[102, 103]).unwrap(), 1);
        assert_eq!(m.kernel.take("tasks"), ["103"]);
        // a thread that exited meanwhile (ESRCH) is skipped, another error is reported
        m.kernel.fail("headroom-be/tasks", 1);
        let err = a.assign_be_tasks(&[104]).unwrap_err().to_string();
        assert!(err.contains("headroom-be/tasks to 104"), "{err}");
        a.restore().unwrap();
        assert_eq!(a.assign_be_tasks(&[105]).unwrap(), 0);
    }

    #[test]
    fn refuses_a_partition_that_leaves_the_lc_nothing() {
        let m = Machine::new();
        let (mut a, _tc) = m.actuators();
        let all = Allocation {
            be_llc_ways: Some(11),
            ..Allocation::default()
        };
        let err = a.apply(&all, &[0]).unwrap_err().to_string();
        assert!(err.contains("be_llc_ways = 11"), "{err}");
        assert!(m.kernel.take("").is_empty(), "nothing is written");
        assert!(!m.dir.path().join("sys/fs/resctrl/headroom-be").exists());
    }

    #[test]
    fn a_group_left_by_a_crashed_agent_is_adopted_and_the_whole_cache_restored() {
        let m = Machine::new();
        // the earlier agent had narrowed the default group and made its BE group
        put(
            m.dir.path(),
            "sys/fs/resctrl/schemata",
            "L3:0=ff;1=ff\nMB:0=100;1=100\n",
        );
        put(
            m.dir.path(),
            "sys/fs/resctrl/headroom-be/schemata",
            "L3:0=700;1=700\nMB:0=40;1=40\n",
        );
        put(m.dir.path(), "sys/fs/resctrl/headroom-be/tasks", "");
        let (mut a, _tc) = m.actuators();
        assert_eq!(
            a.assign_be_tasks(&[7]).unwrap(),
            1,
            "the group is the agent's"
        );
        // the same allocation as before the crash: the BE group is rewritten (its state unknown)
        a.apply(
            &Allocation {
                be_llc_ways: Some(3),
                ..Allocation::default()
            },
            &[],
        )
        .unwrap();
        assert_eq!(
            m.kernel.take("headroom-be/schemata"),
            ["L3:0=700;1=700", "MB:0=100;1=100"]
        );
        a.restore().unwrap();
        assert_eq!(
            m.read("sys/fs/resctrl/schemata"),
            "L3:0=7ff;1=7ff\nMB:0=100;1=100"
        );
        assert!(!m.dir.path().join("sys/fs/resctrl/headroom-be").exists());
    }

    fn skip(test: &str, reason: &str) {
        eprintln!("SKIP {test}: {reason}");
    }

    /// A whole disk's `MAJ:MIN` (throttles refuse partitions, loop and RAM disks are skipped).
    fn a_disk() -> Option<String> {
        let mut names: Vec<String> = std::fs::read_dir("/sys/block")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|n| {
                !["loop", "ram", "zram", "nbd"]
                    .iter()
                    .any(|p| n.starts_with(p))
            })
            .collect();
        names.sort();
        let name = names.first()?;
        Some(
            std::fs::read_to_string(format!("/sys/block/{name}/dev"))
                .ok()?
                .trim()
                .to_string(),
        )
    }

    /// A cgroup removed on drop.
    struct ScratchGroup(Cgroups, GroupPath);

    impl Drop for ScratchGroup {
        fn drop(&mut self) {
            let _ = self.0.remove(&self.1);
        }
    }

    #[test]
    fn io_limits_on_the_real_kernel() {
        const TEST: &str = "io_limits_on_the_real_kernel";
        if !nix::unistd::geteuid().is_root() {
            return skip(TEST, "not root");
        }
        let host = LinuxHost::system();
        let cgroups = match host.cgroups() {
            Ok(c) if c.has(Controller::Io) => c,
            Ok(_) => return skip(TEST, "no io/blkio controller"),
            Err(e) => return skip(TEST, &format!("no cgroups: {e}")),
        };
        let Some(device) = a_disk() else {
            return skip(TEST, "no whole disk in /sys/block");
        };
        let group = GroupPath::new(&format!(
            "headroom-test-actuators-io-{}",
            std::process::id()
        ))
        .unwrap();
        if let Err(e) = cgroups.create(&group) {
            return skip(TEST, &format!("cgroupfs not writable: {e}"));
        }
        let _scratch = ScratchGroup(cgroups.clone(), group.clone());
        let dev: DeviceId = device.parse().unwrap();
        let empty = tempfile::tempdir().unwrap();
        let mut a = Actuators::probe(&LinuxHost::new(empty.path()), &[])
            .with_io(cgroups.clone(), vec![group.clone()]);
        assert_eq!(a.active(), [IO], "{:?}", a.disabled());
        let limits = Allocation {
            be_io_limits: vec![IoLimit {
                device: device.clone(),
                read_bps: None,
                write_bps: Some(10_485_760),
                read_iops: Some(500),
                write_iops: None,
            }],
            ..Allocation::default()
        };
        assert_eq!(a.apply(&limits, &[]).unwrap(), 1);
        assert_eq!(
            cgroups.io_limits(&group, dev).unwrap(),
            IoLimits {
                read_bps: None,
                write_bps: Some(10_485_760),
                read_iops: Some(500),
                write_iops: None,
            }
        );
        assert_eq!(a.apply(&limits, &[]).unwrap(), 0);
        a.restore().unwrap();
        assert_eq!(cgroups.io_limits(&group, dev).unwrap(), IoLimits::default());
    }

    #[test]
    fn egress_ceil_on_a_real_veth_in_a_network_namespace() {
        const TEST: &str = "egress_ceil_on_a_real_veth_in_a_network_namespace";
        if !nix::unistd::geteuid().is_root() {
            return skip(TEST, "not root");
        }
        let run = |program: &str, args: &[&str]| -> Result<String, String> {
            let out = std::process::Command::new(program)
                .args(args)
                .output()
                .map_err(|e| format!("cannot run {program}: {e}"))?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            } else {
                Err(format!(
                    "{program} {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        if run("tc", &["-V"]).is_err() {
            return skip(TEST, "tc (iproute2) not installed");
        }
        let ns = format!("hr-act-{}", std::process::id());
        if let Err(e) = run("ip", &["netns", "add", &ns]) {
            return skip(TEST, &format!("cannot create a network namespace: {e}"));
        }
        struct Netns(String);
        impl Drop for Netns {
            fn drop(&mut self) {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", &self.0])
                    .output();
            }
        }
        let _netns = Netns(ns.clone());
        let veth = [
            "-n", &ns, "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b",
        ];
        if let Err(e) =
            run("ip", &veth).and_then(|_| run("ip", &["-n", &ns, "link", "set", "veth-a", "up"]))
        {
            return skip(TEST, &format!("cannot make a veth pair: {e}"));
        }
        let empty = tempfile::tempdir().unwrap();
        let mut a = Actuators::probe(&LinuxHost::new(empty.path()), &[])
            .with_egress_runner(Arc::new(SystemTc::in_netns(&ns)), "veth-a", 1_000_000_000)
            .unwrap();
        assert_eq!(a.active(), [TC_HTB]);
        let classes = || run("tc", &["-n", &ns, "class", "show", "dev", "veth-a"]).unwrap();
        let ceil = |bytes| Allocation {
            be_egress_ceil_bytes_per_s: Some(bytes),
            ..Allocation::default()
        };
        if let Err(e) = a.apply(&ceil(12_500_000), &[]) {
            return skip(TEST, &format!("HTB unavailable: {e}"));
        }
        let shown = classes();
        let be = shown
            .lines()
            .find(|l| l.contains("htb 1:20"))
            .unwrap_or_default()
            .to_string();
        assert!(be.contains("ceil 100Mbit"), "{shown}");
        assert_eq!(a.apply(&ceil(12_500_000), &[]).unwrap(), 0);
        assert_eq!(a.apply(&ceil(25_000_000), &[]).unwrap(), 1);
        let shown = classes();
        let be = shown
            .lines()
            .find(|l| l.contains("htb 1:20"))
            .unwrap_or_default()
            .to_string();
        assert!(be.contains("ceil 200Mbit"), "{shown}");
        a.restore().unwrap();
        let qdiscs = run("tc", &["-n", &ns, "qdisc", "show", "dev", "veth-a"]).unwrap();
        assert!(!qdiscs.contains("htb"), "{qdiscs}");
    }
}
