//! The server model's parameters: a TOML file (`--model F`, written by `headroom sim calibrate`)
//! whose every key has a documented default, so an empty file is a valid model.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::queue::StallForm;

/// The most CPUs a modelled server may have (CPU sets are bit masks).
pub const MAX_CORES: u32 = 128;

/// Every parameter of the server model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerModel {
    pub server: ServerParams,
    pub lc: LcParams,
    pub sched: SchedParams,
    /// BE kinds by name (`spin`, `llc`, `dram`, `mix` built in).
    pub be: BTreeMap<String, BeKind>,
    /// Where the parameters came from (filled by `sim calibrate`).
    pub calibration: Calibration,
}

/// The machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerParams {
    /// Logical CPUs (overridden by `--cores`).
    pub cores: u32,
    /// Maximum (nominal) frequency, MHz.
    pub freq_max_mhz: f64,
    /// LLC ways (resctrl mask width).
    pub llc_ways: u32,
    /// Peak streaming DRAM bandwidth, bytes/s.
    pub dram_peak_bytes_per_s: f64,
    /// Package power limit, W.
    pub tdp_w: f64,
    /// Power with every CPU idle, W.
    pub static_w: f64,
    /// Power per fully busy CPU at full frequency, W.
    pub core_w: f64,
    /// Logical CPUs come in SMT sibling pairs (CPU i and i + cores/2, Linux's numbering).
    pub smt: bool,
    /// How much an LC request slows when BE keeps its CPU's sibling busy (Heracles' HT
    /// antagonist), fraction of its service time.
    pub smt_penalty: f64,
    /// Host stalls: an extra delay the server's queue does not explain — on a VM the
    /// hypervisor preempting a vCPU or waking a halted one, timer ticks, interrupts. The share
    /// of LC requests (or of time: `stall_form`) that meet one. 0 on the built-in server (bare
    /// metal); `sim calibrate` fits it from the LC-alone points' p95 / p99 / p99.9.
    pub stall_fraction: f64,
    /// What `stall_fraction` is a share of: `requests` (whatever the load) or `time` (a server
    /// vacation, whose backlog makes a busy server's requests meet it more often).
    pub stall_form: StallForm,
    /// Mean of such a stall, µs (exponentially distributed).
    pub stall_mean_us: f64,
}

impl Default for ServerParams {
    fn default() -> Self {
        ServerParams {
            cores: 16,
            freq_max_mhz: 2400.0,
            llc_ways: 20,
            dram_peak_bytes_per_s: 60e9,
            tdp_w: 145.0,
            static_w: 45.0,
            core_w: 5.5,
            smt: false,
            smt_penalty: 0.3,
            stall_fraction: 0.0,
            stall_form: StallForm::Requests,
            stall_mean_us: 0.0,
        }
    }
}

/// How the LC hands requests to its threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dispatch {
    /// One queue served by every thread (M/G/k).
    SharedQueue,
    /// Each connection is bound to one thread (memcached): `threads` M/G/1 queues.
    PerThread,
}

/// The latency-critical service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LcParams {
    /// Mean CPU time per request at full frequency, alone, µs.
    pub service_us: f64,
    /// Coefficient of variation of the service time.
    pub service_cv: f64,
    /// CPU time the LC's CPUs spend per request once awake, µs: what the LC's CPU use (and so
    /// BE's leftover, the idle count, the power) is charged with. 0 = `service_us`. Measured
    /// apart from the service time because the queue's service time is fitted to the tails,
    /// which host stalls shape, and a request's CPU cost is not (`sim calibrate` fits it from
    /// the server CPUs' measured busy time).
    pub cpu_us: f64,
    /// Extra CPU time per request that finds the LC's CPU idle (the wake-up from idle), µs.
    pub wake_cpu_us: f64,
    pub dispatch: Dispatch,
    /// Worker threads for `per-thread` dispatch; 0 = one per CPU.
    pub threads: u32,
    /// Tail-latency SLO, µs, at `percentile`.
    pub slo_us: f64,
    pub percentile: f64,
    /// DRAM traffic per request, bytes.
    pub dram_bytes_per_request: f64,
    /// How much of its service time stretches per unit of LLC pressure (0..1).
    pub llc_sensitivity: f64,
    /// How much its service time stretches when DRAM is saturated (0..).
    pub dram_sensitivity: f64,
}

impl Default for LcParams {
    fn default() -> Self {
        LcParams {
            service_us: 25.0,
            service_cv: 0.6,
            cpu_us: 0.0,
            wake_cpu_us: 0.0,
            dispatch: Dispatch::SharedQueue,
            threads: 0,
            slo_us: 500.0,
            percentile: 99.0,
            dram_bytes_per_request: 4096.0,
            llc_sensitivity: 0.35,
            dram_sensitivity: 1.0,
        }
    }
}

/// The CPU scheduler between LC and BE on a CPU both may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedParams {
    /// LC's cgroup weight (v1 shares) when the policy leaves it alone.
    pub lc_shares: f64,
    /// Wake-up delay an LC request meets on a CPU a BE thread of equal weight holds, µs
    /// (Leverich & Kozyrakis §4: CFS wake-up placement).
    pub delay_fair_us: f64,
    /// The same delay when BE's weight is the minimum (Blagodurov's 2 vs 10000), µs.
    pub delay_low_weight_us: f64,
    /// The same delay when BE is `cpu.idle` (SCHED_IDLE), µs.
    pub delay_idle_us: f64,
    /// LC's share of a CPU held by a `cpu.idle` BE (what SCHED_IDLE still takes).
    pub idle_lc_share: f64,
    /// Fraction of LC wake-ups on a CPU BE holds that miss wake-up preemption and wait out the
    /// delay (the rest preempt at once).
    pub delayed_fraction: f64,
    /// Extra CPU time per LC request that finds BE running on its CPU, µs: the switch to the LC
    /// and back and the caches BE refills, charged to the LC's side of the CPU (what BE loses
    /// beyond the LC's own CPU time).
    pub switch_cpu_us: f64,
}

impl Default for SchedParams {
    fn default() -> Self {
        SchedParams {
            lc_shares: 1024.0,
            delay_fair_us: 3800.0,
            delay_low_weight_us: 150.0,
            delay_idle_us: 120.0,
            idle_lc_share: 0.98,
            delayed_fraction: 0.05,
            switch_cpu_us: 0.0,
        }
    }
}

/// One kind of BE work: how fast it goes and what it does to its neighbours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BeKind {
    /// Work units per second per CPU at full frequency with the whole LLC.
    pub ops_per_cpu_s: f64,
    /// LLC pressure on the LC when BE holds every CPU and the whole LLC (0..1).
    pub llc_pressure: f64,
    /// How much BE slows when it gets only part of the LLC (0..1 at zero ways).
    pub llc_sensitivity: f64,
    /// DRAM bandwidth per busy BE CPU, bytes/s.
    pub dram_bytes_per_cpu_s: f64,
    /// Power per busy BE CPU relative to `server.core_w`.
    pub power_factor: f64,
}

impl Default for BeKind {
    fn default() -> Self {
        BeKind {
            ops_per_cpu_s: 1.0e6,
            llc_pressure: 0.05,
            llc_sensitivity: 0.05,
            dram_bytes_per_cpu_s: 0.2e9,
            power_factor: 1.0,
        }
    }
}

/// Provenance of a calibrated model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Calibration {
    /// The bench directories fitted.
    pub sources: Vec<String>,
    /// The range of LC load (fraction of peak) the data covered.
    pub load_range: Option<[f64; 2]>,
    /// The range of CPU counts the data covered.
    pub cores_range: Option<[u32; 2]>,
    pub params: Vec<FittedParam>,
}

/// One fitted parameter, where it came from and how well it fits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FittedParam {
    /// Dotted key, e.g. `lc.service_us`.
    pub key: String,
    pub value: f64,
    /// The bench point(s) it was fitted on.
    pub source: String,
    /// Relative fit error on those points (0.1 = 10%).
    pub fit_error: f64,
}

impl Default for ServerModel {
    fn default() -> Self {
        let mut be = BTreeMap::new();
        be.insert("spin".to_string(), BeKind::default());
        be.insert(
            "llc".to_string(),
            BeKind {
                ops_per_cpu_s: 0.6e6,
                llc_pressure: 0.6,
                llc_sensitivity: 0.6,
                dram_bytes_per_cpu_s: 0.8e9,
                power_factor: 0.9,
            },
        );
        be.insert(
            "dram".to_string(),
            BeKind {
                ops_per_cpu_s: 0.3e6,
                llc_pressure: 0.8,
                llc_sensitivity: 0.2,
                dram_bytes_per_cpu_s: 6.0e9,
                power_factor: 0.8,
            },
        );
        be.insert(
            "mix".to_string(),
            BeKind {
                ops_per_cpu_s: 0.7e6,
                llc_pressure: 0.3,
                llc_sensitivity: 0.3,
                dram_bytes_per_cpu_s: 1.5e9,
                power_factor: 0.95,
            },
        );
        ServerModel {
            server: ServerParams::default(),
            lc: LcParams::default(),
            sched: SchedParams::default(),
            be,
            calibration: Calibration::default(),
        }
    }
}

impl ServerModel {
    /// Reads and checks a model file.
    pub fn from_file(path: &Path) -> Result<ServerModel, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
        Self::from_toml_str(&text).map_err(|e| e.in_file(path))
    }

    /// Parses and checks model TOML; errors name the key (or line) and the reason.
    pub fn from_toml_str(text: &str) -> Result<ServerModel, SimError> {
        let model: ServerModel = toml::from_str(text).map_err(|e| SimError::Parse {
            file: None,
            line: e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1),
            reason: e.message().to_string(),
        })?;
        model.validate()?;
        Ok(model)
    }

    /// Range checks of every parameter.
    pub fn validate(&self) -> Result<(), SimError> {
        let positive = |key: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(SimError::invalid(key, v, "must be a finite number > 0"))
            }
        };
        let fraction = |key: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(SimError::invalid(key, v, "must be in 0..=1"))
            }
        };
        if self.server.cores == 0 || self.server.cores > MAX_CORES {
            return Err(SimError::invalid(
                "server.cores",
                self.server.cores,
                "must be in 1..=128",
            ));
        }
        positive("server.freq_max_mhz", self.server.freq_max_mhz)?;
        positive(
            "server.dram_peak_bytes_per_s",
            self.server.dram_peak_bytes_per_s,
        )?;
        positive("server.tdp_w", self.server.tdp_w)?;
        positive("server.core_w", self.server.core_w)?;
        if !(self.server.smt_penalty >= 0.0 && self.server.smt_penalty <= 2.0) {
            return Err(SimError::invalid(
                "server.smt_penalty",
                self.server.smt_penalty,
                "must be in 0..=2",
            ));
        }
        if self.server.smt && self.server.cores % 2 == 1 {
            return Err(SimError::invalid(
                "server.cores",
                self.server.cores,
                "must be even with server.smt = true",
            ));
        }
        if self.server.llc_ways == 0 {
            return Err(SimError::invalid("server.llc_ways", 0, "must be > 0"));
        }
        if !(0.0..self.server.tdp_w).contains(&self.server.static_w) {
            return Err(SimError::invalid(
                "server.static_w",
                self.server.static_w,
                "must be in 0..server.tdp_w",
            ));
        }
        fraction("server.stall_fraction", self.server.stall_fraction)?;
        if !(self.server.stall_mean_us.is_finite() && self.server.stall_mean_us >= 0.0) {
            return Err(SimError::invalid(
                "server.stall_mean_us",
                self.server.stall_mean_us,
                "must be >= 0",
            ));
        }
        positive("lc.service_us", self.lc.service_us)?;
        if !(self.lc.service_cv > 0.0 && self.lc.service_cv <= 10.0) {
            return Err(SimError::invalid(
                "lc.service_cv",
                self.lc.service_cv,
                "must be in (0, 10]",
            ));
        }
        positive("lc.slo_us", self.lc.slo_us)?;
        if !(50.0..100.0).contains(&self.lc.percentile) {
            return Err(SimError::invalid(
                "lc.percentile",
                self.lc.percentile,
                "must be in 50..100",
            ));
        }
        fraction("lc.llc_sensitivity", self.lc.llc_sensitivity)?;
        if !(self.lc.dram_sensitivity >= 0.0 && self.lc.dram_bytes_per_request >= 0.0) {
            return Err(SimError::invalid(
                "lc.dram_sensitivity",
                self.lc.dram_sensitivity,
                "lc.dram_sensitivity and lc.dram_bytes_per_request must be >= 0",
            ));
        }
        positive("sched.lc_shares", self.sched.lc_shares)?;
        for (key, v) in [
            ("sched.delay_fair_us", self.sched.delay_fair_us),
            ("sched.delay_low_weight_us", self.sched.delay_low_weight_us),
            ("sched.delay_idle_us", self.sched.delay_idle_us),
            ("sched.switch_cpu_us", self.sched.switch_cpu_us),
            ("lc.cpu_us", self.lc.cpu_us),
            ("lc.wake_cpu_us", self.lc.wake_cpu_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(SimError::invalid(key, v, "must be >= 0"));
            }
        }
        fraction("sched.idle_lc_share", self.sched.idle_lc_share)?;
        fraction("sched.delayed_fraction", self.sched.delayed_fraction)?;
        if self.be.is_empty() {
            return Err(SimError::invalid(
                "be",
                "{}",
                "at least one BE kind is needed",
            ));
        }
        for (name, k) in &self.be {
            positive(&format!("be.{name}.ops_per_cpu_s"), k.ops_per_cpu_s)?;
            fraction(&format!("be.{name}.llc_pressure"), k.llc_pressure)?;
            fraction(&format!("be.{name}.llc_sensitivity"), k.llc_sensitivity)?;
            if !(k.dram_bytes_per_cpu_s >= 0.0 && k.power_factor >= 0.0) {
                return Err(SimError::invalid(
                    &format!("be.{name}.dram_bytes_per_cpu_s"),
                    k.dram_bytes_per_cpu_s,
                    "dram_bytes_per_cpu_s and power_factor must be >= 0",
                ));
            }
        }
        Ok(())
    }

    /// The BE kind `name`.
    pub fn be_kind(&self, name: &str) -> Result<&BeKind, SimError> {
        self.be.get(name).ok_or_else(|| {
            SimError::invalid(
                "be",
                name,
                &format!(
                    "unknown BE kind; the model has {}",
                    self.be.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })
    }

    /// Refuses a request the calibration data do not cover (instead of extrapolating silently).
    pub fn check_coverage(&self, cores: u32, max_load: f64) -> Result<(), SimError> {
        if let Some([lo, hi]) = self.calibration.cores_range {
            if cores < lo || cores > hi {
                return Err(SimError::NotCovered(format!(
                    "{cores} CPUs requested, the model was calibrated on {lo}..={hi} CPUs per LC queue; \
                     scale with --allow-extrapolation"
                )));
            }
        }
        if let Some([lo, hi]) = self.calibration.load_range {
            if max_load > hi + 1e-9 || max_load < lo - 1e-9 {
                return Err(SimError::NotCovered(format!(
                    "LC load up to {:.0}% of peak requested, the calibration covered {:.0}%..{:.0}%",
                    max_load * 100.0,
                    lo * 100.0,
                    hi * 100.0
                )));
            }
        }
        Ok(())
    }

    /// The model as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("the model serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_default_model() {
        assert_eq!(
            ServerModel::from_toml_str("").unwrap(),
            ServerModel::default()
        );
        let round = ServerModel::from_toml_str(&ServerModel::default().to_toml()).unwrap();
        assert_eq!(round, ServerModel::default());
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = ServerModel::from_toml_str("[lc]\nservice_us = -3\n").unwrap_err();
        assert!(e.to_string().contains("lc.service_us"), "{e}");
        let e = ServerModel::from_toml_str("[lc]\nservic_us = 3\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }
}
