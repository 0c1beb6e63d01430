//! The `record` and `publish` phases on a real host: the decision log (size-capped, rotated
//! once), the Prometheus metrics, the reasons `ctl status` shows, and the run's counters.

use std::collections::VecDeque;
use std::time::Duration;

use crate::publish::metrics::{Metrics, ServiceSlo};
use crate::publish::reaction_log::phase;
use headroom_control::advertise::memory::memory_input;
use headroom_control::advertise::{granted_millicpu, AdvertiseInput, Resource};
use headroom_control::controller::{TickOutcome, TickSink};
use headroom_control::decision::{CtlEvent, Decision, DecisionRecord};
use headroom_types::allocation::Allocation;
use headroom_types::decision::Repeat;
use headroom_types::observation::Observation;

use super::advertise::{log_change, AdvertiseLive};
pub use super::decision_log::DecisionLog;
use super::RunSummary;

/// Reasons kept for `ctl status`.
const REASONS_KEPT: usize = 10;

/// A run of identical decisions is written at its end, or once it is this old (a crash loses
/// at most this much of a run).
const RUN_MAX: Duration = Duration::from_secs(10);

/// A run of identical decisions being gathered: its first record and its last tick.
pub struct Run {
    first: DecisionRecord,
    count: u64,
    last_t: Duration,
    last_unix_ms: u64,
    last_observation: Observation,
}

impl Run {
    fn line(&self) -> String {
        if self.count == 1 {
            return self.first.to_json_line();
        }
        let mut rec = self.first.clone();
        rec.repeat = Some(Repeat {
            count: self.count,
            last_t_ms: self.last_t.as_millis() as u64,
            last_t_unix_ms: self.last_unix_ms,
            last_observation: self.last_observation.clone(),
        });
        rec.to_json_line()
    }
}

/// Windows whose ends (tick time − the latency's age) lie closer than this are one window:
/// the sources publish one a second, the age is read in whole milliseconds.
const SAME_WINDOW: Duration = Duration::from_millis(500);

/// Whether the observation at `now_t` carries a latency window (any service's) the one at
/// `prev_t` did not: a run of identical decisions ends there, so that every window the agent
/// saw is the first observation of a line — the log holds each window's figure, not only the
/// decisions it led to. A window is known by its end, not its figure (two windows can give the
/// same p99) nor its age (a tick a second after each publication sees the same age each time).
fn new_latency_window(
    prev: &Observation,
    prev_t: Duration,
    now: &Observation,
    now_t: Duration,
) -> bool {
    let end =
        |t: Duration, age: Option<u64>| age.map(|a| t.saturating_sub(Duration::from_millis(a)));
    let other = |p: Option<Duration>, n: Option<Duration>| match (p, n) {
        (Some(p), Some(n)) => n.abs_diff(p) >= SAME_WINDOW,
        (None, None) => false,
        _ => true,
    };
    other(
        end(prev_t, prev.lc_latency_age_ms),
        end(now_t, now.lc_latency_age_ms),
    ) || prev.lc_groups.len() != now.lc_groups.len()
        || prev
            .lc_groups
            .iter()
            .zip(&now.lc_groups)
            .any(|(p, n)| other(end(prev_t, p.latency_age_ms), end(now_t, n.latency_age_ms)))
}

/// Whether two ticks fall in the same advertiser bucket (a run of identical decisions ends at
/// a bucket's edge: replay feeds only a run's first and last tick).
fn same_bucket(a: Duration, b: Duration, bucket_ms: u64) -> bool {
    let bucket = bucket_ms.max(1);
    a.as_millis() as u64 / bucket == b.as_millis() as u64 / bucket
}

/// Where the Linux agent's ticks go.
pub struct Publisher {
    pub log: Option<DecisionLog>,
    pub metrics: Metrics,
    pub policy: &'static str,
    pub started_unix_ms: u64,
    pub slo_us: f64,
    /// Every LC service's name and SLO (the per-service metrics).
    pub lcs: Vec<ServiceSlo>,
    pub reasons: VecDeque<(u64, String)>,
    pub last_reason: String,
    pub last_allocation: Option<Allocation>,
    pub last_write_error: Option<String>,
    pub summary: RunSummary,
    /// Something the state file records changed (writes were made).
    pub state_dirty: bool,
    /// Why BE is held off for lack of a trustworthy latency signal (`ctl status`).
    pub be_held_off: Option<String>,
    /// A run of identical decisions not yet written (see [`Publisher::record`]).
    pub pending: Option<Run>,
    /// The last decision written as a line of its own.
    pub last_logged: Option<Decision>,
    /// The service whose slack bound the last decision (`ctl status`).
    pub last_binding_lc: Option<String>,
    /// `[kubernetes] advertise`: the advertiser's input, computed and logged with the decision.
    pub advertise: super::advertise::AdvertiseFeed,
}

impl Publisher {
    /// A publisher at the start of a run of `policy`, writing its decisions to `log` (none:
    /// no decision log); `lcs` are the LC services' SLOs, `slo_us` the first one's.
    pub fn new(
        log: Option<DecisionLog>,
        metrics: Metrics,
        policy: &'static str,
        slo_us: f64,
        lcs: Vec<ServiceSlo>,
        started_unix_ms: u64,
    ) -> Publisher {
        Publisher {
            log,
            metrics,
            policy,
            started_unix_ms,
            slo_us,
            lcs,
            reasons: Default::default(),
            last_reason: String::new(),
            last_allocation: None,
            last_write_error: None,
            summary: Default::default(),
            state_dirty: false,
            be_held_off: None,
            pending: None,
            last_logged: None,
            last_binding_lc: None,
            advertise: Default::default(),
        }
    }

    /// Logs a ctl command that changes the policy's decisions, on the decisions' clock, so
    /// `--replay` applies it between the same two decisions.
    pub fn log_event(&mut self, event: &CtlEvent) {
        self.end_run();
        if let Some(log) = &mut self.log {
            log.write_line(&event.to_json_line());
            log.flush();
        }
    }
}

impl Publisher {
    /// Writes the run being gathered (at a ctl event, on exit).
    pub fn end_run(&mut self) {
        if let (Some(run), Some(log)) = (self.pending.take(), self.log.as_mut()) {
            log.write_line(&run.line());
        }
    }
}

impl TickSink for Publisher {
    /// A decision that differs from the last one logged is written at once; the identical
    /// ones after it (allocation, reason, state) are gathered into one line written when the
    /// run ends (or every [`RUN_MAX`]): a flapping host holding BE off wrote 82 600 holds in 11 s.
    fn record(&mut self, t: Duration, obs: &Observation, decision: &Decision) {
        phase::decided();
        self.advertise.input = self.advertise.ctx.map(|c| AdvertiseInput {
            granted_millicpu: granted_millicpu(&decision.allocation, c.machine_cpus),
            health: super::advertise::health(
                obs,
                self.slo_us,
                &self.lcs,
                c.latency_max_age_ms,
                self.be_held_off.as_deref(),
            ),
            floor_millicpu: c.floor_millicpu,
        });
        self.advertise.memory_input = self
            .advertise
            .ctx
            .map(|c| memory_input(obs, c.floor_memory_bytes));
        self.log_decision(t, obs, decision);
        phase::recorded();
    }

    fn publish(&mut self, t: Duration, obs: &Observation, outcome: &TickOutcome) {
        self.publish_tick(t, obs, outcome);
    }
}

impl Publisher {
    fn log_decision(&mut self, t: Duration, obs: &Observation, decision: &Decision) {
        if self.log.is_none() {
            return;
        }
        let unix_ms = self.started_unix_ms + t.as_millis() as u64;
        let same = self.last_logged.as_ref().is_some_and(|d| {
            d.reason == decision.reason
                && d.allocation == decision.allocation
                && d.state == decision.state
                && d.binding_lc == decision.binding_lc
        });
        if same {
            if let Some(run) = &mut self.pending {
                if t.saturating_sub(Duration::from_millis(run.first.t_ms)) < RUN_MAX
                    && !new_latency_window(&run.last_observation, run.last_t, obs, t)
                    && run.first.advertise == self.advertise.input
                    && self
                        .advertise
                        .ctx
                        .is_none_or(|c| same_bucket(run.last_t, t, c.bucket_ms))
                {
                    run.count += 1;
                    run.last_t = t;
                    run.last_unix_ms = unix_ms;
                    run.last_observation.clone_from(obs);
                    return;
                }
            }
            self.end_run();
            self.pending = Some(Run {
                first: self.new_record(t, unix_ms, obs, decision),
                count: 1,
                last_t: t,
                last_unix_ms: unix_ms,
                last_observation: obs.clone(),
            });
            return;
        }
        self.end_run();
        let rec = self.new_record(t, unix_ms, obs, decision);
        if let Some(log) = &mut self.log {
            log.write_line(&rec.to_json_line());
        }
        self.last_logged = Some(decision.clone());
    }

    fn new_record(
        &self,
        t: Duration,
        unix_ms: u64,
        obs: &Observation,
        decision: &Decision,
    ) -> DecisionRecord {
        let mut rec = DecisionRecord::new(t, unix_ms, self.policy, obs, decision);
        rec.advertise.clone_from(&self.advertise.input);
        rec
    }

    fn publish_tick(&mut self, t: Duration, obs: &Observation, outcome: &TickOutcome) {
        match &outcome.actuation {
            Some(Ok(report)) => {
                if !report.writes.is_empty() {
                    let n = report.writes.len() as u64;
                    self.metrics.writes.inc_by(n);
                    self.summary.writes += n;
                    self.state_dirty = true;
                }
                if !report.drift.is_empty() {
                    self.metrics.drift_repairs.inc_by(report.drift.len() as u64);
                }
                self.last_write_error = None;
            }
            Some(Err(e)) => {
                self.metrics.write_errors.inc();
                self.summary.write_errors += 1;
                let msg = e.to_string();
                if self.last_write_error.as_deref() != Some(msg.as_str()) {
                    tracing::error!(error = %msg, "actuation failed");
                }
                self.last_write_error = Some(msg);
            }
            None => {}
        }
        let decision = &outcome.decision;
        // The allocation's gauges hold the same values while it is unchanged.
        let changed = self.last_allocation.as_ref() != Some(&decision.allocation);
        self.metrics.observe_tick(
            obs,
            &decision.allocation,
            changed,
            self.slo_us,
            &decision.reason,
        );
        self.metrics
            .observe_services(&self.lcs, obs, decision.binding_lc.as_deref());
        if self.last_binding_lc != decision.binding_lc {
            self.last_binding_lc.clone_from(&decision.binding_lc);
        }
        if decision.reason != self.last_reason {
            self.reasons
                .push_back((t.as_millis() as u64, decision.reason.clone()));
            if self.reasons.len() > REASONS_KEPT {
                self.reasons.pop_front();
            }
            self.last_reason = decision.reason.clone();
        }
        if changed {
            self.last_allocation = Some(decision.allocation.clone());
        }
        self.summary.ticks += 1;
    }
}

impl Publisher {
    /// Feeds the input the publisher's record phase computed and logged this tick (none while
    /// the floor is unknown); a change goes to the edge and to the log, right after the tick's
    /// decision line (`--replay` checks it there).
    pub(super) fn step_advertiser(&mut self, live: &mut AdvertiseLive, t_ms: u64) {
        let (Some(input), Some(memory)) = (
            self.advertise.input.take(),
            self.advertise.memory_input.take(),
        ) else {
            return;
        };
        let fed = live.feed(t_ms, &input, &memory);
        let (ad, change) = &fed.cpu;
        if let Some(c) = change {
            log_change(
                Resource::BeCpu,
                c.from_millicpu,
                c.to_millicpu,
                c.reason,
                &c.detail,
            );
            self.log_event(&CtlEvent::Advertise {
                t_ms: c.t_ms,
                from_millicpu: c.from_millicpu,
                to_millicpu: c.to_millicpu,
                reason: c.reason,
                detail: c.detail.clone(),
                floor_millicpu: ad.floor_millicpu,
            });
        }
        let (mem, mem_change) = &fed.memory;
        if let Some(c) = mem_change {
            log_change(Resource::BeMemory, c.from, c.to, c.reason, &c.detail);
            self.log_event(&CtlEvent::AdvertiseMemory {
                t_ms: c.t_ms,
                from_bytes: c.from,
                to_bytes: c.to,
                reason: c.reason,
                detail: c.detail.clone(),
                floor_bytes: mem.floor,
            });
        }
        self.metrics
            .be_cpu_advertised(ad.value_millicpu, ad.reason.as_str());
        self.metrics
            .be_memory_advertised(mem.value, mem.reason.as_str());
    }
}

#[cfg(test)]
#[path = "publish_tests.rs"]
pub(super) mod tests;
