//! The agent's TOML configuration (DESIGN.md "Config"; keys are a contract: extend, don't rename).
//!
//! Every paper constant is a key whose default is the paper's value. Unknown keys are refused
//! (`deny_unknown_fields`), and [`Config::validate`] refuses bad values and unsafe paths with an
//! error naming the key, the value and the reason.

use std::net::SocketAddr;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use crate::allocation::IoLimit;

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

fn invalid(key: &str, value: impl std::fmt::Debug, reason: impl Into<String>) -> ConfigError {
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

/// `[actuators]`: which of the extra actuators (`crate::actuators`) may run. Each runs only
/// where `doctor` finds its mechanism; `false` turns it off even there (the policies' parts for
/// it then stay off too). Egress is turned on by `[egress] device` instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ActuatorsConfig {
    /// LLC ways and memory bandwidth of BE through resctrl (`be_llc_ways`, `be_mba_pct`).
    pub resctrl: bool,
    /// The BE CPUs' `scaling_max_freq` (`be_freq_khz`).
    pub cpufreq: bool,
    /// The BE groups' block I/O throttles (`be_io_limits`: `io.max` / `blkio.throttle.*`).
    pub io: bool,
}

impl Default for ActuatorsConfig {
    fn default() -> Self {
        ActuatorsConfig {
            resctrl: true,
            cpufreq: true,
            io: true,
        }
    }
}

/// `[egress]`: the network device whose egress the agent shapes (Heracles Alg. 4). Off unless a
/// device is named: the agent then replaces that device's root qdisc with an HTB tree (LC class
/// 1:10 as the default, BE class 1:20), classifies the BE groups' traffic with a cgroup-BPF
/// program, and removes the tree on exit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Interface name (`""` = no egress control).
    pub device: String,
    /// Link rate, Mbit/s; 0 = read `/sys/class/net/<device>/speed`.
    pub link_mbit: u64,
}

/// Where per-CPU idle time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleSensor {
    /// BPF when it loads (root, CONFIG_BPF_EVENTS), else `/proc/stat`.
    #[default]
    Auto,
    /// A BPF program on the `power:cpu_idle` tracepoint: ns-exact and current, for 1 ms polling.
    Bpf,
    /// `/proc/stat`: idle in 10 ms units, busy time by the scheduler tick.
    ProcStat,
}

/// How the agent learns that the idle-CPU count changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleSensing {
    /// Woken by the BPF idle program's threshold-crossing events wherever it loads (blind and
    /// hybrid policies), sleeping in between; polling at the policy's interval elsewhere.
    #[default]
    Events,
    /// Poll at the policy's interval.
    Poll,
}

/// `[sensors]`: how the machine is read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SensorsConfig {
    /// `"auto"` (default), `"bpf"` (refuse to start without it) or `"proc_stat"`.
    pub idle: IdleSensor,
    /// `"events"` (default) or `"poll"`.
    pub idle_sensing: IdleSensing,
}

/// `[lc]`: the latency-critical service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LcConfig {
    pub name: String,
    /// Relative to the cgroup root; created if missing.
    pub cgroup: String,
    /// Processes to move into the LC group.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// A command the agent launches in the LC group (instead of `pids`).
    #[serde(default)]
    pub command: Vec<String>,
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
            .unwrap_or_else(|| headroom_load::stats::min_samples_for(self.percentile))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencySource {
    Probe,
    Prometheus,
    Feed,
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
}

impl LatencyConfig {
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

/// `[lc.threads]`: how LC threads are treated.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LcThreadsConfig {
    /// Pin LC threads to distinct CPUs (Blagodurov §IV.E, Leverich & Kozyrakis).
    pub pin: bool,
    /// CPUs to pin onto; empty = the agent uses the lowest-numbered CPUs.
    pub cpus: Vec<u32>,
    /// EEVDF slice request for LC threads, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slice_us: Option<u64>,
    /// Run LC threads SCHED_FIFO at this priority (1..99).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fifo_priority: Option<u8>,
}

/// `[[be]]`: one best-effort group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BeConfig {
    pub name: String,
    pub cgroup: String,
    /// Optional command the agent launches in the group and owns.
    #[serde(default)]
    pub command: Vec<String>,
    /// Restart the command when it dies, with exponential backoff.
    #[serde(default = "default_true")]
    pub restart: bool,
    #[serde(default = "default_backoff_ms")]
    pub restart_backoff_ms: u64,
    #[serde(default = "default_backoff_max_ms")]
    pub restart_backoff_max_ms: u64,
}

fn default_true() -> bool {
    true
}
fn default_backoff_ms() -> u64 {
    1000
}
fn default_backoff_max_ms() -> u64 {
    60_000
}

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
        }
    }
}

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
        }
    }
}

/// `[policy.static-cores]`: PerfIso's "CPU cores" baseline: BE confined to N cores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StaticCoresConfig {
    /// Number of BE cores, taken from the highest-numbered CPUs not pinned to LC.
    pub cores: u32,
    /// Explicit BE CPUs (overrides `cores`).
    pub cpus: Vec<u32>,
}

impl Default for StaticCoresConfig {
    fn default() -> Self {
        StaticCoresConfig {
            cores: 1,
            cpus: Vec::new(),
        }
    }
}

/// `[policy.static-cycles]`: PerfIso's "CPU cycles" baseline: BE limited to X% of CPU time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StaticCyclesConfig {
    /// Percent of the whole machine's CPU time (PerfIso used 5%).
    pub percent: f64,
    pub period_us: u64,
}

impl Default for StaticCyclesConfig {
    fn default() -> Self {
        StaticCyclesConfig {
            percent: 5.0,
            period_us: 100_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WeightsMode {
    /// Static weights: critical 10000, batch 2.
    Static,
    /// Dynamic weights from the performance factor (§V.B).
    Fair,
    /// Dynamic, and a group over its agreed maximum load gets RT_sla = ∞ (§V.C).
    Isolation,
}

/// `[[policy.weights.groups]]`: one critical group for dynamic weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightGroupConfig {
    pub name: String,
    pub cgroup: String,
    /// Response-time requirement RT_sla at the SLO percentile, µs.
    pub rt_sla_us: f64,
    /// Agreed maximum load (isolation mode), requests/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_qps: Option<f64>,
}

/// `[policy.weights]`: Blagodurov et al.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WeightsConfig {
    pub mode: WeightsMode,
    /// Critical weight, v1 shares (paper: 10000).
    pub lc_shares: u64,
    /// Batch weight, v1 shares (paper: 2, the minimum).
    pub be_shares: u64,
    /// Critical weight, v2 cpu.weight (10000, the maximum).
    pub lc_weight_v2: u64,
    /// Batch weight, v2 cpu.weight (1, the minimum).
    pub be_weight_v2: u64,
    /// Run BE as `cpu.idle` instead of weight 2 (mainline successor of the lowest weight).
    pub be_cpu_idle: bool,
    /// Control interval of dynamic weights, s (paper: 5).
    pub interval_s: f64,
    /// W^max, v1 shares (paper: 256k).
    pub w_max: u64,
    /// W^min, v1 shares (paper: 1k, the default weight).
    pub w_min: u64,
    /// W^max on v2.
    pub w_max_v2: u64,
    /// W^min on v2 (100 = the v2 default).
    pub w_min_v2: u64,
    /// Lower clamp of the desired CPU allocation C (fraction of the server).
    pub c_min: f64,
    /// Upper clamp of C.
    pub c_max: f64,
    /// RT_sla used for a group over its max load in isolation mode, µs (paper: a million seconds).
    pub infinite_rt_sla_us: f64,
    /// Critical groups; empty = the single `[lc]` group with RT_sla = `lc.slo.target_us` and
    /// max load = `lc.load.peak_qps`.
    pub groups: Vec<WeightGroupConfig>,
}

impl Default for WeightsConfig {
    fn default() -> Self {
        WeightsConfig {
            mode: WeightsMode::Static,
            lc_shares: 10_000,
            be_shares: 2,
            lc_weight_v2: 10_000,
            be_weight_v2: 1,
            be_cpu_idle: false,
            interval_s: 5.0,
            w_max: 262_144,
            w_min: 1024,
            w_max_v2: 10_000,
            w_min_v2: 100,
            c_min: 0.001,
            c_max: 1.0,
            infinite_rt_sla_us: 1e12,
            groups: Vec::new(),
        }
    }
}

/// `[policy.blind]`: PerfIso CPU blind isolation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BlindConfig {
    /// B: idle buffer CPUs kept for LC bursts; may be fractional (the fraction goes to a quota).
    pub buffer_cores: f64,
    /// Poll period, ms: the policy is evaluated every poll, writes happen only on change.
    pub poll_ms: u64,
    /// Minimum S (BE CPUs); 0 lets BE be frozen.
    pub min_be_cpus: f64,
    /// Maximum S; 0 = every CPU BE may use.
    pub max_be_cpus: f64,
    /// S moves in steps of this (or of B's fractional part when B is fractional).
    pub grow_step_cpus: f64,
    /// Minimum time between two growth steps, ms (grow slowly).
    pub grow_interval_ms: u64,
    /// Grow only when I > B + hysteresis.
    pub hysteresis_cpus: f64,
    /// 0 (default): I is the sum of the per-CPU idle fractions — the mean of PerfIso's
    /// instantaneous idle-core count over the poll; > 0: I counts CPUs whose idle fraction
    /// reaches this.
    pub idle_threshold: f64,
    /// Idle CPU time that counts as noise, CPUs: shrink only when I < B - tolerance, grow when
    /// I >= B + step + hysteresis - tolerance. PerfIso counts whole idle cores; an exact idle
    /// sensor (BPF) sees the agent's own polling and kernel housekeeping as a few percent busy,
    /// which without this would read as "one idle core short" on every poll.
    pub idle_tolerance_cpus: f64,
    /// CFS period for the fractional part, µs.
    pub quota_period_us: u64,
    /// CPUs BE may ever use; empty = all online CPUs (minus the LC's pinned CPUs).
    pub be_cpus: Vec<u32>,
}

impl Default for BlindConfig {
    fn default() -> Self {
        BlindConfig {
            buffer_cores: 1.0,
            poll_ms: 1,
            min_be_cpus: 0.0,
            max_be_cpus: 0.0,
            grow_step_cpus: 1.0,
            grow_interval_ms: 50,
            hysteresis_cpus: 0.0,
            idle_threshold: 0.0,
            idle_tolerance_cpus: 0.1,
            quota_period_us: 100_000,
            be_cpus: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LowSlackAction {
    /// Paper's pseudo-code, `be_cores.Remove(be_cores.Size()-2)`: BE keeps at most N cores.
    Keep,
    /// The prose reading: take N cores back from BE.
    Remove,
}

/// `[policy.heracles]`: Heracles (ISCA'15) Alg. 1–4.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeraclesConfig {
    // Alg. 1
    /// Top-level period, s (15).
    pub interval_s: f64,
    /// BE stays disabled this long after slack < 0, s (5 min).
    pub cooldown_s: f64,
    /// Disable BE when load exceeds this fraction of peak (0.85).
    pub load_disable: f64,
    /// Enable BE when load drops below this (0.80).
    pub load_enable: f64,
    /// Below this slack BE may not grow (0.10).
    pub slack_disallow_growth: f64,
    /// Below this slack cores go back to LC (0.05).
    pub slack_shrink: f64,
    /// What "cores go back" means (see [`LowSlackAction`]).
    pub slack_shrink_action: LowSlackAction,
    /// N in the low-slack action (2).
    pub slack_shrink_cores: u32,
    // Alg. 2
    /// Core & memory sub-controller period, s (2).
    pub cores_interval_s: f64,
    /// DRAM_LIMIT as a fraction of peak streaming bandwidth (0.90).
    pub dram_limit: f64,
    /// Peak DRAM bandwidth, bytes/s; absent = from the observation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dram_peak_bytes_per_s: Option<f64>,
    /// Offline model of the LC's DRAM bandwidth at current load, bytes/s at 100% load (scaled by
    /// load); absent = measured total minus BE.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lc_bw_model_bytes_per_s: Option<f64>,
    /// BE starts with this many cores (1).
    pub initial_be_cores: u32,
    /// Most cores BE may get; 0 = all CPUs of its socket but one kept for LC.
    pub max_be_cores: u32,
    /// BE starts with this fraction of the LLC (0.10).
    pub initial_llc_frac: f64,
    /// LLC ways added per GROW_LLC step.
    pub llc_step_ways: u32,
    /// Minimum relative BE progress gain for a cache step to count as a benefit.
    pub be_benefit_min: f64,
    /// Confine BE to this socket (index into the machine's sockets).
    pub be_socket: u32,
    // Alg. 3
    /// Power sub-controller period, s (2).
    pub power_interval_s: f64,
    /// Power threshold as a fraction of TDP (0.90).
    pub power_tdp_frac: f64,
    /// LC guaranteed frequency, MHz (measured with LC alone at full load); absent disables Alg. 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guaranteed_freq_mhz: Option<f64>,
    /// DVFS step, MHz (100).
    pub freq_step_mhz: f64,
    /// Lowest BE frequency cap, MHz.
    pub be_freq_min_mhz: f64,
    /// Highest BE frequency cap, MHz (the uncapped maximum).
    pub be_freq_max_mhz: f64,
    // Alg. 4
    /// Network sub-controller period, s (1).
    pub net_interval_s: f64,
    /// Headroom as a fraction of the link rate (0.05).
    pub net_link_headroom: f64,
    /// Headroom as a fraction of LC bandwidth (0.10).
    pub net_lc_headroom: f64,
    /// Link rate, bytes/s; absent = from the observation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_bytes_per_s: Option<f64>,
}

impl Default for HeraclesConfig {
    fn default() -> Self {
        HeraclesConfig {
            interval_s: 15.0,
            cooldown_s: 300.0,
            load_disable: 0.85,
            load_enable: 0.80,
            slack_disallow_growth: 0.10,
            slack_shrink: 0.05,
            slack_shrink_action: LowSlackAction::Keep,
            slack_shrink_cores: 2,
            cores_interval_s: 2.0,
            dram_limit: 0.90,
            dram_peak_bytes_per_s: None,
            lc_bw_model_bytes_per_s: None,
            initial_be_cores: 1,
            max_be_cores: 0,
            initial_llc_frac: 0.10,
            llc_step_ways: 1,
            be_benefit_min: 0.0,
            be_socket: 0,
            power_interval_s: 2.0,
            power_tdp_frac: 0.90,
            guaranteed_freq_mhz: None,
            freq_step_mhz: 100.0,
            be_freq_min_mhz: 800.0,
            be_freq_max_mhz: 10_000.0,
            net_interval_s: 1.0,
            net_link_headroom: 0.05,
            net_lc_headroom: 0.10,
            link_bytes_per_s: None,
        }
    }
}

/// `[policy.hybrid]`: blind isolation inside, Heracles' top level outside. The inner loop uses
/// `[policy.blind]`, the outer loop's thresholds come from `[policy.heracles]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HybridConfig {
    /// Outer-loop period, s; absent = `lc.slo.window_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
    /// Smallest buffer B the outer loop may choose.
    pub buffer_min_cores: f64,
    /// Largest buffer B; 0 = all CPUs (BE squeezed out).
    pub buffer_max_cores: f64,
    /// B changes by this much per outer step.
    pub buffer_step_cores: f64,
    /// When every CPU BE may use is an LC CPU (a small machine), run BE on those CPUs in the
    /// `cpu.idle` class instead of giving it nothing: the mainline successor of BVT warp
    /// (DESIGN.md), with the outer loop still disabling BE on negative slack or high load.
    pub share_lc_cpus: bool,
}

impl Default for HybridConfig {
    fn default() -> Self {
        HybridConfig {
            interval_s: None,
            buffer_min_cores: 1.0,
            buffer_max_cores: 0.0,
            buffer_step_cores: 0.5,
            share_lc_cpus: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnExit {
    Freeze,
    Restore,
    Leave,
}

/// `[safety]`: rules that override every policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SafetyConfig {
    pub on_exit: OnExit,
    pub state_file: String,
    /// LC latency older than this is stale, ms.
    pub latency_max_age_ms: u64,
    /// BE disabled after this many consecutive ticks with unknown/stale latency (0 = by time only).
    pub stale_disable_ticks: u64,
    /// BE disabled after unknown/stale latency for this long, ms (0 = by ticks only).
    pub stale_disable_ms: u64,
    /// BE disabled for this long after an SLO violation, s (0 = off).
    pub violation_cooldown_s: f64,
    /// BE grows at most once per this many ms, whatever the policy wants (grow slowly).
    pub grow_interval_ms: u64,
    /// No BE growth for this many ms after any shrink (hysteresis against flapping).
    pub grow_after_shrink_ms: u64,
    /// BE disabled while MemAvailable is below this, bytes (PerfIso's low-memory kill switch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_mem_available_bytes: Option<u64>,
    /// BE killed while memory PSI "full" avg10 is above this, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_memory_psi_full: Option<f64>,
    /// Memory limit of the BE groups, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub be_memory_limit_bytes: Option<u64>,
    /// Disk throttles of the BE groups (PerfIso's static I/O limits).
    pub be_io_limits: Vec<IoLimit>,
    /// The control loop runs SCHED_FIFO at this priority so no BE (or LC) thread can delay a
    /// shrink by a scheduler slice; 0 leaves its scheduling alone. Where FIFO is refused (not
    /// root, or a cgroup-v1 cpu group without an RT budget) it falls back to nice -20.
    pub agent_fifo_priority: u8,
}

impl Default for SafetyConfig {
    fn default() -> Self {
        SafetyConfig {
            on_exit: OnExit::Freeze,
            state_file: "/var/lib/headroom/state.json".to_string(),
            latency_max_age_ms: 5000,
            stale_disable_ticks: 0,
            stale_disable_ms: 30_000,
            violation_cooldown_s: 300.0,
            grow_interval_ms: 20,
            grow_after_shrink_ms: 100,
            min_mem_available_bytes: None,
            max_memory_psi_full: None,
            be_memory_limit_bytes: None,
            be_io_limits: Vec::new(),
            agent_fifo_priority: 1,
        }
    }
}

/// `[api]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Control socket (0600).
    pub socket: String,
    /// Prometheus exposition address (default 127.0.0.1:9464); `""` = no metrics endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// Decision log file (one JSON line per decision); absent = none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_log: Option<String>,
    /// The decision log's size cap in MiB: past it the log is renamed `<log>.1` and started
    /// anew (at a 1 ms poll it grows ~1.5 MB/s; unbounded it would fill a disk in a day).
    #[serde(default = "default_decision_log_max_mb")]
    pub decision_log_max_mb: u64,
}

fn default_decision_log_max_mb() -> u64 {
    256
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            socket: "/run/headroom.sock".to_string(),
            metrics: Some("127.0.0.1:9464".to_string()),
            decision_log: None,
            decision_log_max_mb: default_decision_log_max_mb(),
        }
    }
}

/// The longest latency window the agent accepts, seconds.
pub const MAX_WINDOW_S: f64 = 3600.0;
/// The prober's rate cap, Hz, whatever the LC's peak.
pub const MAX_PROBE_HZ: f64 = 10_000.0;
/// The prober's rate cap as a share of `lc.load.peak_qps`.
pub const MAX_PROBE_SHARE: f64 = 0.05;

/// Keys `set KEY=VALUE` may change while the agent runs.
const LIVE_PREFIXES: &[&str] = &["policy.", "lc.slo.", "safety."];
const NOT_LIVE: &[&str] = &["safety.on_exit", "safety.state_file"];

impl Config {
    /// Parses and validates a TOML document.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let mut config: Config =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
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
        let missing = |list: &[u32]| list.iter().find(|c| !cpus.contains(c)).copied();
        let online = crate::allocation::format_cpulist(cpus);
        for (key, list) in [
            ("lc.threads.cpus", &self.lc.threads.cpus),
            ("policy.static-cores.cpus", &self.policy.static_cores.cpus),
        ] {
            if let Some(c) = missing(list) {
                return Err(invalid(
                    key,
                    format!("{list:?}"),
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
        if self.sensors.idle == IdleSensor::ProcStat
            && self.sensors.idle_sensing == IdleSensing::Events
        {
            return Err(invalid(
                "sensors.idle_sensing",
                "events",
                "idle events come from the BPF idle sensor, which sensors.idle = \"proc_stat\" turns off: set idle_sensing = \"poll\"",
            ));
        }
        if self.lc.name.trim().is_empty() {
            return Err(invalid("lc.name", &self.lc.name, "must not be empty"));
        }
        validate_cgroup_path("lc.cgroup", &self.lc.cgroup)?;
        if !self.lc.pids.is_empty() && !self.lc.command.is_empty() {
            return Err(invalid(
                "lc.command",
                &self.lc.command,
                "give either lc.pids or lc.command, not both",
            ));
        }
        if self.lc.pids.contains(&0) {
            return Err(invalid("lc.pids", &self.lc.pids, "pid 0 is not a process"));
        }
        let slo = &self.lc.slo;
        if !(slo.percentile > 0.0 && slo.percentile < 100.0) {
            return Err(invalid(
                "lc.slo.percentile",
                slo.percentile,
                "must be in (0, 100)",
            ));
        }
        positive("lc.slo.target_us", slo.target_us)?;
        positive("lc.slo.window_s", slo.window_s)?;
        if slo.window_s > MAX_WINDOW_S {
            return Err(invalid(
                "lc.slo.window_s",
                slo.window_s,
                format!("above {MAX_WINDOW_S} s: a latency that old cannot steer BE (Heracles uses 15 s)"),
            ));
        }
        if slo.min_samples == Some(0) {
            return Err(invalid("lc.slo.min_samples", 0, "must be at least 1"));
        }
        if let Some(lat) = &self.lc.latency {
            match lat.source {
                LatencySource::Probe => {
                    require_address("lc.latency.address", lat.address.as_deref())?
                }
                LatencySource::Prometheus => {
                    require_some(
                        "lc.latency.url",
                        lat.url.as_deref(),
                        "source = \"prometheus\"",
                    )?;
                    require_some(
                        "lc.latency.metric",
                        lat.metric.as_deref(),
                        "source = \"prometheus\"",
                    )?;
                }
                LatencySource::Feed => {}
            }
            positive("lc.latency.rate_hz", lat.rate_hz)?;
            if let Some(b) = lat.max_send_lag_us {
                positive("lc.latency.max_send_lag_us", b)?;
            }
            // The prober is load on the LC: bounded absolutely and, where the LC's peak is
            // known, to a small fraction of it (a 1e9 Hz prober pushed p99 from 200 µs to 4 ms).
            if lat.source == LatencySource::Probe {
                let cap = self.lc.load.as_ref().map_or(MAX_PROBE_HZ, |l| {
                    (l.peak_qps * MAX_PROBE_SHARE).min(MAX_PROBE_HZ)
                });
                if lat.rate_hz > cap {
                    return Err(invalid(
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
            // run blind until the stale rule disables BE: refuse it at start instead.
            let probes_per_window = lat.rate_hz * slo.window_s;
            if lat.source == LatencySource::Probe && probes_per_window < slo.min_samples() as f64 {
                return Err(invalid(
                    "lc.latency.rate_hz",
                    lat.rate_hz,
                    format!(
                        "{probes_per_window:.0} probes per {} s window (lc.slo.window_s) are fewer than the {} the p{} needs (lc.slo.min_samples); raise the rate or the window",
                        slo.window_s,
                        slo.min_samples(),
                        slo.percentile
                    ),
                ));
            }
        }
        if let Some(load) = &self.lc.load {
            positive("lc.load.peak_qps", load.peak_qps)?;
            match load.source {
                LoadSource::MemcacheStats | LoadSource::RedisInfo => {
                    require_address("lc.load.address", load.address.as_deref())?
                }
                LoadSource::Prometheus => {
                    require_some(
                        "lc.load.url",
                        load.url.as_deref(),
                        "source = \"prometheus\"",
                    )?;
                    require_some(
                        "lc.load.metric",
                        load.metric.as_deref(),
                        "source = \"prometheus\"",
                    )?;
                }
                LoadSource::Feed => {}
            }
        }
        let threads = &self.lc.threads;
        if !self.egress.device.is_empty()
            && (self.egress.device.len() > 15
                || self.egress.device.contains(['/', ' ', '\0'])
                || self.egress.device == "."
                || self.egress.device == "..")
        {
            return Err(invalid(
                "egress.device",
                &self.egress.device,
                "not a network interface name",
            ));
        }
        if !self.actuators.io && !self.safety.be_io_limits.is_empty() {
            return Err(invalid(
                "actuators.io",
                self.actuators.io,
                "safety.be_io_limits are set but would never be applied: drop them or set actuators.io = true",
            ));
        }
        if self.egress.link_mbit > 10_000_000 {
            return Err(invalid(
                "egress.link_mbit",
                self.egress.link_mbit,
                "above 10 Tbit/s: the link rate is in Mbit/s (0 = read the device's speed)",
            ));
        }
        if self.safety.agent_fifo_priority > 99 {
            return Err(invalid(
                "safety.agent_fifo_priority",
                self.safety.agent_fifo_priority,
                "must be in 0..=99 (0 = leave the agent's scheduling alone)",
            ));
        }
        if let Some(p) = threads.fifo_priority {
            if !(1..=99).contains(&p) {
                return Err(invalid("lc.threads.fifo_priority", p, "must be in 1..=99"));
            }
            if threads.slice_us.is_some() {
                return Err(invalid(
                    "lc.threads.slice_us",
                    threads.slice_us,
                    "a slice request has no effect under SCHED_FIFO; give one of the two",
                ));
            }
        }
        if let Some(s) = threads.slice_us {
            if !(100..=100_000).contains(&s) {
                return Err(invalid(
                    "lc.threads.slice_us",
                    s,
                    "EEVDF accepts 100..=100000 µs",
                ));
            }
        }
        distinct("lc.threads.cpus", &threads.cpus)?;
        let mut names = Vec::new();
        for (i, be) in self.be.iter().enumerate() {
            if be.name.trim().is_empty() {
                return Err(invalid(
                    &format!("be[{i}].name"),
                    &be.name,
                    "must not be empty",
                ));
            }
            if names.contains(&&be.name) {
                return Err(invalid(
                    &format!("be[{i}].name"),
                    &be.name,
                    "duplicate BE name",
                ));
            }
            names.push(&be.name);
            validate_cgroup_path(&format!("be[{i}].cgroup"), &be.cgroup)?;
            if let Some((j, other)) = self.be[..i]
                .iter()
                .enumerate()
                .find(|(_, o)| same_or_nested(&o.cgroup, &be.cgroup))
            {
                return Err(invalid(
                    &format!("be[{i}].cgroup"),
                    &be.cgroup,
                    format!(
                        "overlaps be[{j}].cgroup {:?}: each BE needs a group of its own, neither inside the other",
                        other.cgroup
                    ),
                ));
            }
            if same_or_nested(&be.cgroup, &self.lc.cgroup) {
                return Err(invalid(
                    &format!("be[{i}].cgroup"),
                    &be.cgroup,
                    format!("overlaps the LC group {:?}", self.lc.cgroup),
                ));
            }
            if be.restart_backoff_ms == 0 || be.restart_backoff_max_ms < be.restart_backoff_ms {
                return Err(invalid(
                    &format!("be[{i}].restart_backoff_max_ms"),
                    be.restart_backoff_max_ms,
                    "backoffs must be > 0 with max >= restart_backoff_ms",
                ));
            }
        }
        self.validate_policy()?;
        self.validate_safety()?;
        if self.api.socket.trim().is_empty() {
            return Err(invalid("api.socket", &self.api.socket, "must not be empty"));
        }
        if let Some(m) = &self.api.metrics {
            if m.parse::<SocketAddr>().is_err() {
                return Err(invalid(
                    "api.metrics",
                    m,
                    "expected IP:PORT, e.g. 127.0.0.1:9464",
                ));
            }
        }
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
        distinct("policy.static-cores.cpus", &p.static_cores.cpus)?;
        let sc = &p.static_cycles;
        if !(sc.percent > 0.0 && sc.percent <= 100.0) {
            return Err(invalid(
                "policy.static-cycles.percent",
                sc.percent,
                "must be in (0, 100]",
            ));
        }
        period("policy.static-cycles.period_us", sc.period_us)?;

        let w = &p.weights;
        shares("policy.weights.lc_shares", w.lc_shares)?;
        shares("policy.weights.be_shares", w.be_shares)?;
        shares("policy.weights.w_max", w.w_max)?;
        shares("policy.weights.w_min", w.w_min)?;
        weight_v2("policy.weights.lc_weight_v2", w.lc_weight_v2)?;
        weight_v2("policy.weights.be_weight_v2", w.be_weight_v2)?;
        weight_v2("policy.weights.w_max_v2", w.w_max_v2)?;
        weight_v2("policy.weights.w_min_v2", w.w_min_v2)?;
        if w.w_min > w.w_max {
            return Err(invalid("policy.weights.w_min", w.w_min, "must be <= w_max"));
        }
        if w.w_min_v2 > w.w_max_v2 {
            return Err(invalid(
                "policy.weights.w_min_v2",
                w.w_min_v2,
                "must be <= w_max_v2",
            ));
        }
        positive("policy.weights.interval_s", w.interval_s)?;
        positive("policy.weights.c_min", w.c_min)?;
        if w.c_max < w.c_min || w.c_max > 1.0 {
            return Err(invalid(
                "policy.weights.c_max",
                w.c_max,
                "must be in [c_min, 1] (a fraction of the server)",
            ));
        }
        positive("policy.weights.infinite_rt_sla_us", w.infinite_rt_sla_us)?;
        for (i, g) in w.groups.iter().enumerate() {
            validate_cgroup_path(&format!("policy.weights.groups[{i}].cgroup"), &g.cgroup)?;
            positive(
                &format!("policy.weights.groups[{i}].rt_sla_us"),
                g.rt_sla_us,
            )?;
            if let Some(m) = g.max_qps {
                positive(&format!("policy.weights.groups[{i}].max_qps"), m)?;
            }
        }

        let b = &p.blind;
        non_negative("policy.blind.buffer_cores", b.buffer_cores)?;
        if b.poll_ms == 0 || b.poll_ms > 60_000 {
            return Err(invalid(
                "policy.blind.poll_ms",
                b.poll_ms,
                "must be in 1..=60000",
            ));
        }
        non_negative("policy.blind.min_be_cpus", b.min_be_cpus)?;
        non_negative("policy.blind.max_be_cpus", b.max_be_cpus)?;
        if b.max_be_cpus > 0.0 && b.max_be_cpus < b.min_be_cpus {
            return Err(invalid(
                "policy.blind.max_be_cpus",
                b.max_be_cpus,
                "must be >= min_be_cpus (or 0 for no maximum)",
            ));
        }
        positive("policy.blind.grow_step_cpus", b.grow_step_cpus)?;
        non_negative("policy.blind.hysteresis_cpus", b.hysteresis_cpus)?;
        fraction("policy.blind.idle_threshold", b.idle_threshold)?;
        if !(0.0..0.5).contains(&b.idle_tolerance_cpus) {
            return Err(invalid(
                "policy.blind.idle_tolerance_cpus",
                b.idle_tolerance_cpus,
                "must be in [0, 0.5): a whole idle CPU must still count",
            ));
        }
        period("policy.blind.quota_period_us", b.quota_period_us)?;
        distinct("policy.blind.be_cpus", &b.be_cpus)?;

        let h = &p.heracles;
        positive("policy.heracles.interval_s", h.interval_s)?;
        non_negative("policy.heracles.cooldown_s", h.cooldown_s)?;
        fraction("policy.heracles.load_disable", h.load_disable)?;
        fraction("policy.heracles.load_enable", h.load_enable)?;
        if h.load_enable > h.load_disable {
            return Err(invalid(
                "policy.heracles.load_enable",
                h.load_enable,
                format!(
                    "must be <= load_disable ({}) for hysteresis",
                    h.load_disable
                ),
            ));
        }
        fraction(
            "policy.heracles.slack_disallow_growth",
            h.slack_disallow_growth,
        )?;
        fraction("policy.heracles.slack_shrink", h.slack_shrink)?;
        if h.slack_shrink > h.slack_disallow_growth {
            return Err(invalid(
                "policy.heracles.slack_shrink",
                h.slack_shrink,
                "must be <= slack_disallow_growth",
            ));
        }
        positive("policy.heracles.cores_interval_s", h.cores_interval_s)?;
        fraction("policy.heracles.dram_limit", h.dram_limit)?;
        if let Some(v) = h.dram_peak_bytes_per_s {
            positive("policy.heracles.dram_peak_bytes_per_s", v)?;
        }
        if let Some(v) = h.lc_bw_model_bytes_per_s {
            non_negative("policy.heracles.lc_bw_model_bytes_per_s", v)?;
        }
        if h.initial_be_cores == 0 {
            return Err(invalid(
                "policy.heracles.initial_be_cores",
                0,
                "must be >= 1",
            ));
        }
        fraction("policy.heracles.initial_llc_frac", h.initial_llc_frac)?;
        if h.llc_step_ways == 0 {
            return Err(invalid("policy.heracles.llc_step_ways", 0, "must be >= 1"));
        }
        non_negative("policy.heracles.be_benefit_min", h.be_benefit_min)?;
        positive("policy.heracles.power_interval_s", h.power_interval_s)?;
        fraction("policy.heracles.power_tdp_frac", h.power_tdp_frac)?;
        if let Some(g) = h.guaranteed_freq_mhz {
            positive("policy.heracles.guaranteed_freq_mhz", g)?;
        }
        positive("policy.heracles.freq_step_mhz", h.freq_step_mhz)?;
        positive("policy.heracles.be_freq_min_mhz", h.be_freq_min_mhz)?;
        if h.be_freq_max_mhz < h.be_freq_min_mhz {
            return Err(invalid(
                "policy.heracles.be_freq_max_mhz",
                h.be_freq_max_mhz,
                "must be >= be_freq_min_mhz",
            ));
        }
        positive("policy.heracles.net_interval_s", h.net_interval_s)?;
        fraction("policy.heracles.net_link_headroom", h.net_link_headroom)?;
        non_negative("policy.heracles.net_lc_headroom", h.net_lc_headroom)?;
        if let Some(v) = h.link_bytes_per_s {
            positive("policy.heracles.link_bytes_per_s", v)?;
        }

        let y = &p.hybrid;
        if let Some(i) = y.interval_s {
            positive("policy.hybrid.interval_s", i)?;
        }
        non_negative("policy.hybrid.buffer_min_cores", y.buffer_min_cores)?;
        non_negative("policy.hybrid.buffer_max_cores", y.buffer_max_cores)?;
        if y.buffer_max_cores > 0.0 && y.buffer_max_cores < y.buffer_min_cores {
            return Err(invalid(
                "policy.hybrid.buffer_max_cores",
                y.buffer_max_cores,
                "must be >= buffer_min_cores (or 0 for all CPUs)",
            ));
        }
        positive("policy.hybrid.buffer_step_cores", y.buffer_step_cores)?;
        Ok(())
    }

    fn validate_safety(&self) -> Result<(), ConfigError> {
        let s = &self.safety;
        if s.state_file.trim().is_empty() {
            return Err(invalid(
                "safety.state_file",
                &s.state_file,
                "must not be empty",
            ));
        }
        if s.latency_max_age_ms == 0 {
            return Err(invalid("safety.latency_max_age_ms", 0, "must be > 0"));
        }
        if s.stale_disable_ticks == 0 && s.stale_disable_ms == 0 {
            return Err(invalid(
                "safety.stale_disable_ms",
                0,
                "stale_disable_ticks and stale_disable_ms cannot both be 0",
            ));
        }
        non_negative("safety.violation_cooldown_s", s.violation_cooldown_s)?;
        if let Some(p) = s.max_memory_psi_full {
            if !(0.0..=100.0).contains(&p) {
                return Err(invalid(
                    "safety.max_memory_psi_full",
                    p,
                    "PSI is a percentage in [0, 100]",
                ));
            }
        }
        if s.grow_interval_ms > 3_600_000 || s.grow_after_shrink_ms > 3_600_000 {
            return Err(invalid(
                "safety.grow_interval_ms",
                s.grow_interval_ms.max(s.grow_after_shrink_ms),
                "growth pacing above one hour would stop BE growing",
            ));
        }
        for (i, io) in s.be_io_limits.iter().enumerate() {
            let ok = io
                .device
                .split_once(':')
                .is_some_and(|(a, b)| a.parse::<u32>().is_ok() && b.parse::<u32>().is_ok());
            if !ok {
                return Err(invalid(
                    &format!("safety.be_io_limits[{i}].device"),
                    &io.device,
                    "expected MAJOR:MINOR, e.g. \"8:0\"",
                ));
            }
        }
        Ok(())
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

/// Refuses cgroup paths that are empty, absolute, or climb out of the cgroup root.
pub fn validate_cgroup_path(key: &str, path: &str) -> Result<(), ConfigError> {
    if path.trim().is_empty() {
        return Err(invalid(key, path, "must not be empty"));
    }
    if path.contains('\0') {
        return Err(invalid(key, path, "contains a NUL byte"));
    }
    let p = Path::new(path);
    for comp in p.components() {
        match comp {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return Err(invalid(key, path, "path escapes the cgroup root"));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(invalid(
                    key,
                    path,
                    "absolute path; give it relative to the cgroup root",
                ));
            }
        }
    }
    if !p.components().any(|c| matches!(c, Component::Normal(_))) {
        return Err(invalid(key, path, "names the cgroup root itself"));
    }
    // What the agent will use: a GroupPath (`./x`, `a//b` and `a/` are refused here, not at start).
    if let Err(e) = headroom_host::GroupPath::new(path) {
        return Err(invalid(key, path, e.to_string()));
    }
    Ok(())
}

fn same_or_nested(a: &str, b: &str) -> bool {
    let norm = |s: &str| -> Vec<String> {
        Path::new(s)
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect()
    };
    let (a, b) = (norm(a), norm(b));
    a.starts_with(&b) || b.starts_with(&a)
}

fn positive(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(invalid(key, v, "must be a finite number > 0"))
    }
}

fn non_negative(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(invalid(key, v, "must be a finite number >= 0"))
    }
}

fn fraction(key: &str, v: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, v, "must be a fraction in [0, 1]"))
    }
}

fn period(key: &str, v: u64) -> Result<(), ConfigError> {
    if (1000..=1_000_000).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, v, "CFS period must be in 1000..=1000000 µs"))
    }
}

fn shares(key: &str, v: u64) -> Result<(), ConfigError> {
    if (2..=262_144).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, v, "cpu.shares must be in 2..=262144"))
    }
}

fn weight_v2(key: &str, v: u64) -> Result<(), ConfigError> {
    if (1..=10_000).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, v, "cpu.weight must be in 1..=10000"))
    }
}

fn distinct(key: &str, cpus: &[u32]) -> Result<(), ConfigError> {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid(key, cpus, "lists a CPU twice"));
    }
    Ok(())
}

fn require_some(key: &str, v: Option<&str>, when: &str) -> Result<(), ConfigError> {
    match v {
        Some(s) if !s.trim().is_empty() => Ok(()),
        _ => Err(invalid(key, v, format!("required when {when}"))),
    }
}

fn require_address(key: &str, v: Option<&str>) -> Result<(), ConfigError> {
    let Some(addr) = v else {
        return Err(invalid(key, v, "required for this source (host:port)"));
    };
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            addr,
            "expected host:port, e.g. 127.0.0.1:11211",
        ))
    }
}
