//! The safety rules (docs/architecture.md "Safety rules"), applied in one wrapper around every policy:
//!
//! 1. The LC is never restricted: its treatment comes from `[lc.threads]` only, its CPU weight
//!    is never below the default, and BE never gets the CPUs the LC is pinned to.
//! 2. Unknown or stale LC latency (older than `safety.latency_max_age_ms`) → BE stops growing;
//!    after `stale_disable_ticks` ticks or `stale_disable_ms` of it → BE disabled.
//! 3. A cooldown after an SLO violation: latency above the target disables BE for
//!    `violation_cooldown_s` — judged only from a figure that can be trusted (one the sensors
//!    mark untrusted holds BE without a cooldown; the state names the judging source). Shrink fast, grow slowly: shrinks pass at once; BE grows at most
//!    once per `grow_interval_ms` and not within `grow_after_shrink_ms` of a shrink (each policy
//!    also paces itself).
//! 4. Low memory (MemAvailable below `min_mem_available_bytes`, or memory PSI full avg10 above
//!    `max_memory_psi_full`) → BE disabled and killed (PerfIso's memory kill switch).
//!
//! Rules 2–3 need `[lc.latency]`; they do not apply to the `none` baseline, whose purpose is to
//! show what happens without control. Parts of an allocation whose mechanism the host lacks are
//! dropped here (and named in the state), so the reconciler never attempts them.
//! `pause` holds the policy's last decision (the rules still apply); `set` changes a config key
//! live, keeping the policy's state.

use std::borrow::Cow;
use std::time::Duration;

use serde_json::json;

use super::{
    build_unguarded, lc_pinned_cpus, IdleCrossings, LcCpusMemo, MachineInfo, Mechanism, Policy,
};

mod multi;
use crate::config::{Config, ConfigError, PolicyKind};
use headroom_types::allocation::{Allocation, CpuWeight, LcTreatment};
use headroom_types::decision::Decision;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;

/// A policy inside the safety rules.
pub struct Guarded {
    config: Config,
    machine: MachineInfo,
    inner: Box<dyn Policy>,
    paused: bool,
    /// The policy's last allocation and reason, held while paused.
    held: Option<(Allocation, String)>,
    last: Option<Allocation>,
    stale_ticks: u64,
    stale_since: Option<Duration>,
    /// The last trusted SLO violation: the cooldown runs `safety.violation_cooldown_s` from it,
    /// read at each decision, so a live `set` of the cooldown applies to a running one (fourth
    /// hostile pass: a shorter value waited out the old one).
    violation_at: Option<Duration>,
    /// The latency source that judged the violation starting the cooldown (`kernel`, `probe`,
    /// … or `latency` where the observation names none), for the decision log.
    violation_judged_by: Option<String>,
    /// A rule (stale signal, violation cooldown, memory, no CPU besides the LC's) turned the
    /// policy's enabled BE off at the last decision.
    rules_hold_be_off: bool,
    last_grow: Option<Duration>,
    last_shrink: Option<Duration>,
    explain: bool,
    /// The CPUs the LC is pinned to (they change only with the LC's affinity or the config).
    lc_cpus: LcCpusMemo,
    /// The service that bound the policy's last decision (held while paused).
    binding: Option<String>,
}

impl Guarded {
    pub fn new(config: &Config, machine: &MachineInfo) -> Self {
        Guarded::wrap(config, machine, build_unguarded(config, machine))
    }

    /// Wraps an already built policy.
    pub fn wrap(config: &Config, machine: &MachineInfo, inner: Box<dyn Policy>) -> Self {
        Guarded {
            config: config.clone(),
            machine: machine.clone(),
            inner,
            paused: false,
            held: None,
            last: None,
            stale_ticks: 0,
            stale_since: None,
            violation_at: None,
            violation_judged_by: None,
            rules_hold_be_off: false,
            last_grow: None,
            last_shrink: None,
            explain: true,
            lc_cpus: LcCpusMemo::default(),
            binding: None,
        }
    }

    /// When the violation cooldown ends: the last violation plus the cooldown configured now.
    fn violation_until(&self) -> Option<Duration> {
        self.violation_at
            .map(|t| t.saturating_add(super::secs(self.config.safety.violation_cooldown_s)))
    }

    /// The live configuration (after any `set`).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Replaces the policy's LC treatment with the one `[lc.threads]` gives (keeping only the
    /// policy's CPU weight, raised to at least the default), reusing `lc`'s buffer.
    fn set_lc_treatment(&self, lc: &mut LcTreatment) {
        let t = &self.config.lc().threads;
        if t.pin {
            lc.pin_cpus = Some(if t.cpus.is_empty() {
                CpuSet::from(self.machine.cpus.as_slice())
            } else {
                t.cpus.clone()
            });
        } else {
            lc.pin_cpus = None;
        }
        lc.slice_us = t.slice_us;
        lc.fifo_priority = t.fifo_priority;
        lc.cpu_weight = lc.cpu_weight.map(|w| CpuWeight {
            shares: w.shares.max(CpuWeight::DEFAULT.shares),
            weight: w.weight.max(CpuWeight::DEFAULT.weight),
        });
    }

    /// Drops what the host cannot do; returns the names of what was dropped.
    fn drop_missing_mechanisms(&self, a: &mut Allocation) -> Vec<&'static str> {
        let m = self.machine.mechanisms;
        let mut dropped = Vec::new();
        let mut drop = |mechanism: Mechanism, is_set: bool| {
            if !m.has(mechanism) && is_set {
                dropped.push(mechanism.name());
                true
            } else {
                false
            }
        };
        if drop(Mechanism::CpuIdle, a.be_cpu_idle == Some(true)) {
            a.be_cpu_idle = None;
            a.be_cpu_weight.get_or_insert(CpuWeight::BATCH);
        }
        if drop(Mechanism::CpuQuota, a.be_quota_pct.is_some()) {
            a.be_quota_pct = None;
            a.be_quota_period_us = None;
        }
        if drop(Mechanism::ResctrlL3, a.be_llc_ways.is_some()) {
            a.be_llc_ways = None;
        }
        if drop(Mechanism::ResctrlMba, a.be_mba_pct.is_some()) {
            a.be_mba_pct = None;
        }
        if drop(Mechanism::Cpufreq, a.be_freq_khz.is_some()) {
            a.be_freq_khz = None;
        }
        if drop(Mechanism::TcHtb, a.be_egress_ceil_bytes_per_s.is_some()) {
            a.be_egress_ceil_bytes_per_s = None;
        }
        if drop(Mechanism::Memory, a.be_memory_limit_bytes.is_some()) {
            a.be_memory_limit_bytes = None;
        }
        if drop(Mechanism::Pids, a.be_pids_max.is_some()) {
            a.be_pids_max = None;
            a.be_pids_max_default = false;
        }
        if drop(Mechanism::Io, !a.be_io_limits.is_empty()) {
            a.be_io_limits.clear();
        }
        dropped
    }
}

impl Policy for Guarded {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn decide(&mut self, obs: &Observation, now: Duration) -> Decision {
        let (mut a, inner_reason, inner_state) = match (&self.held, self.paused) {
            (Some((alloc, reason)), true) => {
                (alloc.clone(), reason.clone(), serde_json::Value::Null)
            }
            _ => {
                let d = self.inner.decide(obs, now);
                // kept for a pause; copied only when it changed
                match &mut self.held {
                    Some((alloc, reason)) => {
                        if *alloc != d.allocation {
                            *alloc = d.allocation.clone();
                        }
                        if *reason != d.reason {
                            reason.clone_from(&d.reason);
                        }
                    }
                    None => self.held = Some((d.allocation.clone(), d.reason.clone())),
                }
                if self.binding != d.binding_lc {
                    self.binding = d.binding_lc;
                }
                (d.allocation, d.reason, d.state)
            }
        };
        let mut overrides: Vec<Cow<'static, str>> = Vec::new();
        let proposed_enabled = a.be_enabled;

        // Rule 1: the LC is never restricted; BE never on the LC's pinned CPUs.
        self.set_lc_treatment(&mut a.lc);
        let s = &self.config.safety;
        let lc_cpus = self
            .lc_cpus
            .get(obs, || lc_pinned_cpus(&self.machine, &self.config, obs));
        // Several services: every service's CPUs count, and the services' sets are sane.
        let several = self.config.lcs.len() > 1 || !a.lc_services.is_empty();
        let services_cpus = if several {
            overrides.extend(multi::sanitize_lc_services(&self.config, &mut a));
            multi::services_cpus(&self.config, &self.machine, obs, &a)
        } else {
            Vec::new()
        };
        // Exception: BE in the `cpu.idle` class may share the LC's CPUs (hybrid's
        // `share_lc_cpus` on small machines): the idle class yields to the LC at every wake-up,
        // the mainline successor of BVT warp, so it does not restrict the LC.
        let shares_as_idle =
            a.be_cpu_idle == Some(true) && self.machine.mechanisms.has(Mechanism::CpuIdle);
        if let (Some(cpus), false) = (&mut a.be_cpus, shares_as_idle) {
            *cpus = cpus
                .iter()
                .filter(|c| !lc_cpus.contains(c) && !services_cpus.contains(c))
                .collect();
            if cpus.is_empty() {
                a.be_cpus = None;
                if a.be_enabled {
                    a.be_enabled = false;
                    overrides.push("safety:no-cpu-besides-lc:disable".into());
                }
            }
        }
        if a.be_memory_limit_bytes.is_none() {
            a.be_memory_limit_bytes = s.be_memory_limit_bytes;
        }
        // Whatever the policy: a BE that forks without end would take every pid on the host.
        a.be_pids_max = s.be_pids_limit(self.machine.host_tasks(), self.config.be.len());
        a.be_pids_max_default = s.be_pids_max.is_none();
        if a.be_io_limits.is_empty() && !s.be_io_limits.is_empty() {
            a.be_io_limits = s.be_io_limits.clone();
        }
        let dropped = self.drop_missing_mechanisms(&mut a);

        // `multi` with several services (or services the observation lists by name, as
        // Kubernetes discovery's do): rules 2 and 3 judge every service (the first stale one,
        // or the first violating one, is named); other policies protect the first.
        let per_service = (self.config.policy.kind == PolicyKind::Multi
            && (self.config.lcs.len() > 1 || !obs.lc_groups.is_empty()))
        .then(|| multi::services_latency(&self.config, obs));
        // A discovered pod without a latency port has no source: its latency is unknown.
        let latency_rules = (self.config.lc().latency.is_some() || per_service.is_some())
            && self.config.policy.kind != PolicyKind::None;
        let fresh = match &per_service {
            Some(l) => l.stale.is_none(),
            None => {
                obs.lc_latency_us.is_some_and(f64::is_finite)
                    && obs
                        .lc_latency_age_ms
                        .is_some_and(|age| age <= s.latency_max_age_ms)
            }
        };
        let named = |what: &'static str, name: Option<&String>| -> Cow<'static, str> {
            match name {
                Some(n) => Cow::Owned(format!("{what}:{n}")),
                None => Cow::Borrowed(what),
            }
        };
        let stale_name = per_service.as_ref().and_then(|l| l.stale.as_ref());
        // Rule 2: unknown or stale latency.
        if latency_rules && !fresh {
            // Counted only up to the tick rule's limit (none when it is off): a tick beyond it
            // changes nothing, so a run of identical holds is one decision-log line.
            self.stale_ticks = (self.stale_ticks + 1).min(s.stale_disable_ticks);
            let since = *self.stale_since.get_or_insert(now);
            let by_ticks = s.stale_disable_ticks > 0 && self.stale_ticks >= s.stale_disable_ticks;
            let by_time = s.stale_disable_ms > 0
                && now.saturating_sub(since) >= Duration::from_millis(s.stale_disable_ms);
            if by_ticks || by_time {
                if a.be_enabled {
                    overrides.push(named("safety:latency-stale:disable", stale_name));
                }
                a.be_enabled = false;
            } else if let Some(prev) = &self.last {
                let limited = a.limit_growth(prev);
                if limited != a {
                    overrides.push(named("safety:latency-unknown:no-growth", stale_name));
                    a = limited;
                }
            }
        } else {
            self.stale_ticks = 0;
            self.stale_since = None;
        }
        // Rule 3: cooldown after an SLO violation.
        let mut untrusted_violation: Option<String> = None;
        if latency_rules && fresh && s.violation_cooldown_s > 0.0 {
            // A figure that cannot be trusted (a fallback prober's the kernel sensor does not
            // confirm) holds BE this tick but starts no cooldown: a long cooldown on the
            // instrument's own lateness keeps BE off for nothing. Under `multi` a trusted
            // violation of any service starts it; untrusted ones of others only hold.
            let (violating, untrusted) = match &per_service {
                Some(l) => (
                    l.violating.is_some() || l.violating_untrusted.is_some(),
                    l.violating
                        .is_none()
                        .then(|| {
                            l.violating_untrusted
                                .as_ref()
                                .map(|(name, why)| format!("{name}: {why}"))
                        })
                        .flatten(),
                ),
                None => (
                    obs.lc_latency_us.unwrap_or(0.0) > self.config.lc().slo.target_us,
                    obs.lc_latency_untrusted.clone(),
                ),
            };
            if violating && untrusted.is_some() {
                untrusted_violation = untrusted;
            } else if violating {
                self.violation_at = Some(now);
                let source = match &per_service {
                    Some(l) => l.violating.as_ref().and_then(|name| {
                        obs.lc_groups
                            .iter()
                            .find(|g| &g.name == name)
                            .and_then(|g| g.latency_source.clone())
                    }),
                    None => obs.lc_latency_source.clone(),
                };
                self.violation_judged_by = Some(source.unwrap_or_else(|| "latency".to_string()));
            }
        }
        let violation_until = self.violation_until();
        if untrusted_violation.is_some() && violation_until.is_none_or(|t| now >= t) {
            let held = match &self.last {
                Some(prev) => a.limit_growth(prev),
                None => Allocation {
                    be_enabled: false,
                    ..a.clone()
                },
            };
            if held != a {
                overrides.push("safety:slo-violation-untrusted:hold".into());
                a = held;
            }
        }
        if violation_until.is_some_and(|t| now < t) {
            if a.be_enabled {
                let who = per_service.as_ref().and_then(|l| l.violating.as_ref());
                overrides.push(named("safety:slo-violation:cooldown", who));
            }
            a.be_enabled = false;
        }
        // Rule 4: low memory → BE killed (freezing would keep its memory).
        let low_mem = matches!(
            (s.min_mem_available_bytes, obs.mem_available_bytes),
            (Some(min), Some(avail)) if avail < min
        );
        let mem_stall = matches!(
            (s.max_memory_psi_full, obs.psi_memory_full),
            (Some(max), Some(psi)) if psi > max
        );
        if low_mem || mem_stall {
            overrides.push(
                if low_mem {
                    "safety:low-memory:kill"
                } else {
                    "safety:memory-pressure:kill"
                }
                .into(),
            );
            a.be_enabled = false;
            a.be_kill = true;
        }

        // Rule 3b: grow slowly, and not right after a shrink (hysteresis in time). An
        // allocation equal to the last one neither grows nor shrinks it.
        let same_as_last = self.last.as_ref() == Some(&a);
        if let (Some(prev), false) = (&self.last, same_as_last) {
            let ncpus = self.machine.cpus.len();
            let since = |t: Option<Duration>| t.map(|t| now.saturating_sub(t));
            if a.grows_be_over(prev, ncpus) {
                let too_soon = since(self.last_grow)
                    .is_some_and(|d| d < Duration::from_millis(s.grow_interval_ms))
                    || since(self.last_shrink)
                        .is_some_and(|d| d < Duration::from_millis(s.grow_after_shrink_ms));
                if too_soon {
                    overrides.push("safety:grow-paced:hold".into());
                    a = a.limit_growth(prev);
                } else {
                    self.last_grow = Some(now);
                }
            } else if prev.grows_be_over(&a, ncpus) {
                self.last_shrink = Some(now);
            }
        } else if self.last.is_none() && a.be_enabled {
            // the first allocation is a growth from nothing
            self.last_grow = Some(now);
        }

        self.inner.applied(&a);
        self.rules_hold_be_off = proposed_enabled && !a.be_enabled;
        if !same_as_last {
            self.last = Some(a.clone());
        }
        let binding_lc = self.binding.clone();
        let reason = match overrides.first() {
            Some(r) => Some(r.to_string()),
            None if self.paused => Some("safety:paused:hold".to_string()),
            None => None,
        };
        if !self.explain {
            return Decision {
                binding_lc,
                allocation: a,
                reason: reason.unwrap_or(inner_reason),
                state: serde_json::Value::Null,
            };
        }
        let reason = reason.unwrap_or_else(|| inner_reason.clone());
        Decision {
            binding_lc,
            allocation: a,
            reason,
            state: json!({
                "policy": inner_state,
                "policy_reason": inner_reason,
                "safety": {
                    "paused": self.paused,
                    "overrides": overrides,
                    "stale_ticks": self.stale_ticks,
                    "stale_since_ms": self.stale_since.map(|t| t.as_millis() as u64),
                    "violation_cooldown_until_ms":
                        violation_until.map(|t| t.as_millis() as u64),
                    "violation_judged_by": self.violation_judged_by,
                    "untrusted_violation": untrusted_violation,
                    "unavailable": dropped,
                },
            }),
        }
    }

    fn poll_interval(&self) -> Duration {
        self.inner.poll_interval()
    }

    fn applied(&mut self, _allocation: &Allocation) {}

    fn idle_buffer(&self) -> Option<f64> {
        self.inner.idle_buffer()
    }

    fn idle_crossings_matter(&self) -> bool {
        self.idle_crossings().any()
    }

    /// None while paused or while a rule holds BE off (stale signal, violation cooldown):
    /// those lift on the periodic tick, never on a crossing.
    fn idle_crossings(&self) -> IdleCrossings {
        if self.paused || self.rules_hold_be_off {
            IdleCrossings::NONE
        } else {
            self.inner.idle_crossings()
        }
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
        self.inner.set_explain(on);
    }

    fn reconfigure(&mut self, config: &Config) {
        if config.policy.kind == self.config.policy.kind {
            self.inner.reconfigure(config);
        } else {
            self.inner = build_unguarded(config, &self.machine);
            self.inner.set_explain(self.explain);
            self.held = None;
        }
        self.config = config.clone();
        self.lc_cpus.clear();
    }

    fn set_param(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let mut updated = self.config.clone();
        updated.set(key, value)?;
        self.reconfigure(&updated);
        Ok(())
    }

    fn pause(&mut self) {
        self.paused = true;
    }

    fn resume(&mut self) {
        self.paused = false;
    }

    fn is_paused(&self) -> bool {
        self.paused
    }
}
