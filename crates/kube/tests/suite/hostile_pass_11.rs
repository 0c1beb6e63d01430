//! The eleventh hostile pass, Kubernetes side (issue 42, docs/safety-hostile-pass-11-kube.md):
//! what the `headroom` binary met against a hostile API server on 127.0.0.1, brought down to
//! the library where it lives.
//!
//! - the advertise floor summed the node's bound pods' requests with `+`: two pods whose
//!   `headroom.io/be-cpu` (or `be-memory`) requests summed past `u64::MAX` (a hostile server's
//!   pods; the API's parser takes `10E`) panicked the publisher's thread in a debug build and
//!   wrapped to a small floor in a release one (a floor below what bound pods hold);
//! - a list answer was bounded by its bytes only (64 MiB), but kube-rs parses a page into typed
//!   pods of a few kB each however short their JSON: 100 000 pods of ~400 bytes took the
//!   binary's RSS to hundreds of MB, and a 64 MiB answer of `{}` items would cost tens of GB.
//!   Now a list answer of more than `MAX_PODS` items is cut, naming the cap.

use crate::list;

use std::io::{BufReader, Write};

use headroom_hostile_server::{read_request, serve, Server};
use headroom_kube::{Floor, BE_CPU, BE_MEMORY};
use k8s_openapi::api::core::v1::Pod;

fn bound_pod(name: &str, node: &str, cpu: &str, memory: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}")},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "c",
                "image": "x",
                "resources": {
                    "requests": {BE_CPU: cpu, BE_MEMORY: memory},
                    "limits": {BE_CPU: cpu, BE_MEMORY: memory}
                }
            }]
        },
        "status": {"phase": "Running"}
    }))
    .expect("a pod")
}

#[test]
fn a_floor_whose_pods_request_more_than_u64_holds_saturates_rather_than_panics_or_wraps() {
    let node = "node-p11k";
    let mut floor = Floor::of_node(node);
    // 10E = 10^19 each: one fits a u64 (max ~1.8 * 10^19), two do not.
    for name in ["big-0", "big-1"] {
        let refused = floor.apply(&bound_pod(name, node, "10E", "10Ei"));
        assert!(refused.is_none(), "{name}: a whole count: {refused:?}");
    }
    floor.synced = true;
    // The code before: "attempt to add with overflow" here (a debug build), or a wrapped sum.
    let cpu = std::panic::catch_unwind(|| floor.millicpu());
    let memory = std::panic::catch_unwind(|| floor.memory_bytes());
    assert_eq!(
        cpu.ok(),
        Some(u64::MAX),
        "the be-cpu floor of two 10E requests: at least what either holds, never wrapped"
    );
    assert_eq!(
        memory.ok(),
        Some(u64::MAX),
        "the be-memory floor of two 10Ei requests: saturated"
    );
    // A plain floor still sums exactly.
    let mut small = Floor::of_node(node);
    small.apply(&bound_pod("a", node, "1500", "1Gi"));
    small.apply(&bound_pod("b", node, "2k", "1Gi"));
    assert_eq!(small.millicpu(), 3500);
    assert_eq!(small.memory_bytes(), 2 << 30);
}

/// Answers up to `conns` connections on 127.0.0.1, each with one PodList of `items` copies of
/// `item` (after reading the request's head).
fn serve_list(item: &'static str, items: usize, conns: usize) -> Server {
    let mut body = String::from(
        r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"1"},"items":["#,
    );
    for i in 0..items {
        if i > 0 {
            body.push(',');
        }
        body.push_str(item);
    }
    body.push_str("]}");
    serve(conns, (), move |conn, _, _| {
        let _ = read_request(&mut BufReader::new(conn.try_clone().unwrap()));
        let mut w = conn;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = w.write_all(head.as_bytes());
        let _ = w.write_all(body.as_bytes());
    })
}

#[test]
fn a_list_of_more_items_than_a_node_runs_is_cut_naming_the_cap() {
    // 20 000 empty pods: 60 kB of JSON, each a whole typed Pod once parsed (the code before
    // parsed them all: Ok(20000)).
    let server = serve_list("{}", 20_000, 1);
    let got = list::once(server.port);
    let err = got.expect_err("a list of 20 000 items is cut");
    assert!(
        err.contains("cap of 4096 items"),
        "the error names the items cap: {err}"
    );
    // A node's real list (500 pods, strings with braces and escaped quotes inside) passes.
    let pod = r#"{"metadata":{"namespace":"shop","name":"p","uid":"u","resourceVersion":"1","annotations":{"x":"{[\"}]"}},"spec":{"nodeName":"node-a","containers":[{"name":"c","image":"x","ports":[{"containerPort":80}]}]},"status":{"phase":"Running"}}"#;
    let server = serve_list(pod, 500, 1);
    assert_eq!(list::once(server.port), Ok(500));
    // 4096 exactly passes, 4097 does not.
    let server = serve_list("{}", 4096, 1);
    assert_eq!(list::once(server.port), Ok(4096));
    let server = serve_list("{}", 4097, 1);
    assert!(list::once(server.port).is_err());
}
