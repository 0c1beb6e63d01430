//! `[lc]`: the latency-critical service, its SLO and where its latency and load come from.

use headroom_types::{CpuSet, GroupPath, UserSpec};
use serde::{Deserialize, Serialize};

/// `[lc]`: the latency-critical service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LcConfig {
    pub name: String,
    /// Relative to the cgroup root; created if missing.
    pub cgroup: GroupPath,
    /// Rank among several `[[lc]]` services: higher = more important (default 0). Unused
    /// while the agent protects one LC (issue 29's arbitration will read it).
    #[serde(default)]
    pub priority: i32,
    /// Processes to move into the LC group.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// A command the agent launches in the LC group (instead of `pids`).
    #[serde(default)]
    pub command: Vec<String>,
    /// Where the LC is found again when it restarts under a new pid (a service manager
    /// restarted it): a file holding its pid, read every second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_file: Option<String>,
    /// The same by the TCP port it listens on: when its group holds no process, the process
    /// listening there is moved in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen_port: Option<u16>,
    /// The user the LC runs as (a login name or a uid). When set, a process found again by
    /// `pid_file`, `listen_port` or `command` is taken as the LC only if it runs as exactly
    /// this user (real and effective uid), and on the port rule only if its listening socket
    /// was made by this user or root (a daemon binds as root, then becomes its user); root's
    /// and the agent's own processes are not taken unless this user is theirs. Unset: the
    /// users the LC is seen running as in its group count, with root and the agent's user
    /// (and the first process found, when the group was empty since start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserSpec>,
    #[serde(default)]
    pub slo: SloConfig,
    /// Where the tail latency comes from; required by latency-driven policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyConfig>,
    /// Where the load comes from; required by load-driven policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadConfig>,
    /// LC thread treatment (mainline stand-ins for BVT warp).
    #[serde(default)]
    pub threads: LcThreadsConfig,
}

impl LcConfig {
    /// A service in group `cgroup` made of `pids`, judged by `slo`; no command, default
    /// priority and thread treatment.
    pub fn new(
        name: &str,
        cgroup: GroupPath,
        pids: Vec<u32>,
        slo: SloConfig,
        latency: Option<LatencyConfig>,
        load: Option<LoadConfig>,
    ) -> LcConfig {
        LcConfig {
            name: name.to_string(),
            cgroup,
            priority: 0,
            pids,
            command: Vec::new(),
            pid_file: None,
            listen_port: None,
            user: None,
            slo,
            latency,
            load,
            threads: LcThreadsConfig::default(),
        }
    }
}

/// `[lc.slo]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloConfig {
    pub percentile: f64,
    pub target_us: f64,
    pub window_s: f64,
    /// Samples a latency window needs before its percentile counts (default 10 / (1 − p):
    /// 1000 for p99, so that 10 samples lie beyond it — the load generator's own rule).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_samples: Option<u64>,
}

impl Default for SloConfig {
    fn default() -> Self {
        SloConfig {
            percentile: 99.0,
            target_us: 500.0,
            window_s: 15.0,
            min_samples: None,
        }
    }
}

impl SloConfig {
    /// `min_samples`, or the default for the percentile.
    pub fn min_samples(&self) -> u64 {
        self.min_samples
            .unwrap_or_else(|| headroom_types::resources::min_samples_for(self.percentile))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencySource {
    Probe,
    Prometheus,
    Feed,
    /// The passive in-kernel sensor of the LC's own requests on `port`/`ports` (BPF).
    Kernel,
}

/// What fills in for the kernel sensor (`fallback = "probe"`): where it cannot run, and in
/// windows with too few of the LC's requests (a nearly idle LC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyFallback {
    Probe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeProtocol {
    Memcache,
    Redis,
    Http,
}

/// `[lc.latency]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LatencyConfig {
    pub source: LatencySource,
    /// Probe protocol (`source = "probe"`).
    #[serde(default = "default_protocol")]
    pub protocol: ProbeProtocol,
    /// `host:port` of the service to probe (`source = "probe"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Probe requests per second.
    #[serde(default = "default_rate_hz")]
    pub rate_hz: f64,
    /// Prometheus endpoint URL (`source = "prometheus"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Prometheus histogram metric name (`source = "prometheus"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// Unix socket a `headroom load --feed` connects to (`source = "feed"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// The prober refuses a window whose own send lag p99 exceeds this, µs (its CPU was busy:
    /// the window would measure the prober, not the LC). Default: 20% of the SLO target, at
    /// least 100 µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_send_lag_us: Option<f64>,
    /// The LC's TCP port the kernel sensor watches (`source = "kernel"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The LC's TCP ports, where it has several (`source = "kernel"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u16>>,
    /// `"probe"`: the prober fills in where the kernel sensor cannot run or its window has
    /// too few requests (it probes `address`, default `127.0.0.1:<first port>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<LatencyFallback>,
}

impl LatencyConfig {
    /// `source` with every optional key unset, the memcache protocol and the default rate.
    fn of(source: LatencySource) -> LatencyConfig {
        LatencyConfig {
            source,
            protocol: default_protocol(),
            address: None,
            rate_hz: default_rate_hz(),
            url: None,
            metric: None,
            socket: None,
            max_send_lag_us: None,
            port: None,
            ports: None,
            fallback: None,
        }
    }

    /// Windows pushed by `headroom load --feed` to the unix socket `socket`.
    pub fn feed(socket: &std::path::Path) -> LatencyConfig {
        LatencyConfig {
            socket: Some(socket.display().to_string()),
            ..LatencyConfig::of(LatencySource::Feed)
        }
    }

    /// Windows fed in process (the simulator's), no socket.
    pub fn fed_in_process() -> LatencyConfig {
        LatencyConfig::of(LatencySource::Feed)
    }

    /// The agent's memcache prober on `address`, `rate_hz` probes a second.
    pub fn memcache_probe(address: std::net::SocketAddr, rate_hz: f64) -> LatencyConfig {
        LatencyConfig {
            address: Some(address.to_string()),
            rate_hz,
            ..LatencyConfig::of(LatencySource::Probe)
        }
    }

    /// The kernel sensor of the LC's own requests on `port` alone: no prober behind it.
    pub fn kernel(port: u16) -> LatencyConfig {
        LatencyConfig {
            port: Some(port),
            ..LatencyConfig::of(LatencySource::Kernel)
        }
    }

    /// The kernel sensor on `address`'s port, the memcache prober on `address` where it cannot
    /// run or its window has too few requests.
    pub fn kernel_or_memcache_probe(address: std::net::SocketAddr, rate_hz: f64) -> LatencyConfig {
        LatencyConfig {
            port: Some(address.port()),
            fallback: Some(LatencyFallback::Probe),
            ..LatencyConfig::memcache_probe(address, rate_hz)
        }
        .with_source(LatencySource::Kernel)
    }

    fn with_source(self, source: LatencySource) -> LatencyConfig {
        LatencyConfig { source, ..self }
    }

    /// The ports the kernel sensor watches (`port` and `ports` together).
    pub fn kernel_ports(&self) -> Vec<u16> {
        let mut p: Vec<u16> = self.port.into_iter().collect();
        p.extend(self.ports.iter().flatten().copied());
        p.sort_unstable();
        p.dedup();
        p
    }

    /// The address the prober probes: `address`, or for the kernel sensor's fallback the
    /// first of its ports on localhost.
    pub fn probe_address(&self) -> String {
        self.address.clone().unwrap_or_else(|| {
            self.kernel_ports()
                .first()
                .map_or_else(String::new, |p| format!("127.0.0.1:{p}"))
        })
    }

    /// The prober's send-lag bound for an SLO target of `target_us`.
    pub fn send_lag_bound_us(&self, target_us: f64) -> f64 {
        self.max_send_lag_us
            .unwrap_or_else(|| (0.2 * target_us).max(100.0))
    }
}

fn default_protocol() -> ProbeProtocol {
    ProbeProtocol::Memcache
}
fn default_rate_hz() -> f64 {
    1000.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadSource {
    MemcacheStats,
    RedisInfo,
    Prometheus,
    Feed,
}

/// `[lc.load]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadConfig {
    pub source: LoadSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The LC's peak load on this server; load fractions are relative to it.
    pub peak_qps: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Prometheus counter metric name (`source = "prometheus"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
}

impl LoadConfig {
    /// The load fed in process (the simulator's); loads are fractions of `peak_qps`.
    pub fn fed_in_process(peak_qps: f64) -> LoadConfig {
        LoadConfig {
            source: LoadSource::Feed,
            address: None,
            peak_qps,
            url: None,
            metric: None,
            socket: None,
        }
    }

    /// memcached's own `stats` on `address`; loads are fractions of `peak_qps`.
    pub fn memcache_stats(address: std::net::SocketAddr, peak_qps: f64) -> LoadConfig {
        LoadConfig {
            source: LoadSource::MemcacheStats,
            address: Some(address.to_string()),
            peak_qps,
            url: None,
            metric: None,
            socket: None,
        }
    }
}

/// `[lc.threads]`: how LC threads are treated.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LcThreadsConfig {
    /// Pin LC threads to distinct CPUs (Blagodurov §IV.E, Leverich & Kozyrakis).
    pub pin: bool,
    /// CPUs to pin onto; empty = the agent uses the lowest-numbered CPUs.
    #[serde(deserialize_with = "CpuSet::deserialize_distinct")]
    pub cpus: CpuSet,
    /// EEVDF slice request for LC threads, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slice_us: Option<u64>,
    /// Run LC threads SCHED_FIFO at this priority (1..99).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fifo_priority: Option<u8>,
}

/// The longest latency window the agent accepts, seconds.
pub const MAX_WINDOW_S: f64 = 3600.0;
/// The prober's rate cap, Hz, whatever the LC's peak.
pub const MAX_PROBE_HZ: f64 = 10_000.0;
/// The prober's rate cap as a share of `lc.load.peak_qps`.
pub const MAX_PROBE_SHARE: f64 = 0.05;

/// `lc` in the file: one `[lc]` table or several `[[lc]]`; one LC is written back as a table.
/// Read by hand (not an untagged enum) so a refused value keeps its path (`lc[1].slo.target_us`).
pub(crate) mod lc_list {
    use super::LcConfig;
    use serde::de::{self, MapAccess, SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(lcs: &[LcConfig], s: S) -> Result<S::Ok, S::Error> {
        match lcs {
            [one] => one.serialize(s),
            many => many.serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LcConfig>, D::Error> {
        struct Lcs;
        impl<'de> Visitor<'de> for Lcs {
            type Value = Vec<LcConfig>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an [lc] table or [[lc]] tables")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                LcConfig::deserialize(de::value::MapAccessDeserializer::new(map)).map(|lc| vec![lc])
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                let lcs = Vec::<LcConfig>::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                if lcs.is_empty() {
                    return Err(de::Error::custom("at least one LC service is needed"));
                }
                Ok(lcs)
            }
        }
        d.deserialize_any(Lcs)
    }
}
