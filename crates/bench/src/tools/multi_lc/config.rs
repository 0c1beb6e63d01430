//! The agent's config for one policy of `headroom bench multi-lc` (pure: a typed value).

use std::net::SocketAddr;
use std::path::PathBuf;

use headroom_control::config::{
    Config, ConfigError, LatencyConfig, OnExit, PolicyConfig, SafetyConfig, SloConfig,
};

use crate::record::{be_config, lc_config, LcService};

/// Where the agent takes each service's latency from.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Latency {
    /// Each service's own load generator pushes its live windows (`headroom load --feed`): the
    /// measurement that judges the SLO, as `bench colocation` does
    Feed,
    /// The agent's prober on each service's port
    Probe,
    /// The in-kernel sensor on each service's port (BPF), the prober where it cannot run
    Kernel,
}

/// One service as the agent sees it.
#[derive(Debug, Clone)]
pub struct LcEntry {
    pub name: String,
    pub cgroup: String,
    pub pid: u32,
    pub addr: SocketAddr,
    pub slo_us: f64,
    /// The service's capacity alone: its load is relative to it.
    pub peak_qps: f64,
    /// The feed socket (`Latency::Feed`).
    pub feed: PathBuf,
}

/// Everything the config says.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    pub policy: String,
    /// `[[lc]]` tables in order (`hybrid` protects the first only: it gets one).
    pub lcs: Vec<LcEntry>,
    pub latency: Latency,
    pub probe_hz: f64,
    pub percentile: f64,
    pub window_s: f64,
    pub be_cgroup: String,
    pub be_argv: Vec<String>,
    /// The CPUs BE may be given (the services' CPUs): without them blind isolation gives BE
    /// every CPU the services do not use — the load generators' and the agent's.
    pub be_cpus: Vec<usize>,
    pub violation_cooldown_s: f64,
    pub state_file: PathBuf,
    pub socket: PathBuf,
    pub metrics_port: u16,
}

fn latency_config(spec: &AgentSpec, lc: &LcEntry) -> LatencyConfig {
    match spec.latency {
        Latency::Feed => LatencyConfig::feed(&lc.feed),
        Latency::Probe => LatencyConfig::memcache_probe(lc.addr, spec.probe_hz),
        Latency::Kernel => LatencyConfig::kernel_or_memcache_probe(lc.addr, spec.probe_hz),
    }
}

/// The agent's config, built and validated (every problem at once).
pub fn agent_config(spec: &AgentSpec) -> Result<Config, ConfigError> {
    let mut lcs = Vec::new();
    for lc in &spec.lcs {
        let service = LcService {
            name: &lc.name,
            cgroup: &lc.cgroup,
            pid: lc.pid,
            addr: lc.addr,
            peak_qps: lc.peak_qps,
        };
        let slo = SloConfig {
            percentile: spec.percentile,
            target_us: lc.slo_us,
            window_s: spec.window_s,
            min_samples: None,
        };
        lcs.push(lc_config(&service, slo, latency_config(spec, lc))?);
    }
    let policy = PolicyConfig {
        kind: spec.policy.parse()?,
        ..PolicyConfig::default()
    };
    let mut config = Config::new(
        lcs,
        vec![be_config(&spec.be_cgroup, &spec.be_argv)?],
        policy,
    );
    config.policy.blind.be_cpus = spec.be_cpus.iter().map(|&c| c as u32).collect();
    // Alg. 1's cooldown after a negative slack and the safety layer's: the trace stands for a
    // day, so the production cooldown is scaled, at least one latency window.
    config.policy.heracles.cooldown_s = spec.violation_cooldown_s;
    config.safety = SafetyConfig {
        on_exit: OnExit::Restore,
        state_file: spec.state_file.display().to_string(),
        // the agent shares its CPU with the load generators: a SCHED_FIFO agent would
        // preempt them
        agent_fifo_priority: 0,
        violation_cooldown_s: spec.violation_cooldown_s,
        ..SafetyConfig::default()
    };
    config.api.socket = spec.socket.display().to_string();
    config.api.metrics = Some(SocketAddr::from(([127, 0, 0, 1], spec.metrics_port)).to_string());
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(policy: &str, n: usize, latency: Latency) -> AgentSpec {
        let lc = |name: &str, port: u16, slo: f64| LcEntry {
            name: name.into(),
            cgroup: format!("headroom-mlc-1/{name}"),
            pid: 4242,
            addr: ([127, 0, 0, 1], port).into(),
            slo_us: slo,
            peak_qps: 30_000.0,
            feed: PathBuf::from(format!("/tmp/feed-{name}.sock")),
        };
        AgentSpec {
            policy: policy.into(),
            lcs: [lc("a", 11211, 300.0), lc("b", 11212, 800.0)]
                .into_iter()
                .take(n)
                .collect(),
            latency,
            probe_hz: 200.0,
            percentile: 99.0,
            window_s: 10.0,
            be_cgroup: "headroom-mlc-1/be".into(),
            be_argv: vec!["taskset".into(), "-c".into(), "1".into(), "/bin/x".into()],
            be_cpus: vec![1],
            violation_cooldown_s: 10.0,
            state_file: "/tmp/s.json".into(),
            socket: "/tmp/ctl.sock".into(),
            metrics_port: 9999,
        }
    }

    #[test]
    fn the_configs_are_ones_the_agent_reads() {
        for latency in [Latency::Feed, Latency::Probe, Latency::Kernel] {
            for (policy, n) in [("hybrid", 1), ("multi", 2)] {
                let built = agent_config(&spec(policy, n, latency))
                    .unwrap_or_else(|e| panic!("{policy} {latency:?}: {e}"));
                // what the agent reads back from the file is what was built
                let text = toml::to_string(&built).unwrap();
                let c = Config::from_toml_str(&text)
                    .unwrap_or_else(|e| panic!("{policy} {latency:?}: {e}\n{text}"));
                assert_eq!(c, built, "{text}");
                assert_eq!(c.lcs.len(), n, "{text}");
                assert_eq!(c.lcs[0].name, "a");
                // BE only where the services run (the load generators' CPU 0 is not BE's)
                assert_eq!(
                    c.policy.blind.be_cpus.iter().collect::<Vec<_>>(),
                    vec![1],
                    "{text}"
                );
                if n == 2 {
                    assert_eq!(c.lcs[1].slo.target_us, 800.0);
                }
            }
        }
    }
}
