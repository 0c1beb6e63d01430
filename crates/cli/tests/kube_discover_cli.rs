//! `headroom kube-discover` against a stand-in API server on 127.0.0.1: it prints the node's LC
//! pods as one JSON line (`LcSetEvent`), refuses a bad annotation by pod, key and value, and
//! refuses bad flags with exit code 2.
#![cfg(feature = "kube")]

#[path = "../../kube/tests/support/stand_in.rs"]
mod stand_in;

use std::process::Command;

use headroom_types::discovery::LcSetEvent;
use stand_in::StandIn;

const BIN: &str = env!("CARGO_BIN_EXE_headroom");

fn pod(name: &str, uid: &str, qos: &str, slo: &str) -> serde_json::Value {
    let slo = serde_json::json!({"headroom.io/slo-p99-us": slo});
    stand_in::pod(name, uid, "node-a", "Running", qos, slo, 3)
}

#[test]
fn prints_the_nodes_lc_pods_as_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (good, bad) = (
        "aaaaaaaa-0000-0000-0000-000000000001",
        "bbbbbbbb-0000-0000-0000-000000000002",
    );
    let root = dir.path().join("cgroup");
    std::fs::create_dir_all(root.join(format!(
        "kubepods.slice/kubepods-pod{}.slice",
        good.replace('-', "_")
    )))
    .unwrap();
    let server = StandIn::listing(vec![
        pod("cart-0", good, "Guaranteed", "500"),
        pod("slow-0", bad, "Burstable", "fast"),
    ]);
    let kubeconfig = server.kubeconfig(dir.path());
    let out = Command::new(BIN)
        .args([
            "kube-discover",
            "--node",
            "node-a",
            "--once",
            "--for-s",
            "20",
        ])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cgroup-root")
        .arg(&root)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout {stdout}\nstderr {stderr}");
    let last: LcSetEvent = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert!(last.set.synced);
    let names: Vec<&str> = last.set.lcs.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["shop/cart-0"]);
    assert_eq!(
        last.set.lcs[0].cgroup,
        "kubepods.slice/kubepods-podaaaaaaaa_0000_0000_0000_000000000001.slice"
    );
    assert_eq!(last.set.refused[0].pod, "shop/slow-0");
    assert!(
        stderr.contains("shop/slow-0: headroom.io/slo-p99-us = \"fast\""),
        "the refusal is logged: {stderr}"
    );
}

#[test]
fn bad_flags_are_usage_errors() {
    let out = Command::new(BIN)
        .args(["kube-discover", "--node", "n", "--layout", "cgroupv3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cgroupv3"));
    let out = Command::new(BIN)
        .arg("kube-discover")
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NODE_NAME"));
}
