//! A probe is never sent behind an unanswered one on the same connection: there the LC serves
//! requests in order, so a probe queued behind the prober's own earlier probe times the
//! prober's queue (and its reply, merged in the socket with the earlier one, carries the later
//! receive stamp). A probe due while one is unanswered goes out on another connection instead,
//! as a load generator's request would. Against a server that answers each GET 20 ms later on
//! every connection, a prober at 200 probes/s (5 ms apart) must read ~20 ms — queued on one
//! connection its probes would read the growing backlog (seconds), and passed they would leave
//! out every probe a stall held up.

use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_agent::lc_signal::SignalCell;
use headroom_agent::probe::{ProbeSpec, Timing};

/// A memcached stand-in answering each GET of each connection, in order, `delay` after
/// reading it (a thread per connection, 16 at most). Its connections, counted.
fn slow_server(delay: Duration) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for _ in 0..16 {
            let Ok((s, _)) = listener.accept() else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
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
        }
    });
    (addr, accepted)
}

#[test]
fn a_probe_never_waits_behind_the_probers_own() {
    let (addr, accepted) = slow_server(Duration::from_millis(20));
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
    // 20 ms answers at 5 ms apart: about four probes await their replies at any time
    let conns = accepted.load(Ordering::SeqCst);
    assert!(
        (2..=8).contains(&conns),
        "{conns} connections: more than one (a probe due while another is unanswered goes out on its own), at most the prober's 8 ({detail})"
    );
    assert!(
        detail.contains("one probe in flight on each"),
        "the connections are said: {detail}"
    );
}

/// A memcached stand-in that answers at once except in a stall of `stall` at the start of every
/// `period` (on every connection alike, as a descheduled LC): a request read in a stall is
/// answered when it ends.
fn stalling_server(period: Duration, stall: Duration) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let start = Instant::now();
    std::thread::spawn(move || {
        for _ in 0..16 {
            let Ok((s, _)) = listener.accept() else {
                return;
            };
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut lines = BufReader::new(s).lines();
                while let Some(Ok(line)) = lines.next() {
                    if line.starts_with("get ") {
                        let phase = start.elapsed().as_nanos() % period.as_nanos();
                        let in_stall = Duration::from_nanos(phase as u64);
                        if in_stall < stall {
                            std::thread::sleep(stall - in_stall);
                        }
                        if w.write_all(b"END\r\n").is_err() {
                            break;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// A stall of 20 ms in every 100 ms: requests arriving at random times wait in it a fifth of
/// the time, so the time-average p90 is 10 ms (P(wait > x) = 0.2 (1 − x / 20 ms)). A prober
/// that sent only while nothing was unanswered sampled each stall once, and its p90 read the
/// fast answers (~0.1 ms).
#[test]
fn every_probe_a_stall_holds_up_is_counted() {
    let addr = stalling_server(Duration::from_millis(100), Duration::from_millis(20));
    let cell = SignalCell::new();
    let stop = Arc::new(AtomicBool::new(false));
    let mut spec = ProbeSpec::new(
        headroom_control::config::ProbeProtocol::Memcache,
        &addr.to_string(),
        500.0,
        90.0,
        3.0,
    );
    spec.min_samples = 200;
    let handle = headroom_agent::probe::spawn(spec, cell.clone(), stop.clone()).unwrap();
    let start = Instant::now();
    while cell.latest().is_none() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    handle.join().unwrap();
    let detail = cell.detail();
    if !detail.contains(Timing::KernelTxRx.describe()) {
        return eprintln!(
            "SKIP every_probe_a_stall_holds_up_is_counted: no kernel transmit stamps here ({detail})"
        );
    }
    let p90 = cell
        .latest()
        .unwrap_or_else(|| panic!("no window published: {:?}", cell.last_error()))
        .value;
    assert!(
        (5_000.0..30_000.0).contains(&p90),
        "p90 {p90} µs: the stalls' ~10 ms, not the fast answers between them ({detail})"
    );
}
