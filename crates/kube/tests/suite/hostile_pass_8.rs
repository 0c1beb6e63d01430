//! The eighth hostile pass (issue 42, docs/safety-hostile-pass-8-kube.md): the discovery's and
//! the publisher's API client against hostile servers on 127.0.0.1. Each server sends a bounded
//! amount for a bounded time and stops when the test drops it.
//!
//! - a watch whose one event line never ends (no newline) was read into memory without end (the
//!   list answers were capped, the watch was not);
//! - a watch the server ends at once (200, empty body) was started again at once, without
//!   backoff and unsaid: a busy loop of requests;
//! - a status patch the server never answers held the publisher's whole loop (up to the 60 s
//!   request deadline, again at every retry): the floor's pod watch was not read meanwhile, so
//!   pods bound then did not raise the floor the agent computes its value with.

use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use headroom_hostile_server::{
    answer_json, chunk, error_chain, hold, kubeconfig, read_request, serve, start_chunked, wait,
    Server, EMPTY_POD_LIST,
};
use headroom_kube::publish::{PublishOptions, Publisher, Wanted};
use headroom_kube::stand_in::{pod, with_be_cpu};
use headroom_kube::watch::{client_bounded, ApiBounds};
use headroom_kube::{Discovery, DiscoveryOptions};
use headroom_types::discovery::LayoutChoice;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, WatchParams};

const NODE: &str = "node-a";

/// How a hostile server answers a watch (a list is always an empty `PodList`).
#[derive(Clone, Copy)]
enum Watch {
    /// One event line that never ends: `limit` bytes without a newline, then it closes.
    EndlessLine { limit: u64 },
    /// 200 with an empty body: the watch ends at once.
    EndsAtOnce,
}

#[derive(Default)]
struct Counts {
    /// Watch requests answered.
    watches: AtomicU64,
    /// Bytes of watch bodies the client took.
    sent: AtomicU64,
}

fn serve_watch(how: Watch) -> Server<Counts> {
    // bounded: a busy client makes at most this many connections before the server quits
    serve(200_000, Counts::default(), move |conn, stop, counts| {
        answer(conn, how, stop, counts)
    })
}

/// Answers the requests of one connection (keep-alive) until it closes.
fn answer(conn: TcpStream, how: Watch, stop: &AtomicBool, counts: &Counts) {
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    for _ in 0..100_000 {
        let Some(request) = read_request(&mut r) else {
            return;
        };
        if !request.line.contains("watch=true") {
            if answer_json(&mut w, "200 OK", EMPTY_POD_LIST).is_err() {
                return;
            }
            continue;
        }
        counts.watches.fetch_add(1, Ordering::SeqCst);
        match how {
            Watch::EndsAtOnce => {
                if answer_json(&mut w, "200 OK", "").is_err() {
                    return;
                }
            }
            Watch::EndlessLine { limit } => {
                if start_chunked(&mut w).is_err() {
                    return;
                }
                let mut data = String::from(r#"{"type":"ADDED","object":{"metadata":{"name":""#);
                while data.len() < 64 * 1024 {
                    data.push('a');
                }
                let mut total = 0u64;
                while total < limit && !stop.load(Ordering::SeqCst) {
                    if chunk(&mut w, &data).is_err() {
                        return; // the client cut it
                    }
                    total += data.len() as u64;
                    counts.sent.fetch_add(data.len() as u64, Ordering::SeqCst);
                    data = "a".repeat(64 * 1024);
                }
                let _ = std::io::Write::write_all(&mut w, b"0\r\n\r\n");
                return;
            }
        }
    }
}

#[test]
fn a_watch_event_line_that_never_ends_is_cut_at_the_cap_naming_it() {
    // 64 times the cap, then the server closes. Before, the client buffered the whole line
    // (a server that never closed grew it without end) and the stream then ended in silence.
    let cap = 1u64 << 20;
    let limit = 64 * cap;
    let server = serve_watch(Watch::EndlessLine { limit });
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), server.port);
    let bounds = ApiBounds {
        max_watch_line_bytes: cap,
        ..ApiBounds::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let got: Result<(), String> = rt.block_on(async {
        let client = client_bounded(Some(&config), bounds)
            .await
            .map_err(|e| e.to_string())?;
        let api: Api<Pod> = Api::all(client);
        let mut stream = api
            .watch(&WatchParams::default(), "0")
            .await
            .map_err(|e| error_chain(&e))?
            .boxed();
        // a hang guard far past what reading 64 MiB on loopback takes
        match tokio::time::timeout(Duration::from_secs(60), stream.next()).await {
            Ok(Some(Err(e))) => Err(error_chain(&e)),
            Ok(Some(Ok(ev))) => Err(format!("an event from an endless line: {ev:?}")),
            Ok(None) => Ok(()),
            Err(_) => Err("no end within 60 s".into()),
        }
    });
    let sent = server.counts.sent.load(Ordering::SeqCst);
    let err = got.expect_err("an endless watch line is an error, not a quiet end");
    assert!(
        err.contains(&format!("cap of {cap} bytes")),
        "the error names the cap: {err}"
    );
    assert!(
        sent < limit,
        "the client cut the line: it took {sent} of {limit} bytes"
    );
}

#[test]
fn a_watch_the_server_ends_at_once_is_not_started_again_in_a_busy_loop() {
    let server = serve_watch(Watch::EndsAtOnce);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = DiscoveryOptions::new(NODE);
    opts.kubeconfig = Some(kubeconfig(dir.path(), server.port));
    opts.cgroup_root = dir.path().join("cgroup");
    opts.layout = LayoutChoice::Cgroupfs;
    let discovery = Discovery::start(opts, None).expect("the discovery starts");
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let synced = discovery.snapshot().synced;
    discovery.stop();
    let took = t.elapsed();
    let watches = server.counts.watches.load(Ordering::SeqCst);
    assert!(synced, "the empty list arrived: the set is synced");
    // Paced, about one a second; before, thousands in 3 s (one CPU busy with requests).
    assert!(
        watches <= 2 * took.as_secs() + 4,
        "{watches} watches in {took:?}: a busy loop"
    );
}

/// How the server answers `PATCH nodes/<n>/status`.
#[derive(Clone)]
enum PatchAnswer {
    /// Never (20 s at most, then a 500).
    Hangs,
    /// With these status codes in turn, round and round.
    Codes(Vec<u16>),
}

/// A server whose pod list is empty, whose watch streams the lines sent on `events`, and whose
/// `PATCH nodes/<n>/status` is answered as `how` says; it counts the patches.
fn serve_patch(events: mpsc::Receiver<String>, how: PatchAnswer) -> Server<AtomicU64> {
    let events = Mutex::new(events);
    serve(64, AtomicU64::new(0), move |conn, stop, patches| {
        answer_patch(conn, stop, patches, &events, &how)
    })
}

fn answer_patch(
    conn: TcpStream,
    stop: &AtomicBool,
    patches: &AtomicU64,
    events: &Mutex<mpsc::Receiver<String>>,
    how: &PatchAnswer,
) {
    let mut r = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    for _ in 0..1000 {
        let Some(request) = read_request(&mut r) else {
            return;
        };
        if request.line.starts_with("PATCH") {
            let n = patches.fetch_add(1, Ordering::SeqCst);
            let code = match how {
                PatchAnswer::Hangs => {
                    hold(stop, Duration::from_secs(20));
                    500
                }
                PatchAnswer::Codes(codes) => codes[n as usize % codes.len()],
            };
            let body = format!(
                r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"hostile {code}","code":{code}}}"#
            );
            let _ = answer_json(&mut w, &format!("{code} Hostile"), &body);
            continue;
        }
        if !request.line.contains("watch=true") {
            if answer_json(&mut w, "200 OK", EMPTY_POD_LIST).is_err() {
                return;
            }
            continue;
        }
        if start_chunked(&mut w).is_err() {
            return;
        }
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end && !stop.load(Ordering::SeqCst) {
            let next = events
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_millis(50));
            if let Ok(line) = next {
                if chunk(&mut w, &format!("{line}\n")).is_err() {
                    return;
                }
            }
        }
        let _ = std::io::Write::write_all(&mut w, b"0\r\n\r\n");
        return;
    }
}

#[test]
fn a_status_patch_the_server_never_answers_does_not_stop_the_floor() {
    let (tx, rx) = mpsc::channel();
    let server = serve_patch(rx, PatchAnswer::Hangs);
    let dir = tempfile::tempdir().unwrap();
    let mut opts = PublishOptions::new(NODE);
    opts.kubeconfig = Some(kubeconfig(dir.path(), server.port));
    let publisher = Publisher::start(opts).expect("the publisher starts");
    let synced = wait(Duration::from_secs(10), || publisher.state().floor_synced);
    assert!(
        synced,
        "the first pod list arrived: {:?}",
        publisher.state()
    );
    publisher.set_both(Wanted {
        millicpu: 4000,
        memory_bytes: None,
    });
    let asked = wait(Duration::from_secs(10), || {
        server.counts.load(Ordering::SeqCst) > 0
    });
    assert!(asked, "the patch was sent");
    // While the patch hangs, the scheduler binds a pod requesting 1500m of be-cpu.
    let bound = with_be_cpu(
        pod(
            "batch-0",
            "bbbbbbbb-0000-4000-8000-000000000001",
            NODE,
            "Running",
            "BestEffort",
            serde_json::json!({}),
            2,
        ),
        "1500",
    );
    let event = serde_json::json!({"type": "ADDED", "object": bound});
    tx.send(event.to_string()).unwrap();
    // A hang guard well below the 60 s patch deadline the loop waited for before.
    let raised = wait(Duration::from_secs(8), || {
        publisher.floor_millicpu() == 1500
    });
    let state = publisher.state();
    drop(server);
    publisher.stop();
    assert!(
        raised,
        "the pod bound while the patch hung counts in the floor: {state:?}"
    );
}

#[test]
fn status_patch_errors_are_said_once_per_kind_and_nothing_is_published() {
    // 403 for a while, then 409, 429, 500 in turn: each kind said once when it begins.
    let mut codes = vec![403; 6];
    codes.extend([409, 429, 500]);
    let (_tx, rx) = mpsc::channel();
    let server = serve_patch(rx, PatchAnswer::Codes(codes.clone()));
    let dir = tempfile::tempdir().unwrap();
    let mut opts = PublishOptions::new(NODE);
    opts.kubeconfig = Some(kubeconfig(dir.path(), server.port));
    opts.retry = Duration::from_millis(20);
    opts.retry_max = Duration::from_millis(40);
    let publisher = Publisher::start(opts).expect("the publisher starts");
    publisher.set_both(Wanted {
        millicpu: 2000,
        memory_bytes: Some(1 << 30),
    });
    let tried = wait(Duration::from_secs(20), || publisher.state().errors >= 9);
    let state = publisher.state();
    let served = server.counts.load(Ordering::SeqCst);
    drop(server);
    publisher.stop();
    assert!(tried, "nine patches refused: {state:?}");
    assert_eq!(
        state.published_millicpu, None,
        "nothing accepted: {state:?}"
    );
    assert!(
        state.last_error.as_deref().is_some_and(|e| e.contains("(")),
        "the last error is kept, naming its code: {state:?}"
    );
    // At most one line per change of kind in what the server answered (403, then 409, 429,
    // 500, 403 again once the round starts over), never one per retry. (kube-rs retries a 429
    // itself, so the server may answer more patches than the publisher sees.)
    let kinds: Vec<u16> = (0..served as usize)
        .map(|i| codes[i % codes.len()])
        .collect();
    let changes = 1 + kinds.windows(2).filter(|w| w[0] != w[1]).count() as u64;
    assert!(
        state.errors_said >= 2 && state.errors_said <= changes,
        "{} errors said for {} refused patches (the server answered {kinds:?}): {state:?}",
        state.errors_said,
        state.errors
    );
}

/// Pods that appear, flip QoS class and annotations (extreme values among them) and go, 20 000
/// events, then settle: the set follows, each pod is refused or accepted on its own, nothing
/// panics, and what is kept is only the pods now on the node (pure: the discovery's state).
#[test]
fn pods_flapping_with_extreme_annotations_settle_to_the_right_set() {
    use headroom_kube::LATENCY_PORT;
    use headroom_kube::{Discoverer, KubeletLayout, PodEvent, PodFacts, PRIORITY, SLO_P99_US};
    let huge = "9".repeat(200_000);
    let slos = [
        "500",
        "1e308",
        "NaN",
        "inf",
        "-0",
        "0.5",
        "10000000.0000001",
        "1",
        "10000000",
        huge.as_str(),
        " 250 ",
        "",
    ];
    let ports = ["80", "65536", "-1", "0", " 8080 ", "http"];
    let priorities = ["2147483647", "-2147483648", "2147483648", "1.5", "7"];
    let qos = ["Guaranteed", "Burstable", "BestEffort", "", "Bogus"];
    let facts = |i: usize, name: usize| PodFacts {
        namespace: "shop".into(),
        name: format!("p{name}"),
        uid: format!("0a0a0a0a-0000-4000-8000-{name:012}"),
        node: if i.is_multiple_of(17) {
            "node-b".into()
        } else {
            NODE.into()
        },
        phase: if i.is_multiple_of(13) {
            "Pending".into()
        } else {
            "Running".into()
        },
        qos_class: qos[i % qos.len()].into(),
        annotations: [
            (SLO_P99_US.to_string(), slos[i % slos.len()].to_string()),
            (LATENCY_PORT.to_string(), ports[i % ports.len()].to_string()),
            (
                PRIORITY.to_string(),
                priorities[i % priorities.len()].to_string(),
            ),
        ]
        .into_iter()
        .collect(),
        container_ports: vec![(i % 65535) as u16 + 1],
    };
    let mut d = Discoverer::new(NODE);
    d.apply(PodEvent::Init);
    d.apply(PodEvent::InitDone);
    let layout = Some(KubeletLayout::Cgroupfs);
    let mut events = 0;
    for i in 0..20_000usize {
        let name = i % 50;
        if i.is_multiple_of(7) {
            d.apply(PodEvent::Delete(facts(i, name)));
        } else {
            d.apply(PodEvent::Apply(facts(i, name)));
        }
        if d.evaluate(layout, |_| true, i as u64).is_some() {
            events += 1;
        }
    }
    // Settle: every pod goes but one good one and one with a 200 kB SLO value.
    for name in 0..50 {
        d.apply(PodEvent::Delete(facts(0, name)));
    }
    let mut good = facts(1, 1);
    good.qos_class = "Burstable".into();
    good.annotations.insert(SLO_P99_US.into(), "500".into());
    good.annotations.insert(LATENCY_PORT.into(), "8080".into());
    good.annotations
        .insert(PRIORITY.into(), "-2147483648".into());
    good.node = NODE.into();
    good.phase = "Running".into();
    let mut bad = good.clone();
    bad.name = "p2".into();
    bad.uid = "0a0a0a0a-0000-4000-8000-000000000002".into();
    bad.annotations.insert(SLO_P99_US.into(), huge.clone());
    d.apply(PodEvent::Apply(good));
    d.apply(PodEvent::Apply(bad));
    let ev = d
        .evaluate(layout, |_| true, 30_000)
        .expect("the set changed");
    let set = ev.set;
    assert!(
        events > 100,
        "the set followed the flapping: {events} changes"
    );
    let names: Vec<&str> = set.lcs.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        names,
        ["shop/p1"],
        "the good pod is the one LC: {:?}",
        set.refused
    );
    assert_eq!(set.lcs[0].priority, i32::MIN);
    assert_eq!(set.lcs[0].latency_port, Some(8080));
    assert_eq!(set.refused.len(), 1, "only the 200 kB SLO is refused now");
    assert_eq!(set.refused[0].key, SLO_P99_US);
    assert!(set.waiting.is_empty(), "{:?}", set.waiting);
}
