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
