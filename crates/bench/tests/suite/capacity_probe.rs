//! What a capacity or peak probe must show before the LC alone is said to hold a rate.

use headroom_report::model::LoadMetrics;
use serde_json::json;

fn probe(achieved: f64, p99: f64, client_cpu_ok: bool) -> LoadMetrics {
    LoadMetrics::from_value(&json!({
        "target_qps": 100000.0,
        "achieved_qps": achieved,
        "valid": client_cpu_ok,
        "read": { "p99_us": p99 },
        "checks": [
            { "name": "rate", "ok": true, "detail": "achieved within 0.3% of target" },
            { "name": "client_cpu", "ok": client_cpu_ok,
              "detail": "client used 1.99 CPU-s in 2.00 s over 1 threads (100%): saturated" },
        ],
    }))
}

#[test]
fn a_probe_holds_its_rate_only_with_the_rate_reached_the_tail_in_bound_and_the_client_unsaturated()
{
    assert!(probe(99_000.0, 800.0, true).holds(100_000.0, 99.0, 1000.0));
    // A saturated client reaches the rate, and its tail may even be in bound, but the tail is the
    // client's own queue: the LC's capacity is not shown.
    let saturated = probe(100_000.0, 880.0, false);
    assert!(saturated.client_saturated());
    assert!(!saturated.holds(100_000.0, 99.0, 1000.0));
    // Rate short by more than 2%, or the tail past the bound.
    assert!(!probe(97_000.0, 800.0, true).holds(100_000.0, 99.0, 1000.0));
    assert!(!probe(99_000.0, 1200.0, true).holds(100_000.0, 99.0, 1000.0));
    // A percentile the result does not carry cannot be judged.
    assert!(!probe(99_000.0, 800.0, true).holds(100_000.0, 99.99, 1000.0));
    // A sender off its schedule (the inter-arrival fit failed) reaches the rate with the tail
    // in bound, but what it measured is partly its own lag.
    let off = LoadMetrics::from_value(&json!({
        "target_qps": 100000.0,
        "achieved_qps": 100_000.0,
        "valid": false,
        "read": { "p99_us": 326.0 },
        "checks": [
            { "name": "interarrival_fit", "ok": false,
              "detail": "Kolmogorov-Smirnov D = 0.19, p = 0.000 on 1000 actual send intervals" },
            { "name": "client_cpu", "ok": true, "detail": "client used 0.7 CPU-s in 1 s" },
        ],
    }));
    assert!(off.sender_off_schedule());
    assert!(!off.holds(100_000.0, 99.0, 1000.0));
    // Failing only `independence` (a short probe) is not being off schedule.
    let short = LoadMetrics::from_value(&json!({
        "target_qps": 100000.0,
        "achieved_qps": 100_000.0,
        "valid": false,
        "read": { "p99_us": 326.0 },
        "checks": [
            { "name": "independence", "ok": false, "detail": "run ≥ 103 s for a trusted p99" },
        ],
    }));
    assert!(!short.sender_off_schedule());
    assert!(short.holds(100_000.0, 99.0, 1000.0));
}

#[test]
fn a_failed_probe_is_retried_and_two_of_three_decide() {
    use headroom_bench::record::held_by_majority;
    let run = |script: &[bool]| {
        let mut calls = 0;
        let held = held_by_majority(|| {
            calls += 1;
            Ok(script[calls - 1])
        })
        .unwrap();
        (held, calls)
    };
    assert_eq!(run(&[true]), (true, 1), "a first success decides");
    assert_eq!(
        run(&[false, true, true]),
        (true, 3),
        "a hiccup, then two holds"
    );
    assert_eq!(run(&[false, true, false]), (false, 3));
    assert_eq!(run(&[false, false]), (false, 2), "two failures settle it");
    let err = held_by_majority(|| Err(headroom_bench::error::BenchError::Input("x".into())));
    assert!(
        err.is_err(),
        "a probe that cannot run is an error, not a failure"
    );
}

#[test]
fn only_a_result_whose_sole_failure_is_independence_still_measures_the_server() {
    let with = |checks: serde_json::Value, valid: bool| {
        LoadMetrics::from_value(&json!({
            "target_qps": 1000.0, "achieved_qps": 1000.0, "valid": valid,
            "read": { "p99_us": 300.0 }, "checks": checks,
        }))
    };
    assert!(
        with(json!([{ "name": "rate", "ok": true, "detail": "" }]), true).measures_the_server()
    );
    let correlated = json!([
        { "name": "rate", "ok": true, "detail": "" },
        { "name": "independence", "ok": false, "detail": "run ≥ 40 s for a trusted p99" },
    ]);
    assert!(with(correlated, false).measures_the_server());
    let late = json!([
        { "name": "independence", "ok": false, "detail": "run ≥ 40 s" },
        { "name": "interarrival_fit", "ok": false, "detail": "D = 0.2, p = 0.000" },
    ]);
    assert!(!with(late, false).measures_the_server());
    let few = json!([{ "name": "samples", "ok": false, "detail": "463 < 1000" }]);
    assert!(!with(few, false).measures_the_server());
    // Invalid with no failed check named: nothing to say it measured the server.
    assert!(!with(json!([]), false).measures_the_server());
}
