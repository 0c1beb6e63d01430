//! The agent `headroom bench advertise` runs: Kubernetes discovery and advertising against the
//! stand-in API server, multi deciding (hybrid, with the one LC), BestEffort pods as BE — built as a typed config,
//! validated and written as TOML (never text put together by hand).

use std::path::{Path, PathBuf};

use headroom_control::config::{
    holder, BeConfig, Config, KubernetesConfig, OnExit, PolicyConfig, PolicyKind, SafetyConfig,
};
use headroom_types::discovery::LayoutChoice;
use headroom_types::GroupPath;

use super::super::error::Result;
use super::Flags;
use crate::record::write_config;

/// kubelet's BestEffort QoS parent in its cgroupfs layout: the agent's BE group.
pub(super) const BESTEFFORT: &str = "kubepods/besteffort";

/// Builds, validates and writes the agent's config into `dir`; its path.
pub(super) fn write(dir: &Path, kubeconfig: &Path, node: &str, f: &Flags) -> Result<PathBuf> {
    let path = dir.join("agent.toml");
    // A discovery-only config: the holder stands first until the pod list names the LC.
    let be = BeConfig::new("besteffort-pods", GroupPath::new(BESTEFFORT)?, Vec::new());
    // Discovery needs multi; with one LC it is hybrid unchanged (crates/control/src/policy/multi.rs).
    let mut policy = PolicyConfig::of(PolicyKind::Multi);
    // Hybrid's top-level controller has its own cooldown (Heracles' 5 minutes) beside the
    // safety rule's: a 16-vCPU run with only the safety's shortened held BE off 300 s after
    // one violation (2026-11-30).
    policy.heracles.cooldown_s = f.cooldown_s;
    let mut config = Config::new(vec![holder(false)], vec![be], policy);
    config.kubernetes = KubernetesConfig {
        discover: true,
        node_name: Some(node.to_string()),
        kubeconfig: Some(kubeconfig.display().to_string()),
        cgroup_layout: LayoutChoice::Cgroupfs,
        window_s: f.window_s,
        // memcached listens on 127.0.0.1: the prober fills in where the kernel sensor cannot.
        probe_fallback: true,
        advertise: true,
        advertise_horizon_s: f.horizon_s,
        advertise_percentile: f.percentile,
        advertise_margin_millicpu: f.margin_millicpu,
        advertise_damping_s: f.damping_s,
        advertise_min_history_s: f.min_history_s,
        // The step and be-memory's keys: the agent's defaults.
        ..KubernetesConfig::default()
    };
    config.safety = SafetyConfig {
        on_exit: OnExit::Restore,
        state_file: dir.join("state.json").display().to_string(),
        violation_cooldown_s: f.cooldown_s,
        ..SafetyConfig::default()
    };
    config.api.socket = dir.join("ctl.sock").display().to_string();
    // `""` (none) is a TOML spelling the typed value does not take: a free port instead.
    let metrics_port = crate::runner::free_port()?;
    config.api.metrics =
        Some(std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port)).to_string());
    write_config(&path, &config)?;
    Ok(path)
}
