use super::*;
use crate::dist::Dist;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn hist_of(values_ns: &[u64]) -> LatencyHist {
    let mut h = LatencyHist::new();
    for &v in values_ns {
        h.record_ns(v);
    }
    h
}

#[test]
fn percentiles_keep_three_significant_digits() {
    // 1..=100000 µs: the p-th percentile is p·1000 µs.
    let h = hist_of(&(1..=100_000u64).map(|us| us * 1000).collect::<Vec<_>>());
    assert_eq!(h.count(), 100_000);
    for p in [5.0, 50.0, 90.0, 99.0, 99.9, 99.99] {
        let want = p * 1000.0;
        let got = h.percentile_us(p);
        assert!((got - want).abs() <= want * 1e-3, "p{p}: {got} vs {want}");
    }
    assert!((h.mean_us() - 50_000.5).abs() < 50.0);
    assert_eq!(h.min_us(), 1.0);
    assert!((h.max_us() - 100_000.0).abs() <= 100.0);
    // Near the low end (a loopback round trip) the resolution is still 0.1%.
    let h = hist_of(&[12_345]);
    assert!((h.percentile_us(50.0) - 12.345).abs() <= 0.013);
}

#[test]
fn out_of_range_values_are_clamped_and_counted() {
    let mut h = hist_of(&[10, 999, 5_000, 61_000_000_000, u64::MAX]);
    h.record_duration(std::time::Duration::from_secs(100_000));
    assert_eq!(h.count(), 6);
    assert_eq!(h.clamped_low(), 2);
    assert_eq!(h.clamped_high(), 3);
    assert_eq!(h.min_us(), 1.0);
    assert!((h.max_us() - 60e6).abs() <= 60e3);
    h.reset();
    assert!(h.is_empty());
    assert_eq!(h.clamped_low(), 0);
}

#[test]
fn merge_equals_recording_everything_in_one() {
    let mut rng = StdRng::seed_from_u64(4);
    let d: Dist = "gev:50000,20000,0.3".parse().unwrap();
    let values: Vec<u64> = (0..30_000)
        .map(|_| d.sample(&mut rng).max(0.0) as u64)
        .collect();
    let all = hist_of(&values);
    let mut merged = LatencyHist::new();
    for chunk in values.chunks(7000) {
        merged.merge(&hist_of(chunk));
    }
    assert_eq!(merged.histogram(), all.histogram());
    assert_eq!(merged.summary(), all.summary());
    assert_eq!(merged.clamped_low(), all.clamped_low());
    // A histogram with other bounds (e.g. from another HDR tool) merges too, clamped.
    let mut foreign = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 1u64 << 50, 2).unwrap();
    foreign.record(500).unwrap();
    foreign.record(5_000_000).unwrap();
    foreign.record(1u64 << 45).unwrap();
    let mut h = LatencyHist::new();
    h.merge(&LatencyHist::from_histogram(&foreign));
    assert_eq!((h.count(), h.clamped_low(), h.clamped_high()), (3, 1, 1));
}

#[test]
fn summary_has_mutilates_fields() {
    let h = hist_of(&(1..=10_000u64).map(|i| i * 10_000).collect::<Vec<_>>()); // 10 µs..100 ms
    let s = h.summary();
    assert_eq!(s.count, 10_000);
    assert!((s.avg_us - 50_005.0).abs() < 50.0);
    assert!((s.std_us - 28_867.0).abs() < 100.0);
    assert_eq!(s.min_us, 10.0);
    for (got, want) in [
        (s.p5_us, 5_000.0),
        (s.p10_us, 10_000.0),
        (s.p50_us, 50_000.0),
        (s.p90_us, 90_000.0),
        (s.p95_us, 95_000.0),
        (s.p99_us, 99_000.0),
        (s.p999_us, 99_900.0),
        (s.p9999_us, 99_990.0),
    ] {
        assert!((got - want).abs() <= want * 1e-3, "{got} vs {want}");
    }
    assert!(s.p99_ci_us[0] <= s.p99_us && s.p99_us <= s.p99_ci_us[1]);
    assert!(s.p999_ci_us[0] <= s.p999_us && s.p999_us <= s.p999_ci_us[1]);
    // n·p ± 1.96·√(n·p·(1−p)) = 9900 ± 19.5 → ranks 9880..9921.
    assert_eq!(percentile_rank_interval(10_000, 0.99), (9880, 9921));
    assert!(
        (s.p99_ci_us[0] - 98_800.0).abs() <= 100.0,
        "{:?}",
        s.p99_ci_us
    );
    assert!(
        (s.p99_ci_us[1] - 99_210.0).abs() <= 100.0,
        "{:?}",
        s.p99_ci_us
    );
    assert_eq!(LatencyHist::new().summary(), Default::default());
}

#[test]
fn confidence_interval_covers_the_true_percentile() {
    // Exponential latencies with mean 100 µs: the true p99 is 100·ln(100) µs, p99.9 100·ln(1000).
    let d = Dist::Exponential {
        lambda: 1.0 / 100_000.0,
    };
    let true_p99 = 100.0 * 100f64.ln();
    let true_p999 = 100.0 * 1000f64.ln();
    let trials = 200;
    let (mut covered99, mut covered999) = (0, 0);
    for seed in 0..trials {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut h = LatencyHist::new();
        for _ in 0..20_000 {
            h.record_ns(d.sample(&mut rng) as u64);
        }
        let [lo, hi] = h.percentile_ci_us(99.0);
        covered99 += usize::from(lo <= true_p99 && true_p99 <= hi);
        let [lo, hi] = h.percentile_ci_us(99.9);
        covered999 += usize::from(lo <= true_p999 && true_p999 <= hi);
    }
    // Nominal 95%: with 200 trials the coverage's standard error is 1.5%; ≥ 90% is 3.3 below.
    assert!(covered99 >= 180, "p99 covered {covered99}/{trials}");
    assert!(covered999 >= 180, "p99.9 covered {covered999}/{trials}");
    // …and the interval is not trivially wide.
    let mut rng = StdRng::seed_from_u64(999);
    let mut h = LatencyHist::new();
    for _ in 0..20_000 {
        h.record_ns(d.sample(&mut rng) as u64);
    }
    let [lo, hi] = h.percentile_ci_us(99.0);
    assert!(hi - lo < 0.2 * true_p99, "{lo}..{hi}");
}

#[test]
fn too_few_samples_for_a_percentile() {
    assert_eq!(min_samples_for(50.0), 20);
    assert_eq!(min_samples_for(99.0), 1000);
    assert_eq!(min_samples_for(99.9), 10_000);
    assert_eq!(min_samples_for(99.99), 100_000);
    assert_eq!(min_samples_for(100.0), u64::MAX);
    assert!(enough_samples(1000, 99.0));
    assert!(!enough_samples(999, 99.0));
    // With few samples the interval runs to the extremes.
    let h = hist_of(&[1_000_000, 2_000_000, 3_000_000]);
    let [lo, hi] = h.percentile_ci_us(99.0);
    assert!(lo >= 1_000.0 && (hi - 3_000.0).abs() <= 3.0, "{lo}..{hi}");
}

#[test]
fn base64_round_trip() {
    let mut rng = StdRng::seed_from_u64(8);
    let mut h = LatencyHist::new();
    for _ in 0..50_000 {
        h.record_ns(20_000 + rng.random_range(0..2_000_000u64));
    }
    let text = h.to_base64();
    assert!(text.len() < 40_000, "compressed to {} chars", text.len());
    let back = LatencyHist::from_base64(&text).unwrap();
    assert_eq!(back.histogram(), h.histogram());
    assert_eq!(back.summary(), h.summary());
    let empty = LatencyHist::from_base64(&LatencyHist::new().to_base64()).unwrap();
    assert!(empty.is_empty());
    // hdrhistogram's own deserializer reads it (what other HDR tools do).
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&text)
        .unwrap();
    let raw: hdrhistogram::Histogram<u64> = hdrhistogram::serialization::Deserializer::new()
        .deserialize(&mut std::io::Cursor::new(bytes))
        .unwrap();
    assert_eq!(raw.len(), 50_000);
}

#[test]
fn bad_wire_forms_are_named() {
    match LatencyHist::from_base64("not base64 at all!") {
        Err(HistError::Base64 { input, .. }) => assert!(input.contains("not base64"), "{input}"),
        other => panic!("{other:?}"),
    }
    let e = LatencyHist::from_base64("aGVsbG8gd29ybGQ=").unwrap_err();
    assert!(matches!(e, HistError::Decode { .. }), "{e:?}");
    assert!(e.to_string().contains("aGVsbG8gd29ybGQ="), "{e}");
}

use rand::Rng as _;

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn from_base64_never_panics(text in "[A-Za-z0-9+/=]{0,200}") {
            let _ = LatencyHist::from_base64(&text);
        }

        #[test]
        fn corrupted_histograms_never_panic(flips in proptest::collection::vec((0usize..4096, any::<u8>()), 1..6)) {
            let mut h = LatencyHist::new();
            for v in [1_000u64, 50_000, 2_000_000, 7_000_000_000] {
                h.record_ns(v);
            }
            let mut bytes = base64::engine::general_purpose::STANDARD
                .decode(h.to_base64())
                .unwrap();
            for (at, b) in flips {
                let i = at % bytes.len();
                bytes[i] = b;
            }
            let text = base64::engine::general_purpose::STANDARD.encode(&bytes);
            let _ = LatencyHist::from_base64(&text);
        }

        #[test]
        fn merge_is_order_independent(a in proptest::collection::vec(0u64..100_000_000_000, 0..200),
                                      b in proptest::collection::vec(0u64..100_000_000_000, 0..200)) {
            let (ha, hb) = (hist_of(&a), hist_of(&b));
            let mut ab = ha.clone();
            ab.merge(&hb);
            let mut ba = hb.clone();
            ba.merge(&ha);
            prop_assert_eq!(&ab, &ba);
            let all: Vec<u64> = a.iter().chain(&b).copied().collect();
            prop_assert_eq!(&ab, &hist_of(&all));
        }
    }
}
