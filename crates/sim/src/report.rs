//! `sim fleet`'s report in `headroom bench`'s format: headroom-bench's own writer renders
//! `report.html` (inline SVG), `summary.md`, `figures/*.csv|json` and `summary.json`; the fleet
//! fields are then added to each `summary.json` run entry (extend, don't rename), and
//! `servers.csv` lists every server under every policy.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use headroom_report::figure::{Cell, Figure, Series, Shade, Study, Table, XY};
use headroom_report::model::{Machine, Manifest};
use headroom_types::summary::{RunSummary, Summary};
use serde_json::{json, Value};

use crate::error::SimError;
use crate::fleet::{FleetSpec, PolicyFleet, FANOUT_K};
use crate::run::{model_window_s, SimSetup};

/// The fleet fields added to a `summary.json` run entry.
pub fn fleet_fields(f: &PolicyFleet) -> Value {
    json!({
        "servers": f.servers.len(),
        "emu_p5": f.emu_p5(),
        "lc_load_mean": f.servers.iter().map(|s| s.lc_load_mean).sum::<f64>() / f.servers.len().max(1) as f64,
        "violating_servers": f.violating_servers(),
        "violating_windows_per_server_mean": f.total_violations() as f64 / f.servers.len().max(1) as f64,
        "violating_windows_per_server_max": f.servers.iter().map(|s| s.violations).max().unwrap_or(0),
        "be_work_cpu_hours": f.be_cpu_hours(),
        "fanout_p99_us_k10_median": f.fanout_quantile(0, 0.5),
        "fanout_p99_us_k10_max": f.fanout_quantile(0, 1.0),
        "fanout_p99_us_k100_median": f.fanout_quantile(1, 0.5),
        "fanout_p99_us_k100_max": f.fanout_quantile(1, 1.0),
        "policy_calls": f.decisions,
        "allocation_writes": f.writes,
    })
}

fn hourly(values: &[f64], window_s: f64, reduce: fn(&[f64]) -> f64) -> Vec<XY> {
    let per_hour = (3600.0 / window_s).round().max(1.0) as usize;
    values
        .chunks(per_hour)
        .enumerate()
        .map(|(h, c)| XY::new(h as f64 + 0.5, reduce(c)))
        .collect()
}

fn avg(c: &[f64]) -> f64 {
    c.iter().sum::<f64>() / c.len().max(1) as f64
}

fn max(c: &[f64]) -> f64 {
    c.iter().cloned().fold(0.0, f64::max)
}

/// The study of a fleet run.
pub fn fleet_study(setup: &SimSetup, spec: &FleetSpec, results: &[PolicyFleet]) -> Study {
    let m = &setup.model;
    let window_s = model_window_s(setup);
    let runs = results
        .iter()
        .map(|f| RunSummary {
            policy: f.policy.as_str().to_string(),
            be: "pool".to_string(),
            slo_violations: f.total_violations(),
            windows: f.total_windows(),
            emu_mean: Some(f.emu_mean()),
            emu_min: Some(f.emu_min()),
            lc_p99_us_max: Some(f.p99_max()),
            be_throughput_norm: Some(f.be_norm_mean()),
            valid_windows: None,
            slo_violations_valid: None,
        })
        .collect();
    let series = |name: &str, f: &PolicyFleet, points: Vec<XY>| Series {
        name: name.to_string(),
        color_key: f.policy.as_str().to_string(),
        dashed: false,
        points,
    };
    let emu = Figure {
        id: "fleet-emu".into(),
        title: "Fleet EMU over the day".into(),
        caption: "Mean over servers of LC load + normalised BE throughput, hourly means of the SLO windows.".into(),
        x_label: "hour".into(),
        y_label: "EMU (fraction)".into(),
        log_y: false,
        slo: None,
        series: results
            .iter()
            .map(|f| series(f.policy.as_str(), f, hourly(&f.window_emu, window_s, avg)))
            .collect(),
    };
    let n = spec.servers.max(1) as f64;
    let violating = Figure {
        id: "fleet-violating".into(),
        title: "Servers violating the SLO".into(),
        caption: "Share of servers whose SLO window violated, hourly mean.".into(),
        x_label: "hour".into(),
        y_label: "servers violating (%)".into(),
        log_y: false,
        slo: None,
        series: results
            .iter()
            .map(|f| {
                let v: Vec<f64> = f
                    .window_violating
                    .iter()
                    .map(|x| 100.0 * *x as f64 / n)
                    .collect();
                series(f.policy.as_str(), f, hourly(&v, window_s, avg))
            })
            .collect(),
    };
    let mut fanout = Vec::new();
    for (i, k) in FANOUT_K.iter().enumerate() {
        fanout.push(Figure {
            id: format!("fanout-k{k}"),
            title: format!("Fan-out tail: slowest of {k} leaves"),
            caption: format!(
                "p{} of the slowest of {k} leaf responses (leaves drawn at random from the fleet), worst window of each hour; the grid tops out at 50 × the SLO.",
                m.lc.percentile
            ),
            x_label: "hour".into(),
            y_label: "latency (µs)".into(),
            log_y: true,
            slo: Some(m.lc.slo_us),
            series: results
                .iter()
                .map(|f| {
                    let v: Vec<f64> = f.window_fanout_p99.iter().map(|w| w[i]).collect();
                    series(f.policy.as_str(), f, hourly(&v, window_s, max))
                })
                .collect(),
        });
    }
    let mut rows = Vec::new();
    for f in results {
        let viol_pct = 100.0 * f.total_violations() as f64 / f.total_windows().max(1) as f64;
        rows.push(vec![
            Cell::text(f.policy.as_str()),
            Cell::num(Some(f.total_violations() as f64), 0).shaded(Shade::of_violations(
                f.total_violations(),
                f.total_windows(),
            )),
            Cell::num(Some(viol_pct), 2),
            Cell::num(Some(f.violating_servers() as f64), 0),
            Cell::num(Some(100.0 * f.emu_mean()), 1),
            Cell::num(Some(100.0 * f.emu_p5()), 1),
            Cell::num(Some(f.be_norm_mean()), 3),
            Cell::num(Some(f.be_cpu_hours()), 0),
            Cell::num(Some(f.fanout_quantile(0, 0.5)), 0),
            Cell::num(Some(f.fanout_quantile(0, 1.0)), 0),
            Cell::num(Some(f.fanout_quantile(1, 0.5)), 0),
            Cell::num(Some(f.fanout_quantile(1, 1.0)), 0),
        ]);
    }
    let table = Table {
        id: "fleet".into(),
        title: "Fleet per policy".into(),
        caption: format!(
            "{} servers × {} h, SLO p{} ≤ {} µs per {} s window. Fan-out columns: p{} of the slowest of k leaves, median and worst window.",
            spec.servers, spec.hours, m.lc.percentile, m.lc.slo_us, window_s, m.lc.percentile
        ),
        columns: [
            "policy",
            "violating windows",
            "violating %",
            "servers violating",
            "EMU mean %",
            "EMU p5 %",
            "BE norm.",
            "BE CPU-hours",
            "k=10 median µs",
            "k=10 worst µs",
            "k=100 median µs",
            "k=100 worst µs",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
    };
    let findings = results
        .iter()
        .map(|f| {
            format!(
                "{}: {} of {} windows violated ({} of {} servers), fleet EMU mean {:.1}% (p5 across servers {:.1}%), BE {:.0} CPU-hours, fan-out p{} k=10 median {:.0} µs, k=100 median {:.0} µs",
                f.policy.as_str(),
                f.total_violations(),
                f.total_windows(),
                f.violating_servers(),
                f.servers.len(),
                100.0 * f.emu_mean(),
                100.0 * f.emu_p5(),
                f.be_cpu_hours(),
                m.lc.percentile,
                f.fanout_quantile(0, 0.5),
                f.fanout_quantile(1, 0.5)
            )
        })
        .collect();
    let mut figures = vec![emu, violating];
    figures.extend(fanout);
    Study {
        summary: Summary {
            experiment: "sim-fleet".into(),
            slo_us: m.lc.slo_us,
            percentile: m.lc.percentile,
            runs,
        },
        figures,
        tables: vec![table],
        findings,
        commands: Vec::new(),
    }
}

/// The manifest of a fleet run (what the report header shows).
pub fn fleet_manifest(setup: &SimSetup, spec: &FleetSpec, invocation: &str) -> Manifest {
    let mut params = BTreeMap::new();
    params.insert("servers".into(), json!(spec.servers));
    params.insert("hours".into(), json!(spec.hours));
    params.insert("cores".into(), json!(spec.cores));
    params.insert("seed".into(), json!(spec.seed));
    params.insert("tick_s".into(), json!(setup.tick_s));
    params.insert("be_pool".into(), json!(setup.be_pool));
    params.insert(
        "model".into(),
        serde_json::to_value(&setup.model).unwrap_or(Value::Null),
    );
    Manifest {
        experiment: "sim-fleet".into(),
        machine: Machine {
            kernel: "simulated".into(),
            cpu_model: "headroom sim model".into(),
            cpus: spec.cores.iter().copied().max().unwrap_or(0) as usize,
            hostname: "simulated".into(),
            ..Machine::default()
        },
        slo_us: setup.model.lc.slo_us,
        percentile: setup.model.lc.percentile,
        slo_source: "the model's lc.slo_us".into(),
        peak_qps: None,
        peak_source: "per server size: the highest LC load whose tail meets the SLO alone".into(),
        params,
        invocations: vec![invocation.to_string()],
        notes: vec![
            "Simulated: the real policies and safety rules on modelled servers (docs/simulation.md); latencies come from the closed-form queue model, not measurement.".into(),
        ],
        ..Manifest::default()
    }
}

/// The fleet study a `sim fleet` directory keeps for re-rendering.
pub const STUDY_JSON: &str = "study.json";
/// The fleet fields of each policy, in the study's order.
pub const FLEET_JSON: &str = "fleet.json";

fn write_json<T: serde::Serialize + ?Sized>(path: &Path, v: &T) -> Result<(), SimError> {
    let text = serde_json::to_string_pretty(v).expect("json") + "\n";
    std::fs::write(path, text).map_err(|e| SimError::io(path, e))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, SimError> {
    let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| SimError::Parse {
        file: Some(path.to_path_buf()),
        line: Some(e.line()),
        reason: e.to_string(),
    })
}

/// The bench writer's report, then the fleet fields added to each `summary.json` run entry.
fn render(
    dir: &Path,
    manifest: &Manifest,
    study: &Study,
    fleet: &[Value],
) -> Result<headroom_report::format::ReportFiles, SimError> {
    let files = headroom_report::format::write_report(dir, manifest, study)?;
    let mut summary = serde_json::to_value(&study.summary).expect("summary serializes");
    if let Some(runs) = summary.get_mut("runs").and_then(Value::as_array_mut) {
        for (run, extra) in runs.iter_mut().zip(fleet) {
            if let (Some(obj), Value::Object(extra)) = (run.as_object_mut(), extra) {
                obj.extend(extra.clone());
            }
        }
    }
    write_json(&files.summary_json, &summary)?;
    Ok(files)
}

/// Whether `dir` holds a `sim fleet` result (its manifest says so).
pub fn is_fleet_dir(dir: &Path) -> bool {
    read_json::<Value>(&dir.join("manifest.json"))
        .ok()
        .and_then(|m| {
            m.get("experiment")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .is_some_and(|e| e == "sim-fleet")
}

/// `headroom report DIR` on a `sim fleet` directory: re-renders `report.html`, `summary.md`,
/// `figures/` and `summary.json` from the kept study, fleet fields and manifest, without
/// re-simulating.
pub fn rerender_fleet_report(dir: &Path) -> Result<headroom_report::format::ReportFiles, SimError> {
    let manifest: Manifest = read_json(&dir.join("manifest.json"))?;
    let study_path = dir.join(STUDY_JSON);
    if !study_path.is_file() {
        return Err(SimError::Parse {
            file: Some(study_path),
            line: None,
            reason: "missing: written by a `sim fleet` that kept no study (before re-rendering existed); run it again".into(),
        });
    }
    let study: Study = read_json(&study_path)?;
    let fleet: Vec<Value> = read_json(&dir.join(FLEET_JSON))?;
    if fleet.len() != study.summary.runs.len() {
        return Err(SimError::invalid(
            FLEET_JSON,
            fleet.len(),
            &format!(
                "one entry per policy expected, the study has {}",
                study.summary.runs.len()
            ),
        )
        .in_file(&dir.join(FLEET_JSON)));
    }
    render(dir, &manifest, &study, &fleet)
}

/// Writes the report, then adds the fleet fields to `summary.json` and writes `servers.csv`.
pub fn write_fleet_report(
    dir: &Path,
    setup: &SimSetup,
    spec: &FleetSpec,
    results: &[PolicyFleet],
    invocation: &str,
) -> Result<Vec<PathBuf>, SimError> {
    std::fs::create_dir_all(dir).map_err(|e| SimError::io(dir, e))?;
    let study = fleet_study(setup, spec, results);
    let manifest = fleet_manifest(setup, spec, invocation);
    let fleet: Vec<Value> = results.iter().map(fleet_fields).collect();
    // what `headroom report DIR` re-renders from: the study (figures, tables, findings) and
    // the fleet fields, which the per-server results they come from are not kept for
    write_json(&dir.join(STUDY_JSON), &study)?;
    write_json(&dir.join(FLEET_JSON), &fleet)?;
    let files = render(dir, &manifest, &study, &fleet)?;
    let manifest_path = dir.join("manifest.json");
    write_json(&manifest_path, &manifest)?;
    let header = [
        "policy",
        "server",
        "cores",
        "windows",
        "violations",
        "emu_mean",
        "emu_min",
        "be_norm_mean",
        "lc_load_mean",
        "p99_max_us",
        "be_cpu_hours",
    ]
    .map(String::from)
    .to_vec();
    let rows = results.iter().flat_map(|f| {
        f.servers.iter().map(move |s| {
            vec![
                f.policy.as_str().to_string(),
                s.server.to_string(),
                s.cores.to_string(),
                s.windows.to_string(),
                s.violations.to_string(),
                format!("{:.4}", s.emu_mean),
                format!("{:.4}", s.emu_min),
                format!("{:.4}", s.be_norm_mean),
                format!("{:.4}", s.lc_load_mean),
                format!("{:.1}", s.p99_max_us),
                format!("{:.3}", s.be_cpu_hours),
            ]
        })
    });
    let csv = headroom_report::format::csv_document(std::iter::once(header).chain(rows));
    let servers = dir.join("servers.csv");
    std::fs::write(&servers, csv).map_err(|e| SimError::io(&servers, e))?;
    Ok(vec![files.html, files.summary_json, servers])
}
