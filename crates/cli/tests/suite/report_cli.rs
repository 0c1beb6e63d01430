//! `headroom report DIR` on fixture data: re-renders without re-running, exit codes, and the page
//! in headless Chromium (`--check`) when it is installed.

use std::process::Command;

fn headroom() -> Command {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
}

#[test]
fn report_renders_a_fixture_directory() {
    let tmp = tempfile::tempdir().unwrap();
    headroom_bench::fixture::write_colocation(tmp.path()).unwrap();
    let mut cmd = headroom();
    cmd.arg("report").arg(tmp.path());
    let chromium = headroom_report::browser::find_chromium();
    if chromium.is_some() {
        cmd.arg("--check");
    } else {
        eprintln!("SKIP report --check: chromium is not installed (apt-get install chromium)");
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("report.html"), "{stdout}");
    for f in [
        "report.html",
        "summary.json",
        "summary.md",
        "figures/colocation-emu.csv",
    ] {
        assert!(tmp.path().join(f).is_file(), "{f} missing");
    }
    if chromium.is_some() {
        assert!(stdout.contains("page loaded: true, 5 plots"), "{stdout}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["experiment"], "colocation");
}

#[test]
fn report_of_a_directory_without_a_manifest_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = headroom().arg("report").arg(tmp.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a run directory"), "{err}");
    // A manifest whose figures are impossible is refused naming each (it was drawn).
    let manifest = headroom_report::model::Manifest {
        experiment: "colocation".into(),
        slo_us: -1e300,
        percentile: 1e300,
        peak_qps: Some(-5.0),
        ..Default::default()
    };
    std::fs::write(
        tmp.path().join("manifest.json"),
        serde_json::to_string(&manifest).unwrap(),
    )
    .unwrap();
    let out = headroom().arg("report").arg(tmp.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for says in ["slo_us = -1", "percentile = 1", "peak_qps = -5"] {
        assert!(err.contains(says), "{says}: {err}");
    }
}

#[test]
fn unknown_experiment_and_bad_flags_are_usage_errors() {
    let out = headroom()
        .args(["bench", "no-such-thing"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-thing"));
    let out = headroom()
        .args(["bench", "colocation", "--minutes", "-1"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = headroom()
        .args(["bench", "latency-vs-load", "--loads", "abc"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
