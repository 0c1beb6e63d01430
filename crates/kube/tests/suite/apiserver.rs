//! The discovery against a stand-in API server on 127.0.0.1 (no cluster runs here): it answers
//! the pod list and watch endpoints of one node as kube-apiserver does (a PodList, then a chunked
//! stream of watch events), and the pods come, change, go, and one has a bad annotation. The
//! pod groups are directories of a temp cgroup root in kubelet's cgroupfs layout.

use headroom_kube::stand_in;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use headroom_kube::{Discovery, DiscoveryOptions};
use headroom_types::discovery::{LayoutChoice, LcChange, LcSet, LcSetEvent};
use serde_json::json;
use stand_in::{pod, StandIn};

const NODE: &str = "node-a";

/// The next event whose set satisfies `want` (events in between are checked by the caller's
/// later waits only through the set they lead to), within 20 s.
fn wait_for(
    rx: &mpsc::Receiver<LcSetEvent>,
    what: &str,
    seen: &mut Vec<LcChange>,
    want: impl Fn(&LcSet) -> bool,
) -> LcSet {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(ev) => {
                seen.extend(ev.changes.clone());
                if want(&ev.set) {
                    return ev.set;
                }
            }
            Err(e) => panic!("waiting for {what}: {e}; changes so far: {seen:#?}"),
        }
    }
}

fn names(s: &LcSet) -> Vec<&str> {
    s.lcs.iter().map(|l| l.name.as_str()).collect()
}

#[test]
fn pods_come_change_and_go_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let group = |rel: &str| root.join("cpu").join(rel);
    let (a, b, c, d) = (
        "aaaaaaaa-0000-0000-0000-000000000001",
        "bbbbbbbb-0000-0000-0000-000000000002",
        "cccccccc-0000-0000-0000-000000000003",
        "dddddddd-0000-0000-0000-000000000004",
    );
    for rel in [
        format!("kubepods/burstable/pod{a}"),
        format!("kubepods/burstable/pod{b}"),
        format!("kubepods/pod{c}"),
        "kubepods/besteffort".to_string(),
    ] {
        std::fs::create_dir_all(group(&rel)).unwrap();
    }
    let slo = |v: &str| json!({"headroom.io/slo-p99-us": v});
    let list = vec![
        pod(
            "cart-0",
            a,
            NODE,
            "Running",
            "Burstable",
            json!({"headroom.io/slo-p99-us": "500", "headroom.io/latency-port": "11211", "headroom.io/priority": "2"}),
            5,
        ),
        pod("slow-0", b, NODE, "Running", "Burstable", slo("fast"), 6),
        pod("search-0", c, NODE, "Pending", "Guaranteed", slo("300"), 7),
        pod(
            "batch-0",
            "eeeeeeee-0000-0000-0000-000000000005",
            NODE,
            "Running",
            "BestEffort",
            json!({}),
            8,
        ),
        // A pod of another node the server should not have sent: ignored all the same.
        pod(
            "elsewhere-0",
            "ffffffff-0000-0000-0000-000000000006",
            "node-b",
            "Running",
            "Burstable",
            slo("100"),
            9,
        ),
    ];
    let (push, events) = mpsc::channel();
    let server = StandIn::start(list, events).unwrap();
    // The server sends elsewhere-0 despite the field selector: the client's own check is tested.
    server
        .select_fields
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let kubeconfig = server.kubeconfig(dir.path()).unwrap();

    let (tx, rx) = mpsc::channel();
    let mut opts = DiscoveryOptions::new(NODE);
    opts.kubeconfig = Some(kubeconfig);
    opts.cgroup_root = root.clone();
    opts.layout = LayoutChoice::Auto;
    opts.recheck = Duration::from_millis(50);
    let discovery =
        Discovery::start(opts, Some(Box::new(move |ev| tx.send(ev).unwrap_or(())))).unwrap();
    let mut seen = Vec::new();

    // The first list: one LC, the bad pod refused with pod, key and value named.
    let set = wait_for(&rx, "the first list", &mut seen, |s| s.synced);
    assert_eq!(names(&set), ["shop/cart-0"]);
    let cart = &set.lcs[0];
    assert_eq!(cart.cgroup, format!("kubepods/burstable/pod{a}").as_str());
    assert_eq!((cart.target_us, cart.percentile), (500.0, 99.0));
    assert_eq!((cart.latency_port, cart.priority), (Some(11211), 2));
    assert_eq!(set.refused.len(), 1, "{:?}", set.refused);
    assert!(
        set.refused[0]
            .to_string()
            .starts_with("shop/slow-0: headroom.io/slo-p99-us = \"fast\": "),
        "{}",
        set.refused[0]
    );
    assert_eq!(set.refusals_total, 1);
    let reqs = server.requests.lock().unwrap().clone();
    assert!(
        reqs.iter()
            .all(|r| r.contains("fieldSelector=spec.nodeName%3Dnode-a")),
        "every request selects the node's pods: {reqs:?}"
    );

    // search-0 runs.
    push.send(json!({"type": "MODIFIED", "object": pod("search-0", c, NODE, "Running", "Guaranteed", slo("300"), 11)}))
        .unwrap();
    let set = wait_for(&rx, "search-0 running", &mut seen, |s| s.lcs.len() == 2);
    assert_eq!(names(&set), ["shop/cart-0", "shop/search-0"]);
    assert_eq!(
        set.get("shop/search-0").unwrap().cgroup,
        format!("kubepods/pod{c}").as_str()
    );

    // cart-0's SLO changes, then the pod is deleted.
    push.send(json!({"type": "MODIFIED", "object": pod("cart-0", a, NODE, "Running", "Burstable", slo("200"), 12)}))
        .unwrap();
    let set = wait_for(&rx, "cart-0's new SLO", &mut seen, |s| {
        s.get("shop/cart-0").is_some_and(|l| l.target_us == 200.0)
    });
    assert_eq!(set.get("shop/cart-0").unwrap().latency_port, None);
    push.send(json!({"type": "DELETED", "object": pod("cart-0", a, NODE, "Running", "Burstable", slo("200"), 13)}))
        .unwrap();
    let set = wait_for(&rx, "cart-0 gone", &mut seen, |s| {
        s.get("shop/cart-0").is_none()
    });
    assert_eq!(names(&set), ["shop/search-0"]);

    // The bad pod is fixed by its owner: no longer refused, an LC.
    push.send(json!({"type": "MODIFIED", "object": pod("slow-0", b, NODE, "Running", "Burstable", slo("800"), 14)}))
        .unwrap();
    let set = wait_for(&rx, "slow-0 fixed", &mut seen, |s| {
        s.get("shop/slow-0").is_some()
    });
    assert!(set.refused.is_empty());

    // A new pod whose group kubelet has not made yet waits, and becomes an LC when it appears.
    push.send(json!({"type": "ADDED", "object": pod("api-0", d, NODE, "Running", "Guaranteed", slo("1000"), 15)}))
        .unwrap();
    let set = wait_for(&rx, "api-0 waiting", &mut seen, |s| {
        s.waiting.iter().any(|w| w.pod == "shop/api-0")
    });
    assert!(set.get("shop/api-0").is_none());
    std::fs::create_dir_all(group(&format!("kubepods/pod{d}"))).unwrap();
    wait_for(&rx, "api-0's group", &mut seen, |s| {
        s.get("shop/api-0").is_some()
    });

    // search-0's group goes before the API says so: it is no longer an LC.
    std::fs::remove_dir(group(&format!("kubepods/pod{c}"))).unwrap();
    let set = wait_for(&rx, "search-0's group gone", &mut seen, |s| {
        s.get("shop/search-0").is_none()
    });
    assert_eq!(names(&set), ["shop/api-0", "shop/slow-0"]);

    assert_eq!(discovery.snapshot(), set);
    for want in ["shop/cart-0", "shop/search-0"] {
        assert!(seen
            .iter()
            .any(|c| matches!(c, LcChange::Removed { name } if name == want)));
    }
    assert!(!seen
        .iter()
        .any(|c| matches!(c, LcChange::Added { lc } if lc.name.contains("elsewhere") || lc.name.contains("batch"))));
    discovery.stop();
}

/// kube-apiserver ends a watch whose resourceVersion is too old with an ERROR event (a Status,
/// code 410 `Expired`); the client must list again and keep what it knew meanwhile. The server
/// here also applies the field selector, so a pod of another node never reaches the client.
#[test]
fn an_expired_watch_is_listed_again_and_the_lc_kept() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let a = "aaaaaaaa-0000-0000-0000-00000000000a";
    std::fs::create_dir_all(root.join("cpu").join(format!("kubepods/burstable/pod{a}"))).unwrap();
    std::fs::create_dir_all(root.join("cpu").join("kubepods/besteffort")).unwrap();
    let slo = json!({"headroom.io/slo-p99-us": "500"});
    let list = vec![
        pod("cart-0", a, NODE, "Running", "Burstable", slo.clone(), 5),
        pod(
            "elsewhere-0",
            "ffffffff-0000-0000-0000-00000000000f",
            "node-b",
            "Running",
            "Burstable",
            slo.clone(),
            6,
        ),
    ];
    let (push, events) = mpsc::channel();
    let server = StandIn::start(list, events).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut opts = DiscoveryOptions::new(NODE);
    opts.kubeconfig = Some(server.kubeconfig(dir.path()).unwrap());
    opts.cgroup_root = root.clone();
    opts.recheck = Duration::from_millis(50);
    let discovery =
        Discovery::start(opts, Some(Box::new(move |ev| tx.send(ev).unwrap_or(())))).unwrap();
    let mut seen = Vec::new();
    let set = wait_for(&rx, "the first list", &mut seen, |s| s.synced);
    assert_eq!(names(&set), ["shop/cart-0"]);

    let lists = |server: &StandIn| {
        server
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.starts_with("/api/v1/pods") && !r.contains("watch=true"))
            .count()
    };
    let before = lists(&server);
    push.send(
        json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
        "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
        "message": "too old resource version: 10 (42)"}}),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while lists(&server) == before {
        assert!(
            Instant::now() < deadline,
            "no new list after the watch expired: {:?}",
            server.requests.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The new list has been asked for; a second on, it has been read: the set is whole, and the
    // LC never left it.
    let settled = Instant::now() + Duration::from_secs(1);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        while let Ok(ev) = rx.try_recv() {
            seen.extend(ev.changes.clone());
        }
        let snap = discovery.snapshot();
        if snap.synced && Instant::now() >= settled {
            assert_eq!(names(&snap), ["shop/cart-0"]);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the set never came back: {snap:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !seen
            .iter()
            .any(|c| matches!(c, LcChange::Removed { name } if name == "shop/cart-0")),
        "the LC was dropped across the re-list: {seen:#?}"
    );
    assert!(!seen
        .iter()
        .any(|c| matches!(c, LcChange::Added { lc } if lc.name.contains("elsewhere"))));
    discovery.stop();
}
