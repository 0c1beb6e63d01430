//! The agent's prober against memcached stand-ins on loopback whose answers are known:
//! - its figure does not depend on its own scheduling: a prober thread late between deciding to
//!   send and sending (a test hook sleeps there) still measures the server's delay, because each
//!   latency runs from the kernel's transmit stamp to the kernel's receive stamp, and its windows
//!   are not refused for its lateness;
//! - a probe is never sent behind an unanswered one on the same connection: there the LC serves
//!   requests in order, so a probe queued behind the prober's own earlier probe would time the
//!   prober's queue (its reply, merged in the socket with the earlier one, carries the later
//!   receive stamp); it goes out on another connection instead, as a load generator's would;
//! - every probe a stall of the LC holds up is counted: passed, the stall would be one sample
//!   for the prober and many for a load generator.

use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_agent::sensors::lc_signal::SignalCell;
use headroom_agent::sensors::probe::{ProbeSpec, Timing};

/// A memcached stand-in answering each GET of each connection, in order, after `delay(now)`
/// (a thread per connection, 16 at most). Its connections, counted.
fn server(
    delay: impl Fn(Instant) -> Duration + Send + Sync + 'static,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let delay = Arc::new(delay);
    std::thread::spawn(move || {
        for _ in 0..16 {
            let Ok((s, _)) = listener.accept() else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            let delay = delay.clone();
            std::thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut lines = BufReader::new(s).lines();
                while let Some(Ok(line)) = lines.next() {
                    if line.starts_with("get ") {
                        std::thread::sleep(delay(Instant::now()));
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

/// A memcache prober of `addr` at `rate_hz` publishing `percentile` over `window_s` windows of
/// at least `min_samples`.
fn spec(
    addr: std::net::SocketAddr,
    rate_hz: f64,
    percentile: f64,
    window_s: f64,
    min_samples: u64,
) -> ProbeSpec {
    let mut spec = ProbeSpec::new(
        headroom_control::config::ProbeProtocol::Memcache,
        &addr.to_string(),
        rate_hz,
        percentile,
        window_s,
    );
    spec.min_samples = min_samples;
    spec
}

/// Runs the prober until its first published window (30 s at most): its value and the
/// prober's detail, or `None` after a SKIP line where the kernel gives no transmit stamps.
fn first_window(spec: ProbeSpec, test: &str) -> Option<(f64, String)> {
    let cell = SignalCell::new();
    let stop = Arc::new(AtomicBool::new(false));
    let handle = headroom_agent::sensors::probe::spawn(spec, cell.clone(), stop.clone()).unwrap();
    let start = Instant::now();
    while cell.latest().is_none() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    handle.join().unwrap();
    let detail = cell.detail();
    if !detail.contains(Timing::KernelTxRx.describe()) {
        eprintln!("SKIP {test}: no kernel transmit stamps here ({detail})");
        return None;
    }
    assert!(cell.refusal().is_none(), "{:?} ({detail})", cell.refusal());
    let value = cell
        .latest()
        .unwrap_or_else(|| panic!("no window published: {:?}", cell.last_error()))
        .value;
    Some((value, detail))
}

#[test]
fn a_late_prober_still_measures_the_server() {
    let (addr, _) = server(|_| Duration::from_millis(1));
    // The median, not a tail: the test shares its CPUs with whatever else runs, and a tail is
    // that noise; the median tells a 1 ms server from a 30 ms late prober either way.
    let mut spec = spec(addr, 20.0, 50.0, 3.0, 20);
    // Each send 30 ms late (after the prober's own clock read): timed from its own send, every
    // latency would read >= 31 ms, and the old send-lag bound would refuse every window.
    spec.delay_sends = Duration::from_millis(30);
    spec.max_send_lag_us = 100.0;
    let Some((p50, _)) = first_window(spec, "a_late_prober_still_measures_the_server") else {
        return;
    };
    assert!(
        (900.0..20_000.0).contains(&p50),
        "median {p50} µs: the server's 1 ms, not the prober's 30 ms lateness"
    );
}

/// Against a server that answers each GET 20 ms later on every connection, a prober at 200
/// probes/s (5 ms apart) must read ~20 ms — queued on one connection its probes would read the
/// growing backlog (seconds).
#[test]
fn a_probe_never_waits_behind_the_probers_own() {
    let (addr, accepted) = server(|_| Duration::from_millis(20));
    let spec = spec(addr, 200.0, 50.0, 2.0, 20);
    let Some((p50, detail)) = first_window(spec, "a_probe_never_waits_behind_the_probers_own")
    else {
        return;
    };
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

/// A stall of 20 ms at the start of every 100 ms (on every connection alike, as a descheduled
/// LC; a request read in it is answered when it ends): requests arriving at random times wait
/// in it a fifth of the time, so the time-average p90 is 10 ms (P(wait > x) = 0.2 (1 − x /
/// 20 ms)). A prober that sent only while nothing was unanswered sampled each stall once, and
/// its p90 read the fast answers (55 µs).
#[test]
fn every_probe_a_stall_holds_up_is_counted() {
    let (period, stall) = (Duration::from_millis(100), Duration::from_millis(20));
    let start = Instant::now();
    let (addr, _) = server(move |now| {
        let phase =
            Duration::from_nanos((now.duration_since(start).as_nanos() % period.as_nanos()) as u64);
        stall.saturating_sub(phase)
    });
    let spec = spec(addr, 500.0, 90.0, 3.0, 200);
    let Some((p90, detail)) = first_window(spec, "every_probe_a_stall_holds_up_is_counted") else {
        return;
    };
    assert!(
        (5_000.0..30_000.0).contains(&p90),
        "p90 {p90} µs: the stalls' ~10 ms, not the fast answers between them ({detail})"
    );
}

/// A 2 ms server at 100 probes/s: every window includes the server's 2 ms, and a server that
/// answers every connection the prober opens (it opens another when a stall holds one) gives
/// no error.
#[test]
fn the_prober_times_a_memcache_server_open_loop() {
    let (addr, _) = server(|_| Duration::from_millis(2));
    // 100 probes/s: publish after 2 s of probes rather than the default's 10 s (1000 samples).
    let probe = spec(addr, 100.0, 99.0, 5.0, 200);
    let cell = SignalCell::new();
    let stop = Arc::new(AtomicBool::new(false));
    let handle = headroom_agent::sensors::probe::spawn(probe, cell.clone(), stop.clone()).unwrap();
    let start = Instant::now();
    while cell.latest().is_none() && start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    handle.join().unwrap();
    let p99 = cell
        .latest()
        .expect("a window percentile was published")
        .value;
    assert!(p99 >= 1900.0, "p99 {p99} µs includes the server's 2 ms");
    assert_eq!(cell.errors(), 0, "{:?}", cell.last_error());
}
