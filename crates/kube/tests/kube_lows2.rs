//! The Kubernetes side's lows of the twelfth hostile pass (issue 42,
//! docs/safety-hostile-pass-12.md, "Found, not fixed") and the previous kube helper's loose
//! ends, against hostile servers on 127.0.0.1 (each sends a bounded amount for a bounded time).

use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use headroom_hostile_server::{error_chain, hold, kubeconfig, read_request, serve};
use headroom_kube::stand_in::{pod, with_be_cpu};
use headroom_kube::watch::{client_bounded, ApiBounds};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use headroom_kube::Floor;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

const NODE: &str = "node-a";

fn bound(name: &str, uid: Option<&str>, be_cpu: &str) -> Pod {
    let mut p = with_be_cpu(
        pod(name, uid.unwrap_or(""), NODE, "Running", "BestEffort", json!({}), 1),
        be_cpu,
    );
    if uid.is_none() {
        p["metadata"].as_object_mut().unwrap().remove("uid");
    }
    serde_json::from_value(p).unwrap()
}

/// Two distinct pods without `metadata.uid` (a broken or hostile server) shared one key before,
/// so the floor counted one of them: a floor too low, the unsafe direction.
#[test]
fn pods_without_uid_each_count_in_the_floor() {
    let mut floor = Floor::of_node(NODE);
    floor.apply(&bound("a", None, "300"));
    floor.apply(&bound("b", None, "400"));
    // An empty UID is no UID either.
    floor.apply(&bound("c", Some(""), "500"));
    assert_eq!(floor.millicpu(), 1200, "{:?}", floor.pods());
    // The same pod again (no UID) replaces itself, not counted twice.
    floor.apply(&bound("a", None, "300"));
    assert_eq!(floor.millicpu(), 1200, "{:?}", floor.pods());
    // Its delete removes it, and only it.
    floor.delete(&bound("b", None, "400"));
    assert_eq!(floor.millicpu(), 800, "{:?}", floor.pods());
    // Pods with UIDs are keyed by them as before: one UID, one pod.
    floor.apply(&bound("d", Some("uid-d"), "100"));
    floor.apply(&bound("d", Some("uid-d"), "200"));
    assert_eq!(floor.millicpu(), 1000, "{:?}", floor.pods());
}

/// A status patch that hangs is cut at the deadline of every request but a watch; the cut was
/// said as "did not finish a list answer".
#[test]
fn a_hanging_status_patch_is_said_as_the_patch_of_the_nodes_status() {
    let server = serve(4, (), |conn: TcpStream, stop: &AtomicBool, _| {
        let mut r = BufReader::new(conn.try_clone().unwrap());
        if read_request(&mut r).is_some() {
            hold(stop, Duration::from_secs(30));
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), server.port);
    let bounds = ApiBounds {
        list_deadline: Duration::from_secs(1),
        ..ApiBounds::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let text = rt.block_on(async {
        let client = client_bounded(Some(&config), bounds).await.unwrap();
        let nodes: Api<Node> = Api::all(client);
        let patch = Patch::Merge(json!({"status": {"capacity": {"headroom.io/be-cpu": "1"}}}));
        // a hang detector only
        let r = tokio::time::timeout(
            Duration::from_secs(60),
            nodes.patch_status(NODE, &PatchParams::default(), &patch),
        )
        .await
        .expect("the deadline cuts the patch");
        error_chain(&r.expect_err("a hanging patch fails"))
    });
    assert!(
        text.contains("the patch of Node node-a's status"),
        "{text}"
    );
    assert!(!text.contains("list answer"), "{text}");
}

