//! PerfIso CPU blind isolation (ATC'18 §3.1).
//!
//! With I idle CPUs, B buffer CPUs and S CPUs allocated to BE: if I < B, S shrinks at once by
//! what the buffer lacks (rounded up to whole steps of `grow_step_cpus`); if I > B — precisely,
//! if one more step still leaves B idle: I ≥ B + step (+ hysteresis) — S grows by one step, at
//! most once per `grow_interval_ms`. The policy is evaluated every poll; the allocation changes only when S or
//! the usable CPUs change, so the reconciler writes only then. BE never gets the CPUs the LC is
//! pinned to. S = 0 (allowed when `min_be_cpus = 0`) freezes BE. A fractional S — needed when B
//! is fractional on small machines — is given as ceil(S) CPUs in the cpuset plus a CFS quota of
//! S CPUs.
//!
//! When the LC is not pinned it may run on BE's CPUs too (PerfIso's primary "always runs
//! unrestricted"); PerfIso then relies on the buffer's idle cores to absorb the LC's wake-ups,
//! but a wake-up that still lands on a BE CPU waits behind BE at equal CFS weight for a whole
//! slice (Leverich & Kozyrakis §4: ms-scale p99). So BE runs in the `cpu.idle` class there (the
//! safety wrapper falls back to the batch weight where the host lacks `cpu.idle`), which yields
//! to the LC at every wake-up; with the LC pinned away from BE's CPUs nothing is shared and BE
//! keeps its weight.

pub mod config;

use std::time::Duration;

use serde_json::json;

use super::{
    be_candidate_cpus, lc_pinned_cpus, round6, take_top_cpus, IdleCrossings, LcCpusMemo,
    MachineInfo, Policy,
};
use crate::config::Config;
use headroom_types::allocation::Allocation;
use headroom_types::decision::Decision;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;

/// Blind isolation's state and parameters.
#[derive(Debug, Clone)]
pub struct Blind {
    config: Config,
    machine: MachineInfo,
    /// B, possibly overridden by the hybrid policy's outer loop.
    buffer: f64,
    /// Whether S may grow (the hybrid outer loop's "disallow growth").
    growth_allowed: bool,
    /// S: CPUs (possibly fractional) allocated to BE.
    be_cpus: f64,
    last_grow: Option<Duration>,
    /// The last non-empty cpuset, kept while BE is frozen at S = 0.
    last_cpuset: CpuSet,
    /// Fill the decision state (see [`Policy::set_explain`]).
    explain: bool,
    /// The BE candidate CPUs (they change only with the LC's pinning or the config).
    candidates: LcCpusMemo,
    /// The CPUs the LC is pinned to; empty = the LC may run on BE's CPUs.
    lc_pinned: LcCpusMemo,
    /// S's bounds at the last decision (the candidates and `min_be_cpus`/`max_be_cpus`): at a
    /// bound, a crossing towards it cannot change the next decision.
    bounds: Option<(f64, f64)>,
}

impl Blind {
    pub fn new(config: &Config, machine: &MachineInfo) -> Self {
        Blind {
            config: config.clone(),
            machine: machine.clone(),
            buffer: config.policy.blind.buffer_cores,
            growth_allowed: true,
            be_cpus: config.policy.blind.min_be_cpus,
            last_grow: None,
            last_cpuset: CpuSet::new(),
            explain: true,
            candidates: LcCpusMemo::default(),
            bounds: None,
            lc_pinned: LcCpusMemo::default(),
        }
    }

    /// Current S.
    pub fn be_cpus(&self) -> f64 {
        self.be_cpus
    }

    /// Current B.
    pub fn buffer(&self) -> f64 {
        self.buffer
    }

    /// Sets B (the hybrid outer loop chooses it).
    pub fn set_buffer(&mut self, buffer: f64) {
        self.buffer = buffer.max(0.0);
    }

    /// Allows or forbids growth of S (shrinking always happens).
    pub fn set_growth_allowed(&mut self, allowed: bool) {
        self.growth_allowed = allowed;
    }

    /// Restarts from the minimum S (after BE was disabled).
    pub fn reset(&mut self) {
        self.be_cpus = self.config.policy.blind.min_be_cpus;
        self.last_grow = None;
    }

    /// The step S moves by: `grow_step_cpus`, or the fractional part of B when B is fractional
    /// (≥ 0.1), so a B like 1.5 on a 2-CPU machine can leave BE half a CPU.
    fn step(&self) -> f64 {
        let step = self.config.policy.blind.grow_step_cpus;
        let frac = self.buffer - self.buffer.floor();
        if (0.1..step).contains(&frac) {
            round6(frac)
        } else {
            step
        }
    }

    fn max_be_cpus(&self, candidates: usize) -> f64 {
        let p = &self.config.policy.blind;
        let n = candidates as f64;
        if p.max_be_cpus > 0.0 {
            p.max_be_cpus.min(n)
        } else {
            n
        }
    }

    fn allocation(&mut self, candidates: &[u32], lc_shares_be_cpus: bool) -> Allocation {
        let p = &self.config.policy.blind;
        let whole = self.be_cpus.ceil() as usize;
        if whole == 0 || candidates.is_empty() {
            let keep = if self.last_cpuset.is_empty() {
                take_top_cpus(candidates, 1)
            } else {
                self.last_cpuset.clone()
            };
            return Allocation {
                be_cpus: (!keep.is_empty()).then_some(keep),
                ..Allocation::default()
            }
            .disabled();
        }
        let cpus = take_top_cpus(candidates, whole);
        self.last_cpuset.clone_from(&cpus);
        let fractional = (self.be_cpus - self.be_cpus.floor()) > 1e-6;
        Allocation {
            be_cpus: Some(cpus),
            be_quota_pct: fractional.then(|| round6(self.be_cpus * 100.0)),
            be_quota_period_us: fractional.then_some(p.quota_period_us),
            be_cpu_idle: lc_shares_be_cpus.then_some(true),
            ..Allocation::default()
        }
    }
}

impl Policy for Blind {
    fn name(&self) -> &'static str {
        "blind"
    }

    fn decide(&mut self, obs: &Observation, now: Duration) -> Decision {
        let p = &self.config.policy.blind;
        let (min_be_cpus, grow_interval_ms, hysteresis_cpus, idle_threshold, tolerance) = (
            p.min_be_cpus,
            p.grow_interval_ms,
            p.hysteresis_cpus,
            p.idle_threshold,
            p.idle_tolerance_cpus,
        );
        let mut memo = std::mem::take(&mut self.candidates);
        let candidates = memo.get(obs, || {
            be_candidate_cpus(&self.machine, &p.be_cpus, &self.config, obs)
        });
        let max = self.max_be_cpus(candidates.len());
        let min = min_be_cpus.min(max);
        self.bounds = Some((min, max));
        let before = self.be_cpus;
        // The LC may have pinned itself onto more CPUs since the last poll.
        self.be_cpus = self.be_cpus.clamp(min, max);
        let step = self.step();
        let idle = obs.idle_cpu_count(idle_threshold);
        let reason = match idle {
            None => "blind:no-idle-data:hold",
            Some(i) if i < self.buffer - tolerance => {
                // take back what the buffer lacks, in whole steps, so S stays on its grid
                let steps = ((self.buffer - i) / step - 1e-9).ceil().max(1.0);
                self.be_cpus = round6((self.be_cpus - steps * step).max(min));
                if self.be_cpus < before {
                    "blind:idle<buffer:shrink"
                } else {
                    "blind:idle<buffer:at-min"
                }
            }
            // growing by one step must still leave the buffer idle
            Some(i) if i >= self.buffer + step + hysteresis_cpus - tolerance - 1e-9 => {
                let waited = self.last_grow.is_none_or(|t| {
                    now.saturating_sub(t) >= Duration::from_millis(grow_interval_ms)
                });
                if !self.growth_allowed {
                    "blind:idle>buffer:growth-disallowed"
                } else if self.be_cpus >= max {
                    "blind:idle>buffer:at-max"
                } else if !waited {
                    "blind:idle>buffer:grow-wait"
                } else {
                    self.be_cpus = round6((self.be_cpus + step).min(max));
                    self.last_grow = Some(now);
                    "blind:idle>buffer:grow"
                }
            }
            Some(_) => "blind:idle=buffer:steady",
        };
        let lc_shares_be_cpus = self
            .lc_pinned
            .get(obs, || lc_pinned_cpus(&self.machine, &self.config, obs))
            .is_empty();
        let allocation = self.allocation(candidates, lc_shares_be_cpus);
        if !self.explain {
            self.candidates = memo;
            return Decision {
                binding_lc: None,
                allocation,
                reason: reason.to_string(),
                state: serde_json::Value::Null,
            };
        }
        let state = json!({
            "idle": idle,
            "buffer": self.buffer,
            "be_cpus": self.be_cpus,
            "min_be_cpus": min,
            "max_be_cpus": max,
            "growth_allowed": self.growth_allowed,
            "candidates": candidates,
            "be_cpu_idle": lc_shares_be_cpus,
        });
        self.candidates = memo;
        Decision {
            binding_lc: None,
            allocation,
            reason: reason.to_string(),
            state,
        }
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.config.policy.blind.poll_ms)
    }

    fn idle_buffer(&self) -> Option<f64> {
        Some(self.buffer)
    }

    fn idle_crossings(&self) -> IdleCrossings {
        let Some((min, max)) = self.bounds else {
            return IdleCrossings::BOTH;
        };
        IdleCrossings {
            falls: self.be_cpus > min,
            rises: self.growth_allowed && self.be_cpus < max,
        }
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
    }

    fn applied(&mut self, allocation: &Allocation) {
        let cap = allocation.be_cpu_capacity(self.machine.cpus.len());
        if cap < self.be_cpus {
            self.be_cpus = round6(cap.max(0.0));
        }
    }

    fn reconfigure(&mut self, config: &Config) {
        let old_buffer = self.config.policy.blind.buffer_cores;
        self.config = config.clone();
        self.candidates.clear();
        self.lc_pinned.clear();
        if config.policy.blind.buffer_cores != old_buffer {
            self.buffer = config.policy.blind.buffer_cores;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blind(extra: &str) -> Blind {
        let toml = format!(
            "[lc]\nname = \"svc\"\ncgroup = \"headroom/lc\"\n{extra}\n[policy]\nkind = \"blind\"\n"
        );
        Blind::new(
            &Config::from_toml_str(&toml).expect("valid config"),
            &MachineInfo::with_cpus(8),
        )
    }

    fn idle(i: f64) -> Observation {
        Observation {
            idle_cpus: Some(i),
            ..Observation::default()
        }
    }

    /// At its bounds only the crossing away from the bound is armed: at 0 CPUs no fall can
    /// shrink BE, at every candidate CPU no rise can grow it (issue 30: no storms at the limit).
    #[test]
    fn only_crossings_that_can_move_s_are_armed() {
        let mut b = blind("");
        assert_eq!(
            b.idle_crossings(),
            IdleCrossings::BOTH,
            "nothing decided yet"
        );
        // nothing idle: S shrinks to its minimum, 0
        b.decide(&idle(0.0), Duration::ZERO);
        assert_eq!(b.be_cpus(), 0.0);
        assert_eq!(
            b.idle_crossings(),
            IdleCrossings {
                falls: false,
                rises: true
            }
        );
        // all 8 idle, grown to every CPU, one step per grow interval
        for i in 1..=40u64 {
            b.decide(&idle(8.0), Duration::from_millis(100 * i));
        }
        assert_eq!(b.be_cpus(), 8.0);
        assert_eq!(
            b.idle_crossings(),
            IdleCrossings {
                falls: true,
                rises: false
            }
        );
        // in between with growth disallowed (hybrid's outer loop): falls only
        b.decide(&idle(0.5), Duration::from_secs(10));
        assert!(b.be_cpus() > 0.0 && b.be_cpus() < 8.0, "{}", b.be_cpus());
        assert_eq!(b.idle_crossings(), IdleCrossings::BOTH);
        b.set_growth_allowed(false);
        assert_eq!(
            b.idle_crossings(),
            IdleCrossings {
                falls: true,
                rises: false
            }
        );
    }

    /// An unpinned LC may wake up on BE's CPUs: BE must run there in the `cpu.idle` class, not
    /// at the default weight (a whole CFS slice of wait for the LC). Before the fix BE kept the
    /// group's original weight (`be_cpu_idle: None`).
    #[test]
    fn be_yields_as_cpu_idle_on_cpus_an_unpinned_lc_may_use() {
        let mut b = blind("");
        let d = b.decide(&idle(6.0), Duration::ZERO);
        assert!(d.allocation.be_enabled, "{}", d.reason);
        assert_eq!(d.allocation.be_cpus, Some(CpuSet::from([7])));
        assert_eq!(d.allocation.be_cpu_idle, Some(true));
    }

    /// With the LC pinned away from BE's CPUs nothing is shared: BE keeps its weight.
    #[test]
    fn be_keeps_its_weight_when_the_lc_is_pinned_elsewhere() {
        let mut b = blind("[lc.threads]\npin = true\ncpus = [0, 1, 2, 3]");
        let d = b.decide(&idle(6.0), Duration::ZERO);
        assert_eq!(d.allocation.be_cpus, Some(CpuSet::from([7])));
        assert_eq!(d.allocation.be_cpu_idle, None);
        // the LC's observed affinity counts too
        let mut b = blind("");
        let pinned = Observation {
            lc_cpus: Some(vec![0, 1]),
            ..idle(6.0)
        };
        let d = b.decide(&pinned, Duration::ZERO);
        assert_eq!(d.allocation.be_cpu_idle, None);
    }
}
