//! The Kubernetes side's lows of the tenth and eleventh hostile passes (issue 42,
//! docs/safety-hostile-pass-10-kube.md and -11-kube.md, "Found, not fixed"), against hostile
//! servers on 127.0.0.1 (each sends a bounded amount for a bounded time):
//!
//! - pod names and annotation values went into log lines and `ctl status` as the server gave
//!   them (newlines, terminal escapes): now escaped where they enter;
//! - the advertise floor kept every bound pod the server sent, no cap: now at most
//!   `MAX_BOUND_PODS`, and past it the floor fails (never lowered) rather than being cut;
//! - a `302` was said as "Error deserializing response: EOF while parsing a value": now as a
//!   redirect, with its status and Location, not followed;
//! - a list of few but deep items (one pod with a million annotations) passed the byte cap and
//!   parsed to hundreds of MB: now its JSON strings are capped.

use crate::list;

use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use headroom_hostile_server::{
    answer_json, chunk, hold, kubeconfig, read_request, serve, start_chunked, wait, Server,
};
use headroom_kube::pod::verdict;
use headroom_kube::publish::{PublishOptions, Publisher};
use headroom_kube::stand_in::{pod, with_be_cpu};
use headroom_kube::{Floor, KubeletLayout, PodFacts, Verdict, SLO_P99_US};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const NODE: &str = "node-a";

fn no_control(text: &str) -> bool {
    !text.chars().any(|c| c.is_control() || c == '\u{202e}')
}

#[test]
fn api_strings_with_newlines_or_terminal_escapes_are_escaped_before_logs_and_status() {
    let name = "web-0\n2026-11-30T00:00:00Z INFO kubernetes: forged\u{1b}[2J\u{202e}";
    let value = "fast\r\n\u{1b}]0;title\u{7}";
    let p: Pod = serde_json::from_value(pod(
        name,
        "uid-1",
        NODE,
        "Running",
        "Burstable",
        json!({ SLO_P99_US: value }),
        1,
    ))
    .unwrap();
    let facts = PodFacts::from_pod(&p);
    assert!(no_control(&facts.key()), "{:?}", facts.key());
    let Verdict::Refused(r) = verdict(&facts, NODE, Some(KubeletLayout::Cgroupfs)) else {
        panic!("a bad SLO is refused");
    };
    // The code before: the pod and the value as given (a newline, ESC).
    assert!(no_control(&r.pod), "{:?}", r.pod);
    assert!(no_control(&r.value), "{:?}", r.value);
    assert!(no_control(&r.to_string()), "{r}");
    assert!(
        r.pod.contains("web-0\\n2026"),
        "escaped, not dropped: {}",
        r.pod
    );
    // Two names that differ stay different (a backslash is escaped too).
    let other: Pod = serde_json::from_value(pod(
        "web-0\\n2026-11-30T00:00:00Z INFO kubernetes: forged\\u{1b}[2J\\u{202e}",
        "uid-2",
        NODE,
        "Running",
        "Burstable",
        json!({}),
        1,
    ))
    .unwrap();
    assert_ne!(PodFacts::from_pod(&other).key(), facts.key());
    // The floor's refusal: pod and container names.
    let mut bad = with_be_cpu(
        pod(name, "uid-3", NODE, "Running", "Burstable", json!({}), 1),
        "1.5",
    );
    bad["spec"]["containers"][0]["name"] = json!("c\n\u{1b}[31m");
    let bad: Pod = serde_json::from_value(bad).unwrap();
    let mut floor = Floor::of_node(NODE);
    let err = floor.apply(&bad).expect("a fraction is refused");
    assert!(no_control(&err.to_string()), "{err}");
}

/// `n` bound pods of the node, each requesting `be_cpu` milli-CPUs, named `<prefix>-<i>`.
fn bound(prefix: &str, n: usize, be_cpu: &str) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| {
            let name = format!("{prefix}-{i}");
            with_be_cpu(
                pod(&name, &name, NODE, "Running", "Burstable", json!({}), 1),
                be_cpu,
            )
        })
        .collect()
}

#[test]
fn a_floor_past_its_pod_cap_fails_and_is_never_lowered() {
    let cap = headroom_kube::floor::MAX_BOUND_PODS;
    let mut floor = Floor::of_node(NODE);
    for p in bound("a", cap, "2") {
        floor.apply(&serde_json::from_value(p).unwrap());
    }
    assert_eq!(floor.millicpu(), 2 * cap as u64);
    assert_eq!(floor.over_cap(), 0);
    for p in bound("b", 10, "2") {
        floor.apply(&serde_json::from_value(p).unwrap());
    }
    // The code before kept them all (no cap).
    assert_eq!(floor.pods().len(), cap, "no pod past the cap is kept");
    assert_eq!(floor.over_cap(), 10, "the floor knows it lacks pods");
    // A kept pod still changes in place; a new list clears the failure.
    floor.reset();
    assert_eq!(floor.over_cap(), 0);
}

/// Serves a list of `listed` (a PodList), then a watch that streams `watched` as ADDED events
/// and stays open (until the server is dropped, 30 s at most).
fn serve_floor(listed: Vec<serde_json::Value>, watched: Vec<serde_json::Value>) -> Server {
    let list = json!({"apiVersion": "v1", "kind": "PodList",
                      "metadata": {"resourceVersion": "1"}, "items": listed})
    .to_string();
    let lines: Vec<String> = watched
        .into_iter()
        .map(|p| json!({"type": "ADDED", "object": p}).to_string() + "\n")
        .collect();
    serve(64, (), move |conn: TcpStream, stop: &AtomicBool, _| {
        let mut r = BufReader::new(conn.try_clone().unwrap());
        let mut w = conn;
        for _ in 0..100 {
            let Some(req) = read_request(&mut r) else {
                return;
            };
            if req.line.starts_with("PATCH") {
                let _ = answer_json(&mut w, "500 Hostile", "{}");
                continue;
            }
            if !req.line.contains("watch=true") {
                if answer_json(&mut w, "200 OK", &list).is_err() {
                    return;
                }
                continue;
            }
            if start_chunked(&mut w).is_err() {
                return;
            }
            for batch in lines.chunks(100) {
                if chunk(&mut w, &batch.concat()).is_err() {
                    return;
                }
            }
            hold(stop, Duration::from_secs(30));
            return;
        }
    })
}

#[test]
fn a_watch_streaming_more_bound_pods_than_the_cap_fails_the_floor_without_lowering_it() {
    let cap = headroom_kube::floor::MAX_BOUND_PODS;
    // 10 pods of 1000 m listed: the floor 10 000 m. Then more new pods of 1 m than the cap.
    let server = serve_floor(bound("listed", 10, "1000"), bound("flood", cap + 100, "1"));
    let dir = tempfile::tempdir().unwrap();
    let mut opts = PublishOptions::new(NODE);
    opts.kubeconfig = Some(kubeconfig(dir.path(), server.port));
    let publisher = Publisher::start(opts).expect("the publisher starts");
    let failed = wait(Duration::from_secs(30), || {
        publisher.state().floor_over_cap > 0
    });
    let s = publisher.state();
    assert!(failed, "the floor says it is past its cap: {s:?}");
    assert!(s.floor_synced);
    // Never lower than the whole list's floor; the kept pods' sums raise it (10 000 + the
    // flood pods kept, 1 m each).
    assert_eq!(s.floor_millicpu, 10_000 + (cap as u64 - 10));
    // The copy in the state is the last whole list's, not a growing one.
    assert!(
        s.bound_pods.len() <= cap,
        "{} pods copied",
        s.bound_pods.len()
    );
}

#[test]
fn a_redirect_is_said_as_one_with_its_status_and_location() {
    let server = serve(16, (), |conn: TcpStream, _: &AtomicBool, _| {
        let mut r = BufReader::new(conn.try_clone().unwrap());
        let mut w = conn;
        if read_request(&mut r).is_some() {
            let head = "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/elsewhere\r\nContent-Length: 0\r\n\r\n";
            let _ = std::io::Write::write_all(&mut w, head.as_bytes());
        }
    });
    let err = list::once(server.port).expect_err("a redirect is not followed");
    // The code before: "Error deserializing response: EOF while parsing a value".
    assert!(err.contains("302"), "{err}");
    assert!(err.contains("http://127.0.0.1:9/elsewhere"), "{err}");
    assert!(err.contains("not followed"), "{err}");
}

#[test]
fn a_list_of_one_pod_with_a_million_annotations_is_cut_naming_the_strings_cap() {
    // One pod, 1.2 million distinct annotations: ~17 MB of JSON (within the 64 MiB byte cap,
    // one item), ~2.4 million strings once parsed.
    let mut body = String::from(
        r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"namespace":"shop","name":"deep","uid":"u","resourceVersion":"1","annotations":{"#,
    );
    for i in 0..1_200_000u32 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!("\"k{i}\":\"v\""));
    }
    body.push_str(r#"}},"spec":{"nodeName":"node-a","containers":[]}}]}"#);
    let body = std::sync::Arc::new(body);
    let server = serve(4, (), move |conn: TcpStream, _: &AtomicBool, _| {
        let mut r = BufReader::new(conn.try_clone().unwrap());
        let mut w = conn;
        if read_request(&mut r).is_some() {
            let _ = answer_json(&mut w, "200 OK", &body);
        }
    });
    let err = list::once(server.port).expect_err("a list this deep is cut");
    // The code before: Ok(1), the pod parsed whole.
    assert!(
        err.contains("JSON strings"),
        "the error names the cap: {err}"
    );
}
