//! Errors of the bench crate: every one names the path, command or value involved.

use std::path::PathBuf;

/// Anything that can go wrong while recording, studying or formatting an experiment.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing JSON in {path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("starting `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
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
}

impl BenchError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = BenchError> = std::result::Result<T, E>;
