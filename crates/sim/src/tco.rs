//! `headroom plan`: Leverich & Kozyrakis' TCO model (EuroSys'14 §5, Table 2, after Patel et al.)
//! and the operator's question built on it.
//!
//! TCO per server = capital + 3 years of fully burdened power,
//! power cost = (1 + K1 + L1 + K2·L1) · U$,grid · E, E = P · 24 h · 365 d · years,
//! P = peak · (idle + (1 − idle) · CPU utilisation).
//! Co-location is compared with two separate clusters giving the same LC service and the same BE
//! throughput; the improvement in performance per TCO-$ is TCO(split) / TCO(co-located) − 1.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::SimError;

/// Patel et al.'s cost parameters as Leverich & Kozyrakis give them (Table 2's footnote).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcoParams {
    /// Server capital cost, $.
    pub server_usd: f64,
    /// Peak server power, W.
    pub peak_power_w: f64,
    /// Static power as a fraction of peak.
    pub idle_power_fraction: f64,
    pub k1: f64,
    pub l1: f64,
    pub k2: f64,
    /// Grid electricity, $/kWh.
    pub usd_per_kwh: f64,
    /// Amortisation period, years.
    pub years: f64,
}

impl Default for TcoParams {
    fn default() -> Self {
        TcoParams {
            server_usd: 2000.0,
            peak_power_w: 300.0,
            idle_power_fraction: 0.5,
            k1: 1.33,
            l1: 0.8,
            k2: 0.25,
            usd_per_kwh: 0.08,
            years: 3.0,
        }
    }
}

impl TcoParams {
    /// Fully burdened power cost of one server at CPU utilisation `util` over the period, $.
    pub fn power_usd(&self, util: f64) -> f64 {
        let p_kw = self.peak_power_w / 1000.0
            * (self.idle_power_fraction + (1.0 - self.idle_power_fraction) * util.clamp(0.0, 1.0));
        let kwh = p_kw * 24.0 * 365.0 * self.years;
        (1.0 + self.k1 + self.l1 + self.k2 * self.l1) * self.usd_per_kwh * kwh
    }

    /// TCO of one server at utilisation `util`, $.
    pub fn server_tco(&self, util: f64) -> f64 {
        self.server_usd + self.power_usd(util)
    }

    /// Perf/TCO-$ improvement (fraction) of co-locating BE with an LC at `lc_load`, when the BE
    /// achieves `be_throughput` of its solo throughput: split = LC servers at `lc_load` plus
    /// `be_throughput` servers' worth of BE servers at full load; co-located servers run full.
    pub fn colocation_improvement(&self, lc_load: f64, be_throughput: f64) -> f64 {
        let colocated = self.server_tco(1.0);
        let split = self.server_tco(lc_load) + be_throughput * self.server_tco(1.0);
        split / colocated - 1.0
    }
}

/// One row of the paper comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PaperRow {
    pub name: String,
    pub paper_pct: f64,
    pub computed_pct: f64,
}

/// Table 2's memcached loads.
pub const TABLE2_LOADS: [f64; 5] = [0.10, 0.30, 0.50, 0.70, 0.90];
/// Table 2's "Perf/TCO-$ improvement" geo-mean row, %.
pub const TABLE2_PAPER_PCT: [f64; 5] = [52.0, 29.0, 18.0, 11.0, 18.0];

/// Table 2's SPEC CPU2006 instruction throughput (normalised to alone) co-located with memcached
/// at 10/30/50/70/90% load, the 12 benchmarks the paper lists.
pub const TABLE2_SPEC: [(&str, [f64; 5]); 12] = [
    ("400.perlbench", [0.74, 0.42, 0.22, 0.10, 0.14]),
    ("401.bzip2", [0.79, 0.48, 0.41, 0.17, 0.22]),
    ("403.gcc", [0.75, 0.41, 0.23, 0.14, 0.18]),
    ("410.bwaves", [0.65, 0.29, 0.17, 0.09, 0.10]),
    ("416.gamess", [0.78, 0.49, 0.28, 0.17, 0.17]),
    ("429.mcf", [0.77, 0.54, 0.38, 0.28, 0.26]),
    ("433.milc", [0.80, 0.56, 0.38, 0.29, 0.26]),
    ("434.zeusmp", [0.73, 0.43, 0.24, 0.13, 0.14]),
    ("450.soplex", [0.86, 0.53, 0.34, 0.18, 0.22]),
    ("459.GemsFDTD", [0.79, 0.56, 0.38, 0.24, 0.22]),
    ("470.lbm", [0.76, 0.53, 0.35, 0.23, 0.23]),
    ("471.omnetpp", [0.61, 0.48, 0.40, 0.28, 0.39]),
];

/// Table 2's improvement row from the paper's own inputs: the geometric mean of the listed
/// benchmarks' throughput at each load, through [`TcoParams::colocation_improvement`].
pub fn leverich_table2(p: &TcoParams) -> Vec<PaperRow> {
    TABLE2_LOADS
        .iter()
        .enumerate()
        .map(|(j, load)| {
            let n = TABLE2_SPEC.len() as f64;
            let geo = (TABLE2_SPEC.iter().map(|(_, t)| t[j].ln()).sum::<f64>() / n).exp();
            PaperRow {
                name: format!("memcached {:.0}% load", load * 100.0),
                paper_pct: TABLE2_PAPER_PCT[j],
                computed_pct: 100.0 * p.colocation_improvement(*load, geo),
            }
        })
        .collect()
}

/// `headroom plan --config F`: the operator's inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanConfig {
    pub lc: PlanLc,
    pub be: PlanBe,
    #[serde(default)]
    pub server: TcoParams,
    pub colocation: PlanColocation,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanLc {
    /// Fleet-wide LC peak, requests/s.
    pub peak_qps: f64,
    /// LC peak one server of this type carries within the SLO, requests/s.
    pub qps_per_server: f64,
    /// Mean LC load over the day as a fraction of peak; default the summary's `lc_load_mean`.
    #[serde(default)]
    pub mean_load: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanBe {
    /// BE demand in servers' worth of BE-alone throughput.
    pub demand_servers: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanColocation {
    /// The EMU colocation achieves (LC load + BE throughput); or take it from `summary`.
    #[serde(default)]
    pub emu: Option<f64>,
    /// A `summary.json` (from `headroom sim fleet`, `bench colocation` or `demo`), relative to
    /// the plan file.
    #[serde(default)]
    pub summary: Option<String>,
    /// The policy whose entry to read from `summary` (default `hybrid`).
    #[serde(default)]
    pub policy: Option<String>,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanAnswer {
    pub lc_servers: u64,
    pub mean_load: f64,
    pub emu: f64,
    pub emu_source: String,
    pub be_servers_without: u64,
    pub servers_without: u64,
    /// BE servers still needed beside the co-located LC servers.
    pub be_servers_with: u64,
    pub servers_with: u64,
    pub tco_without_usd: f64,
    pub tco_with_usd: f64,
    pub tco_saving_usd: f64,
    pub tco_saving_pct: f64,
    pub perf_per_tco_improvement_pct: f64,
}

impl PlanConfig {
    /// Reads a plan file; errors name the file, the line or field, and why.
    pub fn from_file(path: &Path) -> Result<PlanConfig, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
        let cfg: PlanConfig = toml::from_str(&text).map_err(|e| SimError::Parse {
            file: Some(path.to_path_buf()),
            line: e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1),
            reason: e.message().to_string(),
        })?;
        cfg.check().map_err(|e| e.in_file(path))?;
        Ok(cfg)
    }

    fn check(&self) -> Result<(), SimError> {
        let mut problems = Vec::new();
        let mut pos = |k: &str, v: f64| {
            if !(v.is_finite() && v > 0.0) {
                problems.push(SimError::invalid(k, v, "must be > 0"));
            }
        };
        pos("lc.peak_qps", self.lc.peak_qps);
        pos("lc.qps_per_server", self.lc.qps_per_server);
        pos("server.server_usd", self.server.server_usd);
        pos("server.peak_power_w", self.server.peak_power_w);
        let lc_servers = self.lc.peak_qps / self.lc.qps_per_server;
        // Both rates good (else said above) and their ratio too large or infinite.
        if self.lc.peak_qps > 0.0
            && self.lc.qps_per_server > 0.0
            && (lc_servers.is_nan() || lc_servers > MAX_SERVERS)
        {
            problems.push(SimError::invalid(
                "lc.peak_qps / lc.qps_per_server",
                lc_servers,
                "more than 10⁹ LC servers: check the two rates' units",
            ));
        }
        if let Some(m) = self.lc.mean_load {
            if !(0.0..=1.0).contains(&m) {
                problems.push(SimError::invalid("lc.mean_load", m, "must be in 0..=1"));
            }
        }
        if !(0.0..=MAX_SERVERS).contains(&self.be.demand_servers) {
            problems.push(SimError::invalid(
                "be.demand_servers",
                self.be.demand_servers,
                "must be in 0..=10⁹",
            ));
        }
        if !(0.0..=1.0).contains(&self.server.idle_power_fraction) {
            problems.push(SimError::invalid(
                "server.idle_power_fraction",
                self.server.idle_power_fraction,
                "must be in 0..=1",
            ));
        }
        if let Some(e) = self.colocation.emu {
            if !(0.0..=2.0).contains(&e) {
                problems.push(SimError::invalid("colocation.emu", e, "must be in 0..=2"));
            }
        }
        if self.colocation.emu.is_none() && self.colocation.summary.is_none() {
            problems.push(SimError::invalid(
                "colocation",
                "{}",
                "give `emu` or `summary` (a summary.json with the policy's emu_mean)",
            ));
        }
        SimError::gather(problems)
    }

    /// The EMU and mean load to plan with: given, or read from the summary.
    pub fn resolve(&self, plan_dir: &Path) -> Result<(f64, f64, String), SimError> {
        let policy = self.colocation.policy.as_deref().unwrap_or("hybrid");
        let mut from_summary: Option<(f64, Option<f64>, String)> = None;
        if let Some(rel) = &self.colocation.summary {
            let path = plan_dir.join(rel);
            let text = std::fs::read_to_string(&path).map_err(|e| SimError::io(&path, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| SimError::Parse {
                    file: Some(path.clone()),
                    line: Some(e.line()),
                    reason: e.to_string(),
                })?;
            let run = v["runs"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["policy"] == policy))
                .ok_or_else(|| SimError::Invalid {
                    file: Some(path.clone()),
                    key: "runs[].policy".into(),
                    value: policy.into(),
                    reason: "no entry for this policy".into(),
                })?;
            let emu = run["emu_mean"].as_f64().ok_or_else(|| SimError::Invalid {
                file: Some(path.clone()),
                key: format!("runs[policy={policy}].emu_mean"),
                value: run["emu_mean"].to_string(),
                reason: "not a number".into(),
            })?;
            from_summary = Some((
                emu,
                run["lc_load_mean"].as_f64(),
                format!("{} ({policy})", path.display()),
            ));
        }
        let emu = self
            .colocation
            .emu
            .or(from_summary.as_ref().map(|s| s.0))
            .expect("checked");
        let source = if self.colocation.emu.is_some() {
            "colocation.emu".to_string()
        } else {
            from_summary
                .as_ref()
                .map(|s| s.2.clone())
                .unwrap_or_default()
        };
        let mean_load = self
            .lc
            .mean_load
            .or(from_summary.as_ref().and_then(|s| s.1))
            .ok_or_else(|| {
                SimError::invalid(
                    "lc.mean_load",
                    "absent",
                    "give it, or a summary.json with lc_load_mean (headroom sim fleet writes one)",
                )
            })?;
        Ok((emu, mean_load, source))
    }
}

/// Servers and TCO with and without colocation.
/// The most servers a plan counts (LC or BE): beyond it the inputs' units are wrong, and the
/// counts would overflow.
const MAX_SERVERS: f64 = 1e9;

pub fn plan(cfg: &PlanConfig, emu: f64, mean_load: f64, emu_source: String) -> PlanAnswer {
    let p = &cfg.server;
    let lc_servers = (cfg.lc.peak_qps / cfg.lc.qps_per_server).ceil() as u64;
    let be_servers_without = cfg.be.demand_servers.ceil() as u64;
    let be_per_lc_server = (emu - mean_load).max(0.0);
    let left = (cfg.be.demand_servers - lc_servers as f64 * be_per_lc_server).max(0.0);
    let be_servers_with = left.ceil() as u64;
    let tco_without =
        lc_servers as f64 * p.server_tco(mean_load) + be_servers_without as f64 * p.server_tco(1.0);
    let tco_with =
        lc_servers as f64 * p.server_tco(emu.min(1.0)) + be_servers_with as f64 * p.server_tco(1.0);
    PlanAnswer {
        lc_servers,
        mean_load,
        emu,
        emu_source,
        be_servers_without,
        servers_without: lc_servers + be_servers_without,
        be_servers_with,
        servers_with: lc_servers + be_servers_with,
        tco_without_usd: tco_without,
        tco_with_usd: tco_with,
        tco_saving_usd: tco_without - tco_with,
        tco_saving_pct: 100.0 * (tco_without - tco_with) / tco_without,
        perf_per_tco_improvement_pct: 100.0 * (tco_without / tco_with - 1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table2_row_within_one_point() {
        for r in leverich_table2(&TcoParams::default()) {
            assert!(
                (r.computed_pct - r.paper_pct).abs() <= 1.0,
                "{}: computed {:.2}% vs paper {}%",
                r.name,
                r.computed_pct,
                r.paper_pct
            );
        }
    }

    #[test]
    fn paper_worked_example() {
        // §5.1: at 10% load the co-located BE reaches 75.4% → +52% TCO for a split cluster
        let p = TcoParams::default();
        let imp = p.colocation_improvement(0.10, 0.754);
        assert!((imp - 0.52).abs() < 0.005, "{imp}");
    }

    #[test]
    fn colocation_absorbs_be_demand() {
        let cfg: PlanConfig = toml::from_str(
            "[lc]\npeak_qps = 1000\nqps_per_server = 10\nmean_load = 0.5\n[be]\ndemand_servers = 30\n[colocation]\nemu = 0.9\n",
        )
        .unwrap();
        let a = plan(&cfg, 0.9, 0.5, "test".into());
        assert_eq!(a.lc_servers, 100);
        assert_eq!(a.servers_without, 130);
        // 100 servers × 0.4 of BE = 40 ≥ 30: no BE servers left
        assert_eq!(a.servers_with, 100);
        assert!(a.tco_saving_usd > 0.0);
    }
}
