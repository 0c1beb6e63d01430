//! The cross-crate contracts 1–3 of docs/architecture.md, used the way other crates use them: through
//! the public paths only.

use headroom_load::dist::{Dist, DistError, KeyGenerator};
use headroom_load::protocol::{Op, Protocol, ProtocolError, Reply};
use headroom_load::stats::{gof, LatencyHist};
use headroom_types::load_result::{Check, ClientStats, LatencyStats, LoadResult};
use rand::SeedableRng;

#[test]
fn distributions_contract() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let value: Dist = "fb_value".parse().unwrap();
    let v: f64 = value.sample(&mut rng);
    assert!(v >= 0.0);
    assert!(value.mean().unwrap() > 190.0);
    assert!(value.cdf(1e6).unwrap() > 0.99);
    let err: DistError = "gamma:1,2".parse::<Dist>().unwrap_err();
    assert!(err.to_string().contains("gamma:1,2"));
    // -i exponential at 20k QPS over 4 connections: each connection's gaps have mean 200 µs.
    let ia = Dist::interarrival("exponential", 20_000.0 / 4.0).unwrap();
    assert!((ia.mean().unwrap() - 200e-6).abs() < 1e-12);
    let gaps: Vec<f64> = (0..2000).map(|_| ia.sample(&mut rng)).collect();
    assert!(gof::ks_test_dist(&gaps, &ia).unwrap().p_value > 0.001);
    let keys = KeyGenerator::new("fb_key".parse().unwrap(), 10_000);
    assert_eq!(keys.key(7), keys.key(7));
}

#[test]
fn protocol_contract() {
    let mut out = Vec::with_capacity(256);
    for p in [
        Protocol::MemcacheAscii,
        Protocol::MemcacheBinary,
        Protocol::Resp,
    ] {
        out.clear();
        p.encode(Op::Get, b"key", 0, &mut out);
        p.encode(Op::Set, b"key", 10, &mut out);
        assert!(!out.is_empty());
    }
    let p = Protocol::Resp;
    assert_eq!(p.parse(Op::Get, b"$-1"), Ok(None));
    assert_eq!(
        p.parse(Op::Get, b"$-1\r\n"),
        Ok(Some(Reply {
            consumed: 5,
            hit: false
        }))
    );
    let e: ProtocolError = p.parse(Op::Get, b"garbage\r\n").unwrap_err();
    assert_eq!(e.consumed(), None);
}

#[test]
fn histogram_contract_and_result_json() {
    let mut a = LatencyHist::new();
    let mut b = LatencyHist::new();
    for i in 0..5000u64 {
        a.record_ns(30_000 + i * 10);
        b.record_ns(60_000 + i * 10);
    }
    // Agents ship histograms as base64; the master merges them.
    let mut merged = LatencyHist::from_base64(&a.to_base64()).unwrap();
    merged.merge(&LatencyHist::from_base64(&b.to_base64()).unwrap());
    assert_eq!(merged.count(), 10_000);
    assert!((merged.percentile_us(50.0) - 70.0).abs() < 0.1);
    let read: LatencyStats = merged.summary();
    let result = LoadResult {
        version: 1,
        target_qps: 20_000.0,
        achieved_qps: 19_990.0,
        valid: true,
        checks: vec![Check {
            name: "rate".into(),
            ok: true,
            detail: "achieved within 0.05% of target".into(),
        }],
        read,
        read_uncorrected: a.summary(),
        update: LatencyHist::new().summary(),
        late: 0,
        errors: 0,
        misses: 0,
        client: ClientStats {
            cpu_s: 0.5,
            send_lag_p99_us: 2.0,
            busy_poll_s: 0.0,
            engine: Some("io_uring".into()),
            engine_fallback_reason: None,
            ..ClientStats::default()
        },
    };
    let json = serde_json::to_value(&result).unwrap();
    assert_eq!(json["read"]["count"], 10_000);
    assert!(json["read"]["p99_ci_us"].as_array().unwrap().len() == 2);
    assert_eq!(json["update"]["count"], 0);
    assert_eq!(json["client"]["engine"], "io_uring");
    // Additive: absent when unset, and a result without them still parses.
    assert!(json["client"].get("engine_fallback_reason").is_none());
    let old = r#"{"cpu_s": 1.0, "send_lag_p99_us": 3.0}"#;
    let c: ClientStats = serde_json::from_str(old).unwrap();
    assert_eq!((c.engine, c.engine_fallback_reason), (None, None));
}
