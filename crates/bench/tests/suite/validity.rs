//! Only valid measurements decide: an invalid load run is retried with the configuration its
//! failed checks call for, and when that still fails the bench stops with the check and the fix.
//! Fake load results stand in for `headroom load`; nothing here is timed.

use crate::common;

use std::cell::RefCell;
use std::net::SocketAddr;

use headroom_bench::error::BenchError;
use headroom_bench::experiments::Experiment;
use headroom_bench::record::{scaled_cooldown_s, AgentRun, Options};
use headroom_bench::validity::{
    judge, measure_valid, server_limited, Connections, LoadShape, RateVerdict, MAX_ATTEMPTS,
    MAX_RERUN_S,
};
use headroom_report::model::{LcBaseline, LoadMetrics};
use serde_json::json;

const DEPTH_CAP: (&str, &str) = (
    "rate",
    "client could not keep up: achieved 18000.0 of 20000.0 QPS (-10.00%); 5400 late sends (30.5%): connections at their depth cap",
);
const CLIENT_CPU: (&str, &str) = (
    "client_cpu",
    "client used 0.95 CPU-s in 1.00 s over 1 threads (95%): saturated, latencies include client queueing",
);
const CORRELATED: (&str, &str) = (
    "independence",
    "variance of the median ×3.1: latencies are correlated over longer than this run can average; run ≥ 20 s for a trusted p99",
);

fn result(p99: f64, failed: &[(&str, &str)]) -> LoadMetrics {
    let checks: Vec<_> = failed
        .iter()
        .map(|(n, d)| json!({ "name": n, "ok": false, "detail": d }))
        .chain([json!({ "name": "errors", "ok": true, "detail": "0 lost" })])
        .collect();
    LoadMetrics::from_value(&json!({
        "target_qps": 20000.0, "achieved_qps": 20000.0, "valid": failed.is_empty(),
        "read": { "p99_us": p99 }, "checks": checks,
    }))
}

fn start(threads: usize) -> LoadShape {
    LoadShape {
        threads,
        connections: Connections::Fixed(8),
        depth: 4,
        seconds: 1.0,
    }
}

/// Runs `measure_valid` over scripted results; returns the shapes it ran and the outcome.
fn scripted(
    max_threads: usize,
    script: Vec<LoadMetrics>,
) -> (
    Vec<LoadShape>,
    headroom_bench::Result<headroom_bench::validity::Measured>,
) {
    let ran = RefCell::new(Vec::new());
    let out = measure_valid(start(1), max_threads, |s| {
        ran.borrow_mut().push(s.clone());
        let i = ran.borrow().len() - 1;
        Ok(script[i.min(script.len() - 1)].clone())
    });
    (ran.into_inner(), out)
}

#[test]
fn a_valid_first_run_is_the_measurement() {
    let (ran, m) = scripted(1, vec![result(150.0, &[])]);
    assert_eq!(ran.len(), 1);
    assert!(m.unwrap().valid().is_some());
}

#[test]
fn sends_at_the_depth_cap_are_retried_with_more_connections() {
    let (ran, m) = scripted(1, vec![result(900.0, &[DEPTH_CAP]), result(150.0, &[])]);
    assert_eq!(ran.len(), 2);
    assert_eq!(ran[1].connections, Connections::Fixed(16));
    assert_eq!(ran[1].threads, 1);
    let m = m.unwrap();
    let v = m.valid().expect("the corrected run is valid");
    assert!(v.change.contains("16 connections"), "{}", v.change);
}

#[test]
fn a_saturated_client_gets_another_thread_where_it_has_a_cpu() {
    let (ran, m) = scripted(2, vec![result(900.0, &[CLIENT_CPU]), result(150.0, &[])]);
    assert_eq!(ran[1].threads, 2);
    assert!(m.unwrap().valid().is_some());
}

#[test]
fn a_client_with_no_cpu_left_stops_the_bench_with_the_check_and_the_fix() {
    let (ran, m) = scripted(1, vec![result(900.0, &[CLIENT_CPU])]);
    // Nothing left to correct: the same run once more (a host stall is transient), then stop.
    assert_eq!(ran.len(), 2, "one repeat, as it was");
    assert_eq!(ran[0], ran[1]);
    let m = m.unwrap();
    assert_eq!(m.attempts[1].change, headroom_bench::validity::SAME_AGAIN);
    assert!(m.valid().is_none());
    let e = judge(&m, 20000.0, 99.0, 1000.0, "LC alone at 20000 QPS (slo)", 1).unwrap_err();
    let BenchError::Invalid {
        what, checks, fix, ..
    } = &e
    else {
        panic!("not an Invalid error: {e}");
    };
    assert!(what.contains("20000 QPS"), "{what}");
    assert!(
        checks[0].starts_with("client_cpu: client used 0.95"),
        "{checks:?}"
    );
    assert!(fix.contains("--loadgen-cpus"), "{fix}");
    let text = e.to_string();
    assert!(
        text.contains("client_cpu") && text.contains("Fix:"),
        "{text}"
    );
}

#[test]
fn too_few_independent_samples_ask_for_as_long_a_run_as_the_check_says_within_the_rerun_limit() {
    let (ran, _) = scripted(1, vec![result(150.0, &[CORRELATED]), result(150.0, &[])]);
    assert_eq!(ran[1].seconds, 20.0, "20 s asked, 20 s run");
    let long = (
        "independence",
        "variance of the median ×90: latencies are correlated over longer than this run can average; run ≥ 100 s for a trusted p99",
    );
    let (ran, _) = scripted(1, vec![result(150.0, &[long]), result(150.0, &[])]);
    assert_eq!(ran[1].seconds, MAX_RERUN_S, "100 s asked, capped");
    // A failure that names no length doubles the run, within the probe limit.
    let samples = ("samples", "too few samples for p99: 600 < 1000; run longer");
    let (ran, _) = scripted(1, vec![result(150.0, &[samples]), result(150.0, &[])]);
    assert_eq!(ran[1].seconds, 2.0);
}

#[test]
fn at_most_three_runs_then_the_measurement_is_invalid() {
    let (ran, m) = scripted(1, vec![result(900.0, &[DEPTH_CAP])]);
    assert_eq!(ran.len(), MAX_ATTEMPTS);
    let conns: Vec<_> = ran.iter().map(|s| s.connections).collect();
    assert_eq!(
        conns,
        [8, 16, 32].map(Connections::Fixed),
        "each run doubles the connections"
    );
    let m = m.unwrap();
    assert_eq!(m.attempts.len(), 3);
    // Still at the depth cap with the client on schedule: the LC answers too slowly, so the
    // rate is beyond it rather than the instrument's failure.
    assert!(server_limited(&m.last().metrics));
    // Held back at the cap, the sends also leave the inter-arrival fit: still the LC's limit.
    let both = result(
        900.0,
        &[DEPTH_CAP, ("interarrival_fit", "D = 0.2, p = 0.000")],
    );
    assert!(server_limited(&both));
    // A client out of CPU is the instrument's failure, whatever else failed.
    assert!(!server_limited(&result(900.0, &[DEPTH_CAP, CLIENT_CPU])));
    assert!(!server_limited(&result(
        900.0,
        &[("interarrival_fit", "D = 0.2, p = 0.000")]
    )));
    assert_eq!(
        judge(&m, 20000.0, 99.0, 1000.0, "capacity", 1).unwrap(),
        RateVerdict::Beyond
    );
}

#[test]
fn only_valid_runs_say_held_or_not() {
    let (_, m) = scripted(1, vec![result(900.0, &[DEPTH_CAP]), result(150.0, &[])]);
    let m = m.unwrap();
    assert_eq!(
        judge(&m, 20000.0, 99.0, 1000.0, "x", 1).unwrap(),
        RateVerdict::Held
    );
    assert_eq!(
        judge(&m, 20000.0, 99.0, 100.0, "x", 1).unwrap(),
        RateVerdict::NotHeld
    );
    // A run that cannot happen is an error, not an invalid result.
    let e = measure_valid(start(1), 1, |_| Err(BenchError::Input("no binary".into())));
    assert!(e.is_err());
}

#[test]
fn baselines_keep_every_probe_with_valid_and_used_and_old_files_still_read() {
    // Written before validity was recorded: [target, metrics] pairs, all of them used.
    let old = json!({
        "low_load_p99_us": 120.0, "capacity_qps": 40000.0, "slo_us": 900.0, "slo_source": "",
        "peak_qps": 40000.0, "peak_source": "", "commands": [],
        "probes": [[2000.0, { "target_qps": 2000.0, "achieved_qps": 2001.0, "valid": false,
            "failed_checks": ["samples: too few"], "avg_us": null, "p50_us": null, "p95_us": null,
            "p99_us": 130.0, "p999_us": null, "count": null, "send_lag_p99_us": null,
            "late": null, "errors": null }]]
    });
    let b: LcBaseline = serde_json::from_value(old).unwrap();
    assert_eq!(b.probes.len(), 1);
    assert_eq!(b.probes[0].target_qps, 2000.0);
    assert!(!b.probes[0].valid && b.probes[0].used);
    // Written now: each probe an object with valid, used and what it measured.
    let mut b2 = b.clone();
    b2.probes[0].used = false;
    b2.probes[0].purpose = "low load".into();
    let text = serde_json::to_value(&b2).unwrap();
    assert_eq!(text["probes"][0]["used"], json!(false));
    assert_eq!(text["probes"][0]["valid"], json!(false));
    let back: LcBaseline = serde_json::from_value(text).unwrap();
    assert_eq!(back, b2);
}

#[test]
fn the_violation_cooldown_scales_with_the_traces_compression() {
    // A 90 s demo trace with 10 s windows: one latency window, not 300 s.
    assert_eq!(scaled_cooldown_s(90.0, 10.0), 10.0);
    // A trace as long as the day it stands for keeps the production value.
    assert_eq!(scaled_cooldown_s(86_400.0, 15.0), 300.0);
    assert_eq!(scaled_cooldown_s(43_200.0, 15.0), 150.0);
    assert_eq!(scaled_cooldown_s(10.0 * 86_400.0, 15.0), 300.0);
}

#[test]
fn colocation_agents_get_the_scaled_cooldown_and_the_agent_accepts_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = Options::defaults(
        Experiment::Colocation,
        true,
        tmp.path().join("no-such-headroom"),
    );
    opts.minutes = 1.5;
    opts.duration_s = 10.0;
    let s = common::quiet_session(Experiment::Colocation, opts, &tmp.path().join("run"));
    let addr: SocketAddr = "127.0.0.1:11211".parse().unwrap();
    let path = s
        .agent_config(&AgentRun {
            name: "coloc-hybrid".into(),
            policy: "hybrid".into(),
            tweak: headroom_bench::record::no_tweak,
            lc_pid: 4242,
            addr,
            be_argv: vec!["headroom".into(), "antagonist".into(), "spin".into()],
            slo_us: 500.0,
            peak_qps: 50_000.0,
            feed_socket: Some("/tmp/feed.sock".into()),
        })
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let c = headroom_control::config::Config::from_toml_str(&text)
        .unwrap_or_else(|e| panic!("the agent refuses it: {e}\n{text}"));
    assert_eq!(c.safety.violation_cooldown_s, 10.0, "{text}");
}

#[test]
fn a_run_failing_only_independence_is_never_used_but_its_high_tail_says_not_held() {
    // Every run failing only `independence`: none is used (figures come from valid runs only),
    // the last is the one that kept its schedule.
    let (ran, m) = scripted(1, vec![result(150.0, &[CORRELATED])]);
    let m = m.unwrap();
    assert!(ran.len() >= 2, "a longer run was tried");
    assert_eq!(m.used_index(), None);
    assert!(m.valid().is_none());
    assert!(std::ptr::eq(m.schedule_kept().unwrap(), m.last()));
    // its tail (150 µs) above a 100 µs bound: not held; within 200 µs: not a verdict
    assert_eq!(
        judge(&m, 20000.0, 99.0, 100.0, "x", 1).unwrap(),
        RateVerdict::NotHeld
    );
    assert!(judge(&m, 20000.0, 99.0, 200.0, "x", 1).is_err());
    // Independence beside an instrument failure: never used, never evidence.
    let (_, m) = scripted(1, vec![result(150.0, &[CORRELATED, CLIENT_CPU])]);
    let m = m.unwrap();
    assert!(m.valid().is_none() && m.schedule_kept().is_none());
}
