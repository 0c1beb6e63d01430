//! `headroom kube-discover` against a stand-in API server on 127.0.0.1: it prints the node's LC
//! pods as one JSON line (`LcSetEvent`), refuses a bad annotation by pod, key and value, and
//! refuses bad flags with exit code 2.
#![cfg(feature = "kube")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use headroom_types::discovery::LcSetEvent;

const BIN: &str = env!("CARGO_BIN_EXE_headroom");

fn pod(name: &str, uid: &str, qos: &str, slo: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "shop", "name": name, "uid": uid, "resourceVersion": "3",
                     "annotations": {"headroom.io/slo-p99-us": slo}},
        "spec": {"nodeName": "node-a", "containers": []},
        "status": {"phase": "Running", "qosClass": qos}
    })
}

/// Answers the pod list with `items`, and holds each watch open and silent for a few seconds.
fn stand_in(items: serde_json::Value) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(8).flatten() {
            let items = items.clone();
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut len = 0;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; len];
                    let _ = r.read_exact(&mut body);
                    if line.contains("watch=true") {
                        let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
                        let _ = w.flush();
                        std::thread::sleep(Duration::from_secs(5));
                        let _ = write!(w, "0\r\n\r\n");
                        return;
                    }
                    let body = serde_json::json!({"apiVersion": "v1", "kind": "PodList",
                        "metadata": {"resourceVersion": "3"}, "items": items})
                    .to_string();
                    let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                }
            });
        }
    });
    port
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
    let port = stand_in(serde_json::json!([
        pod("cart-0", good, "Guaranteed", "500"),
        pod("slow-0", bad, "Burstable", "fast"),
    ]));
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: s\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: s\n  context:\n    cluster: s\n    user: u\ncurrent-context: s\nusers:\n- name: u\n  user: {{}}\n"
        ),
    )
    .unwrap();
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
