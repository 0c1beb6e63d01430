//! The decision log's records (one JSON line per decision or ctl event): written by the agent,
//! read by `--replay`, `headroom bench` and `headroom sim` through these types only.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::allocation::Allocation;
use crate::observation::Observation;

/// What a policy decided in one tick.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub allocation: Allocation,
    /// Short machine-readable reason, `policy:cause[:action]`, e.g. `heracles:slack<0:disable`.
    pub reason: String,
    /// The policy's internal state after the decision (for the log, `ctl status` and replay).
    pub state: serde_json::Value,
    /// With several `[[lc]]` services: the one whose slack bound this decision (the tightest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_lc: Option<String>,
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
    /// With several `[[lc]]` services: the one whose slack bound this decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_lc: Option<String>,
    /// A run of identical decisions (allocation, reason and state) written as this one line:
    /// absent for a single decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<Repeat>,
    /// `[kubernetes] advertise`: what this tick fed the advertiser (every tick of a run fed the
    /// same); absent where nothing was fed (advertise off, the floor not yet listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<crate::advertise::AdvertiseInput>,
}

/// The rest of a run of identical decisions: `--replay` decides again at its last tick, with
/// its last observation, and expects the same decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repeat {
    /// Decisions in the run, the first included.
    pub count: u64,
    /// The last decision's `t_ms` and `t_unix_ms`.
    pub last_t_ms: u64,
    pub last_t_unix_ms: u64,
    pub last_observation: Observation,
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
            binding_lc: decision.binding_lc.clone(),
            repeat: None,
            advertise: None,
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
    /// Kubernetes discovery changed the LC services the policy sees (`[kubernetes] discover`):
    /// whether the first pod list has arrived, and every discovered LC after the change. Replay
    /// rebuilds the policy's services from these and the config, as the live agent did.
    LcSet {
        t_ms: u64,
        synced: bool,
        lcs: Vec<crate::discovery::DiscoveredLc>,
    },
    /// `[kubernetes] advertise`: the node's advertised `headroom.io/be-cpu` changed (one line
    /// per change, the floor then), after the line of the tick that changed it. Not a policy
    /// input: replay recomputes it from the decisions' advertiser inputs and checks it.
    Advertise {
        t_ms: u64,
        /// `None`: the first value.
        from_millicpu: Option<u64>,
        to_millicpu: u64,
        reason: crate::advertise::AdvertiseReason,
        detail: String,
        floor_millicpu: u64,
    },
    /// `[kubernetes] advertise`: the node's advertised `headroom.io/be-memory` changed (one line
    /// per change, the floor then, bytes), after the line of the tick that changed it. Its input
    /// is the host's memory, not a policy decision: replay passes it by.
    AdvertiseMemory {
        t_ms: u64,
        /// `None`: the first value.
        from_bytes: Option<u64>,
        to_bytes: u64,
        reason: crate::advertise::AdvertiseReason,
        detail: String,
        floor_bytes: u64,
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

/// A whole decision log's text, parsed: its lines, and the torn last line left out (an agent
/// killed or a disk filled mid-write; it ends without a newline and does not parse).
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedLog {
    pub lines: Vec<LogLine>,
    /// The torn last line's number (from 1) and why it does not parse.
    pub torn_tail: Option<(usize, String)>,
}

/// A line of a decision log that is neither a decision nor a ctl event (not a torn tail).
#[derive(Debug, thiserror::Error)]
#[error("line {line}: neither a decision record nor a ctl event: {source}")]
pub struct LogLineError {
    pub line: usize,
    #[source]
    pub source: serde_json::Error,
}

/// Parses a decision log's text; a torn last line (no newline after it, not parseable) is
/// left out and named, any other bad line is an error.
pub fn parse_log(text: &str) -> Result<ParsedLog, LogLineError> {
    let mut out = ParsedLog {
        lines: Vec::new(),
        torn_tail: None,
    };
    let numbered: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let unterminated = !text.ends_with('\n');
    for (k, &(i, line)) in numbered.iter().enumerate() {
        match LogLine::from_json_line(line) {
            Ok(l) => out.lines.push(l),
            Err(e) if unterminated && k + 1 == numbered.len() => {
                out.torn_tail = Some((i + 1, e.to_string()));
            }
            Err(source) => {
                return Err(LogLineError {
                    line: i + 1,
                    source,
                })
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_of(n: u64) -> String {
        (1..=n)
            .map(|t| CtlEvent::Pause { t_ms: t }.to_json_line() + "\n")
            .collect()
    }

    /// A log whose writer died mid-line replays everything before the torn tail.
    #[test]
    fn a_torn_tail_is_left_out_and_named() {
        let text = log_of(3) + "{\"Pause\":{\"t_m";
        let parsed = parse_log(&text).unwrap();
        assert_eq!(parsed.lines.len(), 3);
        assert_eq!(parsed.torn_tail.as_ref().map(|t| t.0), Some(4));
        let whole = parse_log(&log_of(3)).unwrap();
        assert_eq!(whole.lines.len(), 3);
        assert!(whole.torn_tail.is_none());
    }

    /// A bad line anywhere else (or a bad last line that ends in a newline) is an error.
    #[test]
    fn a_bad_line_that_is_not_the_torn_tail_is_an_error() {
        let text = log_of(1) + "garbage\n" + &log_of(1);
        assert_eq!(parse_log(&text).unwrap_err().line, 2);
        let text = log_of(2) + "garbage\n";
        assert_eq!(parse_log(&text).unwrap_err().line, 3);
    }
}
