//! Errors of the bench crate: every one names the path, command or value involved.

use std::path::PathBuf;

/// Anything that can go wrong while recording, studying or formatting an experiment.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("bad input: {0}")]
    Input(String),
    /// The agent config a run built is not one the agent would run.
    #[error("the agent config for {path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("{0}")]
    Unavailable(String),
    /// A measurement stayed invalid after its corrections: nothing may be derived from it.
    #[error("{what}: no valid measurement after {} run(s) ({}); failed self-check(s): {}. Fix: {fix}", tried.len(), tried.join("; "), checks.join(" | "))]
    Invalid {
        what: String,
        checks: Vec<String>,
        tried: Vec<String>,
        fix: String,
    },
    #[error(transparent)]
    Report(#[from] headroom_report::ReportError),
    /// The host layer (how a child is started: its group, its capabilities).
    #[error(transparent)]
    Host(#[from] headroom_host::HostError),
}

impl BenchError {
    /// A file the bench reads or writes (the results store's error, shared).
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Report(headroom_report::ReportError::io(op, path, source))
    }
}

pub type Result<T, E = BenchError> = std::result::Result<T, E>;
