//! The one error type of the load generator's engine, options, agents and outputs.

use std::path::PathBuf;

/// Everything that can stop a load run. Each variant names the thing involved (an address, a
/// flag and its value, a path) so the message alone tells the user what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A malformed option value: `flag` as the user spelled it, the value, why it is wrong.
    #[error("invalid value {value:?} for {flag}: {reason}")]
    InvalidOption {
        flag: String,
        value: String,
        reason: String,
    },
    /// A flag headroom accepts for mutilate's command lines but does not implement.
    #[error("{flags}: not supported: {reason}")]
    Unsupported { flags: String, reason: String },
    /// A flag whose meaning contradicts another's value (`--binary --protocol redis`).
    #[error("{flag} conflicts with {other}")]
    Conflict { flag: String, other: String },
    /// Two flags that each choose what the run is (`--scan`, `--search`).
    #[error("{flag} and {other} cannot be combined")]
    Combined { flag: String, other: String },
    /// A server address that does not resolve.
    #[error("cannot resolve server address {addr:?}: {reason}")]
    Resolve { addr: String, reason: String },
    /// A server that refuses or does not answer the connection.
    #[error("cannot connect to server {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// A server that answered the preload with something that is not a reply.
    #[error("preloading keys on {addr}: {reason}")]
    Preload { addr: String, reason: String },
    /// A file or socket this run writes (`--json`, `--csv`, `--hdr`, `--save`, `--feed`).
    #[error("{what} {path}: {source}")]
    Output {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A memcache-protocol server whose `stats` could not be read.
    #[error("reading `stats` from {addr}: {reason}")]
    ServerStats { addr: String, reason: String },
    /// A remote load agent (or, in agent mode, the master) broke the protocol or failed.
    #[error("load agent {peer}: {reason}")]
    Agent { peer: String, reason: String },
    /// More than one of the above found at once (every bad option is named, not only the first).
    #[error("{} problems: {}", .0.len(), .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Several(Vec<LoadError>),
    /// The operating system refused something the engine needs (a thread, a poller, a timer).
    #[error("{what}: {source}")]
    System {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl LoadError {
    pub(crate) fn invalid(
        flag: &str,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> LoadError {
        LoadError::InvalidOption {
            flag: flag.to_string(),
            value: value.into(),
            reason: reason.into(),
        }
    }

    /// One error as itself, several as [`LoadError::Several`].
    pub(crate) fn several(mut all: Vec<LoadError>) -> LoadError {
        if all.len() == 1 {
            all.remove(0)
        } else {
            LoadError::Several(all)
        }
    }

    pub(crate) fn system(what: impl Into<String>, source: std::io::Error) -> LoadError {
        LoadError::System {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn agent(peer: impl Into<String>, reason: impl Into<String>) -> LoadError {
        LoadError::Agent {
            peer: peer.into(),
            reason: reason.into(),
        }
    }

    /// True when the user asked for something impossible (maps to the CLI's usage exit code).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            LoadError::InvalidOption { .. }
                | LoadError::Unsupported { .. }
                | LoadError::Conflict { .. }
                | LoadError::Combined { .. }
        ) || matches!(self, LoadError::Several(all) if all.iter().any(LoadError::is_usage))
    }
}
