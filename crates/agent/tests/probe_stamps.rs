//! The prober's figure does not depend on its own scheduling: a prober thread that is late
//! between deciding to send and sending (a test hook sleeps there) still measures the server's
//! injected delay, because each latency runs from the kernel's transmit stamp to the kernel's
//! receive stamp; and its windows are not refused for its lateness.

use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_agent::lc_signal::SignalCell;
use headroom_agent::probe::{ProbeSpec, Timing};

/// A memcached stand-in on loopback answering every GET with a miss after `delay`.
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
fn a_late_prober_still_measures_the_server() {
    let addr = slow_server(Duration::from_millis(1));
    let cell = SignalCell::new();
    let stop = Arc::new(AtomicBool::new(false));
    // The median, not a tail: the test shares its CPUs with whatever else runs, and a tail is
    // that noise; the median tells a 1 ms server from a 30 ms late prober either way.
    let mut spec = ProbeSpec::new(
        headroom_control::config::ProbeProtocol::Memcache,
        &addr.to_string(),
        20.0,
        50.0,
        3.0,
    );
    spec.min_samples = 20;
    // Each send 30 ms late (after the prober's own clock read): timed from its own send, every
    // latency would read >= 31 ms, and the old send-lag bound would refuse every window.
    spec.delay_sends = Duration::from_millis(30);
    spec.max_send_lag_us = 100.0;
    let handle = headroom_agent::probe::spawn(spec, cell.clone(), stop.clone()).unwrap();
    let start = Instant::now();
    while cell.latest().is_none() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    handle.join().unwrap();
    let detail = cell.detail();
    if !detail.contains(Timing::KernelTxRx.describe()) {
        return eprintln!(
            "SKIP a_late_prober_still_measures_the_server: no kernel transmit stamps here ({detail})"
        );
    }
    let p50 = cell
        .latest()
        .unwrap_or_else(|| panic!("no window published: {:?}", cell.last_error()))
        .value;
    assert!(
        (900.0..20_000.0).contains(&p50),
        "median {p50} µs: the server's 1 ms, not the prober's 30 ms lateness"
    );
    assert!(cell.refusal().is_none(), "{:?}", cell.refusal());
}
