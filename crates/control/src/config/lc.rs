//! `[lc]`: the latency-critical service, its SLO and where its latency and load come from.

use crate::config::api::MAX_SOCKET_PATH;
use crate::config::checks::*;
use crate::config::{invalid, relative_path, Problems};
use headroom_types::{CpuSet, GroupPath};
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

impl LcConfig {
    /// Refuses bad values under `key` (`lc`, or `lc[1]` among several): each error names the
    /// key, the value and the reason.
    pub(crate) fn validate_as(&self, key: &str, p: &mut Problems) {
        let mut mine = Problems::default();
        self.validate(&mut mine);
        for e in mine.0 {
            p.push(e.rekeyed("lc", key));
        }
    }

    /// The checks, keyed `lc.*` as in the single-table form.
    fn validate(&self, p: &mut Problems) {
        if self.name.trim().is_empty() {
            p.push(invalid("lc.name", &self.name, "must not be empty"));
        }
        if !self.pids.is_empty() && !self.command.is_empty() {
            p.push(invalid(
                "lc.command",
                &self.command,
                "give either lc.pids or lc.command, not both",
            ));
        }
        if self.pids.contains(&0) {
            p.push(invalid("lc.pids", &self.pids, "pid 0 is not a process"));
        }
        if let Some(f) = &self.pid_file {
            if !f.starts_with('/') {
                p.push(invalid(
                    "lc.pid_file",
                    f,
                    "must be an absolute path (the file the LC's service manager writes its pid to)",
                ));
            }
        }
        if self.listen_port == Some(0) {
            p.push(invalid("lc.listen_port", 0, "port 0 is not a port"));
        }
        let slo = &self.slo;
        if !(slo.percentile > 0.0 && slo.percentile < 100.0) {
            p.push(invalid(
                "lc.slo.percentile",
                slo.percentile,
                "must be in (0, 100)",
            ));
        }
        p.check(positive("lc.slo.target_us", slo.target_us));
        p.check(positive("lc.slo.window_s", slo.window_s));
        if slo.window_s > MAX_WINDOW_S {
            p.push(invalid(
                "lc.slo.window_s",
                slo.window_s,
                format!("above {MAX_WINDOW_S} s: a latency that old cannot steer BE (Heracles uses 15 s)"),
            ));
        }
        if slo.min_samples == Some(0) {
            p.push(invalid("lc.slo.min_samples", 0, "must be at least 1"));
        }
        // The feed sockets the agent binds: `headroom load --feed` started elsewhere must find them.
        let feed_sockets = [
            (
                "lc.latency.socket",
                self.latency.as_ref().and_then(|l| l.socket.as_deref()),
            ),
            (
                "lc.load.socket",
                self.load.as_ref().and_then(|l| l.socket.as_deref()),
            ),
        ];
        for (key, socket) in feed_sockets {
            if let Some(s) = socket.filter(|s| !s.starts_with('/')) {
                p.push(relative_path(key, s, "`headroom load --feed`"));
            }
            // bind(2) refused it at start, after the config had passed (eighth hostile pass)
            if let Some(s) = socket.filter(|s| s.len() > MAX_SOCKET_PATH) {
                p.push(invalid(
                    key,
                    s,
                    format!(
                        "{} bytes: a Unix socket path holds at most {MAX_SOCKET_PATH}; give a shorter one",
                        s.len()
                    ),
                ));
            }
        }
        if let Some(lat) = &self.latency {
            match lat.source {
                LatencySource::Probe => p.check(require_address(
                    "lc.latency.address",
                    lat.address.as_deref(),
                )),
                LatencySource::Prometheus => {
                    p.check(require_some(
                        "lc.latency.url",
                        lat.url.as_deref(),
                        "source = \"prometheus\"",
                    ));
                    p.check(require_some(
                        "lc.latency.metric",
                        lat.metric.as_deref(),
                        "source = \"prometheus\"",
                    ));
                }
                LatencySource::Feed => {}
                LatencySource::Kernel => {
                    let ports = lat.kernel_ports();
                    if ports.is_empty() {
                        p.push(invalid(
                            "lc.latency.port",
                            lat.port,
                            "source = \"kernel\" needs the LC's TCP port (port = N or ports = [...])",
                        ));
                    } else if ports.contains(&0) {
                        p.push(invalid("lc.latency.ports", &ports, "port 0 is not a port"));
                    } else if ports.len() > headroom_types::resources::MAX_LATENCY_PORTS {
                        p.push(invalid(
                            "lc.latency.ports",
                            ports.len(),
                            format!(
                                "at most {} ports",
                                headroom_types::resources::MAX_LATENCY_PORTS
                            ),
                        ));
                    }
                    if lat.address.is_some() {
                        p.check(require_address(
                            "lc.latency.address",
                            lat.address.as_deref(),
                        ));
                    }
                }
            }
            if lat.source != LatencySource::Kernel {
                if lat.fallback.is_some() {
                    p.push(invalid(
                        "lc.latency.fallback",
                        "probe",
                        "only source = \"kernel\" has a fallback",
                    ));
                }
                if lat.port.is_some() || lat.ports.is_some() {
                    p.push(invalid(
                        "lc.latency.port",
                        lat.kernel_ports(),
                        "port/ports are the kernel sensor's (source = \"kernel\")",
                    ));
                }
            }
            p.check(positive("lc.latency.rate_hz", lat.rate_hz));
            if let Some(b) = lat.max_send_lag_us {
                p.check(positive("lc.latency.max_send_lag_us", b));
            }
            // The prober is load on the LC: bounded absolutely and, where the LC's peak is
            // known, to a small fraction of it (a 1e9 Hz prober pushed p99 from 200 µs to 4 ms).
            // Checked only against valid inputs: a bad peak or SLO is named once, as itself.
            let peak_ok = self
                .load
                .as_ref()
                .is_none_or(|l| l.peak_qps.is_finite() && l.peak_qps > 0.0);
            let slo_ok = slo.percentile > 0.0
                && slo.percentile < 100.0
                && slo.window_s.is_finite()
                && slo.window_s > 0.0
                && slo.min_samples != Some(0);
            // The prober runs as the source or as the kernel sensor's fallback.
            let probes = lat.source == LatencySource::Probe || lat.fallback.is_some();
            if probes && peak_ok {
                let cap = self.load.as_ref().map_or(MAX_PROBE_HZ, |l| {
                    (l.peak_qps * MAX_PROBE_SHARE).min(MAX_PROBE_HZ)
                });
                if lat.rate_hz > cap {
                    p.push(invalid(
                        "lc.latency.rate_hz",
                        lat.rate_hz,
                        format!(
                            "above {cap:.0} Hz: the prober may add at most {:.0}% of lc.load.peak_qps and {MAX_PROBE_HZ:.0} Hz of load to the LC",
                            MAX_PROBE_SHARE * 100.0
                        ),
                    ));
                }
            }
            // A prober that cannot fill its window never yields a latency, and the agent would
            // run blind until the stale rule disables BE: refuse it at start instead. Probes can
            // only go missing at run time (a loaded host sends fewer than asked), so the count
            // must clear the minimum with a margin.
            let probes_per_window = lat.rate_hz * slo.window_s;
            let needed = headroom_types::resources::with_margin(slo.min_samples());
            if probes && slo_ok && probes_per_window < needed as f64 {
                p.push(invalid(
                    "lc.latency.rate_hz",
                    lat.rate_hz,
                    format!(
                        "{probes_per_window:.0} probes per {} s window (lc.slo.window_s) are fewer than {needed}: the {} the p{} needs (lc.slo.min_samples) with a {}x margin, since a loaded host sends fewer probes than asked; raise the rate to at least {:.0} Hz or the window",
                        slo.window_s,
                        slo.min_samples(),
                        slo.percentile,
                        headroom_types::resources::COUNT_MARGIN,
                        (needed as f64 / slo.window_s).ceil(),
                    ),
                ));
            }
        }
        if let Some(load) = &self.load {
            p.check(positive("lc.load.peak_qps", load.peak_qps));
            match load.source {
                LoadSource::MemcacheStats | LoadSource::RedisInfo => {
                    p.check(require_address("lc.load.address", load.address.as_deref()))
                }
                LoadSource::Prometheus => {
                    p.check(require_some(
                        "lc.load.url",
                        load.url.as_deref(),
                        "source = \"prometheus\"",
                    ));
                    p.check(require_some(
                        "lc.load.metric",
                        load.metric.as_deref(),
                        "source = \"prometheus\"",
                    ));
                }
                LoadSource::Feed => {}
            }
        }
        let threads = &self.threads;
        if let Some(prio) = threads.fifo_priority {
            if !(1..=99).contains(&prio) {
                p.push(invalid(
                    "lc.threads.fifo_priority",
                    prio,
                    "must be in 1..=99",
                ));
            }
            if threads.slice_us.is_some() {
                p.push(invalid(
                    "lc.threads.slice_us",
                    threads.slice_us,
                    "a slice request has no effect under SCHED_FIFO; give one of the two",
                ));
            }
        }
        if let Some(s) = threads.slice_us {
            if !(100..=100_000).contains(&s) {
                p.push(invalid(
                    "lc.threads.slice_us",
                    s,
                    "EEVDF accepts 100..=100000 µs",
                ));
            }
        }
    }
}

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
