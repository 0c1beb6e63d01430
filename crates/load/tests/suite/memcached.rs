//! Against a real memcached (started on a free loopback port; skipped when not installed):
//! preload then GETs hit, the binary protocol, SETs, measurement connections, scan and search.

use crate::support;

use headroom_load::sweep::{scan, search};
use headroom_load::{run_report, LoadOptions, ProtocolKind, ScanSpec, SearchSpec};
use support::Memcached;

fn opts(server: &str) -> LoadOptions {
    LoadOptions {
        servers: vec![server.to_string()],
        qps: 2000,
        time_s: 1.0,
        records: 1000,
        seed: Some(7),
        drain_ms: 500,
        ..LoadOptions::default()
    }
}

#[test]
fn preloaded_keys_all_hit_over_ascii() {
    let Some(mc) = Memcached::start("preloaded_keys_all_hit_over_ascii") else {
        return;
    };
    let r = run_report(&opts(&mc.spec()), &mut |_| {}).expect("run");
    assert!(r.result.read.count > 1500, "count {}", r.result.read.count);
    assert_eq!(r.result.misses, 0);
    assert_eq!(r.result.errors, 0);
    assert!(r.bytes_rx > 200 * r.result.read.count, "values come back");
    let json = serde_json::to_value(&r).unwrap();
    for key in [
        "version",
        "target_qps",
        "achieved_qps",
        "valid",
        "checks",
        "read",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
}

#[test]
fn binary_protocol_with_updates_and_variable_sizes() {
    let Some(mc) = Memcached::start("binary_protocol_with_updates_and_variable_sizes") else {
        return;
    };
    let o = LoadOptions {
        protocol: ProtocolKind::Binary,
        update: 0.3,
        keysize: "fb_key".into(),
        valuesize: "fb_value".into(),
        ..opts(&mc.spec())
    };
    let r = run_report(&o, &mut |_| {}).expect("run");
    assert!(
        r.result.update.count > 300,
        "sets {}",
        r.result.update.count
    );
    assert!(r.result.read.count > 1000, "gets {}", r.result.read.count);
    assert_eq!(r.result.misses, 0, "every key was preloaded");
    assert_eq!(r.result.errors, 0);
}

#[test]
fn unloaded_keys_miss() {
    let Some(mc) = Memcached::start("unloaded_keys_miss") else {
        return;
    };
    let o = LoadOptions {
        noload: true,
        ..opts(&mc.spec())
    };
    let r = run_report(&o, &mut |_| {}).expect("run");
    assert_eq!(r.result.misses, r.result.read.count);
}

#[test]
fn measurement_connections_are_the_reported_latency() {
    let Some(mc) = Memcached::start("measurement_connections_are_the_reported_latency") else {
        return;
    };
    let o = LoadOptions {
        qps: 3000,
        measure_connections: Some(1),
        measure_qps: Some(500),
        threads: 1,
        connections: 2,
        ..opts(&mc.spec())
    };
    let r = run_report(&o, &mut |_| {}).expect("run");
    assert!(r.measurement_connections);
    // Reported reads are the measurement connections' ~500/s, achieved counts all ~3000/s.
    let n = r.result.read.count as f64;
    assert!((350.0..650.0).contains(&n), "measured {n}");
    assert!(r.completed > 2500, "completed {}", r.completed);
}

#[test]
fn scan_gives_a_row_per_step_and_search_finds_a_rate() {
    let Some(mc) = Memcached::start("scan_gives_a_row_per_step_and_search_finds_a_rate") else {
        return;
    };
    let o = LoadOptions {
        time_s: 0.5,
        ..opts(&mc.spec())
    };
    let mut seen = 0;
    let rows = scan(
        &o,
        &ScanSpec {
            min: 500,
            max: 1500,
            step: 500,
        },
        &mut |_| seen += 1,
    )
    .expect("scan");
    assert_eq!(
        rows.iter().map(|r| r.qps).collect::<Vec<_>>(),
        vec![500, 1000, 1500]
    );
    assert_eq!(seen, 3);
    // A generous target: every rate up to the peak meets it, so the answer is near the peak.
    let spec = SearchSpec {
        percentile: 50.0,
        target_us: 100_000.0,
    };
    let out = search(&LoadOptions { noload: true, ..o }, &spec, &mut |_| {}).expect("search");
    assert!(out.curve.len() >= 2);
    assert!(
        out.curve.windows(2).all(|w| w[0].qps <= w[1].qps),
        "sorted curve"
    );
    let peak = out.curve.iter().find(|r| r.qps == 0).expect("the peak run");
    eprintln!(
        "search: peak {:.0} QPS, best {:?}",
        peak.report.result.achieved_qps,
        out.best.as_ref().map(|b| b.qps)
    );
    // The answer is the highest rate that met the target with its rate held (timing on a shared
    // machine decides which rates those are; the bisection's bookkeeping must agree with them).
    let met = |r: &headroom_load::sweep::SweepRow| {
        r.qps > 0
            && r.percentile_us <= spec.target_us
            && r.report
                .result
                .checks
                .iter()
                .all(|c| c.name != "rate" || c.ok)
    };
    if let Some(best) = &out.best {
        assert!(met(best));
        assert!(best.qps as f64 <= peak.report.result.achieved_qps);
    }
    assert_eq!(
        out.best.as_ref().map(|b| b.qps),
        out.curve.iter().filter(|r| met(r)).map(|r| r.qps).max()
    );
}
