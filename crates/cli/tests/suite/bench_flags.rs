//! Every `headroom bench NAME` parses its flags with clap: bad values and unknown flags exit 2
//! naming the flag, and `--help` lists them.

use std::process::Command;

fn bench(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run headroom");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn bench_host_refuses_bad_values_naming_the_flag() {
    let (code, text) = bench(&["host", "--reads", "0"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--reads"), "{text}");
    let (code, text) = bench(&["host", "--poll-hz", "1e6"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--poll-hz") && text.contains("100000"),
        "{text}"
    );
    let (code, text) = bench(&["host", "--bogus"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--bogus"), "{text}");
}

#[test]
fn bench_experiment_flags_are_clap_parsed() {
    let (code, text) = bench(&["colocation", "--minutes", "abc"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--minutes"), "{text}");
    let (code, text) = bench(&["host", "--help"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("--poll-seconds"), "{text}");
}

#[test]
fn bench_prober_refuses_bad_values_naming_the_flag() {
    let (code, text) = bench(&["prober", "--seconds", "1"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--seconds") && text.contains("5..=3600"),
        "{text}"
    );
    let (code, text) = bench(&["prober", "--probe-hz", "50000"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--probe-hz"), "{text}");
    let (code, text) = bench(&["prober", "--cases", "hog,bogus"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--cases") && text.contains("bogus"), "{text}");
    let (code, text) = bench(&["prober", "--help"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("--qps") && text.contains("no-hog"), "{text}");
}

#[test]
fn every_bad_experiment_value_is_named_at_once_and_each_is_bounded() {
    // 1e300 minutes overflowed the trace's durations; inf passed "positive".
    for (flag, value) in [
        ("--minutes", "1e300"),
        ("--minutes", "inf"),
        ("--duration", "1e300"),
        ("--slo-us", "inf"),
        ("--peak-qps", "1e300"),
    ] {
        let (code, text) = bench(&["colocation", flag, value, "--dry-run"]);
        assert_eq!(code, 2, "{flag} {value}: {text}");
        assert!(text.contains(flag), "{flag} {value}: {text}");
    }
    let (code, text) = bench(&[
        "colocation",
        "--minutes",
        "0",
        "--repeats",
        "0",
        "--percentile",
        "100",
        "--server-cpus",
        "x",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("4 problems: "), "{text}");
    for flag in ["--minutes", "--repeats", "--percentile", "--server-cpus"] {
        assert!(text.contains(flag), "{flag} missing: {text}");
    }
}

#[test]
fn the_demo_refuses_bad_values_before_it_starts_naming_each() {
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "demo",
            "--minutes",
            "1e300",
            "--window",
            "1",
            "--be",
            "bogus",
            "--out",
        ])
        .arg(std::env::temp_dir().join("headroom-demo-refused-never-made"))
        .output()
        .expect("run headroom");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("3 problems: "), "{text}");
    for flag in ["--minutes", "--window", "--be"] {
        assert!(text.contains(flag), "{flag} missing: {text}");
    }
    // Nothing was started: not a line of the demo's own.
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let (code, text) = {
        let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(["demo", "--minutes", "1", "--window", "100"])
            .output()
            .expect("run headroom");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("--window 100") && text.contains("not one window"),
        "{text}"
    );
}
