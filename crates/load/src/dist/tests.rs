use super::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn parse(s: &str) -> Dist {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn parse_err(s: &str) -> DistError {
    match s.parse::<Dist>() {
        Ok(d) => panic!("{s} parsed as {d:?}"),
        Err(e) => e,
    }
}

#[test]
fn parses_every_syntax() {
    assert_eq!(parse("30"), Dist::Fixed(30.0));
    assert_eq!(parse("0"), Dist::Fixed(0.0));
    assert_eq!(parse("0.5"), Dist::Fixed(0.5));
    assert_eq!(parse("fixed:200"), Dist::Fixed(200.0));
    assert_eq!(parse("uniform:100"), Dist::Uniform { max: 100.0 });
    assert_eq!(
        parse("normal:10,2.5"),
        Dist::Normal {
            mean: 10.0,
            sd: 2.5
        }
    );
    assert_eq!(parse("exponential:4"), Dist::Exponential { lambda: 4.0 });
    assert_eq!(parse("exponential"), Dist::Exponential { lambda: 1.0 });
    assert_eq!(
        parse("pareto:15,214.476,0.348238"),
        Dist::Pareto {
            loc: 15.0,
            scale: 214.476,
            shape: 0.348238
        }
    );
    assert_eq!(
        parse("gev:1,2,-0.5"),
        Dist::Gev {
            loc: 1.0,
            scale: 2.0,
            shape: -0.5
        }
    );
    assert_eq!(parse("fb_key"), Dist::fb_key());
    assert_eq!(parse("fb_value"), Dist::fb_value());
    assert_eq!(parse("fb_ia"), Dist::fb_ia());
    match parse("zipf:0.99") {
        Dist::Zipf(z) => {
            assert_eq!(z.exponent(), 0.99);
            assert_eq!(z.records(), DEFAULT_RECORDS);
        }
        other => panic!("{other:?}"),
    }
    match parse("zipf:1.2,500") {
        Dist::Zipf(z) => assert_eq!(z.records(), 500),
        other => panic!("{other:?}"),
    }
    // Case and surrounding spaces do not matter, as in mutilate.
    assert_eq!(parse(" Exponential:2 "), Dist::Exponential { lambda: 2.0 });
    assert_eq!(parse("FB_KEY"), Dist::fb_key());
}

#[test]
fn errors_name_the_input_and_what_was_expected() {
    let e = parse_err("expareto:1,2,3");
    assert_eq!(e.input, "expareto:1,2,3");
    assert!(
        e.reason.contains("unknown distribution \"expareto\""),
        "{e}"
    );
    assert!(
        e.reason.contains("fb_value") && e.reason.contains("zipf:S"),
        "{e}"
    );
    // mutilate's substring match made this a normal; an exact match refuses it.
    assert!(parse_err("lognormal:1,2")
        .reason
        .contains("unknown distribution \"lognormal\""));
    let e = parse_err("normal:5");
    assert!(e.to_string().contains("normal:5"), "{e}");
    assert!(e.reason.contains("normal:M,SD"), "{e}");
    let e = parse_err("pareto:0,1");
    assert!(e.reason.contains("3 parameters"), "{e}");
    let e = parse_err("uniform:abc");
    assert!(e.reason.contains("\"abc\""), "{e}");
    assert!(parse_err("fb_key:3").reason.contains("no parameters"));
    assert!(parse_err("exponential:0").reason.contains("L must be > 0"));
    assert!(parse_err("exponential:1,2")
        .reason
        .contains("0 or 1 parameters"));
    assert!(parse_err("gev:0,-1,0.1").reason.contains("SCALE"));
    assert!(parse_err("pareto:0,0,0.1").reason.contains("SCALE"));
    assert!(parse_err("normal:1,-1").reason.contains("SD"));
    assert!(parse_err("uniform:-3").reason.contains("MAX"));
    assert!(parse_err("zipf:0").reason.contains("S must be > 0"));
    assert!(parse_err("zipf:1,0").reason.contains("N must be"));
    assert!(parse_err("zipf:1,2.5").reason.contains("N must be"));
    assert!(parse_err("").reason.contains("empty"));
    assert!(parse_err("inf").reason.contains("finite"));
    assert!(parse_err("fixed:nan").reason.contains("finite"));
    assert!(parse_err("normal:1,").reason.contains("SD"));
}

#[test]
fn display_parses_back() {
    for spec in [
        "30",
        "uniform:100",
        "normal:10,2.5",
        "exponential",
        "pareto:0,16.0292,0.154971",
        "gev:30.7984,8.20449,0.078688",
        "fb_value",
        "fb_key",
        "fb_ia",
        "zipf:0.99,1000",
    ] {
        let d = parse(spec);
        assert_eq!(parse(&d.to_string()), d, "{spec} → {d}");
    }
}

#[test]
fn facebook_distributions_use_mutilates_constants() {
    assert_eq!(
        Dist::fb_key(),
        Dist::Gev {
            loc: 30.7984,
            scale: 8.20449,
            shape: 0.078688
        }
    );
    assert_eq!(
        Dist::fb_ia(),
        Dist::Pareto {
            loc: 0.0,
            scale: 16.0292,
            shape: 0.154971
        }
    );
    let Dist::Discrete { table, rest } = Dist::fb_value() else {
        panic!("fb_value is a discrete table")
    };
    assert_eq!(table.len(), 15);
    assert_eq!(table[2], (0.17820, 2.0));
    assert_eq!(table[14], (0.01980, 14.0));
    assert_eq!(
        *rest,
        Dist::Pareto {
            loc: 15.0,
            scale: 214.476,
            shape: 0.348238
        }
    );
    // Means from the constants (computed independently): table 0.44155 of the mass with
    // Σ p·v = 2.29836, the rest GPareto mean 15 + 214.476 / (1 − 0.348238).
    let table_mass: f64 = FB_VALUE_TABLE.iter().map(|&(p, _)| p).sum();
    assert!((table_mass - 0.44155).abs() < 1e-12);
    let fb_value_mean = 2.29836 + (1.0 - 0.44155) * (15.0 + 214.476 / (1.0 - 0.348238));
    assert!((Dist::fb_value().mean().unwrap() - fb_value_mean).abs() < 1e-9);
    assert!((Dist::fb_value().mean().unwrap() - 194.444_833).abs() < 1e-5);
    // GEV mean μ + σ(Γ(1−ξ) − 1)/ξ = 36.22305 (Python's math.gamma).
    assert!((Dist::fb_key().mean().unwrap() - 36.223_050_05).abs() < 1e-6);
}

#[test]
fn key_lengths_match_mutilates_formula() {
    // Golden values from an independent implementation of mutilate's KeyGenerator:
    // U = fnv_64(i) / ULLONG_MAX, G = GEV(U), keylen = max(round(G), floor(log10(10000)) + 1).
    let g = KeyGenerator::new(Dist::fb_key(), 10_000);
    for (index, len) in [(0, 38), (1, 35), (2, 51), (42, 91), (777, 45), (9999, 23)] {
        assert_eq!(g.key_len(index), len, "record {index}");
    }
    let key = g.key(42);
    assert_eq!(key.len(), 91);
    assert!(key.starts_with(b"0000") && key.ends_with(b"0042"));
}

/// Sample mean within 5 standard errors of the analytic mean, sample variance within 5
/// standard errors (estimated from the sample's fourth moment) of the analytic variance.
fn check_moments(d: &Dist, n: usize, seed: u64, check_variance: bool) {
    let mut rng = StdRng::seed_from_u64(seed);
    let x: Vec<f64> = (0..n).map(|_| d.sample(&mut rng)).collect();
    let nf = n as f64;
    let mean = x.iter().sum::<f64>() / nf;
    let want_mean = d.mean().unwrap();
    let want_var = d.variance().unwrap();
    let se_mean = (want_var / nf).sqrt();
    assert!(
        (mean - want_mean).abs() <= 5.0 * se_mean + 1e-12,
        "{d}: mean {mean} vs {want_mean} ± {se_mean}"
    );
    if check_variance {
        let m2 = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / nf;
        let m4 = x.iter().map(|v| (v - mean).powi(4)).sum::<f64>() / nf;
        let se_var = ((m4 - m2 * m2) / nf).sqrt();
        assert!(
            (m2 - want_var).abs() <= 5.0 * se_var + 1e-12,
            "{d}: variance {m2} vs {want_var} ± {se_var}"
        );
    }
}

/// The fraction of draws at or below quantile(p) is p within 5 binomial standard errors.
fn check_quantiles(d: &Dist, n: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let x: Vec<f64> = (0..n).map(|_| d.sample(&mut rng)).collect();
    for p in [0.05, 0.25, 0.5, 0.9, 0.99] {
        let q = d.quantile(p).unwrap();
        assert!(
            (d.cdf(q).unwrap() - p).abs() < 1e-6,
            "{d}: cdf(quantile({p}))"
        );
        let below = x.iter().filter(|&&v| v <= q).count() as f64 / n as f64;
        let se = (p * (1.0 - p) / n as f64).sqrt();
        assert!((below - p).abs() <= 5.0 * se, "{d}: P(X <= q{p}) = {below}");
    }
}

#[test]
fn continuous_samples_match_analytic_moments_and_quantiles() {
    let n = 200_000;
    for (i, spec) in [
        "uniform:100",
        "normal:50,7",
        "exponential:0.25",
        "fb_key",
        "gev:5,2,0",
        "gev:5,2,-0.3",
        "pareto:1,2,0.1",
        "pareto:1,2,0",
        "pareto:1,2,-0.5",
    ]
    .iter()
    .enumerate()
    {
        let d = parse(spec);
        check_moments(&d, n, 100 + i as u64, true);
        check_quantiles(&d, n, 200 + i as u64);
    }
    // Heavy tails (infinite fourth moment): the mean only.
    check_moments(&Dist::fb_ia(), n, 300, false);
    check_quantiles(&Dist::fb_ia(), n, 301);
    check_moments(&Dist::fb_value(), n, 302, false);
}

#[test]
fn normal_is_a_true_normal() {
    // mutilate's sqrt(-2 ln U)·cos(2πU) from a single uniform is not normal; ours has 68.27%
    // of the mass within one sd and no skew.
    let d = parse("normal:0,1");
    let mut rng = StdRng::seed_from_u64(5);
    let n = 100_000;
    let x: Vec<f64> = (0..n).map(|_| d.sample(&mut rng)).collect();
    let within = x.iter().filter(|v| v.abs() <= 1.0).count() as f64 / n as f64;
    assert!((within - 0.682_689).abs() < 5.0 * (0.68 * 0.32 / n as f64).sqrt());
    let skew = x.iter().map(|v| v.powi(3)).sum::<f64>() / n as f64;
    assert!(
        skew.abs() < 5.0 * (15.0 / n as f64).sqrt(),
        "skewness {skew}"
    );
}

#[test]
fn fb_value_table_frequencies() {
    let d = Dist::fb_value();
    let mut rng = StdRng::seed_from_u64(9);
    let n = 200_000;
    let mut small = [0usize; 15];
    let mut tail = 0usize;
    for _ in 0..n {
        let v = d.sample(&mut rng);
        if v < 15.0 {
            assert_eq!(v.fract(), 0.0);
            small[v as usize] += 1;
        } else {
            tail += 1;
        }
    }
    for (k, &(p, _)) in FB_VALUE_TABLE.iter().enumerate() {
        let se = (n as f64 * p * (1.0 - p)).sqrt();
        assert!(
            (small[k] as f64 - p * n as f64).abs() <= 5.0 * se + 1.0,
            "size {k}: {} vs {}",
            small[k],
            p * n as f64
        );
    }
    let p_tail = 1.0 - 0.44155;
    assert!((tail as f64 / n as f64 - p_tail).abs() < 5.0 * (p_tail * 0.44155 / n as f64).sqrt());
    // The cdf steps at the table sizes and is continuous above 15.
    assert!((d.cdf(2.0).unwrap() - (0.00536 + 0.00047 + 0.17820)).abs() < 1e-12);
    assert!((d.cdf(14.99).unwrap() - 0.44155).abs() < 1e-12);
    assert!(d.cdf(1e9).unwrap() > 0.999_999);
    assert!(!d.is_continuous());
}

#[test]
fn interarrival_mean_is_one_over_rate() {
    let rate = 2500.0;
    for spec in [
        "exponential",
        "exponential:1",
        "fb_ia",
        "pareto:0,1,0.3",
        "fixed:7",
        "3",
        "uniform:1",
        "normal:1,0.0001",
        "gev:0,1,0.1",
        "gev:0,1,0",
        "gev:0,1,-0.3",
    ] {
        let d = Dist::interarrival(spec, rate).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let mean = d.mean().unwrap();
        assert!((mean - 1.0 / rate).abs() < 1e-12, "{spec}: mean {mean}");
        check_moments(&d, 50_000, 77, false);
    }
    // fb_ia keeps its shape, and mutilate's scale (1 − shape)/λ.
    assert_eq!(
        Dist::interarrival("fb_ia", 1000.0).unwrap(),
        Dist::Pareto {
            loc: 0.0,
            scale: (1.0 - 0.154971) / 1000.0,
            shape: 0.154971
        }
    );
    assert_eq!(
        Dist::interarrival("exponential", 50.0).unwrap(),
        Dist::Exponential { lambda: 50.0 }
    );
    // Rate 0 = no pacing, whatever the shape (mutilate's "0 = peak QPS").
    assert_eq!(Dist::interarrival("fb_ia", 0.0).unwrap(), Dist::Fixed(0.0));
}

#[test]
fn interarrival_refusals_say_why() {
    for (spec, rate, needle) in [
        ("fb_value", 10.0, "not an inter-arrival"),
        ("zipf:1", 10.0, "not an inter-arrival"),
        ("pareto:0,1,1.5", 10.0, "SHAPE < 1"),
        ("pareto:1,1,0.1", 10.0, "LOC"),
        ("gev:0,1,-2", 10.0, "SHAPE"),
        ("exponential", -1.0, "rate"),
        ("exponential", f64::NAN, "rate"),
        ("bogus", 10.0, "unknown distribution"),
    ] {
        let e = Dist::interarrival(spec, rate).unwrap_err();
        assert_eq!(e.input, spec);
        assert!(e.reason.contains(needle), "{spec}: {e}");
    }
}

#[test]
fn sample_len_truncates_and_clamps() {
    let mut rng = StdRng::seed_from_u64(1);
    assert_eq!(Dist::Fixed(200.9).sample_len(&mut rng, 1 << 20), 200);
    assert_eq!(Dist::Fixed(-5.0).sample_len(&mut rng, 100), 0);
    assert_eq!(Dist::Fixed(1e12).sample_len(&mut rng, 4096), 4096);
    let d = parse("normal:10,100");
    assert!((0..1000).all(|_| d.sample_len(&mut rng, 64) <= 64));
}

#[test]
fn zipf_index_moments_and_cdf() {
    let d = parse("zipf:0.99,1000");
    check_moments(&d, 200_000, 21, true);
    let mut rng = StdRng::seed_from_u64(3);
    assert!((0..10_000).all(|_| {
        let v = d.sample(&mut rng);
        (0.0..1000.0).contains(&v) && v.fract() == 0.0
    }));
    // P(index 0) = 1 / H(1000, 0.99).
    let h: f64 = (1..=1000).map(|k| (k as f64).powf(-0.99)).sum();
    assert!((d.cdf(0.0).unwrap() - 1.0 / h).abs() < 1e-12);
    assert_eq!(d.cdf(999.0), Some(1.0));
    assert_eq!(d.cdf(-1.0), Some(0.0));
    assert_eq!(d.from_uniform(1e-9), 0.0);
    assert_eq!(d.from_uniform(1.0), 999.0);
    // A key generator over zipf sizes stays cheap (O(1) per key even for 4 Mi records).
    let big = Dist::zipf(1.0, 1 << 22).unwrap();
    assert!(big.from_uniform(0.5) > 0.0);
    let d = d.with_records(10).unwrap();
    assert!(matches!(&d, Dist::Zipf(z) if z.records() == 10));
    assert_eq!(Dist::Fixed(1.0).with_records(10).unwrap(), Dist::Fixed(1.0));
}

#[test]
fn cdfs_have_the_right_support() {
    assert_eq!(parse("pareto:15,1,0.3").cdf(14.0), Some(0.0));
    assert_eq!(parse("pareto:0,1,-0.5").cdf(2.0), Some(1.0)); // upper end 2
    assert_eq!(parse("gev:0,1,0.5").cdf(-2.0), Some(0.0)); // lower end −2
    assert_eq!(parse("gev:0,1,-0.5").cdf(2.0), Some(1.0)); // upper end 2
    assert_eq!(parse("exponential:3").cdf(-1.0), Some(0.0));
    assert_eq!(parse("uniform:10").cdf(5.0), Some(0.5));
    assert_eq!(Dist::Fixed(3.0).cdf(2.9), Some(0.0));
    assert_eq!(Dist::Fixed(3.0).cdf(3.0), Some(1.0));
    assert_eq!(parse("uniform:10").cdf(f64::NAN), None);
    assert!(parse("pareto:0,1,1.5").mean().is_none());
    assert!(parse("pareto:0,1,0.6").variance().is_none());
    assert!(parse("gev:0,1,1").mean().is_none());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn parsing_never_panics(spec in "\\PC{0,40}") {
            if let Err(e) = spec.parse::<Dist>() {
                prop_assert_eq!(e.input, spec);
            }
        }

        #[test]
        fn parsing_spec_like_text_never_panics(
            name in prop_oneof![
                Just("fixed"), Just("uniform"), Just("normal"), Just("exponential"),
                Just("pareto"), Just("gev"), Just("zipf"), Just("fb_key"), Just("x")
            ],
            args in proptest::collection::vec(-1e6f64..1e6, 0..5),
        ) {
            let text: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let spec = format!("{name}:{}", text.join(","));
            if let Ok(d) = spec.parse::<Dist>() {
                // Whatever parses displays back to itself and samples without panicking.
                prop_assert_eq!(&d.to_string().parse::<Dist>().unwrap(), &d);
                let mut rng = StdRng::seed_from_u64(1);
                for _ in 0..10 {
                    let _ = d.sample(&mut rng);
                }
            }
        }

        #[test]
        fn interarrival_means_follow_any_rate(rate in 1e-3f64..1e7, which in 0usize..6) {
            let spec = ["exponential", "fb_ia", "uniform:1", "fixed:1", "gev:0,1,0.2", "normal:1,0"][which];
            let d = Dist::interarrival(spec, rate).unwrap();
            let mean = d.mean().unwrap();
            prop_assert!((mean * rate - 1.0).abs() < 1e-9, "{} at {}: {}", spec, rate, mean);
        }
    }
}
