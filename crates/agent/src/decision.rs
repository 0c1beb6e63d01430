//! A policy's decision, the decision-log record (TEAM.md contract 6), and replay.
//!
//! Replay builds a fresh policy from the same config and feeds it the recorded observations at
//! the recorded times; every decision must come out identical. For that the runtime must log
//! every tick on which it called `decide`, and call it with `now = Duration::from_millis(t_ms)`
//! (see [`tick_time`]), so the replayed clock equals the live one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::allocation::Allocation;
use crate::config::Config;
use crate::observation::Observation;
use crate::policy::{self, MachineInfo};

/// What a policy decided in one tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub allocation: Allocation,
    /// Short machine-readable reason, `policy:cause[:action]`, e.g. `heracles:slack<0:disable`.
    pub reason: String,
    /// The policy's internal state after the decision (for the log, `ctl status` and replay).
    pub state: serde_json::Value,
}

/// One line of the decision log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// Milliseconds since the agent started (the `now` given to the policy).
    pub t_ms: u64,
    /// Wall-clock time of the decision, ms since the Unix epoch.
    pub t_unix_ms: u64,
    /// `policy.kind`.
    pub policy: String,
    pub observation: Observation,
    pub allocation: Allocation,
    pub reason: String,
    pub state: serde_json::Value,
}

impl DecisionRecord {
    /// Builds the log record of `decision`, taken at `now` on the agent's monotonic clock.
    pub fn new(
        now: Duration,
        t_unix_ms: u64,
        policy: &str,
        observation: &Observation,
        decision: &Decision,
    ) -> DecisionRecord {
        DecisionRecord {
            t_ms: now.as_millis() as u64,
            t_unix_ms,
            policy: policy.to_string(),
            observation: observation.clone(),
            allocation: decision.allocation.clone(),
            reason: decision.reason.clone(),
            state: decision.state.clone(),
        }
    }

    /// Parses one JSON line of the log.
    pub fn from_json_line(line: &str) -> Result<DecisionRecord, serde_json::Error> {
        serde_json::from_str(line)
    }

    /// The JSON line (without newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a decision record always serializes")
    }
}

/// A `headroom ctl` command that changed how the policy decides, logged between the decisions
/// so `--replay` applies it at the same point (`{"event":"set","t_ms":…,"key":…,"value":…}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum CtlEvent {
    Set {
        t_ms: u64,
        key: String,
        value: String,
    },
    Pause {
        t_ms: u64,
    },
    Resume {
        t_ms: u64,
    },
    /// The kill switch: actuation stops; the policy keeps deciding (nothing to replay).
    Off {
        t_ms: u64,
    },
}

impl CtlEvent {
    /// The JSON line (without newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a ctl event always serializes")
    }
}

/// One line of a decision log: a decision, or a ctl event between decisions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LogLine {
    Event(CtlEvent),
    Decision(Box<DecisionRecord>),
}

impl LogLine {
    /// Parses one JSON line of the log (logs written before ctl events were logged hold only
    /// decisions and parse the same).
    pub fn from_json_line(line: &str) -> Result<LogLine, serde_json::Error> {
        if let Ok(event) = serde_json::from_str::<CtlEvent>(line) {
            return Ok(LogLine::Event(event));
        }
        DecisionRecord::from_json_line(line).map(|r| LogLine::Decision(Box::new(r)))
    }
}

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
    /// `allocation`, `reason`, `state` or `policy`.
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
    let mut policy = policy::build(config, machine);
    let mut mismatches = Vec::new();
    let mut index = 0usize;
    for line in lines {
        let record = match line {
            LogLine::Event(CtlEvent::Set { t_ms, key, value }) => {
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
            LogLine::Event(CtlEvent::Off { .. }) => continue,
            LogLine::Decision(r) => r,
        };
        index += 1;
        let index = index - 1;
        let now = Duration::from_millis(record.t_ms);
        let decision = policy.decide(&record.observation, now);
        let mut compare =
            |field: &str, recorded: serde_json::Value, replayed: serde_json::Value| {
                if recorded != replayed {
                    mismatches.push(Mismatch {
                        index,
                        t_ms: record.t_ms,
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
    }
    mismatches
}
