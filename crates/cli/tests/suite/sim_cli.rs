//! `headroom sim fleet | calibrate | validate`: the report files and their contract fields, the
//! exit code and message on bad input, calibration from fixture bench directories (invalid
//! points refused) and validation against a fixture colocation run.

use crate::support;

use std::path::Path;

use headroom_bench::experiments::Experiment;
use support::{headroom, text};

#[test]
fn fleet_writes_the_bench_report_with_fleet_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("fleet");
    let o = headroom(&[
        "sim",
        "fleet",
        "--servers",
        "4",
        "--hours",
        "1",
        "--cores",
        "8,16",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("server-hours per CPU-second"),
        "{}",
        text(&o)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["experiment"], "sim-fleet");
    let runs = summary["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "none",
            "static-cores",
            "static-cycles",
            "weights",
            "blind",
            "heracles",
            "hybrid"
        ]
    );
    for r in runs {
        // 4 servers × 240 windows of 15 s
        assert_eq!(r["windows"], 960, "{r}");
        assert!(r["slo_violations"].as_u64().unwrap() <= 960);
        for key in [
            "emu_mean",
            "emu_min",
            "emu_p5",
            "lc_load_mean",
            "be_work_cpu_hours",
            "fanout_p99_us_k10_median",
            "fanout_p99_us_k100_median",
        ] {
            assert!(r[key].as_f64().is_some_and(f64::is_finite), "{key} in {r}");
        }
        assert!(r["fanout_p99_us_k100_median"].as_f64() >= r["fanout_p99_us_k10_median"].as_f64());
    }
    // no BE at all: `none` lets BE run everywhere and violates every window in the model
    assert_eq!(runs[0]["slo_violations"], 960);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.matches("<svg").count() >= 4, "plots missing");
    let csv = std::fs::read_to_string(out.join("servers.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4 * 7);
    assert!(out.join("figures/fanout-k100.csv").is_file());

    // `headroom report DIR` re-renders it without re-simulating: same summary (fleet fields
    // included), the report and figures written again
    let before = std::fs::read_to_string(out.join("summary.json")).unwrap();
    std::fs::remove_file(out.join("report.html")).unwrap();
    std::fs::remove_dir_all(out.join("figures")).unwrap();
    let o = headroom(&["report", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("summary.json")).unwrap(),
        before
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(
        html.matches("<svg").count() >= 4,
        "plots missing after re-render"
    );
    assert!(out.join("figures/fanout-k100.csv").is_file());
    // a directory without the kept study says what is missing (exit 2)
    std::fs::remove_file(out.join("study.json")).unwrap();
    let o = headroom(&["report", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("study.json: missing"), "{}", text(&o));
}

fn write(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p.to_str().unwrap().to_string()
}

/// `sim fleet` of one server for an hour with `FLAG FILE` (the input under test) into `out`
/// exits 2 with a message holding `says`.
fn fleet_refuses(flag: &str, file: &str, out: &Path, says: &str) {
    let o = headroom(&[
        "sim",
        "fleet",
        "--servers",
        "1",
        "--hours",
        "1",
        flag,
        file,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains(says), "{}", text(&o));
}

#[test]
fn bad_trace_and_model_files_exit_2_naming_file_line_and_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o");
    let trace = write(tmp.path(), "day.csv", "t_s,load\n0,0.2\n60,lots\n");
    let says = "day.csv: line 3: load `lots` is not a number";
    fleet_refuses("--trace", &trace, &out, says);

    let model = write(
        tmp.path(),
        "m.toml",
        "[lc]\nservice_us = 20\nservice_cv = -1\n",
    );
    fleet_refuses("--model", &model, &out, "m.toml: lc.service_cv = -1");

    let model = write(tmp.path(), "typo.toml", "\n[sched]\ndelay_fair = 3\n");
    let says = "typo.toml: line 3: unknown field `delay_fair`";
    fleet_refuses("--model", &model, &out, says);

    let o = headroom(&["sim", "fleet", "--policies", "fastest", "--out", "x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // Every bad flag at once, and --servers bounded (10⁸ ran on for ever).
    let o = headroom(&[
        "sim",
        "fleet",
        "--servers",
        "100000000",
        "--hours",
        "0",
        "--cores",
        "0",
        "--policies",
        "fastest",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    for says in ["4 problems", "--servers", "--hours", "--cores", "fastest"] {
        assert!(text(&o).contains(says), "{says}: {}", text(&o));
    }
    assert!(!out.exists(), "nothing is written for refused flags");
}

#[test]
fn calibrate_refuses_invalid_points_and_validate_compares_per_window() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = tmp.path().join("lvl");
    headroom_bench::fixture::write_sweep(
        &sweep,
        Experiment::LatencyVsLoad,
        &["alone"],
        &[0.2, 0.4, 0.6, 0.8, 0.9],
    )
    .unwrap();
    let model = tmp.path().join("model.toml");
    let o = headroom(&[
        "sim",
        "calibrate",
        sweep.to_str().unwrap(),
        "--out",
        model.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let msg = text(&o);
    assert!(msg.contains("lc.service_us"), "{msg}");
    // the fixture's last load fails its self-checks in every repeat: refused, not fitted
    assert_eq!(msg.matches("refused:").count(), 3, "{msg}");
    assert!(msg.contains("failed self-checks"), "{msg}");
    let m = headroom_sim::model::ServerModel::from_file(&model).unwrap();
    assert_eq!(m.calibration.cores_range, Some([1, 1]));
    let keys: Vec<&str> = m
        .calibration
        .params
        .iter()
        .map(|p| p.key.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "lc.service_us",
            "lc.service_cv",
            "server.stall_fraction",
            "server.stall_mean_us",
            "lc.cpu_us",
            "lc.wake_cpu_us"
        ]
    );
    // the fixture's LC keeps `load` of its CPU busy at 100k × load QPS: 10 µs a request, no
    // wake-up cost
    assert!((m.lc.cpu_us - 10.0).abs() < 0.05, "{}", m.lc.cpu_us);
    assert!(m.lc.wake_cpu_us.abs() < 0.05, "{}", m.lc.wake_cpu_us);
    for p in &m.calibration.params {
        assert!(p.source.contains("lvl: alone/"), "{}", p.source);
        assert!(p.fit_error.is_finite());
    }

    // a 16-CPU fleet from a 1-CPU calibration is refused unless asked to extrapolate
    let out = tmp.path().join("f");
    let says = "not covered by the model's calibration";
    fleet_refuses("--model", model.to_str().unwrap(), &out, says);

    // a colocation run is validation data, not calibration data
    let coloc = tmp.path().join("coloc");
    headroom_bench::fixture::write_colocation(&coloc).unwrap();
    let o = headroom(&["sim", "calibrate", coloc.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("validation data"), "{}", text(&o));

    // the fixture run reaches 89% load, the fit (its 90% points refused) only 80%
    let o = headroom(&[
        "sim",
        "validate",
        model.to_str().unwrap(),
        coloc.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("covered 0%..80%"), "{}", text(&o));
    let o = headroom(&[
        "sim",
        "validate",
        model.to_str().unwrap(),
        coloc.to_str().unwrap(),
        "--allow-extrapolation",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let msg = text(&o);
    assert!(
        msg.contains("median |error| over the 12 of 12 windows measured validly: p99"),
        "{msg}"
    );
    assert!(msg.contains("over all 12 windows: p99"), "{msg}");
    assert!(msg.contains("hybrid + "), "{msg}");
    let o = headroom(&[
        "sim",
        "validate",
        model.to_str().unwrap(),
        coloc.to_str().unwrap(),
        "--json",
        "--allow-extrapolation",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let run = &v["runs"][0];
    assert_eq!(run["windows"].as_array().unwrap().len(), 12, "{run}");
    assert!(run["p99_median_abs_rel_error"].as_f64().is_some());
    assert_eq!(run["scored_windows"], 12, "{run}");
    assert_eq!(
        run["all_windows"]["p99_median_abs_rel_error"],
        run["p99_median_abs_rel_error"]
    );
    // the server model's own error: the valid windows where both agents gave BE the same CPUs
    let agreed = run["windows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| {
            w["measured_valid"] == true
                && w["measured_be_cpus"].as_f64().is_some_and(|m| {
                    (m - w["predicted_be_cpus"].as_f64().unwrap()).abs() <= 0.1 * 1.0
                })
        })
        .count();
    assert_eq!(run["decisions_agreed"]["windows"], agreed, "{run}");
    assert!(
        msg.contains("where both agents gave BE the same CPUs"),
        "{msg}"
    );
}

#[test]
fn sim_model_prints_the_default_model_as_valid_toml() {
    let o = headroom(&["sim", "model"]);
    assert!(o.status.success(), "{}", text(&o));
    let m = headroom_sim::model::ServerModel::from_toml_str(&String::from_utf8_lossy(&o.stdout))
        .unwrap();
    assert_eq!(m, headroom_sim::model::ServerModel::default());
}
