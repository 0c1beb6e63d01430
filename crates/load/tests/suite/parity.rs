//! mutilate's remaining flags with their meaning: -S skips sends when far behind, --moderate
//! spaces a send from the last reply, -R assigns threads to servers round-robin, --no_nodelay,
//! -l weights an agent's share of the rate.

use crate::support;

use std::time::Duration;

use headroom_load::agent::weighted_split;
use headroom_load::{run_report, LoadOptions};
use support::{Behaviour, TestServer};

fn opts(server: &str, qps: u64, time_s: f64) -> LoadOptions {
    LoadOptions {
        servers: vec![server.to_string()],
        qps,
        time_s,
        noload: true,
        seed: Some(42),
        drain_ms: 500,
        ..LoadOptions::default()
    }
}

#[test]
fn skip_drops_sends_behind_a_stall_and_the_rate_check_says_so() {
    // 50 ms stalls each 0.5 s at depth 1: without -S every request waits its turn (late);
    // with -S the connection skips whatever is more than 5 ms behind.
    let server = TestServer::start(Behaviour::Stall {
        period: Duration::from_millis(500),
        stall: Duration::from_millis(50),
    });
    let plain = run_report(&opts(&server.spec(), 2000, 2.0), &mut |_| {}).expect("run");
    let skip = run_report(
        &LoadOptions {
            skip: true,
            ..opts(&server.spec(), 2000, 2.0)
        },
        &mut |_| {},
    )
    .expect("run");
    eprintln!(
        "stall: plain skipped {} late {}; -S skipped {} late {}",
        plain.skipped, plain.result.late, skip.skipped, skip.result.late
    );
    assert_eq!(plain.skipped, 0);
    assert!(skip.skipped > 50, "skipped {}", skip.skipped);
    let rate = skip
        .result
        .checks
        .iter()
        .find(|c| c.name == "rate")
        .unwrap();
    assert!(!rate.ok && rate.detail.contains("skipped (-S)"), "{rate:?}");
}

#[test]
fn moderate_keeps_250_us_between_a_reply_and_the_next_send() {
    // One connection, depth 1, 6000 QPS asked: a send can follow a reply only 250 µs later,
    // so at most ~4000/s go out and most sends are held (counted late).
    let server = TestServer::start(Behaviour::Prompt);
    let r = run_report(
        &LoadOptions {
            moderate: true,
            ..opts(&server.spec(), 6000, 1.0)
        },
        &mut |_| {},
    )
    .expect("run");
    eprintln!(
        "moderate: achieved {:.0} QPS, uncorrected p50 {:.1} us",
        r.result.achieved_qps, r.result.read_uncorrected.p50_us
    );
    assert!(r.result.achieved_qps < 4100.0, "{}", r.result.achieved_qps);
    assert!(r.result.late > 0);
}

#[test]
fn no_nodelay_runs_with_nagle_on() {
    // Depth 1 never has two small writes outstanding, so Nagle does not delay anything here:
    // the run is simply valid with the flag (its assignment of threads is a unit test of the
    // runner, -R's too).
    let server = TestServer::start(Behaviour::Prompt);
    let r = run_report(
        &LoadOptions {
            no_nodelay: true,
            ..opts(&server.spec(), 500, 0.5)
        },
        &mut |_| {},
    )
    .expect("run");
    assert!(r.completed > 150, "{}", r.completed);
    assert_eq!(r.result.errors, 0);
}

#[test]
fn lambda_mul_weights_the_split_exactly() {
    assert_eq!(weighted_split(1000, &[1, 1, 1]), vec![334, 333, 333]);
    assert_eq!(weighted_split(1000, &[2, 1, 1]), vec![500, 250, 250]);
    assert_eq!(weighted_split(10, &[3, 0]), vec![10, 0]);
    assert_eq!(weighted_split(7, &[0, 0]), vec![0, 0]);
    let s = weighted_split(99_999, &[5, 3, 1]);
    assert_eq!(s.iter().sum::<u64>(), 99_999);
}
