//! A policy's decision, the decision-log record (docs/architecture.md, contract 6), and replay.
//!
//! Replay builds a fresh policy from the same config and feeds it the recorded observations at
//! the recorded times; every decision must come out identical. For that the runtime must log
//! every tick on which it called `decide`, and call it with `now = Duration::from_millis(t_ms)`
//! (see [`tick_time`]), so the replayed clock equals the live one.
//!
//! With `[kubernetes] advertise` each decision line also carries what its tick fed the
//! advertiser (BE granted, the LCs' health, the floor): replay feeds the same inputs to a fresh
//! advertiser, checks the granted CPUs against the replayed allocation, and checks every logged
//! `advertise` change against the one it recomputes (field `advertise`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::advertise::{granted_millicpu, AdvertiseChange, Advertiser, Tick};
use crate::config::Config;
use crate::policy::{self, MachineInfo};

pub use headroom_types::decision::{CtlEvent, Decision, DecisionRecord, LogLine};

/// The monotonic time to give a policy: truncated to whole milliseconds, so that a replay from
/// the log's `t_ms` reproduces it exactly.
pub fn tick_time(since_start: Duration) -> Duration {
    Duration::from_millis(since_start.as_millis() as u64)
}

/// One difference between a recorded and a replayed decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Index of the record in the log (0-based).
    pub index: usize,
    pub t_ms: u64,
    /// `allocation`, `reason`, `state`, `policy`, `binding_lc`, `event`, `advertise` or
    /// `advertise_granted`.
    pub field: String,
    pub recorded: serde_json::Value,
    pub replayed: serde_json::Value,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "record {} (t_ms {}): {} recorded {} replayed {}",
            self.index, self.t_ms, self.field, self.recorded, self.replayed
        )
    }
}

/// Normalises a value through its JSON text, so a freshly computed value compares equal to one
/// parsed from a log line that was printed from it.
fn via_json<T: Serialize>(value: &T) -> serde_json::Value {
    let text = serde_json::to_string(value).expect("serializable");
    serde_json::from_str(&text).expect("re-parsable")
}

/// Re-runs a fresh policy built from `config` over the recorded observations and times and
/// returns every difference (empty = the log is reproduced exactly).
pub fn replay(config: &Config, machine: &MachineInfo, records: &[DecisionRecord]) -> Vec<Mismatch> {
    let lines: Vec<LogLine> = records
        .iter()
        .map(|r| LogLine::Decision(Box::new(r.clone())))
        .collect();
    replay_log(config, machine, &lines)
}

/// [`replay`] over a whole log: ctl events are applied to the policy where they were logged
/// (`set` through [`Policy::set_param`], `pause`/`resume`), as the live agent applied them.
/// Record indexes in the mismatches count decisions only.
pub fn replay_log(config: &Config, machine: &MachineInfo, lines: &[LogLine]) -> Vec<Mismatch> {
    // With Kubernetes discovery the policy's services are the config's and the discovered
    // pods' (`LcSet` events), rebuilt here as the live agent built them.
    let mut policy = policy::build(&crate::discovered::initial_policy_config(config), machine);
    let mut current = config.clone();
    let mut mismatches = Vec::new();
    let mut index = 0usize;
    let mut advertise = AdvertiseCheck::new(config, machine);
    for line in lines {
        let record = match line {
            LogLine::Event(CtlEvent::LcSet { synced, lcs, .. }) => {
                let c = crate::discovered::policy_config(&current, *synced, lcs);
                policy.reconfigure(&c);
                continue;
            }
            LogLine::Event(CtlEvent::Set { t_ms, key, value }) => {
                let _ = current.set(key, value);
                if let Err(e) = policy.set_param(key, value) {
                    mismatches.push(Mismatch {
                        index,
                        t_ms: *t_ms,
                        field: "event".into(),
                        recorded: serde_json::json!(format!("set {key}={value} accepted")),
                        replayed: serde_json::json!(e.to_string()),
                    });
                }
                continue;
            }
            LogLine::Event(CtlEvent::Pause { .. }) => {
                policy.pause();
                continue;
            }
            LogLine::Event(CtlEvent::Resume { .. }) => {
                policy.resume();
                continue;
            }
            // be-memory follows the host's memory, not a decision: nothing to recompute.
            LogLine::Event(CtlEvent::Off { .. } | CtlEvent::AdvertiseMemory { .. }) => continue,
            // What the node advertised follows from the decisions' advertiser inputs.
            LogLine::Event(event @ CtlEvent::Advertise { .. }) => {
                mismatches.extend(advertise.logged(index, event));
                continue;
            }
            LogLine::Decision(r) => r,
        };
        index += 1;
        let index = index - 1;
        // A run written as one line: its first tick, and its last (the ticks between held
        // the same decision).
        let last = record
            .repeat
            .as_ref()
            .map(|r| (r.last_t_ms, &r.last_observation));
        for (t_ms, observation) in std::iter::once((record.t_ms, &record.observation)).chain(last) {
            let decision = policy.decide(observation, Duration::from_millis(t_ms));
            let mut compare =
                |field: &str, recorded: serde_json::Value, replayed: serde_json::Value| {
                    if recorded != replayed {
                        mismatches.push(Mismatch {
                            index,
                            t_ms,
                            field: field.to_string(),
                            recorded,
                            replayed,
                        });
                    }
                };
            compare(
                "policy",
                via_json(&record.policy),
                via_json(&config.policy.kind.as_str()),
            );
            compare(
                "allocation",
                via_json(&record.allocation),
                via_json(&decision.allocation),
            );
            compare(
                "reason",
                via_json(&record.reason),
                via_json(&decision.reason),
            );
            compare("state", via_json(&record.state), via_json(&decision.state));
            compare(
                "binding_lc",
                via_json(&record.binding_lc),
                via_json(&decision.binding_lc),
            );
            if let Some(input) = &record.advertise {
                mismatches.extend(advertise.tick(index, t_ms, input, &decision.allocation));
            }
        }
    }
    mismatches.extend(advertise.unlogged(index));
    mismatches
}

/// The advertiser replayed beside the policy: the change its last tick made, until the log's
/// `advertise` line for it (the agent writes that line right after the tick's decision line).
struct AdvertiseCheck {
    advertiser: Advertiser,
    machine_cpus: u32,
    /// The change recomputed at the last tick fed, with that tick's floor.
    pending: Option<(AdvertiseChange, u64)>,
}

impl AdvertiseCheck {
    fn new(config: &Config, machine: &MachineInfo) -> AdvertiseCheck {
        AdvertiseCheck {
            advertiser: Advertiser::new(config.kubernetes.advertise_params()),
            machine_cpus: machine.cpus.len() as u32,
            pending: None,
        }
    }

    /// The logged `advertise` line of a change recomputed.
    fn event(change: &AdvertiseChange, floor_millicpu: u64) -> CtlEvent {
        CtlEvent::Advertise {
            t_ms: change.t_ms,
            from_millicpu: change.from_millicpu,
            to_millicpu: change.to_millicpu,
            reason: change.reason,
            detail: change.detail.clone(),
            floor_millicpu,
        }
    }

    /// A recomputed change no line followed.
    fn unlogged(&mut self, index: usize) -> Option<Mismatch> {
        let (change, floor) = self.pending.take()?;
        Some(Mismatch {
            index,
            t_ms: change.t_ms,
            field: "advertise".into(),
            recorded: serde_json::Value::Null,
            replayed: via_json(&Self::event(&change, floor)),
        })
    }

    /// One tick's logged input, fed; its granted CPUs must be what the replayed allocation
    /// grants.
    fn tick(
        &mut self,
        index: usize,
        t_ms: u64,
        input: &crate::advertise::AdvertiseInput,
        allocation: &headroom_types::allocation::Allocation,
    ) -> Vec<Mismatch> {
        let mut out: Vec<Mismatch> = self.unlogged(index).into_iter().collect();
        let granted = granted_millicpu(allocation, self.machine_cpus);
        if granted != input.granted_millicpu {
            out.push(Mismatch {
                index,
                t_ms,
                field: "advertise_granted".into(),
                recorded: serde_json::json!(input.granted_millicpu),
                replayed: serde_json::json!(granted),
            });
        }
        let (_, change) = self.advertiser.update(&Tick::of(t_ms, input));
        self.pending = change.map(|c| (c, input.floor_millicpu));
        out
    }

    /// A logged `advertise` line: it must be the change the last tick recomputed.
    fn logged(&mut self, index: usize, event: &CtlEvent) -> Option<Mismatch> {
        let CtlEvent::Advertise { t_ms, .. } = event else {
            return None;
        };
        let replayed = match self.pending.take() {
            Some((change, floor)) => via_json(&Self::event(&change, floor)),
            None => serde_json::Value::Null,
        };
        let recorded = via_json(event);
        (recorded != replayed).then_some(Mismatch {
            index,
            t_ms: *t_ms,
            field: "advertise".into(),
            recorded,
            replayed,
        })
    }
}
