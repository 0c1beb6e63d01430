//! Whose time is whose: a client made late on purpose (it sleeps 1 ms between making each send
//! and handing it to the kernel) against a server that answers 2 ms late. Timed from the
//! kernel's transmit stamp, the latency is the server's 2 ms and the client's 1 ms shows as its
//! send lag, which fails the `send_lag` bound; where the kernel refuses transmit stamps the
//! latency is timed from the user-space send (3 ms: the client's lateness charged to the
//! server) and the result says so. Both engines.
//!
//! One test: the delay hook is read once per process, and the refusal hook is process-wide.

mod support;

use std::time::Duration;

use headroom_load::engine::{
    choose_engine, EngineChoice, EngineKind, SEND_DELAY_SIMULATE_ENV, TX_STAMP_SIMULATE_ENV,
};
use headroom_load::{run_report, LoadOptions, LoadReport};
use support::{Behaviour, TestServer};

fn run(server: &TestServer, engine: EngineChoice) -> LoadReport {
    let o = LoadOptions {
        servers: vec![server.spec()],
        qps: 200,
        time_s: 2.0,
        connections: 4,
        noload: true,
        seed: Some(42),
        drain_ms: 500,
        engine,
        ..LoadOptions::default()
    };
    run_report(&o, &mut |_| {}).expect("run")
}

fn check<'a>(r: &'a LoadReport, name: &str) -> &'a headroom_types::load_result::Check {
    r.result
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} check in {:?}", r.result.checks))
}

#[test]
fn a_late_client_is_not_charged_to_the_server_unless_the_kernel_refuses_stamps() {
    // SAFETY (of the process environment): this binary's only test sets it before any run.
    std::env::set_var(SEND_DELAY_SIMULATE_ENV, "1000");
    let server = TestServer::start(Behaviour::Delay(Duration::from_millis(2)));
    let mut engines = vec![(EngineChoice::Epoll, "epoll")];
    if matches!(
        choose_engine(EngineChoice::Auto).map(|c| c.kind),
        Ok(EngineKind::IoUring)
    ) {
        engines.push((EngineChoice::IoUring, "io_uring"));
    } else {
        eprintln!("SKIP a_late_client_is_not_charged_to_the_server (io_uring half): io_uring unavailable here");
    }
    for (engine, name) in engines {
        std::env::remove_var(TX_STAMP_SIMULATE_ENV);
        let r = run(&server, engine);
        let (p50, unc, lag) = (
            r.result.read.p50_us / 1000.0,
            r.result.read_uncorrected.p50_us / 1000.0,
            r.send_lag.p50_us / 1000.0,
        );
        let stamps = check(&r, "timestamps");
        eprintln!(
            "{name}, kernel stamps: p50 {p50:.3} ms, uncorrected {unc:.3} ms, send lag p50 {lag:.3} ms; {}",
            stamps.detail
        );
        assert!(
            r.result.read.count > 300,
            "{name}: count {}",
            r.result.read.count
        );
        assert!((2.0..=2.3).contains(&p50), "{name}: corrected p50 {p50} ms");
        assert!(
            (2.0..=2.3).contains(&unc),
            "{name}: uncorrected p50 {unc} ms"
        );
        // At least the 1 ms sleep; more where several sends fall due in one turn (io_uring hands
        // them to the kernel together, after every one's sleep) or the sleep overshoots.
        assert!((1.0..=3.0).contains(&lag), "{name}: send lag p50 {lag} ms");
        assert!(
            (r.result.client.send_lag_p99_us - 1000.0) > 0.0,
            "{name}: {}",
            r.result.client.send_lag_p99_us
        );
        assert!(
            stamps.ok
                && stamps.detail.starts_with(&format!(
                    "kernel transmit stamps timed {} of {}",
                    r.completed, r.completed
                )),
            "{name}: {stamps:?}"
        );
        let lag_check = check(&r, "send_lag");
        assert!(
            !lag_check.ok,
            "{name}: a 1 ms late client passed: {lag_check:?}"
        );
        assert!(!r.result.valid);

        std::env::set_var(TX_STAMP_SIMULATE_ENV, "EPERM");
        let r = run(&server, engine);
        std::env::remove_var(TX_STAMP_SIMULATE_ENV);
        let unc = r.result.read_uncorrected.p50_us / 1000.0;
        let stamps = check(&r, "timestamps");
        eprintln!(
            "{name}, transmit stamps refused: uncorrected p50 {unc:.3} ms; {}",
            stamps.detail
        );
        // From the user-space send: the client's 1 ms is charged to the server, and said so.
        assert!(
            (2.9..=3.4).contains(&unc),
            "{name}: uncorrected p50 {unc} ms"
        );
        assert!(
            stamps.detail.contains("kernel transmit stamps timed 0 of")
                && stamps.detail.contains("refused")
                && stamps.detail.contains("user space"),
            "{name}: {stamps:?}"
        );
        assert!(
            headroom_load::report::format_table(&r)
                .contains("Timestamps: kernel transmit stamps timed 0"),
            "{name}: the table does not say it"
        );
    }
}
