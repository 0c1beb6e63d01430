//! The agent's config for one policy of `headroom bench multi-lc` (pure: text from values).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::record::{be_and_policy, feed_latency, probe_latency, LcTables};

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

fn latency_table(spec: &AgentSpec, lc: &LcEntry) -> String {
    match spec.latency {
        Latency::Feed => feed_latency(&lc.feed),
        Latency::Probe => probe_latency(lc.addr, spec.probe_hz),
        Latency::Kernel => format!(
            "source = \"kernel\"\nport = {}\nfallback = \"probe\"\nprotocol = \"memcache\"\naddress = \"{}\"\nrate_hz = {:?}",
            lc.addr.port(),
            lc.addr,
            spec.probe_hz
        ),
    }
}

/// The TOML text.
pub fn agent_toml(spec: &AgentSpec) -> String {
    let mut t = format!(
        "# Written by headroom bench multi-lc: policy {}, {} LC service(s)\n",
        spec.policy,
        spec.lcs.len()
    );
    for lc in &spec.lcs {
        let latency = latency_table(spec, lc);
        let tables = LcTables {
            name: &lc.name,
            cgroup: &lc.cgroup,
            pid: lc.pid,
            percentile: spec.percentile,
            slo_us: lc.slo_us,
            window_s: spec.window_s,
            latency: &latency,
            addr: lc.addr,
            peak_qps: lc.peak_qps,
        };
        t.push('\n');
        t.push_str(&tables.toml("[[lc]]"));
    }
    t.push_str(&format!(
        r#"
{be}
[policy.blind]
be_cpus = [{be_cpus}]

[policy.heracles]
# Alg. 1's cooldown after a negative slack, scaled as the safety layer's below
cooldown_s = {cooldown:?}

[safety]
on_exit = "restore"
state_file = "{state}"
# the agent shares its CPU with the load generators: a SCHED_FIFO agent would preempt them
agent_fifo_priority = 0
# the trace stands for a day: the production cooldown scaled, at least one latency window
violation_cooldown_s = {cooldown:?}

[api]
socket = "{socket}"
metrics = "127.0.0.1:{port}"
"#,
        be = be_and_policy(&spec.be_cgroup, &spec.be_argv, &spec.policy),
        be_cpus = spec
            .be_cpus
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        state = spec.state_file.display(),
        cooldown = spec.violation_cooldown_s,
        socket = spec.socket.display(),
        port = spec.metrics_port,
    ));
    t
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
                let text = agent_toml(&spec(policy, n, latency));
                let c = headroom_control::config::Config::from_toml_str(&text)
                    .unwrap_or_else(|e| panic!("{policy} {latency:?}: {e}\n{text}"));
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
