//! Goodness of fit of samples to a fully specified continuous distribution (the load
//! generator's inter-arrival self-check): Kolmogorov–Smirnov and Anderson–Darling, with
//! asymptotic p-values.

use crate::dist::Dist;

/// Result of a fit test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GofResult {
    /// Number of samples.
    pub n: usize,
    /// D (Kolmogorov–Smirnov) or A² (Anderson–Darling).
    pub statistic: f64,
    /// Probability of a statistic at least this large if the samples come from the
    /// distribution (small → reject the fit).
    pub p_value: f64,
}

fn sorted(samples: &[f64]) -> Option<Vec<f64>> {
    if samples.is_empty() || samples.iter().any(|x| x.is_nan()) {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    Some(v)
}

/// One-sample Kolmogorov–Smirnov test: D = sup |F_n(x) − F(x)|, p-value from the Kolmogorov
/// distribution at (√n + 0.12 + 0.11/√n)·D (Stephens' small-sample correction). `None` for no
/// samples or a NaN sample.
pub fn ks_test<F: Fn(f64) -> f64>(samples: &[f64], cdf: F) -> Option<GofResult> {
    let x = sorted(samples)?;
    let n = x.len() as f64;
    let mut d: f64 = 0.0;
    for (i, &xi) in x.iter().enumerate() {
        let f = cdf(xi).clamp(0.0, 1.0);
        d = d.max((i as f64 + 1.0) / n - f).max(f - i as f64 / n);
    }
    let sqrt_n = n.sqrt();
    let lambda = (sqrt_n + 0.12 + 0.11 / sqrt_n) * d;
    Some(GofResult {
        n: x.len(),
        statistic: d,
        p_value: kolmogorov_survival(lambda),
    })
}

/// P(K > λ) for the Kolmogorov distribution.
pub fn kolmogorov_survival(lambda: f64) -> f64 {
    if lambda <= 0.0 {
        return 1.0;
    }
    if lambda < 1.18 {
        // P(K ≤ λ) = √(2π)/λ · Σ exp(−(2j−1)²π²/(8λ²)), fast for small λ.
        let c = -std::f64::consts::PI.powi(2) / (8.0 * lambda * lambda);
        let sum: f64 = (1..=5)
            .map(|j| ((2 * j - 1) as f64).powi(2))
            .map(|k| (k * c).exp())
            .sum();
        (1.0 - (2.0 * std::f64::consts::PI).sqrt() / lambda * sum).clamp(0.0, 1.0)
    } else {
        // P(K > λ) = 2 Σ (−1)^(j−1) exp(−2j²λ²).
        let sum: f64 = (1..=10)
            .map(|j| {
                let sign = if j % 2 == 1 { 1.0 } else { -1.0 };
                sign * (-2.0 * (j * j) as f64 * lambda * lambda).exp()
            })
            .sum();
        (2.0 * sum).clamp(0.0, 1.0)
    }
}

/// Anderson–Darling test against a fully specified distribution:
/// A² = −n − (1/n) Σ (2i−1)·[ln F(x₍ᵢ₎) + ln(1 − F(x₍ₙ₊₁₋ᵢ₎))], more sensitive in the tails than
/// KS. p-value from the asymptotic distribution (Marsaglia & Marsaglia 2004), good for n ≥ 50.
pub fn anderson_darling<F: Fn(f64) -> f64>(samples: &[f64], cdf: F) -> Option<GofResult> {
    let x = sorted(samples)?;
    let n = x.len();
    // Keep the logs finite for samples at (or rounded onto) the support's ends.
    const EPS: f64 = 1e-15;
    let f: Vec<f64> = x.iter().map(|&v| cdf(v).clamp(EPS, 1.0 - EPS)).collect();
    let mut sum = 0.0;
    for i in 0..n {
        let w = (2 * i + 1) as f64;
        sum += w * (f[i].ln() + (-f[n - 1 - i]).ln_1p());
    }
    let a2 = -(n as f64) - sum / n as f64;
    Some(GofResult {
        n,
        statistic: a2,
        p_value: (1.0 - anderson_darling_cdf(a2)).clamp(0.0, 1.0),
    })
}

/// Asymptotic P(A² ≤ z) (Marsaglia & Marsaglia, "Evaluating the Anderson-Darling
/// distribution", J. Stat. Software 9(2), 2004), absolute error below 2e-6.
pub fn anderson_darling_cdf(z: f64) -> f64 {
    if z <= 0.0 {
        return 0.0;
    }
    if z < 2.0 {
        (-1.233_714_1 / z).exp() / z.sqrt()
            * (2.000_12
                + (0.247_105
                    - (0.064_982_1 - (0.034_796_2 - (0.011_672 - 0.001_686_91 * z) * z) * z) * z)
                    * z)
    } else {
        (-(1.077_6
            - (2.306_95 - (0.434_24 - (0.082_433 - (0.008_056 - 0.000_314_6 * z) * z) * z) * z)
                * z)
            .exp())
        .exp()
    }
}

/// [`ks_test`] against a [`Dist`]; `None` when it has no continuous cdf or there are no samples.
pub fn ks_test_dist(samples: &[f64], dist: &Dist) -> Option<GofResult> {
    if !dist.is_continuous() {
        return None;
    }
    ks_test(samples, |x| dist.cdf(x).unwrap_or(0.0))
}

/// [`anderson_darling`] against a [`Dist`]; `None` when it has no continuous cdf or no samples.
pub fn anderson_darling_dist(samples: &[f64], dist: &Dist) -> Option<GofResult> {
    if !dist.is_continuous() {
        return None;
    }
    anderson_darling(samples, |x| dist.cdf(x).unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn ad_cdf_matches_published_critical_values() {
        // Case 0 (fully specified) critical values: 1.933 (10%), 2.492 (5%), 3.857 (1%).
        assert!((anderson_darling_cdf(1.933) - 0.90).abs() < 2e-3);
        assert!((anderson_darling_cdf(2.492) - 0.95).abs() < 2e-3);
        assert!((anderson_darling_cdf(3.857) - 0.99).abs() < 1e-3);
    }

    #[test]
    fn kolmogorov_survival_known_values() {
        // Critical values of the Kolmogorov distribution: 1.358 (5%), 1.628 (1%), 1.224 (10%).
        assert!((kolmogorov_survival(1.358) - 0.05).abs() < 1e-3);
        assert!((kolmogorov_survival(1.628) - 0.01).abs() < 1e-3);
        assert!((kolmogorov_survival(1.224) - 0.10).abs() < 1e-3);
        // Both series agree where they meet.
        let below = kolmogorov_survival(1.179_999);
        let above = kolmogorov_survival(1.180_001);
        assert!((below - above).abs() < 1e-5, "{below} vs {above}");
    }

    fn draws(d: &Dist, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| d.sample(&mut rng)).collect()
    }

    #[test]
    fn accepts_samples_of_the_right_distribution() {
        for spec in [
            "exponential:1000",
            "fb_ia",
            "normal:5,2",
            "gev:30.7984,8.20449,0.078688",
        ] {
            let d: Dist = spec.parse().unwrap();
            let d = if spec == "fb_ia" {
                Dist::interarrival(spec, 1000.0).unwrap()
            } else {
                d
            };
            let x = draws(&d, 5000, 11);
            let ks = ks_test_dist(&x, &d).unwrap();
            let ad = anderson_darling_dist(&x, &d).unwrap();
            assert!(ks.p_value > 0.001, "{spec}: KS {ks:?}");
            assert!(ad.p_value > 0.001, "{spec}: AD {ad:?}");
        }
    }

    #[test]
    fn rejects_samples_of_a_wrong_distribution() {
        // fb_ia at 1000/s has the same mean as exponential at 1000/s, but another shape.
        let truth = Dist::interarrival("fb_ia", 1000.0).unwrap();
        let claimed = Dist::interarrival("exponential", 1000.0).unwrap();
        let x = draws(&truth, 5000, 12);
        assert!(ks_test_dist(&x, &claimed).unwrap().p_value < 1e-6);
        assert!(anderson_darling_dist(&x, &claimed).unwrap().p_value < 1e-6);
        // A 5% rate error is caught too.
        let x = draws(&Dist::Exponential { lambda: 1050.0 }, 20_000, 13);
        assert!(ks_test_dist(&x, &claimed).unwrap().p_value < 0.01);
    }

    #[test]
    fn p_values_are_roughly_uniform_under_the_null() {
        // About 5% of true-distribution samples are rejected at the 5% level.
        let d = Dist::Exponential { lambda: 2.0 };
        let trials = 400;
        let (mut ks_rej, mut ad_rej) = (0, 0);
        for seed in 0..trials {
            let x = draws(&d, 200, 1000 + seed);
            ks_rej += usize::from(ks_test_dist(&x, &d).unwrap().p_value < 0.05);
            ad_rej += usize::from(anderson_darling_dist(&x, &d).unwrap().p_value < 0.05);
        }
        // Binomial(400, 0.05): mean 20, sd 4.4; allow 5 sd.
        assert!((0..=42).contains(&ks_rej), "KS rejected {ks_rej}/{trials}");
        assert!((0..=42).contains(&ad_rej), "AD rejected {ad_rej}/{trials}");
        assert!(
            ks_rej >= 3 && ad_rej >= 3,
            "tests never reject: {ks_rej} {ad_rej}"
        );
    }

    #[test]
    fn empty_or_nan_samples_give_none() {
        assert!(ks_test(&[], |x| x).is_none());
        assert!(anderson_darling(&[0.5, f64::NAN], |x| x).is_none());
        assert!(ks_test_dist(&[1.0], &Dist::Fixed(1.0)).is_none());
    }
}
