//! The agent's tick over one modelled server, shared by one-LC servers (`run.rs`) and servers
//! with several LC services (`multi.rs`): the BE job running, then sense → decide (the real
//! policy inside its safety rules) → actuate (the one ordered write path, through
//! `impl Node for SimHost`), called as often within a model tick as the policy would be.
//!
//! A policy polling at ≥ 100 ms is called at its own period; a fast poller (`blind`, the inner
//! loop of `hybrid`, 1 ms) at the tick's start and again, one growth pacing interval later, for
//! as long as its allocation keeps changing: between model changes its input is constant, so
//! the polls skipped would have decided the same (event-exact up to the tick).

use std::time::Duration;

use headroom_control::actuation::Actuation;
use headroom_control::config::{Config, PolicyKind};
use headroom_control::controller::{Controller, Discard};
use headroom_control::policy::{self, MachineInfo};
use headroom_types::allocation::Allocation;
use headroom_types::decision::Decision;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::SimError;
use crate::host::{SimHost, TickState};
use crate::model::BeKind;
use crate::node::sim_groups;
use crate::setup::{ServerSpec, SimSetup};

/// One server's host, policy and BE jobs, stepped a model tick at a time.
pub(crate) struct ClosedLoop<'m> {
    pub host: SimHost,
    kinds: Vec<&'m BeKind>,
    jobs: BeJobs,
    current_kind: usize,
    controller: Controller,
    sink: Discard,
    kind: PolicyKind,
    poll: Duration,
    fast: bool,
    pace: Duration,
    pub tick: Duration,
    pub ticks_per_window: usize,
    pub total_ticks: usize,
    /// The allocation in force (the last one the policy changed to).
    pub applied: Allocation,
    pub decisions: u64,
    pub writes: u64,
}

impl<'m> ClosedLoop<'m> {
    pub fn new(
        setup: &'m SimSetup,
        spec: &ServerSpec,
        config: &Config,
        kind: PolicyKind,
        window_s: f64,
        record: bool,
    ) -> Result<ClosedLoop<'m>, SimError> {
        let model = &setup.model;
        let machine = MachineInfo::with_cpus(spec.cores);
        let mut policy = policy::build(config, &machine);
        policy.set_explain(record);
        let poll = policy.poll_interval();
        let kinds: Vec<&BeKind> = setup
            .be_pool
            .iter()
            .map(|n| model.be_kind(n))
            .collect::<Result<_, _>>()?;
        let mut host = SimHost::new(model, spec.cores, kinds[0], setup.tick_s);
        let pace = Duration::from_millis(
            config
                .policy
                .blind
                .grow_interval_ms
                .max(config.safety.grow_interval_ms)
                .max(poll.as_millis() as u64),
        );
        let actuation =
            Actuation::attach(&mut host, sim_groups()).map_err(|e| SimError::Invalid {
                file: None,
                key: "SimHost".into(),
                value: "attach".into(),
                reason: e.to_string(),
            })?;
        // read every knob back once an hour of ticks (the model never drifts, the cost is the plan)
        let controller = Controller::new(policy, Some(actuation), machine.cpus.clone(), 720);
        Ok(ClosedLoop {
            host,
            jobs: BeJobs::new(spec.seed, kinds.len()),
            kinds,
            current_kind: usize::MAX,
            controller,
            sink: Discard,
            kind,
            poll,
            fast: poll < Duration::from_millis(100),
            pace,
            tick: Duration::from_secs_f64(setup.tick_s),
            ticks_per_window: (window_s / setup.tick_s).round().max(1.0) as usize,
            total_ticks: (spec.duration_s / setup.tick_s).round() as usize,
            applied: Allocation::default(),
            decisions: 0,
            writes: 0,
        })
    }

    /// Starts tick `i`: the BE job of the pool running then is the host's. Returns the tick's
    /// start.
    pub fn start_tick(&mut self, i: usize, be_job_mean_s: f64) -> Duration {
        let t0 = self.tick * i as u32;
        let job = self
            .jobs
            .at(t0.as_secs_f64(), self.kinds.len(), be_job_mean_s);
        if job != self.current_kind {
            self.current_kind = job;
            self.host.set_be_kind(self.kinds[job]);
        }
        t0
    }

    /// The pool index of the BE job running.
    pub fn current_kind(&self) -> usize {
        self.current_kind
    }

    /// Runs the policy over the tick starting at `t0` (the host's inputs set); `on_decision`
    /// sees every decision. Returns the model's state at the tick's end.
    pub fn run_tick(
        &mut self,
        t0: Duration,
        mut on_decision: impl FnMut(Decision),
    ) -> Result<TickState, SimError> {
        let mut t = t0;
        loop {
            let outcome = self.controller.step(&mut self.host, t, &mut self.sink);
            if let Some(Err(e)) = &outcome.actuation {
                return Err(SimError::Invalid {
                    file: None,
                    key: "SimHost".into(),
                    value: self.kind.as_str().into(),
                    reason: format!("the write path failed on the model: {e}"),
                });
            }
            self.decisions += 1;
            let changed = outcome.decision.allocation != self.applied;
            if changed {
                self.applied = outcome.decision.allocation.clone();
                self.writes += 1;
            }
            on_decision(outcome.decision);
            let step = if self.fast {
                if !changed {
                    break;
                }
                self.pace
            } else {
                self.poll
            };
            t += step;
            if t >= t0 + self.tick {
                break;
            }
        }
        Ok(*self.host.last_state().expect("sensed this tick"))
    }
}

/// The BE job schedule of a server: which kind runs when (the same under every policy).
struct BeJobs {
    rng: ChaCha8Rng,
    until_s: f64,
    current: usize,
}

impl BeJobs {
    fn new(seed: u64, pool: usize) -> BeJobs {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xbe_b0b);
        let current = rng.random_range(0..pool.max(1));
        BeJobs {
            rng,
            until_s: 0.0,
            current,
        }
    }

    /// The pool index running at `t_s` (call with increasing t).
    fn at(&mut self, t_s: f64, pool: usize, mean_s: f64) -> usize {
        while t_s >= self.until_s {
            if self.until_s > 0.0 {
                self.current = self.rng.random_range(0..pool.max(1));
            }
            let u: f64 = self.rng.random::<f64>().max(1e-12);
            self.until_s += -u.ln() * mean_s;
        }
        self.current
    }
}
