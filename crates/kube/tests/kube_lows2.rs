//! The Kubernetes side's lows of the twelfth hostile pass (issue 42,
//! docs/safety-hostile-pass-12.md, "Found, not fixed") and the previous kube helper's loose
//! ends, against hostile servers on 127.0.0.1 (each sends a bounded amount for a bounded time).

use headroom_kube::stand_in::{pod, with_be_cpu};
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
