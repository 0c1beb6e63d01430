//! Pure policies: an [`Observation`] and the injected monotonic time in, a [`Decision`] out.
//!
//! No policy reads files or clocks; every constant is a config key. [`build`] returns the
//! configured policy wrapped in the safety rules ([`Guarded`]), which override every policy.

pub(crate) mod blind;
pub(crate) mod heracles;
pub(crate) mod hybrid;
pub(crate) mod multi;
mod safety;
pub(crate) mod simple;
#[cfg(test)]
mod testing;
pub(crate) mod weights;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{Config, ConfigError, PolicyKind};
use headroom_types::allocation::Allocation;
pub use headroom_types::decision::Decision;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;

pub use blind::Blind;
pub use heracles::Heracles;
pub use hybrid::Hybrid;
pub use multi::Multi;
pub use safety::Guarded;
pub use simple::{NonePolicy, StaticCores, StaticCycles};
pub use weights::Weights;

/// A colocation policy.
pub trait Policy: Send {
    /// The config spelling of the policy (`policy.kind`).
    fn name(&self) -> &'static str;

    /// Decides the allocation for this tick. `now` is monotonic time since the agent started,
    /// injected by the caller (never read from a clock here).
    fn decide(&mut self, obs: &Observation, now: Duration) -> Decision;

    /// How often the runtime should call [`Policy::decide`].
    fn poll_interval(&self) -> Duration;

    /// Tells the policy what was finally emitted after the safety rules, so it can resync its
    /// own state (e.g. blind isolation's S) when a rule held or cut its proposal.
    fn applied(&mut self, _allocation: &Allocation) {}

    /// Adopts changed parameters from `config` (same `policy.kind`), keeping the policy's state.
    fn reconfigure(&mut self, config: &Config);

    /// `ctl set KEY=VALUE`: changes a config key live, with validation.
    fn set_param(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        Err(ConfigError::Invalid {
            key: key.to_string(),
            value: format!("{value:?}"),
            reason: format!("policy {} takes no live changes", self.name()),
        })
    }

    /// `ctl pause`: hold the current allocation (safety rules still apply).
    fn pause(&mut self) {}

    /// `ctl resume`.
    fn resume(&mut self) {}

    /// Whether the policy is paused.
    fn is_paused(&self) -> bool {
        false
    }

    /// Whether [`Decision::state`] is filled (default: on). The runtime turns it off when no
    /// decision log is written: building the state (a JSON map) would otherwise be most of a
    /// 1 ms poll's cost. Allocations and reasons do not depend on it.
    fn set_explain(&mut self, _on: bool) {}

    /// The idle buffer B this policy keeps now (blind isolation, hybrid's inner loop, whose
    /// outer loop moves it): an event-driven agent arms the kernel's idle-count thresholds
    /// from it. `None` for policies that do not decide on the idle count.
    fn idle_buffer(&self) -> Option<f64> {
        None
    }

    /// Whether an idle-count crossing can change this policy's next decision now: `false`
    /// (BE disabled, paused) disarms the kernel's thresholds, so a flapping CPU wakes nothing.
    fn idle_crossings_matter(&self) -> bool {
        true
    }

    /// Which idle-count crossings can change the next decision now: a fall only where BE can
    /// still shrink, a rise only where it can still grow (not at its limit, not with growth
    /// disallowed). The kernel's thresholds are armed for these alone.
    fn idle_crossings(&self) -> IdleCrossings {
        if self.idle_crossings_matter() {
            IdleCrossings::BOTH
        } else {
            IdleCrossings::NONE
        }
    }
}

/// The idle-count crossings that can change a policy's decision ([`Policy::idle_crossings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleCrossings {
    /// A fall below the low threshold (BE can shrink).
    pub falls: bool,
    /// A rise to the high threshold (BE can grow).
    pub rises: bool,
}

impl IdleCrossings {
    pub const BOTH: IdleCrossings = IdleCrossings {
        falls: true,
        rises: true,
    };
    pub const NONE: IdleCrossings = IdleCrossings {
        falls: false,
        rises: false,
    };

    pub fn any(self) -> bool {
        self.falls || self.rises
    }
}

pub use headroom_types::mechanism::{Mechanism, MechanismSet};
/// The mechanisms a policy may use (the shared [`MechanismSet`]); a policy part whose
/// mechanism is missing is disabled with a reason in the decision state.
pub type Mechanisms = MechanismSet;

/// The machine a policy runs on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    /// Online CPU ids, sorted.
    pub cpus: Vec<u32>,
    /// CPUs of each socket (sorted); empty = a single socket holding every CPU.
    #[serde(default)]
    pub sockets: Vec<Vec<u32>>,
    /// LLC ways (resctrl `cbm_mask` width); absent = no cache allocation.
    #[serde(default)]
    pub llc_ways: Option<u32>,
    #[serde(default)]
    pub mechanisms: Mechanisms,
    /// The host's `kernel.pid_max`, where read: the default `safety.be_pids_max` is a quarter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_max: Option<u64>,
    /// The host's `kernel.threads-max`, where read: a fork fails past it whatever `pid_max`
    /// is (on a host of 4 GiB or less it is below 32768, `pid_max` often 4194304).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads_max: Option<u64>,
}

impl MachineInfo {
    /// A single-socket machine with CPUs `0..n`, every mechanism available, 20 LLC ways.
    pub fn with_cpus(n: u32) -> MachineInfo {
        MachineInfo {
            cpus: (0..n).collect(),
            sockets: Vec::new(),
            llc_ways: Some(20),
            mechanisms: Mechanisms::default(),
            pid_max: None,
            threads_max: None,
        }
    }

    /// The most tasks (processes and threads) the host hands out: the lower of `pid_max`
    /// (the kernel's default 32768 where unread) and `threads_max`; `None` where neither was
    /// read. The default `safety.be_pids_max` is a quarter, shared among the BE groups.
    pub fn host_tasks(&self) -> Option<u64> {
        match (self.pid_max, self.threads_max) {
            (None, None) => None,
            (p, t) => Some(
                p.unwrap_or(crate::config::KERNEL_DEFAULT_PID_MAX)
                    .min(t.unwrap_or(u64::MAX)),
            ),
        }
    }

    /// The CPUs of socket `index`, or every CPU when the machine reports no sockets or fewer.
    pub fn socket_cpus(&self, index: u32) -> Vec<u32> {
        match self.sockets.get(index as usize) {
            Some(cpus) if !cpus.is_empty() => cpus.clone(),
            _ => self.cpus.clone(),
        }
    }
}

/// Builds the configured policy inside the safety wrapper.
pub fn build(config: &Config, machine: &MachineInfo) -> Box<dyn Policy> {
    Box::new(Guarded::new(config, machine))
}

/// Builds the bare configured policy, without the safety rules (for tests and simulation).
pub fn build_unguarded(config: &Config, machine: &MachineInfo) -> Box<dyn Policy> {
    match config.policy.kind {
        PolicyKind::None => Box::new(NonePolicy::new(config, machine)),
        PolicyKind::StaticCores => Box::new(StaticCores::new(config, machine)),
        PolicyKind::StaticCycles => Box::new(StaticCycles::new(config, machine)),
        PolicyKind::Weights => Box::new(Weights::new(config, machine)),
        PolicyKind::Blind => Box::new(Blind::new(config, machine)),
        PolicyKind::Heracles => Box::new(Heracles::new(config, machine)),
        PolicyKind::Hybrid => Box::new(Hybrid::new(config, machine)),
        PolicyKind::Multi => Box::new(Multi::new(config, machine)),
    }
}

/// CPUs BE may be given: `allowed` (empty = every online CPU) minus the CPUs the LC is pinned to
/// — from the LC threads' observed affinity (when it is a strict subset of the machine) and from
/// the agent's own pinning — sorted.
pub fn be_candidate_cpus(
    machine: &MachineInfo,
    allowed: &CpuSet,
    config: &Config,
    obs: &Observation,
) -> Vec<u32> {
    let base: Vec<u32> = if allowed.is_empty() {
        machine.cpus.clone()
    } else {
        machine
            .cpus
            .iter()
            .copied()
            .filter(|&c| allowed.contains(c))
            .collect()
    };
    let lc = lc_pinned_cpus(machine, config, obs);
    base.into_iter().filter(|c| !lc.contains(c)).collect()
}

/// The CPUs the LC is pinned to (observed or configured), empty when it is not pinned.
pub fn lc_pinned_cpus(machine: &MachineInfo, config: &Config, obs: &Observation) -> Vec<u32> {
    let mut lc = Vec::new();
    if let Some(cpus) = &obs.lc_cpus {
        let covers_all = machine.cpus.iter().all(|c| cpus.contains(c));
        if !covers_all {
            lc.extend(cpus.iter().copied());
        }
    }
    let threads = &config.lc().threads;
    if threads.pin && !threads.cpus.is_empty() {
        lc.extend(threads.cpus.iter());
    }
    lc.sort_unstable();
    lc.dedup();
    lc
}

/// A CPU list derived from the machine, the config and `obs.lc_cpus` — its only per-tick
/// input, which changes at most once per slow sensor period — kept between ticks and recomputed
/// only when `obs.lc_cpus` differs from the one it was computed for (or after [`LcCpusMemo::clear`],
/// which the owner calls when its config changes).
#[derive(Debug, Clone, Default)]
pub(crate) struct LcCpusMemo {
    /// The `obs.lc_cpus` the value was computed for; `None` = nothing computed.
    key: Option<Option<Vec<u32>>>,
    value: Vec<u32>,
}

impl LcCpusMemo {
    /// The value for `obs`, from `compute` when the memo does not hold it.
    pub(crate) fn get(&mut self, obs: &Observation, compute: impl FnOnce() -> Vec<u32>) -> &[u32] {
        if self.key.as_ref() != Some(&obs.lc_cpus) {
            self.value = compute();
            match &mut self.key {
                Some(k) => k.clone_from(&obs.lc_cpus),
                None => self.key = Some(obs.lc_cpus.clone()),
            }
        }
        &self.value
    }

    /// Forgets the value (the config it was derived from changed).
    pub(crate) fn clear(&mut self) {
        self.key = None;
    }
}

/// The `n` highest-numbered of `candidates` (sorted ascending): BE takes CPUs from the top, away
/// from CPU 0 where interrupts and the LC usually sit.
pub fn take_top_cpus(candidates: &[u32], n: usize) -> CpuSet {
    let n = n.min(candidates.len());
    candidates[candidates.len() - n..].iter().copied().collect()
}

/// A century: never reached, yet added to any instant without overflow.
const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Seconds as a `Duration`, saturating on nonsense (config validation keeps them sane).
pub(crate) fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).map_or(FAR, |d| d.min(FAR))
}

/// Rounds to 1e-6 so repeated fractional steps do not drift (and replay stays exact).
pub(crate) fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}
