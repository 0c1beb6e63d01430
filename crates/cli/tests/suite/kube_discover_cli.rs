//! `headroom kube-discover` against a stand-in API server on 127.0.0.1: it prints the node's LC
//! pods as one JSON line (`LcSetEvent`), refuses a bad annotation by pod, key and value, and
//! refuses bad flags with exit code 2.
#![cfg(feature = "kube")]

use headroom_kube::stand_in;

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
    ])
    .unwrap();
    let kubeconfig = server.kubeconfig(dir.path()).unwrap();
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
    // Too long for the clock: refused before the watch starts (it panicked at the deadline).
    let out = Command::new(BIN)
        .args(["kube-discover", "--node", "n", "--for-s", "1e300"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--for-s 1e300"));
}

/// `--socket`: after the set, the agent's advertisement (asked on its control socket, here a
/// stand-in answering one status) as a JSON line, and in words on stderr: the value, the floor,
/// the horizon's figures and the last change with its reason.
#[test]
fn with_the_agents_socket_it_prints_what_the_node_advertises_and_why() {
    use headroom_agent::publish::control::{self, Request};
    use headroom_types::advertise::{
        AdvertiseChange, AdvertiseEdgeStatus, AdvertiseLine, AdvertiseReason, AdvertiseStatus,
        Advertised, Advertisement, Change, Horizon, HorizonFigures, LcHealth, MemoryInput,
        Resource,
    };
    use headroom_types::control::{AgentStatus, Response};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let (rx, handle) = control::serve(&sock, stop.clone()).unwrap();
    let change = AdvertiseChange {
        t_ms: 61_000,
        from_millicpu: Some(500),
        to_millicpu: 1500,
        reason: AdvertiseReason::Slo,
        detail:
            "p10 of BE granted while every LC held its SLO over 600 s = 1700m, less margin 200m"
                .into(),
    };
    let advertise = AdvertiseStatus {
        advertisement: Some(Advertisement {
            value_millicpu: 1500,
            reason: AdvertiseReason::Slo,
            detail: change.detail.clone(),
            floor_millicpu: 500,
            target_millicpu: 1500,
            horizon: HorizonFigures {
                buckets: 60,
                troubled_buckets: 1,
                covered_s: 600.0,
                horizon_s: 3600.0,
                percentile: 10.0,
                percentile_millicpu: 1700,
                min_millicpu: 0,
                max_millicpu: 2000,
                margin_millicpu: 200,
            },
            last_change: Some(change),
        }),
        memory: Some(Advertised {
            resource: Resource::BeMemory,
            value: 6 << 30,
            reason: AdvertiseReason::Peak,
            detail: "the node's memory less the LC's and system's peak over 600 s leaves 6979321856 B (6.50 GiB), less margin 536870912 B (0.50 GiB)".into(),
            floor: 1 << 30,
            target: 6 << 30,
            horizon: Horizon {
                buckets: 60,
                covered_s: 600.0,
                horizon_s: 3600.0,
                percentile_value: 6979321856,
                min: 6979321856,
                max: 9 << 30,
                margin: 512 << 20,
                ..Horizon::default()
            },
            last_change: Some(Change {
                t_ms: 30_000,
                from: Some(1 << 30),
                to: 6 << 30,
                reason: AdvertiseReason::Peak,
                detail: "rose".into(),
            }),
        }),
        memory_input: Some(MemoryInput {
            room_bytes: 8 << 30,
            total_bytes: 16 << 30,
            lc_bytes: Some(5 << 30),
            health: LcHealth::Held,
            floor_bytes: 1 << 30,
        }),
        edge: AdvertiseEdgeStatus {
            floor_synced: true,
            floor_millicpu: 500,
            published_millicpu: Some(1500),
            floor_memory_bytes: 1 << 30,
            published_memory_bytes: Some(6 << 30),
            patches: 3,
            errors: 0,
            last_error: None,
        },
    };
    let want = advertise.clone();
    let agent = std::thread::spawn(move || {
        let (req, reply) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(matches!(req, Request::Status), "{req:?}");
        let mut r = Response::ok("status");
        r.status = Some(Box::new(AgentStatus {
            advertise: Some(advertise),
            ..AgentStatus::default()
        }));
        reply.send(r).unwrap();
    });
    let server = StandIn::listing(vec![pod(
        "cart-0",
        "aaaaaaaa-0000-0000-0000-000000000001",
        "Guaranteed",
        "500",
    )])
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
        .arg(server.kubeconfig(dir.path()).unwrap())
        .arg("--cgroup-root")
        .arg(dir.path().join("cgroup"))
        .arg("--socket")
        .arg(&sock)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout {stdout}\nstderr {stderr}");
    agent.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    handle.join().unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    let set: LcSetEvent = serde_json::from_str(lines[lines.len() - 2]).unwrap();
    assert!(set.set.synced);
    let last: AdvertiseLine = serde_json::from_str(lines[lines.len() - 1]).unwrap();
    assert_eq!(last.advertise, want);
    for said in [
        "advertise headroom.io/be-cpu: 1500m (slo: p10 of BE granted",
        "floor 500m",
        "horizon: 600 of 3600 s seen, 60 buckets (1 troubled): p10 1700m (min 0m, max 2000m), margin 200m",
        "last change: t=61000 ms 500m → 1500m (slo:",
        "API: published 1500m (3 patches, 0 errors)",
        "advertise headroom.io/be-memory: 6442450944 B (6.00 GiB) (peak: the node's memory less",
        "floor 1073741824 B (1.00 GiB) (bound pods' requests)",
        "node memory 17179869184 B (16.00 GiB), LC groups hold 5368709120 B (5.00 GiB)",
        "least room 6979321856 B (6.50 GiB)",
        "last change: t=30000 ms 1073741824 B (1.00 GiB) → 6442450944 B (6.00 GiB) (peak: rose)",
        "API: published 6442450944 B (6.00 GiB)",
    ] {
        assert!(stderr.contains(said), "{said:?} in:\n{stderr}");
    }
}
