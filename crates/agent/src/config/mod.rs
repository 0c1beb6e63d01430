//! The agent's TOML configuration (docs/architecture.md "Config"; keys are a contract: extend, don't rename).
//!
//! Every paper constant is a key whose default is the paper's value. Unknown keys are refused
//! (`deny_unknown_fields`), and [`Config::validate`] refuses bad values and unsafe paths with an
//! error naming the key, the value and the reason.

use std::path::Path;

use headroom_types::CpuSet;
use serde::{Deserialize, Serialize};

mod api;
mod be;
pub(crate) mod checks;
mod host;
mod lc;
mod policy;
mod safety;

pub use api::*;
pub use be::*;
pub use host::*;
pub use lc::*;
pub use policy::*;
pub use safety::*;

pub use crate::policy::blind::config::BlindConfig;
pub use crate::policy::heracles::config::{HeraclesConfig, LowSlackAction};
pub use crate::policy::hybrid::config::HybridConfig;
pub use crate::policy::simple::config::{StaticCoresConfig, StaticCyclesConfig};
pub use crate::policy::weights::config::{WeightGroupConfig, WeightsConfig, WeightsMode};

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

/// The whole agent configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub lc: LcConfig,
    #[serde(default)]
    pub be: Vec<BeConfig>,
    #[serde(default)]
    pub policy: PolicyConfig,
    #[serde(default)]
    pub safety: SafetyConfig,
    #[serde(default)]
    pub api: ApiConfig,
    #[serde(default)]
    pub sensors: SensorsConfig,
    #[serde(default)]
    pub egress: EgressConfig,
    #[serde(default)]
    pub actuators: ActuatorsConfig,
}

/// Keys `set KEY=VALUE` may change while the agent runs.
const LIVE_PREFIXES: &[&str] = &["policy.", "lc.slo.", "safety."];
const NOT_LIVE: &[&str] = &["safety.on_exit", "safety.state_file"];

impl Config {
    /// Parses and validates a TOML document.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        // Syntax first (toml's message has the line); then the typed read, whose errors name
        // the key a value type refused (`be[0].cgroup = "./x": ...`).
        let doc: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let mut config: Config =
            serde_path_to_error::deserialize(de).map_err(|e| refused_value(&doc, e))?;
        config.normalize();
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Config::from_toml_str(&text).map_err(|e| match e {
            ConfigError::Parse(m) => ConfigError::Parse(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// The TOML form (what `status` shows and `set` edits).
    pub fn to_toml_string(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# unserializable config: {e}"))
    }

    /// Changes one key (dotted, as in the file: `policy.blind.buffer_cores`) to a TOML value
    /// (`2`, `0.5`, `"fair"`, `[1, 2]`; a bare word is taken as a string), validating the result.
    /// Only policy, SLO and safety keys may change at run time. On error `self` is unchanged.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let live = LIVE_PREFIXES.iter().any(|p| key.starts_with(p)) && !NOT_LIVE.contains(&key);
        if !live {
            return Err(invalid(
                key,
                value,
                "not changeable at run time (only policy.*, lc.slo.* and safety.* keys are)",
            ));
        }
        let parsed = parse_toml_value(value);
        let mut doc = toml::Value::try_from(&*self)
            .map_err(|e| invalid(key, value, format!("cannot serialize config: {e}")))?;
        let parts: Vec<&str> = key.split('.').collect();
        let (last, parents) = parts.split_last().expect("split of a non-empty key");
        let mut table = doc.as_table_mut().expect("config serializes as a table");
        for part in parents {
            table = match table.get_mut(*part).and_then(|v| v.as_table_mut()) {
                Some(t) => t,
                None => return Err(invalid(key, value, format!("no table {part:?} here"))),
            };
        }
        table.insert((*last).to_string(), parsed);
        let mut updated: Config = doc
            .try_into()
            .map_err(|e: toml::de::Error| invalid(key, value, e.message().to_string()))?;
        updated.normalize();
        updated.validate()?;
        *self = updated;
        Ok(())
    }

    /// Spellings TOML cannot express otherwise: `api.metrics = ""` turns the endpoint off.
    fn normalize(&mut self) {
        if self
            .api
            .metrics
            .as_deref()
            .is_some_and(|m| m.trim().is_empty())
        {
            self.api.metrics = None;
        }
    }

    /// Checks values and paths; the error names the key, the value and the reason.
    /// The checks that need the machine: CPU ids that exist, buffers smaller than the machine.
    pub fn validate_on(&self, cpus: &[u32]) -> Result<(), ConfigError> {
        let missing = |list: &CpuSet| list.iter().find(|c| !cpus.contains(c));
        let online = crate::allocation::format_cpulist(cpus);
        for (key, list) in [
            ("lc.threads.cpus", &self.lc.threads.cpus),
            ("policy.static-cores.cpus", &self.policy.static_cores.cpus),
        ] {
            if let Some(c) = missing(list) {
                return Err(invalid(
                    key,
                    format!("{:?}", list.to_vec()),
                    format!("CPU {c} is not online here (online: {online})"),
                ));
            }
        }
        let n = cpus.len() as f64;
        let b = self.policy.blind.buffer_cores;
        if !cpus.is_empty() && b >= n {
            return Err(invalid(
                "policy.blind.buffer_cores",
                b,
                format!(
                    "this machine has {n} CPUs: a buffer of {b} idle cores would never let BE run"
                ),
            ));
        }
        if !cpus.is_empty() && self.policy.static_cores.cores as f64 > n {
            return Err(invalid(
                "policy.static-cores.cores",
                self.policy.static_cores.cores,
                format!("this machine has {n} CPUs"),
            ));
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.lc.validate()?;
        validate_be(&self.be, &self.lc.cgroup)?;
        self.egress.validate()?;
        self.sensors.validate()?;
        if !self.actuators.io && !self.safety.be_io_limits.is_empty() {
            return Err(invalid(
                "actuators.io",
                self.actuators.io,
                "safety.be_io_limits are set but would never be applied: drop them or set actuators.io = true",
            ));
        }
        self.validate_policy()?;
        self.safety.validate()?;
        self.api.validate()?;
        Ok(())
    }

    fn validate_policy(&self) -> Result<(), ConfigError> {
        let p = &self.policy;
        let needs_latency = matches!(p.kind, PolicyKind::Heracles | PolicyKind::Hybrid)
            || (p.kind == PolicyKind::Weights && p.weights.mode != WeightsMode::Static);
        if needs_latency && self.lc.latency.is_none() && self.lc.load.is_none() {
            return Err(invalid(
                "policy.kind",
                p.kind.as_str(),
                "needs [lc.latency] (and [lc.load]) to be configured",
            ));
        }
        if needs_latency && self.lc.latency.is_none() {
            return Err(invalid(
                "policy.kind",
                p.kind.as_str(),
                "needs [lc.latency] to be configured",
            ));
        }
        if matches!(p.kind, PolicyKind::Heracles | PolicyKind::Hybrid) && self.lc.load.is_none() {
            return Err(invalid(
                "policy.kind",
                p.kind.as_str(),
                "needs [lc.load] (with peak_qps) to be configured",
            ));
        }
        p.static_cores.validate()?;
        p.static_cycles.validate()?;

        p.weights.validate()?;
        p.blind.validate()?;
        p.heracles.validate()?;
        p.hybrid.validate()?;
        Ok(())
    }
}

/// A typed read that failed: when the path leads to a value in the document, the error is
/// `key = value: reason` like every other refusal; otherwise toml's own message (with its line).
fn refused_value(doc: &toml::Table, e: serde_path_to_error::Error<toml::de::Error>) -> ConfigError {
    use serde_path_to_error::Segment;
    let key = e.path().to_string();
    let mut at: Option<&toml::Value> = None;
    let mut table = Some(doc);
    for segment in e.path().iter() {
        at = match (segment, at) {
            (Segment::Map { key }, None) => table.and_then(|t| t.get(key)),
            (Segment::Map { key }, Some(v)) => v.get(key.as_str()),
            (Segment::Seq { index }, Some(v)) => v.get(*index),
            _ => None,
        };
        table = None;
        if at.is_none() {
            break;
        }
    }
    let inner = e.into_inner();
    match at {
        Some(v) if !v.is_table() => ConfigError::Invalid {
            key,
            value: v.to_string(),
            reason: inner.message().to_string(),
        },
        _ => ConfigError::Parse(inner.to_string()),
    }
}

/// Parses `value` as a TOML value; a bare word that is not TOML is taken as a string.
fn parse_toml_value(value: &str) -> toml::Value {
    let doc = format!("v = {value}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or(toml::Value::String(value.to_string())),
        Err(_) => toml::Value::String(value.to_string()),
    }
}
