//! Figures for docs/load-distributions.md (not a timed test: ignored by default, prints only).
//! `cargo test --release -p headroom-load --test suite -- core_bench:: --ignored --nocapture`

use std::hint::black_box;
use std::time::Instant;

use headroom_load::dist::{Dist, KeyGenerator};
use headroom_load::protocol::{Op, Protocol};
use headroom_load::stats::{gof, LatencyHist};
use rand::SeedableRng;

fn ns_per(n: u64, start: Instant) -> f64 {
    start.elapsed().as_nanos() as f64 / n as f64
}

#[test]
#[ignore = "benchmark: prints figures"]
fn core_costs() {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let n = 2_000_000u64;
    for spec in [
        "200",
        "exponential:1",
        "fb_ia",
        "fb_key",
        "fb_value",
        "normal:100,10",
        "zipf:0.99,1000000",
    ] {
        let d: Dist = spec.parse().unwrap();
        let t = Instant::now();
        let mut sum = 0.0;
        for _ in 0..n {
            sum += d.sample(&mut rng);
        }
        black_box(sum);
        println!("sample {spec:<20} {:6.1} ns", ns_per(n, t));
    }
    let keys = KeyGenerator::new(Dist::fb_key(), 1_000_000);
    let mut out = Vec::with_capacity(256);
    let t = Instant::now();
    for i in 0..n {
        out.clear();
        keys.write_key(i % 1_000_000, &mut out);
    }
    println!("KeyGenerator::write_key (fb_key) {:6.1} ns", ns_per(n, t));

    for p in [
        Protocol::MemcacheAscii,
        Protocol::MemcacheBinary,
        Protocol::Resp,
    ] {
        let mut req = Vec::new();
        let t = Instant::now();
        for _ in 0..n {
            req.clear();
            p.encode(Op::Get, b"000000000000000000000000012345", 0, &mut req);
        }
        let enc = ns_per(n, t);
        let reply: Vec<u8> = match p {
            Protocol::MemcacheAscii => {
                let mut r = b"VALUE 000000000000000000000000012345 0 200\r\n".to_vec();
                r.extend([b'x'; 200]);
                r.extend(b"\r\nEND\r\n");
                r
            }
            Protocol::MemcacheBinary => {
                let mut r = vec![0x81, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 204];
                r.extend([0u8; 12]);
                r.extend([0u8; 204]);
                r
            }
            Protocol::Resp => {
                let mut r = b"$200\r\n".to_vec();
                r.extend([b'x'; 200]);
                r.extend(b"\r\n");
                r
            }
        };
        let t = Instant::now();
        for _ in 0..n {
            black_box(p.parse(Op::Get, black_box(&reply)).unwrap());
        }
        println!(
            "{p:<17} encode GET {enc:5.1} ns, parse 200-byte hit {:5.1} ns",
            ns_per(n, t)
        );
    }

    let mut h = LatencyHist::new();
    let lat: Dist = "gev:50000,20000,0.2".parse().unwrap();
    let vals: Vec<u64> = (0..n)
        .map(|_| lat.sample(&mut rng).max(0.0) as u64)
        .collect();
    let t = Instant::now();
    for &v in &vals {
        h.record_ns(v);
    }
    println!("LatencyHist::record_ns {:5.1} ns", ns_per(n, t));
    let t = Instant::now();
    let s = black_box(h.summary());
    println!(
        "summary() of {} values: {:.2} ms (p99 {:.1} us, CI {:.1}..{:.1})",
        s.count,
        t.elapsed().as_secs_f64() * 1e3,
        s.p99_us,
        s.p99_ci_us[0],
        s.p99_ci_us[1]
    );
    let t = Instant::now();
    let text = h.to_base64();
    let enc = t.elapsed();
    let t = Instant::now();
    black_box(LatencyHist::from_base64(&text).unwrap());
    println!(
        "to_base64 {} chars in {:.2} ms, from_base64 {:.2} ms",
        text.len(),
        enc.as_secs_f64() * 1e3,
        t.elapsed().as_secs_f64() * 1e3
    );
    let ia = Dist::interarrival("fb_ia", 5000.0).unwrap();
    let gaps: Vec<f64> = (0..100_000).map(|_| ia.sample(&mut rng)).collect();
    let t = Instant::now();
    let ks = gof::ks_test_dist(&gaps, &ia).unwrap();
    let ks_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let ad = gof::anderson_darling_dist(&gaps, &ia).unwrap();
    println!(
        "KS on 100k gaps {ks_ms:.1} ms (D {:.4}, p {:.2}); AD {:.1} ms (A2 {:.2}, p {:.2})",
        ks.statistic,
        ks.p_value,
        t.elapsed().as_secs_f64() * 1e3,
        ad.statistic,
        ad.p_value
    );
}
