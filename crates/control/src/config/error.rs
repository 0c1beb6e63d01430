//! The config's errors: each names the key, the value and what is wrong; several at once.

use std::path::Path;

/// The reason a number above `checks::MAX_NUMBER` is refused (a key's own bound, checked later,
/// replaces it: see `Problems::push`).
pub(crate) const TOO_LARGE: &str = "must be at most 1e12";

/// A configuration error: the key, the value and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// TOML syntax, a wrong type, or an unknown key (toml's message names the key and line).
    #[error("config: {0}")]
    Parse(String),
    /// A value that parsed but is not acceptable.
    #[error("{key} = {value}: {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
    /// The config file could not be read.
    #[error("reading config {path}: {reason}")]
    Io { path: String, reason: String },
    /// More than one of the above, in the file's order of sections; printed one a line.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Several(Vec<ConfigError>),
}

impl ConfigError {
    /// Every problem this error stands for (itself, unless it is [`ConfigError::Several`]).
    pub fn problems(&self) -> Vec<&ConfigError> {
        match self {
            ConfigError::Several(all) => all.iter().flat_map(|e| e.problems()).collect(),
            one => vec![one],
        }
    }

    /// The same error with a key under `from` moved under `to` (`lc.slo.target_us` to
    /// `lc[1].slo.target_us`).
    pub(crate) fn rekeyed(self, from: &str, to: &str) -> ConfigError {
        match self {
            ConfigError::Invalid { key, value, reason } if key.starts_with(&format!("{from}.")) => {
                ConfigError::Invalid {
                    key: format!("{to}{}", &key[from.len()..]),
                    value,
                    reason,
                }
            }
            other => other,
        }
    }

    /// A parse error's message with the file it came from.
    pub(crate) fn in_file(self, path: &Path) -> ConfigError {
        match self {
            ConfigError::Parse(m) => ConfigError::Parse(format!("{}: {m}", path.display())),
            ConfigError::Several(all) => {
                ConfigError::Several(all.into_iter().map(|e| e.in_file(path)).collect())
            }
            other => other,
        }
    }
}

/// The problems found in a config, at most one per key: the first (a later check of the same
/// key, such as `w_min <= w_max` after `w_min` was out of range, would only repeat it).
#[derive(Debug, Default)]
pub(crate) struct Problems(pub(crate) Vec<ConfigError>);

impl Problems {
    pub(crate) fn push(&mut self, e: ConfigError) {
        let same_key = |p: &ConfigError| match (p, &e) {
            (ConfigError::Invalid { key: a, .. }, ConfigError::Invalid { key: b, .. }) => a == b,
            _ => false,
        };
        match self.0.iter().position(same_key) {
            None => self.0.push(e),
            // The generic bound gives way to the key's own, more telling one.
            Some(i) if matches!(&self.0[i], ConfigError::Invalid { reason, .. } if reason == TOO_LARGE) =>
            {
                self.0[i] = e;
            }
            Some(_) => {}
        }
    }

    pub(crate) fn check(&mut self, result: Result<(), ConfigError>) {
        if let Err(e) = result {
            self.push(e);
        }
    }

    /// `Ok` when nothing was found; one problem as itself; several as [`ConfigError::Several`].
    pub(crate) fn into_result(mut self) -> Result<(), ConfigError> {
        match self.0.len() {
            0 => Ok(()),
            1 => Err(self.0.remove(0)),
            _ => Err(ConfigError::Several(self.0)),
        }
    }
}

pub(crate) fn invalid(
    key: &str,
    value: impl std::fmt::Debug,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        value: format!("{value:?}"),
        reason: reason.into(),
    }
}

/// A path key given relative: resolved against the agent's working directory, which a unit
/// file and an operator's shell do not share, so `who` looks in another place than the agent
/// (seventh hostile pass).
pub(crate) fn relative_path(key: &str, value: &str, who: &str) -> ConfigError {
    if value.trim().is_empty() {
        return invalid(key, value, "must not be empty");
    }
    invalid(
        key,
        value,
        format!("a relative path is resolved against the agent's working directory, so {who} started from another one looks in another place; give an absolute path"),
    )
}
