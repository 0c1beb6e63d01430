//! `headroom bench advertise`, short (30 s; the target's figure is the 5-minute run by hand):
//! memcached as a discovered LC at two loads, a BestEffort pod committed at 1500m, hybrid and
//! the stand-in API server. Checked: a row per sample with the columns, the summary and its
//! verdict printed, the JSON written, the advertised value never below the committed pod (the
//! floor: a property of the advertiser, not of timing), and the decision log's replay exact
//! (every advertised change recomputed). Root, writable cpu/cpuset cgroups, memcached and no
//! `kubepods` group needed (SKIP otherwise).
#![cfg(feature = "kube")]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use headroom_host::{Controller, LinuxHost};
use headroom_types::GroupPath;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_headroom");
const TEST: &str = "bench_advertise_prints_the_side_by_side_rows_and_its_verdict";

#[test]
fn bench_advertise_prints_the_side_by_side_rows_and_its_verdict() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIP {TEST}: not root");
    }
    let cgroups = match LinuxHost::system().cgroups() {
        Ok(c) if c.backend(Controller::Cpu).is_ok() && c.backend(Controller::Cpuset).is_ok() => c,
        _ => return eprintln!("SKIP {TEST}: no writable cpu/cpuset cgroups"),
    };
    if cgroups.exists(&GroupPath::new("kubepods").unwrap()) {
        return eprintln!("SKIP {TEST}: a kubepods group exists (not ours to touch)");
    }
    if Command::new("memcached").arg("-h").output().is_err() {
        return eprintln!("SKIP {TEST}: no memcached");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["bench", "advertise", "--out"])
        .arg(dir.path())
        .args([
            "--seconds",
            "30",
            "--sample-s",
            "5",
            "--damping-s",
            "10",
            "--horizon-s",
            "60",
            "--min-history-s",
            "4",
            "--settle-s",
            "5",
            "--peak-qps",
            "20000",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A hang detector, not a timing bound: 30 s of load, the agent's start and stop.
    let end = Instant::now() + Duration::from_secs(240);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            panic!("bench advertise did not finish within 240 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("granted_m") && stdout.contains("advertised_m"),
        "{stdout}"
    );
    assert!(stdout.contains("min advertised:"), "{stdout}");
    assert!(stdout.contains("targets:"), "{stdout}");
    let result: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("advertise.json")).unwrap())
            .unwrap();
    let rows = result["rows"].as_array().unwrap();
    assert!(rows.len() >= 2, "{result}");
    assert!(rows.iter().any(|r| r["phase"] == "20%"), "{result}");
    assert!(rows.iter().any(|r| r["phase"] == "80%"), "{result}");
    let min = result["summary"]["min_advertised_millicpu"]
        .as_u64()
        .unwrap();
    assert!(min >= 1500, "never below the committed pod: {result}");
    assert_eq!(result["replay"]["exact"], true, "{result}");
    // Everything the bench made is gone.
    assert!(!cgroups.exists(&GroupPath::new("kubepods").unwrap()));
}
