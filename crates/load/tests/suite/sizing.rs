//! `-c auto` and the result's account of the client: connections sized from the measured round
//! trip (more for a slow server than for a fast one), grown during a run whose server stalls,
//! the scheduling class and the connection sizing in the result, and a rate the server cannot
//! carry named as such. Behaviour only: no timing is asserted beyond orders of magnitude.

use crate::support;

use std::time::Duration;

use headroom_load::testkit::Mm1Server;
use headroom_load::{run_report, LoadOptions};
use support::{Behaviour, TestServer};

fn auto(server: &str, qps: u64, time_s: f64) -> LoadOptions {
    LoadOptions {
        servers: vec![server.to_string()],
        qps,
        time_s,
        noload: true,
        seed: Some(7),
        drain_ms: 500,
        connections_auto: true,
        ..LoadOptions::default()
    }
}

#[test]
fn auto_opens_more_connections_for_a_slow_server_than_for_a_fast_one() {
    let fast = Mm1Server::start_delay(Duration::from_micros(10), None).expect("fast server");
    // 20 ms: far beyond a busy host's stalls (CI saw a 10 µs server's ping p99 reach 8.5 ms), so
    // the comparison is the servers', not the host's.
    let slow = Mm1Server::start_delay(Duration::from_millis(20), None).expect("slow server");
    let run = |addr: std::net::SocketAddr| {
        let r = run_report(&auto(&addr.to_string(), 2000, 1.0), &mut |_| {}).expect("run");
        r.result.client.connections.expect("sizing reported")
    };
    let f = run(fast.addr());
    let s = run(slow.addr());
    eprintln!("fast: {f:?}\nslow: {s:?}");
    assert_eq!((f.mode.as_str(), s.mode.as_str()), ("auto", "auto"));
    assert!(
        s.rtt_p50_us >= 20_000.0,
        "the slow server's round trip: {s:?}"
    );
    assert!(
        s.per_thread > f.per_thread,
        "slow {} vs fast {}",
        s.per_thread,
        f.per_thread
    );
    // 2000/s × ≥ 20 ms × 2 + 2 ≥ 82 in flight.
    assert!(s.per_thread >= 82 && s.total == s.per_thread, "{s:?}");
    // Each sizing follows its own measured p99 by the rule, whatever the host's noise.
    for c in [&f, &s] {
        let rule = headroom_load::sizing::size_connections(2000.0, (c.rtt_p99_us * 1e3) as u64, 1);
        assert!(
            rule.per_thread.abs_diff(c.per_thread) <= 1,
            "{c:?} vs {rule:?}"
        );
    }
    assert!(s.reason.contains("RTT p99"), "{}", s.reason);
}

#[test]
fn a_server_that_stalls_mid_run_makes_auto_open_connections() {
    // The ping phase and the first 0.6 s see a prompt server; then replies stop for 150 ms, so
    // the ~300 requests due meanwhile find every connection at its depth cap.
    let server = TestServer::start(Behaviour::StallOnce {
        at: Duration::from_millis(600),
        stall: Duration::from_millis(150),
    });
    let r = run_report(&auto(&server.spec(), 2000, 1.5), &mut |_| {}).expect("run");
    let c = r.result.client.connections.expect("sizing reported");
    eprintln!("{c:?}; late {}", r.result.late);
    assert!(c.grown > 0, "no connection opened during the stall: {c:?}");
    // 5 ms of 2000/s is 10 in flight: the reserve holds what the scheduled ones do not.
    let reserve = headroom_load::sizing::reserve(c.per_thread, 2000.0, c.depth, 1);
    assert_eq!(c.reserve, reserve, "{c:?}");
    assert_eq!(c.grown_to, c.total + c.reserve + c.grown as usize);
    assert_eq!(c.grow_cap, headroom_load::sizing::grow_cap(c.per_thread));
    assert!(c.grown_to <= c.grow_cap, "{c:?}");
    assert_eq!(r.result.errors, 0);
}

#[test]
fn a_fixed_c_never_grows_and_the_result_names_class_and_sizing() {
    let server = TestServer::start(Behaviour::Prompt);
    let o = LoadOptions {
        connections: 2,
        connections_auto: false,
        ..auto(&server.spec(), 500, 0.5)
    };
    let r = run_report(&o, &mut |_| {}).expect("run");
    let c = r
        .result
        .client
        .connections
        .clone()
        .expect("sizing reported");
    assert_eq!(
        (c.mode.as_str(), c.per_thread, c.total, c.grown),
        ("fixed", 2, 2, 0)
    );
    let json = serde_json::to_value(&r).unwrap();
    let class = json["client"]["sched"].as_str().expect("client.sched");
    assert!(class.starts_with("SCHED_"), "{class}");
    assert!(
        json["client"]["sched_reason"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{json}"
    );
    assert_eq!(json["client"]["connections"]["mode"], "fixed");
}

#[test]
fn a_rate_the_server_cannot_carry_is_invalid_and_names_the_server() {
    // One FIFO server at 2000/s offered 6000/s: connections grow to their cap and the replies
    // queue at the server.
    let server = Mm1Server::start(2000.0, 3).expect("server");
    let r = run_report(&auto(&server.addr().to_string(), 6000, 1.0), &mut |_| {}).expect("run");
    let why = r.result.client.limited_by.clone().expect("limited_by set");
    eprintln!("{why}");
    assert!(!r.result.valid);
    assert!(why.starts_with("server:"), "{why}");
    assert!(
        why.contains("reached") && why.contains("of 6000 QPS"),
        "{why}"
    );
}
