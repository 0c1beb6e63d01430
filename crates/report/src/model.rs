//! What an experiment records: the run's manifest, the machine, and the raw per-point results.
//! Everything here is written as JSON into the run directory and read back by the study.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ReportError, Result};

/// The figures of one `headroom load --json` result that the study uses (docs/architecture.md "The JSON contracts").
/// Read leniently: a field the load generator did not write is `None`, never a parse failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct LoadMetrics {
    pub target_qps: f64,
    pub achieved_qps: f64,
    /// The load generator's own verdict on its self-checks.
    pub valid: bool,
    /// Names and details of the self-checks that failed.
    pub failed_checks: Vec<String>,
    pub avg_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p95_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub count: Option<f64>,
    /// The load generator's send lag: how late it sent compared with its schedule.
    pub send_lag_p99_us: Option<f64>,
    pub late: Option<f64>,
    pub errors: Option<f64>,
}

impl LoadMetrics {
    /// Extracts the metrics from the JSON text `headroom load --json` wrote (`origin` names the file).
    pub fn from_json_text(text: &str, origin: &std::path::Path) -> Result<LoadMetrics> {
        let v: Value = serde_json::from_str(text).map_err(|source| ReportError::Json {
            path: origin.to_path_buf(),
            source,
        })?;
        Ok(LoadMetrics::from_value(&v))
    }

    /// Extracts the metrics from a parsed load result.
    pub fn from_value(v: &Value) -> LoadMetrics {
        let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
        let read = v.get("read").cloned().unwrap_or(Value::Null);
        let failed_checks = v
            .get("checks")
            .and_then(Value::as_array)
            .map(|checks| {
                checks
                    .iter()
                    .filter(|c| c.get("ok").and_then(Value::as_bool) == Some(false))
                    .map(|c| {
                        let name = c.get("name").and_then(Value::as_str).unwrap_or("check");
                        match c.get("detail").and_then(Value::as_str) {
                            Some(d) => format!("{name}: {d}"),
                            None => name.to_string(),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        LoadMetrics {
            target_qps: num(v, "target_qps").unwrap_or(0.0),
            achieved_qps: num(v, "achieved_qps").unwrap_or(0.0),
            valid: v.get("valid").and_then(Value::as_bool).unwrap_or(false),
            failed_checks,
            avg_us: num(&read, "avg_us"),
            p50_us: num(&read, "p50_us"),
            p95_us: num(&read, "p95_us"),
            p99_us: num(&read, "p99_us"),
            p999_us: num(&read, "p999_us"),
            count: num(&read, "count"),
            send_lag_p99_us: v
                .get("client")
                .and_then(|c| c.get("send_lag_p99_us"))
                .and_then(Value::as_f64),
            late: num(v, "late"),
            errors: num(v, "errors"),
        }
    }

    /// Whether the load generator ran out of CPU (its `client_cpu` self-check failed): its
    /// latencies then hold its own queue of late sends, not the service's.
    pub fn client_saturated(&self) -> bool {
        self.failed_checks
            .iter()
            .any(|c| c.starts_with("client_cpu"))
    }

    /// Whether the load generator failed to send on its schedule: its send intervals do not
    /// fit the configured distribution, or its rate check failed (late sends at the depth cap,
    /// send lag past 1 ms). What it measured then is partly its own lag.
    pub fn sender_off_schedule(&self) -> bool {
        self.failed_checks
            .iter()
            .any(|c| c.starts_with("interarrival_fit") || c.starts_with("rate"))
    }

    /// Whether the tail this result reports is an unbiased measurement of the server: every
    /// self-check passed, or only `independence` failed — the latencies are correlated over
    /// longer than the run averages (a queue or a BE slice persisting), so the interval is
    /// wider than independent samples would give, but the sender kept its schedule and the
    /// estimate itself is not the instrument's. Fits and validations use such points (their
    /// noise counts against the model, never for it); a point failing any other check is refused.
    pub fn measures_the_server(&self) -> bool {
        self.valid
            || (!self.failed_checks.is_empty()
                && self
                    .failed_checks
                    .iter()
                    .all(|c| c.starts_with("independence")))
    }

    /// Whether this probe shows the LC holding `target_qps` with its p`percentile` within
    /// `bound_us`: rate reached (≥ 98%), tail within the bound, a load generator with CPU to
    /// spare (a saturated client reaches its rate, but its tail is its own queue) and on its
    /// schedule. (Measured: a capacity search that took a probe at 170k QPS whose sends failed
    /// the inter-arrival fit as held ran the colocation trace at 148k QPS, where the load
    /// generator's send lag p99 was 4.6 ms with no BE at all and 11 of 12 windows failed their
    /// self-checks.) A probe failing only `independence` (too short to trust its p99 fully)
    /// still counts; the majority of three absorbs one unlucky probe.
    pub fn holds(&self, target_qps: f64, percentile: f64, bound_us: f64) -> bool {
        self.achieved_qps >= 0.98 * target_qps
            && !self.client_saturated()
            && !self.sender_off_schedule()
            && self
                .percentile_us(percentile)
                .is_some_and(|t| t <= bound_us)
    }

    /// The latency at a percentile the result reports (50, 95, 99, 99.9), `None` otherwise.
    pub fn percentile_us(&self, percentile: f64) -> Option<f64> {
        let close = |p: f64| (percentile - p).abs() < 1e-9;
        if close(99.0) {
            self.p99_us
        } else if close(95.0) {
            self.p95_us
        } else if close(50.0) {
            self.p50_us
        } else if close(99.9) {
            self.p999_us
        } else {
            None
        }
    }
}

/// The machine a run was recorded on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Machine {
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub hostname: String,
    /// `headroom doctor --json` output, `null` when it could not be obtained.
    pub doctor: Option<Value>,
    /// CPUs the load generator (and the agent) were pinned to.
    pub loadgen_cpus: Vec<usize>,
    /// CPUs the LC service and the BE workloads ran on.
    pub server_cpus: Vec<usize>,
    /// CPUs the BE workloads the bench started ran on (the server CPUs unless `--be-cpus`).
    #[serde(default)]
    pub be_cpus: Vec<usize>,
}

/// The run's parameters and context: written first, completed at the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Manifest {
    pub experiment: String,
    pub machine: Machine,
    pub slo_us: f64,
    pub percentile: f64,
    /// How the SLO was chosen (stated in the report).
    pub slo_source: String,
    pub peak_qps: Option<f64>,
    /// How the peak was found.
    pub peak_source: String,
    /// Parameters as given (duration, repeats, loads, ...), for the report.
    pub params: BTreeMap<String, Value>,
    /// The `headroom bench ...` invocation(s) that produced this directory.
    pub invocations: Vec<String>,
    pub started_unix_ms: u64,
    pub finished_unix_ms: Option<u64>,
    /// Things the reader must know (a missing mechanism, a skipped configuration).
    pub notes: Vec<String>,
}

/// One measured point of a sweep: one configuration, one load level, one repetition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Point {
    pub id: String,
    /// The configuration (policy, antagonist, dispatch mode) this point belongs to.
    pub series: String,
    /// BE workload running during the point, `none` for LC alone.
    pub be: String,
    /// LC load as a fraction of the peak.
    pub load_fraction: f64,
    pub repeat: u32,
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
    /// `None` when the load run failed (see `error`).
    pub load: Option<LoadMetrics>,
    pub error: Option<String>,
    pub be_ops_per_s: Option<f64>,
    /// BE throughput over its solo throughput on the same CPUs.
    pub be_norm: Option<f64>,
    /// Idle share of the server CPUs during the point, percent.
    pub idle_cpu_pct: Option<f64>,
    /// CPU time the hypervisor took from this machine during the point (steal), percent of all
    /// CPUs' time: a figure measured while it is high says more about the host than the policy.
    #[serde(default)]
    pub steal_pct: Option<f64>,
    /// Agent allocation summary over the point (BE CPUs, weight, quota), when an agent ran.
    pub agent: Option<AgentWindow>,
    /// The exact commands this point ran.
    pub commands: Vec<String>,
    /// The load generator's JSON as written.
    pub raw_load: Option<Value>,
}

/// What the agent allowed BE during a time window, summarised from its decision log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct AgentWindow {
    pub decisions: u64,
    /// Time-averaged count of BE CPUs (0 when BE was disabled).
    pub be_cpus_mean: Option<f64>,
    pub be_cpu_weight: Option<f64>,
    pub be_quota_pct: Option<f64>,
    pub be_enabled_share: Option<f64>,
    /// The last decision's reason in the window.
    pub last_reason: Option<String>,
}

/// One window of a colocation trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Window {
    pub index: usize,
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
    /// The trace's target LC load, fraction of peak.
    pub target_fraction: f64,
    pub load: Option<LoadMetrics>,
    pub error: Option<String>,
    /// Achieved LC load, fraction of peak.
    pub lc_load_fraction: f64,
    pub be_ops_per_s: Option<f64>,
    /// BE throughput over its solo throughput.
    pub be_fraction: Option<f64>,
    pub agent: Option<AgentWindow>,
    /// CPU time the hypervisor took from this machine during the window (steal), percent of all
    /// CPU time; `None` where `/proc/stat` has no steal column or the run predates it.
    #[serde(default)]
    pub steal_pct: Option<f64>,
}

/// One policy's pass over the colocation trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ColocationRun {
    pub policy: String,
    pub be: String,
    /// The agent ran with `--dry-run` (decided and logged, wrote nothing).
    pub dry_run: bool,
    pub be_solo_ops_per_s: Option<f64>,
    pub windows: Vec<Window>,
    pub commands: Vec<String>,
    pub notes: Vec<String>,
}

/// A BE workload's throughput running alone on the server CPUs (the EMU denominator).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct SoloBaseline {
    pub kind: String,
    /// The EMU denominator: what the BE does alone on its CPUs, per second. It is the BE's
    /// operations per CPU-second times its threads when the progress lines report CPU time (so
    /// other tenants of a shared machine do not shrink it), else the measured rate.
    pub ops_per_s: f64,
    /// The rate measured during the solo run (wall clock).
    #[serde(default)]
    pub measured_ops_per_s: f64,
    /// Operations per CPU-second of the BE alone.
    #[serde(default)]
    pub ops_per_cpu_s: Option<f64>,
    pub seconds: f64,
    pub commands: Vec<String>,
}

/// The LC service alone: its capacity, the SLO derived from it, and the peak meeting the SLO.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct LcBaseline {
    pub low_load_p99_us: Option<f64>,
    pub capacity_qps: f64,
    pub slo_us: f64,
    pub slo_source: String,
    pub peak_qps: f64,
    pub peak_source: String,
    /// Every probe run, valid or not; `used` says which ones the capacity, SLO and peak rest on.
    pub probes: Vec<Probe>,
    pub commands: Vec<String>,
}

/// One load run of the LC-alone baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(from = "ProbeRepr")]
pub struct Probe {
    pub target_qps: f64,
    /// The load generator's self-checks all passed.
    pub valid: bool,
    /// The capacity, SLO or peak rests on this probe; an invalid probe is kept for the record
    /// with `used: false`.
    pub used: bool,
    /// What it measured for: `low load`, `capacity`, `slo`, `peak`.
    #[serde(default)]
    pub purpose: String,
    /// The load generator's configuration (`-T .. -c .. -d .., N s`); empty in older files.
    #[serde(default)]
    pub config: String,
    /// What the run before it had failed and this one changed (empty for a first run).
    #[serde(default)]
    pub correction: String,
    pub metrics: LoadMetrics,
}

/// A stored probe: the object above, or the `[target QPS, metrics]` pair that baselines
/// written before validity was recorded hold (every one of those was used).
#[derive(Deserialize)]
#[serde(untagged)]
enum ProbeRepr {
    Record {
        target_qps: f64,
        valid: bool,
        #[serde(default = "yes")]
        used: bool,
        #[serde(default)]
        purpose: String,
        #[serde(default)]
        config: String,
        #[serde(default)]
        correction: String,
        metrics: LoadMetrics,
    },
    Pair(f64, LoadMetrics),
}

fn yes() -> bool {
    true
}

impl From<ProbeRepr> for Probe {
    fn from(r: ProbeRepr) -> Probe {
        match r {
            ProbeRepr::Record {
                target_qps,
                valid,
                used,
                purpose,
                config,
                correction,
                metrics,
            } => Probe {
                target_qps,
                valid,
                used,
                purpose,
                config,
                correction,
                metrics,
            },
            ProbeRepr::Pair(target_qps, metrics) => Probe {
                target_qps,
                valid: metrics.valid,
                used: true,
                metrics,
                ..Default::default()
            },
        }
    }
}
