//! Errors of the simulator, planner and calibration: each names the file, line or key, and value.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Malformed input (TOML, CSV): the file, the line when known, and why.
    #[error("{}", where_(file.as_deref(), *line, reason))]
    Parse {
        file: Option<PathBuf>,
        line: Option<usize>,
        reason: String,
    },
    /// A value out of range: the key, the value, why.
    #[error("{}{key} = {value}: {reason}", file.as_ref().map_or(String::new(), |f| format!("{}: ", f.display())))]
    Invalid {
        file: Option<PathBuf>,
        key: String,
        value: String,
        reason: String,
    },
    /// More than one of the above found at once (every bad value is named, not only the first).
    #[error("{} problems: {}", .0.len(), .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Several(Vec<SimError>),
    /// The model's calibration data do not cover what was asked.
    #[error("not covered by the model's calibration: {0}")]
    NotCovered(String),
    /// Bench data that cannot be fitted (all points failed their self-checks, nothing usable).
    #[error("calibration refused: {0}")]
    Refused(String),
    #[error(transparent)]
    Report(#[from] headroom_report::ReportError),
}

fn where_(file: Option<&Path>, line: Option<usize>, reason: &str) -> String {
    match (file, line) {
        (Some(f), Some(l)) => format!("{}: line {l}: {reason}", f.display()),
        (Some(f), None) => format!("{}: {reason}", f.display()),
        (None, Some(l)) => format!("line {l}: {reason}"),
        (None, None) => reason.to_string(),
    }
}

impl SimError {
    pub fn io(path: &Path, source: std::io::Error) -> SimError {
        SimError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn invalid(key: &str, value: impl std::fmt::Display, reason: &str) -> SimError {
        SimError::Invalid {
            file: None,
            key: key.to_string(),
            value: value.to_string(),
            reason: reason.to_string(),
        }
    }

    /// None for no problem, the one itself, or [`SimError::Several`].
    pub fn gather(mut all: Vec<SimError>) -> Result<(), SimError> {
        match all.len() {
            0 => Ok(()),
            1 => Err(all.remove(0)),
            _ => Err(SimError::Several(all)),
        }
    }

    /// Attaches the file an error came from.
    pub fn in_file(self, path: &Path) -> SimError {
        match self {
            SimError::Parse { line, reason, .. } => SimError::Parse {
                file: Some(path.to_path_buf()),
                line,
                reason,
            },
            SimError::Invalid {
                key, value, reason, ..
            } => SimError::Invalid {
                file: Some(path.to_path_buf()),
                key,
                value,
                reason,
            },
            SimError::Several(all) => {
                SimError::Several(all.into_iter().map(|e| e.in_file(path)).collect())
            }
            other => other,
        }
    }

    /// True for errors in what the user gave (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            SimError::Parse { .. }
                | SimError::Invalid { .. }
                | SimError::NotCovered(_)
                | SimError::Refused(_)
        ) || matches!(self, SimError::Several(all) if all.iter().any(SimError::is_bad_input))
    }
}
