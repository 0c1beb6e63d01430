//! The run checks' and the verdict's unit tests.

use super::*;
use crate::results::RawResults;

/// `-c total -d depth` on one thread: fixed connections.
fn fixed(total: usize, depth: usize) -> headroom_types::load_result::ConnectionSizing {
    headroom_types::load_result::ConnectionSizing {
        mode: "fixed".into(),
        per_thread: total,
        depth,
        total,
        ..Default::default()
    }
}

fn raw_with(target: f64, completed: u64, samples: Vec<f64>) -> RawResults {
    let mut raw = RawResults {
        target_qps: target,
        measured_s: 1.0,
        wall_s: 1.0,
        threads: 1,
        cpu_s: 0.1,
        ia_samples: samples,
        clients: 1,
        ..RawResults::default()
    };
    raw.counters.completed = completed;
    raw.counters.sent = completed;
    raw.counters.scheduled = (target * 1.0) as u64;
    for _ in 0..completed {
        raw.load.read.record_ns(50_000);
    }
    raw
}

/// Hostile pass 28: against a server that never answers, `-c 1 -d 1` sends one request
/// and waits; the verdict blamed the connections ("too few for this rate and round
/// trip"), hiding that not one reply came.
#[test]
fn a_server_that_never_answered_is_blamed_however_few_were_sent() {
    let mut raw = raw_with(1000.0, 0, vec![]);
    raw.counters.sent = 1;
    raw.counters.late = 999;
    raw.counters.errors = 1;
    raw.connections = Some(fixed(1, 1));
    let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
    let checks = run_checks(&raw, &unit, 99.0);
    let why = limited_by(&raw, &checks).expect("the rate was not carried");
    assert!(
        why.starts_with("server:") && why.contains("answered 0 of the 1"),
        "{why}"
    );
}

/// Hostile pass 30: a server that answered 500 requests and then stopped (or closed its
/// connections) held `-c 1 -d 1` at 501 sends, 500 answered: the verdict blamed the
/// connections ("too few for this rate and round trip") and the rate check the client.
#[test]
fn a_server_that_stopped_or_closed_is_blamed_not_the_connections() {
    for (stalled, closed, said) in [(1, 0, "still unanswered"), (0, 13, "closed the load")] {
        let mut raw = raw_with(1000.0, 500, vec![]);
        raw.counters.sent = 501;
        raw.counters.late = 21;
        raw.counters.errors = 1 + closed;
        raw.counters.stalled = stalled;
        raw.counters.closed = closed;
        raw.connections = Some(fixed(1, 1));
        let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
        let checks = run_checks(&raw, &unit, 99.0);
        let why = limited_by(&raw, &checks).expect("the rate was not carried");
        assert!(why.starts_with("server:") && why.contains(said), "{why}");
        let rate = checks.iter().find(|k| k.name == "rate").unwrap();
        assert!(
            rate.detail.starts_with("the server did not keep up"),
            "{}",
            rate.detail
        );
    }
}

/// Hostile pass 31: a client thread beside a busy CPU read its replies late, its 50
/// connections at depth 4 sat at their cap, and the verdict said "-c 50 -d 4 too few for
/// this rate and round trip" against a server that answered in 50 µs.
#[test]
fn a_late_thread_with_room_in_flight_is_blamed_not_the_connections() {
    for (total, depth, said) in [(50, 4, "client scheduling:"), (1, 1, "connections:")] {
        let mut raw = raw_with(30_000.0, 30_000, vec![]);
        raw.counters.sent = 30_000;
        raw.counters.late = 2_400;
        // The requests holding the late sends' room were themselves sent late by the thread,
        // and answered at once; the thread reached the replies 11 ms later.
        raw.counters.room_server_ns = 2_400 * 20_000;
        raw.counters.room_client_ns = 2_400 * 11_000_000;
        for _ in 0..30_000 {
            raw.send_lag.record_ns(11_000_000);
            raw.load.read_uncorrected.record_ns(50_000);
        }
        raw.connections = Some(fixed(total, depth));
        let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
        let checks = run_checks(&raw, &unit, 99.0);
        let why = limited_by(&raw, &checks).expect("the schedule was not kept");
        assert!(why.starts_with(said), "-c {total} -d {depth}: {why}");
    }
}

/// Hostile pass 32: `-c 1 -d 1 -w 1` against a server answering each request in 20 ms
/// at 200 QPS: the warmup's backlog outlasted the run, no measured request was sent or
/// marked late, and the verdict blamed the server ("0.00% of the 600 scheduled answered").
#[test]
fn a_backlog_that_left_measured_requests_unsent_is_blamed_on_the_connections() {
    let mut raw = raw_with(200.0, 0, vec![]);
    raw.counters.scheduled = 600;
    for _ in 0..600 {
        raw.send_lag.record_ns(300_000);
    }
    raw.connections = Some(fixed(1, 1));
    let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
    let checks = run_checks(&raw, &unit, 99.0);
    let why = limited_by(&raw, &checks).expect("the rate was not carried");
    assert!(why.starts_with("connections:"), "{why}");
}

#[test]
fn rate_within_one_percent_passes_and_below_fails_with_a_reason() {
    let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
    let ok = run_checks(&raw_with(100000.0, 99500, vec![]), &unit, 99.0);
    assert!(ok.iter().find(|c| c.name == "rate").unwrap().ok);
    let mut slow = raw_with(100000.0, 90000, vec![]);
    slow.counters.late = 10000;
    let bad = run_checks(&slow, &unit, 99.0);
    let rate = bad.iter().find(|c| c.name == "rate").unwrap();
    assert!(!rate.ok);
    assert!(
        rate.detail.contains("could not keep up") && rate.detail.contains("late"),
        "{}",
        rate.detail
    );
}

/// A server that never answers read "client could not keep up … client CPU saturated".
#[test]
fn a_silent_server_is_named_as_the_server_not_the_client() {
    let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
    let mut silent = raw_with(10000.0, 0, vec![]);
    silent.counters.sent = 4000;
    silent.counters.late = 6000;
    silent.cpu_s = 1.0; // a client waiting on a silent server polls: it reads busy
    let checks = run_checks(&silent, &unit, 99.0);
    let rate = checks.iter().find(|c| c.name == "rate").unwrap();
    assert!(!rate.ok);
    assert!(
        rate.detail.starts_with("the server did not keep up")
            && rate
                .detail
                .contains("the server answered 0 of the 4000 requests sent"),
        "{}",
        rate.detail
    );
    let limit = limited_by(&silent, &checks).unwrap();
    assert!(limit.starts_with("server:"), "{limit}");
}

#[test]
fn fit_rejects_fixed_gaps_for_an_exponential_schedule() {
    let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
    let checks = run_checks(&raw_with(1000.0, 1000, vec![1.0; 1000]), &unit, 99.0);
    assert!(
        !checks
            .iter()
            .find(|c| c.name == "interarrival_fit")
            .unwrap()
            .ok
    );
}

#[test]
fn too_few_samples_fail_for_the_requested_percentile() {
    let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
    let checks = run_checks(&raw_with(0.0, 500, vec![]), &unit, 99.0);
    let s = checks.iter().find(|c| c.name == "samples").unwrap();
    assert!(!s.ok && s.detail.contains("too few"), "{}", s.detail);
    assert_eq!(samples_needed(99.9), 10000);
}

/// Hostile pass 32: `headroom serve` paused 10 ms of every 500 ms (a GC-like stop), `-c 10 -d 2`
/// at 20 000 QPS: 1.9% of the sends found their connections full, their lag after the replies
/// freed room was the client's ordinary reaction (p99 1190 µs on a 2-vCPU VM), and the verdict
/// said "client scheduling" for the server's pause. The sends that waited for room waited
/// mostly on the server: the server is named, whatever the host's wake-up. The same waits with
/// too few connections for the rate stay the connections' doing.
#[test]
fn a_server_that_paused_is_blamed_not_the_clients_reaction_to_its_replies() {
    for (total, depth, said) in [(10, 2, "server:"), (1, 1, "connections:")] {
        let mut raw = raw_with(20_000.0, 20_000, vec![]);
        raw.counters.scheduled = 20_000;
        raw.counters.late = 380;
        // Each late send waited ~5 ms on average for the paused server's reply, then ~0.4 ms
        // for the client thread to send.
        raw.counters.room_server_ns = 380 * 5_000_000;
        raw.counters.room_client_ns = 380 * 400_000;
        raw.counters.room_waits = 380;
        for i in 0..20_000u64 {
            raw.send_lag
                .record_ns(if i % 50 == 0 { 1_190_000 } else { 20_000 });
            raw.load.read_uncorrected.record_ns(50_000);
        }
        raw.connections = Some(fixed(total, depth));
        let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
        let checks = run_checks(&raw, &unit, 99.0);
        let why = limited_by(&raw, &checks).expect("1.9% of the sends were late");
        assert!(why.starts_with(said), "-c {total} -d {depth}: {why}");
    }
}

/// Hostile pass 34: a server answering every request in 5 ms, steadily, `-c 1 -d 2` at 100 QPS:
/// a tenth of the sends found both slots taken (Poisson arrivals), each waited for the rest of
/// the oldest request's round trip (2 ms on average, under the 5 ms p90), and the verdict said
/// "the server paused or answered in bursts" (the waits were the server's, and 2 in flight
/// carry 100 QPS at 5 ms by Little's law twice over). A steady server holds a send that found
/// no room for less than one round trip: the connections are too few, not the server paused,
/// and not the client's lateness (its send lag p99 1.5 ms, a VM's wake-ups).
#[test]
fn a_steady_slow_server_with_too_few_connections_is_not_blamed_for_pausing() {
    let mut raw = raw_with(100.0, 300, vec![]);
    raw.counters.scheduled = 300;
    raw.counters.late = 40;
    raw.counters.room_server_ns = 40 * 2_000_000;
    raw.counters.room_client_ns = 40 * 100_000;
    raw.counters.room_waits = 40;
    for i in 0..300u64 {
        raw.send_lag
            .record_ns(if i % 50 == 0 { 1_500_000 } else { 20_000 });
        raw.load
            .read_uncorrected
            .record_ns(5_000_000 + (i % 10) * 100_000);
    }
    raw.connections = Some(fixed(1, 2));
    let unit: Dist = Dist::interarrival("exponential", 1.0).unwrap();
    let checks = run_checks(&raw, &unit, 99.0);
    let why = limited_by(&raw, &checks).expect("13% of the sends were late");
    assert!(why.starts_with("connections:"), "{why}");
}
