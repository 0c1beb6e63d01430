//! One tick of the agent as named phases — sense, decide, record, actuate, publish — over any
//! [`Node`]: the Linux runtime and the simulator run this same code, with the same policies,
//! safety rules and write order.

use std::time::Duration;

use crate::actuation::{Actuation, ActuationError, ApplyReport};
use crate::decision::Decision;
use crate::node::Node;
use crate::policy::Policy;
use headroom_types::allocation::Allocation;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;

/// Where a tick's results go: the decision log and the metrics on a real host, the
/// simulator's accounting on a model.
pub trait TickSink {
    /// Phase `record`: the observation and the decision, before anything is written.
    fn record(&mut self, t: Duration, obs: &Observation, decision: &Decision);
    /// Phase `publish`: the tick's outcome, after the writes.
    fn publish(&mut self, t: Duration, obs: &Observation, outcome: &TickOutcome);
}

/// A sink that keeps nothing (tests, benchmarks).
pub struct Discard;

impl TickSink for Discard {
    fn record(&mut self, _: Duration, _: &Observation, _: &Decision) {}
    fn publish(&mut self, _: Duration, _: &Observation, _: &TickOutcome) {}
}

/// What one tick did.
#[derive(Debug)]
pub struct TickOutcome {
    pub decision: Decision,
    /// `None`: nothing was planned (not actuating, or an unchanged allocation between
    /// read-backs).
    pub actuation: Option<Result<ApplyReport, ActuationError>>,
    /// The BE processes were killed this tick (`be_kill`: low memory).
    pub killed: usize,
}

/// The policy and the write path of one node.
pub struct Controller {
    policy: Box<dyn Policy>,
    actuation: Option<Actuation>,
    /// Every online CPU (BE's CPUs when an allocation names none).
    machine_cpus: Vec<u32>,
    /// Ticks between read-backs of every knob (when no period is set).
    verify_every: u64,
    /// Time between read-backs: ticks come at uneven intervals when they follow events.
    verify_period: Option<Duration>,
    last_verify: Option<Duration>,
    ticks: u64,
    /// Writing (false: dry run or kill switch).
    actuating: bool,
    /// The last allocation the node took whole.
    last_applied: Option<Allocation>,
    /// The last plan failed: the next tick plans again even if the allocation is the same.
    failed: bool,
}

impl Controller {
    /// `actuation` is `None` for a dry run (decide and record, write nothing).
    pub fn new(
        policy: Box<dyn Policy>,
        actuation: Option<Actuation>,
        machine_cpus: Vec<u32>,
        verify_every: u64,
    ) -> Controller {
        Controller {
            actuating: actuation.is_some(),
            policy,
            actuation,
            machine_cpus,
            verify_every: verify_every.max(1),
            verify_period: None,
            last_verify: None,
            ticks: 0,
            last_applied: None,
            failed: false,
        }
    }

    /// Reads every knob back at most `period` apart in tick time (the first tick, and then
    /// the first tick at least `period` after the last read-back), whatever the tick rate: an
    /// event-driven agent ticks irregularly, and a tick count would stretch the period.
    pub fn with_verify_period(mut self, period: Duration) -> Controller {
        self.verify_period = Some(period);
        self
    }

    /// Changes the read-back period (the event-driven loop's longer one).
    pub fn set_verify_period(&mut self, period: Duration) {
        self.verify_period = Some(period);
    }

    /// One tick at `t` since start.
    pub fn step(
        &mut self,
        node: &mut dyn Node,
        t: Duration,
        sink: &mut dyn TickSink,
    ) -> TickOutcome {
        // sense + decide + record, while the observation is borrowed from the node
        let decision = {
            let obs = node.sense(t);
            let decision = self.policy.decide(obs, t);
            sink.record(t, obs, &decision);
            decision
        };
        let mut outcome = TickOutcome {
            decision,
            actuation: None,
            killed: 0,
        };
        self.actuate(node, t, &mut outcome);
        self.ticks += 1;
        // publish: the node's observation after the writes (on a real host the tick's own
        // sample: sensing twice cost a second sample every tick)
        let obs = node.observed(t).clone();
        sink.publish(t, &obs, &outcome);
        outcome
    }

    /// Phase `actuate`: the one ordered write path.
    fn actuate(&mut self, node: &mut dyn Node, t: Duration, outcome: &mut TickOutcome) {
        if !self.actuating {
            return;
        }
        let Some(act) = self.actuation.as_mut() else {
            return;
        };
        let allocation = &outcome.decision.allocation;
        if allocation.be_kill {
            outcome.killed = node.kill_be(&act.groups().be);
            act.invalidate();
            self.last_applied = None;
        }
        let verify = match self.verify_period {
            Some(period) => self
                .last_verify
                .is_none_or(|last| t.saturating_sub(last) >= period),
            None => self.ticks.is_multiple_of(self.verify_every),
        };
        if verify {
            self.last_verify = Some(t);
        }
        let same = self.last_applied.as_ref() == Some(allocation);
        // Between read-backs an unchanged allocation needs no plan at all.
        if same && !verify && !self.failed {
            return;
        }
        let be_cpus = allocation
            .be_cpus
            .as_ref()
            .map_or_else(|| self.machine_cpus.clone(), CpuSet::to_vec);
        let result = act.apply(node, allocation, &be_cpus, verify);
        self.failed = result.is_err();
        if result.is_ok() && !same {
            self.last_applied = Some(allocation.clone());
        }
        outcome.actuation = Some(result);
    }

    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }

    pub fn policy_mut(&mut self) -> &mut dyn Policy {
        self.policy.as_mut()
    }

    pub fn actuation(&self) -> Option<&Actuation> {
        self.actuation.as_ref()
    }

    pub fn actuation_mut(&mut self) -> Option<&mut Actuation> {
        self.actuation.as_mut()
    }

    pub fn is_actuating(&self) -> bool {
        self.actuating
    }

    /// Stops (kill switch) or resumes writing; resuming reads every knob back first.
    pub fn set_actuating(&mut self, on: bool) {
        self.actuating = on && self.actuation.is_some();
        if on {
            if let Some(a) = self.actuation.as_mut() {
                a.invalidate();
            }
            self.last_applied = None;
        }
    }

    /// The last allocation the node took whole (the state file's safe state).
    pub fn last_applied(&self) -> Option<&Allocation> {
        self.last_applied.as_ref()
    }

    /// Forgets the last applied allocation (originals were restored behind the plan's back).
    pub fn forget_applied(&mut self) {
        self.last_applied = None;
    }

    /// Applies `allocation` at once, reading every knob back (a restart's last safe state, the
    /// exit action's freeze).
    pub fn apply_now(
        &mut self,
        node: &mut dyn Node,
        allocation: &Allocation,
    ) -> Result<ApplyReport, ActuationError> {
        let Some(act) = self.actuation.as_mut() else {
            return Ok(ApplyReport::default());
        };
        let be_cpus = allocation
            .be_cpus
            .as_ref()
            .map_or_else(|| self.machine_cpus.clone(), CpuSet::to_vec);
        let report = act.apply(node, allocation, &be_cpus, true)?;
        self.last_applied = Some(allocation.clone());
        self.failed = false;
        Ok(report)
    }

    pub fn ticks(&self) -> u64 {
        self.ticks
    }
}
