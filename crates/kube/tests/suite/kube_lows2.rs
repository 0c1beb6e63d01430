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
use headroom_kube::Floor;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const NODE: &str = "node-a";

fn bound(name: &str, uid: Option<&str>, be_cpu: &str) -> Pod {
    let mut p = with_be_cpu(
        pod(
            name,
            uid.unwrap_or(""),
            NODE,
            "Running",
            "BestEffort",
            json!({}),
            1,
        ),
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

/// The advertise warning said "the node keeps headroom.io/be-cpu Some(0)" (Rust debug text),
/// even after a 404 (a deleted Node keeps nothing).
#[test]
fn the_advertise_warning_says_what_the_node_keeps_in_units_or_that_it_is_gone() {
    use headroom_kube::publish::kept_text;
    let kept = kept_text(NODE, Some(700), Some(2 << 30), false);
    assert!(!kept.contains("Some("), "{kept}");
    assert!(
        kept.contains("700m") && kept.contains("2147483648 bytes"),
        "{kept}"
    );
    let none = kept_text(NODE, None, None, false);
    assert!(!none.contains("None") && none.contains("nothing"), "{none}");
    let gone = kept_text(NODE, Some(0), None, true);
    assert!(!gone.contains("Some(") && !gone.contains("keeps"), "{gone}");
    assert!(gone.contains("not there") && gone.contains(NODE), "{gone}");
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
    assert!(text.contains("the patch of Node node-a's status"), "{text}");
    assert!(!text.contains("list answer"), "{text}");
}

/// A watch ERROR event whose object is no Status parses to an empty one, said before as
/// "error returned by apiserver during watch: :".
#[test]
fn a_watch_error_event_without_a_status_says_what_came() {
    use headroom_kube::watch::watch_error_text;
    use kube::runtime::watcher;
    let empty = watcher::Error::WatchError(Box::default());
    let text = watch_error_text(&empty);
    assert!(!text.ends_with(": :"), "{text}");
    assert!(text.contains("without a Status"), "{text}");
    let coded = watcher::Error::WatchError(Box::new(kube::core::Status {
        code: 500,
        ..Default::default()
    }));
    assert!(watch_error_text(&coded).contains("code 500"));
    let said = watcher::Error::WatchError(Box::new(kube::core::Status {
        code: 500,
        message: "etcd down".into(),
        reason: "InternalError".into(),
        ..Default::default()
    }));
    assert!(watch_error_text(&said).contains("etcd down: InternalError"));
}

/// A refused TLS connection was said as "client error (Connect)" alone: its reason is a source
/// of the error. Here the server does not speak TLS (a plain HTTP server behind an `https://`
/// kubeconfig); an unknown issuer is a source the same way.
#[test]
fn a_refused_tls_connection_says_its_reason() {
    use headroom_kube::watch::error_text;
    let server = serve(4, (), |conn: TcpStream, stop: &AtomicBool, _| {
        let mut w = conn;
        let _ = std::io::Write::write_all(&mut w, b"HTTP/1.1 400 Bad Request\r\n\r\n");
        hold(stop, Duration::from_secs(5));
    });
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kubeconfig");
    std::fs::write(
        &config,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:{}\n\
             contexts:\n- name: t\n  context:\n    cluster: t\n    user: nobody\n\
             current-context: t\nusers:\n- name: nobody\n  user: {{}}\n",
            server.port
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt.block_on(async {
        let client = client_bounded(Some(&config), ApiBounds::default())
            .await
            .unwrap();
        let pods: Api<Pod> = Api::all(client);
        // a hang detector only
        tokio::time::timeout(Duration::from_secs(60), pods.list(&Default::default()))
            .await
            .expect("an answer")
            .expect_err("not TLS")
    });
    let text = error_text(&err);
    let shown = err.to_string();
    // The code before said `shown` alone ("... client error (Connect)").
    assert!(text.len() > shown.len() + 10, "{text}");
    assert!(
        ["corrupt", "InvalidContentType", "tls", "TLS"]
            .iter()
            .any(|r| text.contains(r)),
        "{text}"
    );
}
