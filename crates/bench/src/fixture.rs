//! Synthetic run directories for tests of the study and format steps (and of `headroom report`).
//! Every manifest they write carries a note saying the data is synthetic, so a fixture report can
//! never be mistaken for a measurement.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;

use crate::error::Result;
use crate::experiments::Experiment;
use headroom_report::model::{
    AgentWindow, ColocationRun, LoadMetrics, Machine, Manifest, Point, Window,
};
use headroom_report::store::{RunDir, POINTS, RUNS};

pub const FIXTURE_NOTE: &str = "SYNTHETIC FIXTURE DATA for tests: not a measurement.";

fn machine() -> Machine {
    Machine {
        kernel: "6.18.0-fixture".into(),
        cpu_model: "Fixture CPU @ 2.0GHz".into(),
        cpus: 2,
        hostname: "fixture".into(),
        doctor: Some(json!({"kernel": "6.18.0-fixture", "cgroup_mode": "v1", "cpus": 2})),
        loadgen_cpus: vec![0],
        server_cpus: vec![1],
        be_cpus: vec![1],
    }
}

/// A load result as the load generator would report it, from a simple queueing-like model.
pub fn synthetic_load(target_qps: f64, base_us: f64, load: f64, valid: bool) -> LoadMetrics {
    let stretch = 1.0 / (1.0 - load.min(0.97));
    LoadMetrics {
        target_qps,
        achieved_qps: target_qps * if valid { 0.999 } else { 0.9 },
        valid,
        failed_checks: if valid {
            vec![]
        } else {
            vec!["rate: achieved 90% of target".into()]
        },
        avg_us: Some(base_us * stretch * 0.8),
        p50_us: Some(base_us * stretch * 0.7),
        p95_us: Some(base_us * stretch * 1.6),
        p99_us: Some(base_us * stretch * 2.5),
        p999_us: Some(base_us * stretch * 5.0),
        count: Some(target_qps * 2.0),
        send_lag_p99_us: Some(3.0),
        late: Some(0.0),
        errors: Some(0.0),
    }
}

fn manifest(exp: Experiment, series: &[&str]) -> Manifest {
    let mut params = BTreeMap::new();
    params.insert("series".to_string(), json!(series));
    params.insert("repeats".to_string(), json!(3));
    Manifest {
        experiment: exp.name().into(),
        machine: machine(),
        slo_us: 500.0,
        percentile: 99.0,
        slo_source: "fixture".into(),
        peak_qps: Some(100_000.0),
        peak_source: "fixture".into(),
        params,
        invocations: vec![format!("headroom bench {} --out DIR (fixture)", exp.name())],
        started_unix_ms: 1_700_000_000_000,
        finished_unix_ms: Some(1_700_000_600_000),
        notes: vec![FIXTURE_NOTE.into()],
    }
}

/// Writes a sweep experiment's run directory: `series` × `loads` × 3 repeats. A series' index
/// scales its latency, so later series are "worse"; the last load of the last series fails its
/// self-checks.
pub fn write_sweep(dir: &Path, exp: Experiment, series: &[&str], loads: &[f64]) -> Result<RunDir> {
    let run = RunDir::create(dir)?;
    run.write_manifest(&manifest(exp, series))?;
    for (si, s) in series.iter().enumerate() {
        for (li, l) in loads.iter().enumerate() {
            for r in 0..3u32 {
                let valid = !(si + 1 == series.len() && li + 1 == loads.len());
                let base = 60.0 * (1.0 + si as f64 * 0.9) * (1.0 + r as f64 * 0.03);
                let be = if *s == "alone" { "none" } else { "spin" };
                let p = Point {
                    id: format!("{s}/{l}/{r}"),
                    series: s.to_string(),
                    be: be.into(),
                    load_fraction: *l,
                    repeat: r,
                    start_unix_ms: 1_700_000_000_000 + (li as u64) * 10_000,
                    end_unix_ms: 1_700_000_000_000 + (li as u64) * 10_000 + 5_000,
                    load: Some(synthetic_load(l * 100_000.0, base, *l, valid)),
                    error: None,
                    be_ops_per_s: (be != "none").then_some(1e6 * (1.0 - l)),
                    be_norm: (be != "none").then_some(1.0 - l),
                    // the LC alone keeps `load` of its CPU busy; a spinning BE the rest
                    idle_cpu_pct: Some(if be == "none" { 100.0 * (1.0 - l) } else { 0.0 }),
                    steal_pct: Some(0.5),
                    agent: None,
                    commands: vec![
                        "headroom load -s 127.0.0.1:1 -q 1 -t 5 --noload --json F".into()
                    ],
                    raw_load: None,
                };
                run.save(POINTS, &p.id, &p)?;
            }
        }
    }
    Ok(run)
}

/// The diurnal trace: 20% → 90% → 20% over `n` windows (a half sine).
pub fn diurnal(n: usize, low: f64, high: f64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let phase = if n <= 1 {
                0.5
            } else {
                i as f64 / (n - 1) as f64
            };
            low + (high - low) * (std::f64::consts::PI * phase).sin()
        })
        .collect()
}

/// Writes a colocation run directory with two runs over 12 windows: `none` (violates at high load,
/// full BE) and `hybrid` (meets the SLO, BE shrinks as the load rises).
pub fn write_colocation(dir: &Path) -> Result<RunDir> {
    let run_dir = RunDir::create(dir)?;
    let mut m = manifest(Experiment::Colocation, &["none", "hybrid"]);
    m.params.insert("window_s".into(), json!(15));
    run_dir.write_manifest(&m)?;
    let trace = diurnal(12, 0.2, 0.9);
    for policy in ["none", "hybrid"] {
        let windows = trace
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let start = 1_700_000_000_000 + i as u64 * 15_000;
                let (base, be_fraction, be_cpus) = if policy == "none" {
                    (150.0, 0.5, 1.0)
                } else {
                    (15.0, (0.95 - f).max(0.05), if *f > 0.7 { 0.0 } else { 1.0 })
                };
                Window {
                    index: i,
                    start_unix_ms: start,
                    end_unix_ms: start + 15_000,
                    target_fraction: *f,
                    load: Some(synthetic_load(f * 100_000.0, base, *f, true)),
                    error: None,
                    lc_load_fraction: f * 0.999,
                    be_ops_per_s: Some(be_fraction * 1e6),
                    be_fraction: Some(be_fraction),
                    agent: (policy != "none").then(|| AgentWindow {
                        decisions: 15,
                        be_cpus_mean: Some(be_cpus),
                        be_cpu_weight: Some(2.0),
                        be_quota_pct: Some(50.0),
                        be_enabled_share: Some(1.0),
                        last_reason: Some("slack-ok".into()),
                    }),
                    steal_pct: Some(0.1),
                }
            })
            .collect();
        let run = ColocationRun {
            policy: policy.into(),
            be: "spin".into(),
            dry_run: false,
            be_solo_ops_per_s: Some(1e6),
            windows,
            commands: vec![],
            notes: vec![],
        };
        run_dir.save(RUNS, &format!("{policy}-spin"), &run)?;
    }
    Ok(run_dir)
}
