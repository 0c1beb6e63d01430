//! `headroom doctor` end to end: the JSON has the contract's keys (docs/architecture.md), the table prints, a fake root is
//! probed without touching the machine, and a bad --root is a usage error (exit 2).

use std::process::Command;

fn headroom() -> Command {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
}

const MECHANISMS: [&str; 13] = [
    "cpuset",
    "cpu_weight",
    "cpu_idle",
    "cpu_quota",
    "freeze",
    "memory",
    "io",
    "sched_attr",
    "resctrl_l3",
    "resctrl_mba",
    "rapl",
    "cpufreq",
    "tc_htb",
];

#[test]
fn doctor_json_has_every_contract_key() {
    let out = headroom().args(["doctor", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "kernel",
        "cgroup_mode",
        "root",
        "cpus",
        "smt",
        "llc_bytes",
        "numa_nodes",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert!(["v1", "v2", "hybrid", "none"].contains(&json["cgroup_mode"].as_str().unwrap()));
    for key in MECHANISMS {
        let m = &json["mechanisms"][key];
        assert!(m["available"].is_boolean(), "{key}: {m}");
        if m["available"] == false {
            assert!(m["reason"].is_string(), "{key} has no reason");
        }
    }
    for key in ["proc_stat", "schedstat", "psi", "resctrl_mon"] {
        assert!(json["sensors"][key]["available"].is_boolean(), "{key}");
    }
}

#[test]
fn doctor_prints_a_table() {
    let out = headroom().arg("doctor").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "kernel",
        "cgroups",
        "mechanisms",
        "sensors",
        "cpu_quota",
        "proc_stat",
    ] {
        assert!(text.contains(needle), "{needle} missing in:\n{text}");
    }
}

#[test]
fn doctor_probes_a_fake_root_and_explains_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let w = |rel: &str, content: &str| {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    };
    w(
        "proc/self/mountinfo",
        "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
    );
    w("sys/fs/cgroup/cpu/cgroup.procs", "");
    w("sys/devices/system/cpu/online", "0-3\n");
    w("proc/sys/kernel/osrelease", "6.99.0-fake\n");
    w("proc/stat", "cpu  1 0 1 1\ncpu0 1 0 1 1\n");
    let out = headroom()
        .args(["doctor", "--json", "--root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["kernel"], "6.99.0-fake");
    assert_eq!(json["cgroup_mode"], "v1");
    assert_eq!(json["cpus"], 4);
    let memory = json["mechanisms"]["memory"]["reason"].as_str().unwrap();
    assert!(memory.contains("no v1 memory hierarchy"), "{memory}");
    let rapl = json["mechanisms"]["rapl"]["reason"].as_str().unwrap();
    assert!(rapl.contains("powercap"), "{rapl}");
    let leftovers: Vec<String> = std::fs::read_dir(dir.path().join("sys/fs/cgroup/cpu"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("headroom-doctor-"))
        .collect();
    assert!(leftovers.is_empty(), "doctor left {leftovers:?}");
}

#[test]
fn a_bad_root_is_a_usage_error() {
    let out = headroom()
        .args(["doctor", "--root", "/does/not/exist"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/does/not/exist"));
}
