//! The `record` and `publish` phases on a real host: the decision log (size-capped, rotated
//! once), the Prometheus metrics, the reasons `ctl status` shows, and the run's counters.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::allocation::Allocation;
use crate::controller::{TickOutcome, TickSink};
use crate::decision::{CtlEvent, Decision, DecisionRecord};
use crate::observation::Observation;
use crate::publish::metrics::Metrics;

use super::RunSummary;

/// Reasons kept for `ctl status`.
const REASONS_KEPT: usize = 10;

/// The decision log: one JSON line per decision. When it reaches `max_bytes` it is renamed to
/// `<path>.1` (replacing the previous one) and started anew, so it never holds more than twice
/// its cap on disk. A failing write (ENOSPC) is reported once, and again only after a write
/// has succeeded in between.
pub struct DecisionLog {
    path: PathBuf,
    file: BufWriter<File>,
    written: u64,
    max_bytes: u64,
    failing: bool,
    /// Lines that could not be written.
    pub lost: u64,
}

impl DecisionLog {
    pub fn open(path: &Path, max_bytes: u64) -> std::io::Result<DecisionLog> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let written = file.metadata().map_or(0, |m| m.len());
        Ok(DecisionLog {
            path: path.to_path_buf(),
            file: BufWriter::with_capacity(1 << 16, file),
            written,
            max_bytes: max_bytes.max(4096),
            failing: false,
            lost: 0,
        })
    }

    /// Appends `line` and a newline.
    pub fn write_line(&mut self, line: &str) {
        if self.written + line.len() as u64 + 1 > self.max_bytes {
            if let Err(e) = self.rotate() {
                self.failed("rotating", &e);
            }
        }
        match self
            .file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.write_all(b"\n"))
        {
            Ok(()) => {
                self.written += line.len() as u64 + 1;
                if self.failing {
                    tracing::info!(path = %self.path.display(), lost = self.lost, "decision log writable again");
                }
                self.failing = false;
            }
            Err(e) => {
                self.lost += 1;
                self.failed("writing", &e);
            }
        }
    }

    fn failed(&mut self, what: &str, e: &std::io::Error) {
        if !self.failing {
            tracing::error!(path = %self.path.display(), error = %e, "{what} the decision log failed (reported once until it works again)");
        }
        self.failing = true;
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.file.flush()?;
        let mut old = self.path.as_os_str().to_owned();
        old.push(".1");
        std::fs::rename(&self.path, PathBuf::from(old))?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.file = BufWriter::with_capacity(1 << 16, file);
        self.written = 0;
        Ok(())
    }

    pub fn flush(&mut self) {
        if let Err(e) = self.file.flush() {
            self.failed("flushing", &e);
        }
    }
}

/// Where the Linux agent's ticks go.
pub struct Publisher {
    pub log: Option<DecisionLog>,
    pub metrics: Metrics,
    pub policy: &'static str,
    pub started_unix_ms: u64,
    pub slo_us: f64,
    pub reasons: VecDeque<(u64, String)>,
    pub last_reason: String,
    pub last_allocation: Option<Allocation>,
    pub last_write_error: Option<String>,
    pub summary: RunSummary,
    /// Something the state file records changed (writes were made).
    pub state_dirty: bool,
}

impl Publisher {
    /// Logs a ctl command that changes the policy's decisions, on the decisions' clock, so
    /// `--replay` applies it between the same two decisions.
    pub fn log_event(&mut self, event: &CtlEvent) {
        if let Some(log) = &mut self.log {
            log.write_line(&event.to_json_line());
            log.flush();
        }
    }
}

impl TickSink for Publisher {
    fn record(&mut self, t: Duration, obs: &Observation, decision: &Decision) {
        if let Some(log) = &mut self.log {
            let rec = DecisionRecord::new(
                t,
                self.started_unix_ms + t.as_millis() as u64,
                self.policy,
                obs,
                decision,
            );
            log.write_line(&rec.to_json_line());
        }
    }

    fn publish(&mut self, t: Duration, obs: &Observation, outcome: &TickOutcome) {
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

#[cfg(test)]
mod tests {
    use super::DecisionLog;

    /// At 1 ms a log grows ~1.5 MB/s: past its cap it is rotated once, so the disk holds at
    /// most twice the cap however long the agent runs.
    #[test]
    fn the_decision_log_is_capped_and_rotated_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.jsonl");
        let mut log = DecisionLog::open(&path, 8192).unwrap();
        let line = format!("{{\"t_ms\":1,\"pad\":\"{}\"}}", "x".repeat(100));
        for _ in 0..10_000 {
            log.write_line(&line);
        }
        log.flush();
        let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let rotated = dir.path().join("decisions.jsonl.1");
        assert!(size(&path) <= 8192, "{}", size(&path));
        assert!(size(&rotated) <= 8192 && size(&rotated) > 0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        // every line kept is whole
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().all(|l| l == line));
        assert_eq!(log.lost, 0);
    }

    /// A log on a full disk loses lines (counted) and says so once, not every tick.
    #[test]
    fn a_full_disk_is_counted_not_fatal() {
        if !std::path::Path::new("/dev/full").exists() {
            return eprintln!("SKIP a_full_disk_is_counted_not_fatal: no /dev/full");
        }
        let mut log = DecisionLog::open(std::path::Path::new("/dev/full"), 1 << 30).unwrap();
        for _ in 0..100 {
            log.write_line(&"y".repeat(70_000));
        }
        assert!(log.lost > 0);
    }
}
