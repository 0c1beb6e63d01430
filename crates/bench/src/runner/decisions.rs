//! The agent's decision log as the bench reads it: one point per decision, a tail that
//! follows the file, and the summary of a window.

use std::io::{BufRead, Seek};
use std::path::PathBuf;

use headroom_report::model::AgentWindow;

/// One decision-log line reduced to what the report plots.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionPoint {
    pub t_unix_ms: u64,
    pub be_enabled: bool,
    /// `None`: no cpuset restriction (every server CPU).
    pub be_cpus: Option<usize>,
    pub be_weight: Option<f64>,
    pub be_quota_pct: Option<f64>,
    pub reason: String,
}

impl DecisionPoint {
    /// A decision line of the agent's log, read through its contract type (ctl events and
    /// lines that are not decisions give `None`).
    pub fn from_line(line: &str) -> Option<DecisionPoint> {
        let headroom_types::decision::LogLine::Decision(rec) =
            headroom_types::decision::LogLine::from_json_line(line).ok()?
        else {
            return None;
        };
        let a = &rec.allocation;
        Some(DecisionPoint {
            t_unix_ms: rec.t_unix_ms,
            be_enabled: a.be_enabled,
            be_cpus: a.be_cpus.as_ref().map(|c| c.len()),
            be_weight: a.be_cpu_weight.map(|w| w.shares as f64),
            be_quota_pct: a.be_quota_pct,
            reason: rec.reason.clone(),
        })
    }

    /// BE CPUs in effect: 0 when disabled, the cpuset size, or all `server_cpus` when unrestricted.
    pub fn effective_cpus(&self, server_cpus: usize) -> f64 {
        if !self.be_enabled {
            0.0
        } else {
            self.be_cpus.unwrap_or(server_cpus) as f64
        }
    }
}

/// Reads a growing decision log incrementally (it can be large at 1 ms polling).
pub struct DecisionTail {
    path: PathBuf,
    offset: u64,
    partial: String,
    /// The last decision read (in effect until the next).
    pub last: Option<DecisionPoint>,
}

impl DecisionTail {
    pub fn new(path: PathBuf) -> DecisionTail {
        DecisionTail {
            path,
            offset: 0,
            partial: String::new(),
            last: None,
        }
    }

    /// Decisions appended since the previous call.
    pub fn read_new(&mut self) -> Vec<DecisionPoint> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        // The agent rotates its log at a size cap: a shorter file is a new one.
        if f.metadata().is_ok_and(|m| m.len() < self.offset) {
            self.offset = 0;
            self.partial.clear();
        }
        if f.seek(std::io::SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut reader = std::io::BufReader::new(f);
        let mut out = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.offset += n as u64;
                    if !line.ends_with('\n') {
                        self.partial.push_str(&line);
                        break;
                    }
                    let full = std::mem::take(&mut self.partial) + &line;
                    if let Some(d) = DecisionPoint::from_line(full.trim()) {
                        out.push(d);
                    }
                }
            }
        }
        if let Some(d) = out.last() {
            self.last = Some(d.clone());
        }
        out
    }
}

/// Summarises the decisions in effect over `[start, end]`: time-weighted BE CPUs and enabled
/// share, the last weight, quota and reason. `before` is the decision in effect at `start`.
pub fn summarize_decisions(
    before: Option<&DecisionPoint>,
    within: &[DecisionPoint],
    start_ms: u64,
    end_ms: u64,
    server_cpus: usize,
) -> Option<AgentWindow> {
    if end_ms <= start_ms || (before.is_none() && within.is_empty()) {
        return None;
    }
    let mut cur = before.cloned();
    let mut t = start_ms;
    let mut cpu_ms = 0.0;
    let mut enabled_ms = 0.0;
    let mut known_ms = 0.0;
    let mut step = |d: &Option<DecisionPoint>, from: u64, to: u64| {
        if let Some(d) = d {
            let dt = to.saturating_sub(from) as f64;
            cpu_ms += d.effective_cpus(server_cpus) * dt;
            if d.be_enabled {
                enabled_ms += dt;
            }
            known_ms += dt;
        }
    };
    for d in within.iter().filter(|d| d.t_unix_ms <= end_ms) {
        let at = d.t_unix_ms.max(start_ms);
        step(&cur, t, at);
        t = at;
        cur = Some(d.clone());
    }
    step(&cur, t, end_ms);
    let last = cur.as_ref();
    Some(AgentWindow {
        decisions: within.len() as u64,
        be_cpus_mean: (known_ms > 0.0).then(|| cpu_ms / known_ms),
        be_cpu_weight: last.and_then(|d| d.be_weight),
        be_quota_pct: last.and_then(|d| d.be_quota_pct),
        be_enabled_share: (known_ms > 0.0).then(|| enabled_ms / known_ms),
        last_reason: last.map(|d| d.reason.clone()),
    })
}
