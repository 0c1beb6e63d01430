//! A probe is never sent behind an unanswered one: on one connection the LC serves requests
//! in order, so a probe queued behind the prober's own earlier probe times the prober's queue
//! (and its reply, merged in the socket with the earlier one, carries the later receive
//! stamp). Against a server that answers each GET 20 ms later, a prober at 200 probes/s (5 ms
//! apart) must read ~20 ms — queued, its probes would read the growing backlog, seconds.

use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_agent::lc_signal::SignalCell;
use headroom_agent::probe::{ProbeSpec, Timing};

/// A memcached stand-in answering each GET of one connection, in order, `delay` after reading it.
fn slow_server(delay: Duration) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut w = s.try_clone().unwrap();
        let mut lines = BufReader::new(s).lines();
        while let Some(Ok(line)) = lines.next() {
            if line.starts_with("get ") {
                std::thread::sleep(delay);
                if w.write_all(b"END\r\n").is_err() {
                    break;
                }
            }
        }
    });
    addr
}

#[test]
fn a_probe_never_waits_behind_the_probers_own() {
    let addr = slow_server(Duration::from_millis(20));
    let cell = SignalCell::new();
    let stop = Arc::new(AtomicBool::new(false));
    let mut spec = ProbeSpec::new(
        headroom_control::config::ProbeProtocol::Memcache,
        &addr.to_string(),
        200.0,
        50.0,
        2.0,
    );
    spec.min_samples = 20;
    let handle = headroom_agent::probe::spawn(spec, cell.clone(), stop.clone()).unwrap();
    let start = Instant::now();
    while cell.latest().is_none() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    handle.join().unwrap();
    let detail = cell.detail();
    if !detail.contains(Timing::KernelTxRx.describe()) {
        return eprintln!(
            "SKIP a_probe_never_waits_behind_the_probers_own: no kernel transmit stamps here ({detail})"
        );
    }
    let p50 = cell
        .latest()
        .unwrap_or_else(|| panic!("no window published: {:?}", cell.last_error()))
        .value;
    // the median: the server's 20 ms (plus a loaded host's scheduling), not a backlog of
    // probes that grows by 15 ms each 5 ms
    assert!(
        (19_000.0..60_000.0).contains(&p50),
        "median {p50} µs: the server's 20 ms, not the prober's own queue ({detail})"
    );
    assert!(
        detail.contains("sends passed behind an unanswered probe")
            && !detail.contains(" 0 sends passed"),
        "the passed sends are said: {detail}"
    );
}
