//! Reading the agent's config file: the one place the config's text comes from disk (the
//! control crate parses and validates text, and reads no files).

use std::path::Path;

use headroom_control::config::{Config, ConfigError, KubernetesConfig};

/// Reads, parses and validates the config file at `path`; every error names the file.
pub fn read_config(path: &Path) -> Result<Config, ConfigError> {
    Config::from_file_text(&read(path)?, path)
}

/// The `[kubernetes]` section alone of the config file at `path` (default when absent).
pub fn read_kubernetes_config(path: &Path) -> Result<KubernetesConfig, ConfigError> {
    KubernetesConfig::from_config_text(&read(path)?, path)
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}
