//! `[policy]`: which policy runs; each policy's own section lives beside it in `crate::policy`.

use crate::config::{
    BlindConfig, HeraclesConfig, HybridConfig, MultiConfig, StaticCoresConfig, StaticCyclesConfig,
    WeightsConfig,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    None,
    StaticCores,
    StaticCycles,
    Weights,
    Blind,
    Heracles,
    Hybrid,
    /// `hybrid` bound by the tightest of several `[[lc]]` services, with PARTIES' CPU moves
    /// between pinned services (issue 29).
    Multi,
}

impl PolicyKind {
    /// The config spelling (`policy.kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::None => "none",
            PolicyKind::StaticCores => "static-cores",
            PolicyKind::StaticCycles => "static-cycles",
            PolicyKind::Weights => "weights",
            PolicyKind::Blind => "blind",
            PolicyKind::Heracles => "heracles",
            PolicyKind::Hybrid => "hybrid",
            PolicyKind::Multi => "multi",
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = crate::config::ConfigError;

    /// The config spelling (`"hybrid"`, `"static-cores"`, …).
    fn from_str(s: &str) -> Result<PolicyKind, Self::Err> {
        ALL_POLICY_KINDS
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                crate::config::invalid(
                    "policy.kind",
                    s,
                    format!(
                        "not a policy: one of {}",
                        ALL_POLICY_KINDS.map(PolicyKind::as_str).join(", ")
                    ),
                )
            })
    }
}

/// Every policy, in the order the docs list them.
pub const ALL_POLICY_KINDS: [PolicyKind; 8] = [
    PolicyKind::None,
    PolicyKind::StaticCores,
    PolicyKind::StaticCycles,
    PolicyKind::Weights,
    PolicyKind::Blind,
    PolicyKind::Heracles,
    PolicyKind::Hybrid,
    PolicyKind::Multi,
];

/// `[policy]`: which policy runs, and every policy's constants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    pub kind: PolicyKind,
    #[serde(rename = "static-cores")]
    pub static_cores: StaticCoresConfig,
    #[serde(rename = "static-cycles")]
    pub static_cycles: StaticCyclesConfig,
    pub weights: WeightsConfig,
    pub blind: BlindConfig,
    pub heracles: HeraclesConfig,
    pub hybrid: HybridConfig,
    pub multi: MultiConfig,
}

impl PolicyConfig {
    /// `kind` with every policy's constants at their defaults (the papers').
    pub fn of(kind: PolicyKind) -> PolicyConfig {
        PolicyConfig {
            kind,
            ..PolicyConfig::default()
        }
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            kind: PolicyKind::Hybrid,
            static_cores: StaticCoresConfig::default(),
            static_cycles: StaticCyclesConfig::default(),
            weights: WeightsConfig::default(),
            blind: BlindConfig::default(),
            heracles: HeraclesConfig::default(),
            hybrid: HybridConfig::default(),
            multi: MultiConfig::default(),
        }
    }
}
