//! Errors of the results store and the renderer: every one names the path, command or value.

use std::path::PathBuf;

/// Anything that can go wrong while storing, reading or rendering results.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
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
    #[error("{0}")]
    Unavailable(String),
    #[error("rendering plot {figure}: {detail}")]
    Plot { figure: String, detail: String },
}

impl ReportError {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ReportError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T, E = ReportError> = std::result::Result<T, E>;
