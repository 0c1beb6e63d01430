//! Zipf key popularity over `n` records: P(rank k) ∝ k^−s, k = 1..=n, sampled in O(1) by
//! rejection-inversion (Hörmann & Derflinger 1996), so a million records need no table.

use rand::Rng;

/// Zipf(s) over ranks 1..=n. [`Zipf::sample_rank`] draws a rank; [`super::Dist::Zipf`] reports
/// `rank − 1`, a record index in 0..n with index 0 the most popular.
#[derive(Clone, Debug, PartialEq)]
pub struct Zipf {
    s: f64,
    n: u64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
}

impl Zipf {
    /// `s` > 0 (finite), `n` ≥ 1; checked by the caller ([`super::Dist`] parsing).
    pub(crate) fn new(s: f64, n: u64) -> Zipf {
        let mut z = Zipf {
            s,
            n,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            threshold: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(n as f64 + 0.5);
        z.threshold = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// The exponent `s`.
    pub fn exponent(&self) -> f64 {
        self.s
    }

    /// Number of ranks `n`.
    pub fn records(&self) -> u64 {
        self.n
    }

    /// A rank in 1..=n.
    pub fn sample_rank<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        loop {
            let u: f64 = rng.random();
            let hu = self.h_integral_n + u * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(hu);
            let k = ((x + 0.5) as u64).clamp(1, self.n);
            let kf = k as f64;
            if kf - x <= self.threshold || hu >= self.h_integral(kf + 0.5) - self.h(kf) {
                return k;
            }
        }
    }

    /// Approximate quantile in O(1): the rank at probability `u` of the continuous envelope the
    /// sampler inverts (exact at the ends, within a rank or so elsewhere). Used to map a given
    /// uniform to a rank ([`super::Dist::from_uniform`]); sampling itself is exact.
    pub fn approx_rank_at(&self, u: f64) -> u64 {
        let u = u.clamp(0.0, 1.0);
        let hu = self.h_integral_x1 + u * (self.h_integral_n - self.h_integral_x1);
        let x = self.h_integral_inverse(hu);
        if x.is_nan() {
            return 1;
        }
        ((x + 0.5) as u64).clamp(1, self.n)
    }

    /// Σ_{k=1..=m} k^−s (O(m)).
    fn partial_sum(&self, m: u64, power: f64) -> f64 {
        (1..=m.min(self.n)).map(|k| (k as f64).powf(power)).sum()
    }

    /// P(rank ≤ m).
    pub fn rank_cdf(&self, m: u64) -> f64 {
        if m == 0 {
            return 0.0;
        }
        if m >= self.n {
            return 1.0;
        }
        self.partial_sum(m, -self.s) / self.partial_sum(self.n, -self.s)
    }

    /// E[rank] and E[rank²] (O(n) sums).
    pub fn rank_moments(&self) -> (f64, f64) {
        let norm = self.partial_sum(self.n, -self.s);
        (
            self.partial_sum(self.n, 1.0 - self.s) / norm,
            self.partial_sum(self.n, 2.0 - self.s) / norm,
        )
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// ∫ x^−s dx from 1 to x, i.e. (x^(1−s) − 1)/(1 − s), stable near s = 1.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.s) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let mut t = x * (1.0 - self.s);
        if t < -1.0 {
            // Rounding can push t below −1 at the far end; clamp as the reference does.
            t = -1.0;
        }
        (helper1(t) * x).exp()
    }
}

/// ln(1 + x) / x, stable near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// (eˣ − 1) / x, stable near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Rank frequencies match the exact pmf within 5 binomial standard errors.
    fn check_frequencies(s: f64, n: u64) {
        let z = Zipf::new(s, n);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let draws = 200_000u64;
        let mut counts = vec![0u64; n as usize + 1];
        for _ in 0..draws {
            let k = z.sample_rank(&mut rng);
            assert!((1..=n).contains(&k));
            counts[k as usize] += 1;
        }
        let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
        for k in [1u64, 2, 3, 10, n] {
            let p = (k as f64).powf(-s) / norm;
            let expected = p * draws as f64;
            let se = (draws as f64 * p * (1.0 - p)).sqrt();
            let got = counts[k as usize] as f64;
            assert!(
                (got - expected).abs() <= 5.0 * se + 1.0,
                "s={s} n={n} rank {k}: {got} vs {expected:.1} ± {se:.1}"
            );
        }
    }

    #[test]
    fn frequencies_match_pmf() {
        check_frequencies(0.99, 1000);
        check_frequencies(1.0, 100);
        check_frequencies(0.5, 50);
        check_frequencies(2.0, 10_000);
    }

    #[test]
    fn approximate_quantile_is_close_to_the_exact_one() {
        let z = Zipf::new(0.99, 1000);
        assert_eq!(z.approx_rank_at(0.0), 1);
        assert_eq!(z.approx_rank_at(1.0), 1000);
        for u in [0.2, 0.5, 0.8, 0.95] {
            let approx = z.approx_rank_at(u);
            let exact = (1..=1000).find(|&m| z.rank_cdf(m) >= u).unwrap();
            let gap = (approx as f64 - exact as f64).abs();
            assert!(
                gap <= 0.05 * exact as f64 + 2.0,
                "u={u}: {approx} vs {exact}"
            );
        }
    }

    #[test]
    fn single_record_always_rank_one() {
        let z = Zipf::new(1.2, 1);
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert!((0..100).all(|_| z.sample_rank(&mut rng) == 1));
    }
}
