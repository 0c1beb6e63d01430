//! The agent's TOML configuration (docs/architecture.md "Config"; keys are a contract: extend, don't rename).
//!
//! Every paper constant is a key whose default is the paper's value. Unknown keys are refused
//! (`deny_unknown_fields`), and [`Config::validate`] refuses bad values and unsafe paths with an
//! error naming the key, the value and the reason. Every problem is reported at once
//! ([`ConfigError::Several`], one a line): each top-level section's first type error, or, when
//! every section parses, every refused value (at most one per key).

use std::path::Path;

use headroom_types::CpuSet;
use serde::{Deserialize, Serialize};

mod api;
mod be;
pub(crate) mod checks;
mod cross;
pub(crate) mod error;
mod host;
pub mod kubernetes;
mod lc;
mod lc_checks;
mod policy;
mod refusals;
mod safety;

pub use api::*;
pub use be::*;
pub use error::ConfigError;
pub(crate) use error::{invalid, relative_path, Problems};
pub use host::*;
pub use kubernetes::*;
pub use lc::*;
pub use policy::*;
pub use safety::*;

pub use crate::policy::blind::config::BlindConfig;
pub use crate::policy::heracles::config::{HeraclesConfig, LowSlackAction};
pub use crate::policy::hybrid::config::HybridConfig;
pub use crate::policy::multi::config::MultiConfig;
pub use crate::policy::simple::config::{StaticCoresConfig, StaticCyclesConfig};
pub use crate::policy::weights::config::{WeightGroupConfig, WeightsConfig, WeightsMode};

/// The whole agent configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The LC services: one `[lc]` table or several `[[lc]]`, never empty; the first is the
    /// one the agent protects ([`Config::lc`]) until issue 29's arbitration lands.
    /// With `[kubernetes] discover = true` and no `[lc]`, the holder service
    /// ([`kubernetes::holder`]) stands first.
    #[serde(rename = "lc", with = "lc::lc_list", default)]
    pub lcs: Vec<LcConfig>,
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
    /// `[kubernetes]`: live discovery of the node's LC pods.
    #[serde(default, skip_serializing_if = "KubernetesConfig::is_default")]
    pub kubernetes: KubernetesConfig,
}

pub(super) const MISSING_LC: &str = "missing: at least one LC service ([lc] or [[lc]]) is needed, unless [kubernetes] discover = true finds them";

/// Keys `set KEY=VALUE` may change while the agent runs.
const LIVE_PREFIXES: &[&str] = &["policy.", "lc.slo.", "safety."];
/// Safety keys read once, at start (the threads' scheduling is set when they start).
const NOT_LIVE: &[&str] = &[
    "safety.on_exit",
    "safety.state_file",
    "safety.agent_fifo_priority",
];
/// A service's SLO keys its latency sources are started with (the percentile they compute over
/// their window): read once, at start. Taken live, `ctl status` named a percentile the sensors
/// did not measure (fourth hostile pass); `slo.target_us` stays live.
const SLO_MEASURED: &[&str] = &["slo.percentile", "slo.window_s", "slo.min_samples"];

impl Config {
    /// `lcs` (the first protected by single-LC policies) beside `be`, run by `policy`; every
    /// other section at its defaults. Not yet validated: check it with [`Config::validate`]
    /// once it is complete.
    pub fn new(lcs: Vec<LcConfig>, be: Vec<BeConfig>, policy: PolicyConfig) -> Config {
        Config {
            lcs,
            be,
            policy,
            safety: SafetyConfig::default(),
            api: ApiConfig::default(),
            sensors: SensorsConfig::default(),
            egress: EgressConfig::default(),
            actuators: ActuatorsConfig::default(),
            kubernetes: KubernetesConfig::default(),
        }
    }

    /// The primary LC: the only one with `[lc]`, the first of several `[[lc]]`.
    pub fn lc(&self) -> &LcConfig {
        &self.lcs[0]
    }

    /// The primary LC, to change.
    pub fn lc_mut(&mut self) -> &mut LcConfig {
        &mut self.lcs[0]
    }

    /// The config key of LC `i`: `lc` when it is the only one, `lc[i]` among several.
    pub fn lc_key(&self, i: usize) -> String {
        if self.lcs.len() == 1 {
            "lc".to_string()
        } else {
            format!("lc[{i}]")
        }
    }

    /// Refuses a config the running agent cannot protect. Every validated config runs now:
    /// several `[[lc]]` services each get their group, sources and status, and single-LC
    /// policies protect the first (docs/agent.md "Several LC services"). Kept as the one
    /// place a start-time refusal goes.
    pub fn check_runnable(&self) -> Result<(), ConfigError> {
        Ok(())
    }

    /// Parses and validates a TOML document.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        // Syntax first (toml's message has the line); then the typed read, whose errors name
        // the key a value type refused (`be[0].cgroup = "./x": ...`). serde stops at the first
        // refusal, so the other sections are then read one by one for theirs.
        let doc: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let mut config: Config = match serde_path_to_error::deserialize(de) {
            Ok(config) => config,
            Err(e) => return Err(refusals::every_refusal(doc, e)),
        };
        if config.lcs.is_empty() {
            if !config.kubernetes.discover {
                return Err(invalid("lc", "", MISSING_LC));
            }
            config.lcs.push(kubernetes::holder(false));
        }
        config.normalize();
        config.validate()?;
        Ok(config)
    }

    /// The LC services the config names itself (the holder of a discovery-only config is none).
    pub fn static_lcs(&self) -> &[LcConfig] {
        match self.lcs.first() {
            Some(first) if kubernetes::is_holder(first) => &self.lcs[1..],
            _ => &self.lcs,
        }
    }

    /// Parses and validates the text of the config file at `path` (read by the caller: this
    /// crate reads no files); errors name the file.
    pub fn from_file_text(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Config::from_toml_str(text).map_err(|e| e.in_file(path))
    }

    /// The TOML form (what `status` shows and `set` edits).
    pub fn to_toml_string(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# unserializable config: {e}"))
    }

    /// Changes one key (dotted, as in the file: `policy.blind.buffer_cores`) to a TOML value
    /// (`2`, `0.5`, `"fair"`, `[1, 2]`; a bare word is taken as a string), validating the result.
    /// Only policy, SLO and safety keys may change at run time. On error `self` is unchanged.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        // `lc[i].slo.*` names one of several services; `lc.slo.*` the first.
        let service = lc_index(key);
        let live = (LIVE_PREFIXES.iter().any(|p| key.starts_with(p)) && !NOT_LIVE.contains(&key))
            || service.is_some_and(|(_, rest)| rest.starts_with("slo."));
        if NOT_LIVE.contains(&key) {
            return Err(invalid(
                key,
                value,
                "read once at start: change it in the config file and restart the agent",
            ));
        }
        if let Some((_, rest)) = service.filter(|(_, rest)| SLO_MEASURED.contains(rest)) {
            return Err(invalid(
                key,
                value,
                format!("read once at start (the latency sources measure the {rest} they started with): change it in the config file and restart the agent"),
            ));
        }
        if !live {
            return Err(invalid(
                key,
                value,
                "not changeable at run time (only policy.*, lc.slo.*, lc[i].slo.* and safety.* keys are)",
            ));
        }
        if let Some((i, _)) = service.filter(|(i, _)| *i >= self.lcs.len()) {
            return Err(invalid(
                key,
                value,
                format!("there is no lc[{i}]: {} LC service(s)", self.lcs.len()),
            ));
        }
        let parsed = parse_toml_value(value);
        let mut doc = toml::Value::try_from(&*self)
            .map_err(|e| invalid(key, value, format!("cannot serialize config: {e}")))?;
        let parts: Vec<&str> = key.split('.').collect();
        let (last, parents) = parts.split_last().expect("split of a non-empty key");
        let mut table = doc.as_table_mut().expect("config serializes as a table");
        for (n, part) in parents.iter().enumerate() {
            // `lc` is one table or an array of them (several services): `lc[i]`, or `lc`
            // for the first.
            let (name, index) = match (n, service) {
                (0, Some((i, _))) => ("lc", i),
                _ => (*part, 0),
            };
            let at = table.get_mut(name).and_then(|v| match v {
                toml::Value::Array(a) => a.get_mut(index),
                other => Some(other),
            });
            table = match at.and_then(|v| v.as_table_mut()) {
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
        let mut p = Problems::default();
        let missing = |list: &CpuSet| list.iter().find(|c| !cpus.contains(c));
        let online = headroom_types::allocation::format_cpulist(cpus);
        let lc_keys: Vec<String> = (0..self.lcs.len())
            .map(|i| format!("{}.threads.cpus", self.lc_key(i)))
            .collect();
        let lists = self
            .lcs
            .iter()
            .zip(&lc_keys)
            .map(|(lc, k)| (k.as_str(), &lc.threads.cpus));
        for (key, list) in
            lists.chain([("policy.static-cores.cpus", &self.policy.static_cores.cpus)])
        {
            if let Some(c) = missing(list) {
                p.push(invalid(
                    key,
                    format!("{:?}", list.to_vec()),
                    format!("CPU {c} is not online here (online: {online})"),
                ));
            }
        }
        let n = cpus.len() as f64;
        let b = self.policy.blind.buffer_cores;
        if !cpus.is_empty() && b >= n {
            p.push(invalid(
                "policy.blind.buffer_cores",
                b,
                format!(
                    "this machine has {n} CPUs: a buffer of {b} idle cores would never let BE run"
                ),
            ));
        }
        if !cpus.is_empty() && self.policy.static_cores.cores as f64 > n {
            p.push(invalid(
                "policy.static-cores.cores",
                self.policy.static_cores.cores,
                format!("this machine has {n} CPUs"),
            ));
        }
        p.into_result()
    }

    /// Every value check that needs no machine; all the problems found, at most one per key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut p = Problems::default();
        for (i, lc) in self.lcs.iter().enumerate() {
            lc.validate_as(&self.lc_key(i), &mut p);
        }
        self.validate_lcs(&mut p);
        validate_be(&self.be, &self.lcs, &mut p);
        self.egress.validate(&mut p);
        self.sensors.validate(&mut p);
        if !self.actuators.io && !self.safety.be_io_limits.is_empty() {
            p.push(invalid(
                "actuators.io",
                self.actuators.io,
                "safety.be_io_limits are set but would never be applied: drop them or set actuators.io = true",
            ));
        }
        self.validate_policy(&mut p);
        self.safety.validate(&mut p);
        self.api.validate(&mut p);
        self.kubernetes.validate(&mut p);
        self.validate_across(&mut p);
        if self.static_lcs().is_empty() && self.policy.kind != PolicyKind::Multi {
            p.push(invalid(
                "policy.kind",
                self.policy.kind.as_str(),
                "[kubernetes] discover = true with no static [lc] needs policy.kind = \"multi\" (the policy that arbitrates between the pods it finds)",
            ));
        }
        p.into_result()
    }

    /// Several LCs: each its own name and its own group, neither inside another's.
    fn validate_lcs(&self, p: &mut Problems) {
        for (i, lc) in self.lcs.iter().enumerate() {
            let before = self.lcs[..i].iter().enumerate();
            if let Some((j, _)) = before.clone().find(|(_, o)| o.name == lc.name) {
                p.push(invalid(
                    &format!("lc[{i}].name"),
                    &lc.name,
                    format!("lc[{j}] has the same name: each LC service needs its own"),
                ));
            }
            if let Some((j, o)) = before.clone().find(|(_, o)| o.cgroup.overlaps(&lc.cgroup)) {
                let how = if o.cgroup == lc.cgroup {
                    "is the same group as"
                } else {
                    "overlaps"
                };
                p.push(invalid(
                    &format!("lc[{i}].cgroup"),
                    lc.cgroup.as_str(),
                    format!(
                        "{how} lc[{j}].cgroup {:?} ({:?}): each LC needs a group of its own, neither inside the other",
                        o.cgroup.as_str(),
                        o.name
                    ),
                ));
            }
        }
    }

    fn validate_policy(&self, problems: &mut Problems) {
        let p = &self.policy;
        let steered = matches!(
            p.kind,
            PolicyKind::Heracles | PolicyKind::Hybrid | PolicyKind::Multi
        );
        let needs_latency =
            steered || (p.kind == PolicyKind::Weights && p.weights.mode != WeightsMode::Static);
        // Each service needs the signals the policy steers by. One LC keeps the message it
        // always had (on `policy.kind`); among several, the service's own key is named.
        // heracles/hybrid steer by the first service's load alone, multi by every service's.
        let needs_load = |i: usize| steered && (i == 0 || p.kind == PolicyKind::Multi);
        for (i, lc) in self.lcs.iter().enumerate() {
            if kubernetes::is_holder(lc) {
                continue;
            }
            let (key, value) = if self.lcs.len() == 1 {
                ("policy.kind".to_string(), p.kind.as_str().to_string())
            } else {
                (format!("lc[{i}].latency"), "none".to_string())
            };
            let of = if self.lcs.len() == 1 {
                String::new()
            } else {
                format!("policy.kind = {:?} ", p.kind.as_str())
            };
            let ix = self.lc_key(i);
            if needs_latency && lc.latency.is_none() {
                let and_load = if lc.load.is_none() && needs_load(i) {
                    format!(" (and [{ix}.load])")
                } else {
                    String::new()
                };
                problems.push(invalid(
                    &key,
                    &value,
                    format!("{of}needs [{ix}.latency]{and_load} to be configured"),
                ));
            } else if needs_load(i) && lc.load.is_none() {
                let key = if self.lcs.len() == 1 {
                    key
                } else {
                    format!("lc[{i}].load")
                };
                problems.push(invalid(
                    &key,
                    &value,
                    format!("{of}needs [{ix}.load] (with peak_qps) to be configured"),
                ));
            }
        }
        p.static_cores.validate(problems);
        p.static_cycles.validate(problems);
        p.weights.validate(problems);
        p.blind.validate(problems);
        p.heracles.validate(problems);
        p.hybrid.validate(problems);
        p.multi.validate(problems);
        if p.kind == PolicyKind::Multi {
            cross::validate_services(self, problems);
        }
    }
}

/// `lc[i].rest` → `(i, "rest")`; `lc.rest` → `(0, "rest")` (the first service); else `None`.
fn lc_index(key: &str) -> Option<(usize, &str)> {
    if let Some(rest) = key.strip_prefix("lc.") {
        return Some((0, rest));
    }
    let (i, rest) = key.strip_prefix("lc[")?.split_once("].")?;
    Some((i.parse().ok()?, rest))
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
