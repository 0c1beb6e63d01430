//! The format step on fixture data: summary.json keys, per-figure CSV/JSON, every plot in the HTML,
//! and (when Chromium is installed) the page loading in a headless browser with every plot.

use std::collections::BTreeSet;

use headroom_bench::experiments::Experiment;
use headroom_bench::fixture;
use headroom_bench::study;
use headroom_report::browser;

fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object().expect("object").keys().cloned().collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn colocation_report_has_design_summary_keys_data_files_and_plots() {
    let tmp = tempfile::tempdir().unwrap();
    fixture::write_colocation(tmp.path()).unwrap();
    let files = study::report(tmp.path()).unwrap();

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files.summary_json).unwrap()).unwrap();
    assert_eq!(
        keys(&summary),
        set(&["experiment", "slo_us", "percentile", "runs"])
    );
    assert_eq!(summary["experiment"], "colocation");
    let runs = summary["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        assert_eq!(
            keys(r),
            set(&[
                "policy",
                "be",
                "slo_violations",
                "windows",
                "emu_mean",
                "emu_min",
                "lc_p99_us_max",
                "be_throughput_norm",
                "valid_windows",
                "slo_violations_valid"
            ])
        );
    }
    // The fixture's `none` run violates at high load; `hybrid` never does.
    let none = runs.iter().find(|r| r["policy"] == "none").unwrap();
    let hybrid = runs.iter().find(|r| r["policy"] == "hybrid").unwrap();
    assert!(none["slo_violations"].as_u64().unwrap() > 0);
    assert_eq!(hybrid["slo_violations"].as_u64().unwrap(), 0);
    assert_eq!(hybrid["windows"].as_u64().unwrap(), 12);

    let (_, study) =
        study::study_dir(&headroom_report::store::RunDir::open(tmp.path()).unwrap()).unwrap();
    for f in &study.figures {
        for ext in ["csv", "json"] {
            let p = tmp.path().join("figures").join(format!("{}.{ext}", f.id));
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(text.len() > 20, "{} is empty", p.display());
        }
        let csv = std::fs::read_to_string(tmp.path().join("figures").join(format!("{}.csv", f.id)))
            .unwrap();
        let rows = csv.lines().count() - 1;
        let points: usize = f.series.iter().map(|s| s.points.len()).sum();
        assert_eq!(rows, points, "{}: one CSV row per plotted point", f.id);
    }
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert_eq!(html.matches("<svg").count(), study.figures.len());
    assert!(study.figures.len() >= 5);
    assert!(html.contains("SLO"));
    assert!(!html.contains("http://") || html.contains("xmlns=\"http://www.w3.org/2000/svg\""));
    let md = std::fs::read_to_string(&files.summary_md).unwrap();
    assert!(md.contains("| hybrid | spin | 0 / 12 |"), "{md}");

    browser_check(&files.html, study.figures.len(), "colocation");
}

#[test]
fn interference_heatmap_is_coloured_like_heracles_fig1() {
    let tmp = tempfile::tempdir().unwrap();
    fixture::write_sweep(
        tmp.path(),
        Experiment::Interference,
        &["alone", "llc-0.25", "dram", "spin-os"],
        &[0.1, 0.5, 0.9],
    )
    .unwrap();
    let files = study::report(tmp.path()).unwrap();
    let heat: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("figures/interference-heatmap.json")).unwrap(),
    )
    .unwrap();
    let rows = heat["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    // Every numeric cell's shade follows ≤100 ok, 100–120 warn, >120 bad.
    for row in rows {
        for cell in row.as_array().unwrap().iter().skip(1) {
            let v = cell["value"].as_f64().unwrap();
            let want = if v <= 100.0 {
                "Ok"
            } else if v <= 120.0 {
                "Warn"
            } else {
                "Bad"
            };
            assert_eq!(cell["shade"], want, "cell {cell}");
        }
    }
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("class=\"ok\""));
    assert!(html.contains("class=\"bad\""));
    assert_eq!(html.matches("<svg").count(), 2);
    // The worst antagonist's curve is drawn next to LC alone.
    let worst: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("figures/interference-worst.json")).unwrap(),
    )
    .unwrap();
    let names: Vec<&str> = worst["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alone", "spin-os"]);
    browser_check(&files.html, 2, "interference");
}

#[test]
fn every_sweep_experiment_renders() {
    for exp in Experiment::ALL {
        if exp == Experiment::Colocation {
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        fixture::write_sweep(tmp.path(), exp, &["alone", "hybrid", "none"], &[0.25, 0.75]).unwrap();
        let files = study::report(tmp.path()).unwrap();
        let html = std::fs::read_to_string(&files.html).unwrap();
        assert!(html.matches("<svg").count() >= 1, "{}", exp.name());
        let s: headroom_types::summary::Summary =
            serde_json::from_str(&std::fs::read_to_string(&files.summary_json).unwrap()).unwrap();
        assert_eq!(s.experiment, exp.name());
        assert_eq!(s.runs.len(), 3);
        assert!(files.data.iter().all(|p| p.is_file()));
    }
}

fn browser_check(html: &std::path::Path, figures: usize, what: &str) {
    let Some(chromium) = browser::find_chromium() else {
        eprintln!(
            "SKIP chromium check ({what}): chromium is not installed (apt-get install chromium)"
        );
        return;
    };
    let dom = browser::dump_dom(&chromium, html).unwrap();
    let check = browser::check_dom(&dom);
    assert!(
        check.has_title,
        "the page did not load: {}",
        &dom[..dom.len().min(400)]
    );
    assert_eq!(check.svg_count, figures, "every plot is in the DOM");
    assert_eq!(check.figure_count, figures);
}
