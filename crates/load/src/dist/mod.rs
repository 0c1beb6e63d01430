//! Random distributions with mutilate's syntax and exact parameters (sizes, inter-arrival gaps,
//! key popularity).
//!
//! Syntax (`-K`, `-V`, `-i` and every other distribution flag), names case-insensitive:
//!
//! | spec | meaning |
//! | --- | --- |
//! | `V` or `fixed:V` | always `V` |
//! | `uniform:MAX` | uniform on [0, MAX) |
//! | `normal:M,SD` | normal, mean `M`, standard deviation `SD` |
//! | `exponential[:L]` | exponential with rate `L` (mean 1/L); bare `exponential` is `exponential:1` |
//! | `pareto:LOC,SCALE,SHAPE` | generalized Pareto |
//! | `gev:LOC,SCALE,SHAPE` | generalized extreme value |
//! | `fb_key` | `gev:30.7984,8.20449,0.078688` (Facebook ETC key sizes) |
//! | `fb_value` | the 0–14 byte table, else `pareto:15,214.476,0.348238` (ETC value sizes) |
//! | `fb_ia` | `pareto:0,16.0292,0.154971` (ETC inter-arrival gaps; rescaled by the rate) |
//! | `zipf:S[,N]` | Zipf(S) record index in 0..N (index 0 most popular); N defaults to 10000 |
//!
//! Where we differ from mutilate 1.0 (each is a crash or an ambiguity there):
//! - names match exactly (mutilate matches by case-insensitive substring, so `lognormal:1,2` was
//!   `normal:1,2`); unknown names fail with the list of valid ones;
//! - the argument count is checked (mutilate silently reads missing numbers as 0);
//! - bare `exponential` means `exponential:1` (mutilate segfaults on it); as an inter-arrival
//!   distribution its rate comes from `--qps` anyway, as in mutilate;
//! - a fixed value may be any number, `0.5` included (mutilate only took values whose integer part
//!   is non-zero, or exactly `0`);
//! - `normal` draws a true normal by inversion (mutilate computed `sqrt(-2 ln U) cos(2πU)` from a
//!   single uniform, which is not normal);
//! - shape 0 of `pareto`/`gev` is the exponential/Gumbel limit (mutilate asserts shape ≠ 0);
//! - `gev` works as an inter-arrival distribution (mutilate dies with "set_lambda() not
//!   implemented"): its scale is set so the mean is 1/rate; `fb_value` and `zipf` are refused there.

mod keys;
mod spec;
mod special;
mod zipf;

pub use keys::{fnv_64, KeyGenerator, MAX_KEY_LEN};
pub use special::{erfc, gamma, normal_cdf, normal_quantile};
pub use zipf::Zipf;

use rand::Rng;

/// `fb_key`: GEV(loc, scale, shape) of Facebook ETC key sizes (Atikoglu et al., SIGMETRICS'12).
pub const FB_KEY_GEV: [f64; 3] = [30.7984, 8.20449, 0.078688];
/// `fb_value`: (probability, size) of the 0–14 byte values.
pub const FB_VALUE_TABLE: [(f64, f64); 15] = [
    (0.00536, 0.0),
    (0.00047, 1.0),
    (0.17820, 2.0),
    (0.09239, 3.0),
    (0.00018, 4.0),
    (0.02740, 5.0),
    (0.00065, 6.0),
    (0.00606, 7.0),
    (0.00023, 8.0),
    (0.00837, 9.0),
    (0.00837, 10.0),
    (0.08989, 11.0),
    (0.00092, 12.0),
    (0.00326, 13.0),
    (0.01980, 14.0),
];
/// `fb_value`: generalized Pareto (loc, scale, shape) of the sizes not in [`FB_VALUE_TABLE`].
pub const FB_VALUE_PARETO: [f64; 3] = [15.0, 214.476, 0.348238];
/// `fb_ia`: generalized Pareto (loc, scale, shape) of inter-arrival gaps; the scale is replaced
/// so the mean is 1/rate.
pub const FB_IA_PARETO: [f64; 3] = [0.0, 16.0292, 0.154971];
/// mutilate's default `--records`, used by `zipf:S` without `,N`.
pub const DEFAULT_RECORDS: u64 = 10_000;

/// The valid distribution names, for error messages and docs.
pub const DIST_NAMES: &str =
    "V, fixed:V, uniform:MAX, normal:M,SD, exponential[:L], pareto:LOC,SCALE,SHAPE, \
     gev:LOC,SCALE,SHAPE, fb_key, fb_value, fb_ia, zipf:S[,N]";

/// A distribution spec that could not be parsed or used: names the input and what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid distribution \"{input}\": {reason}")]
pub struct DistError {
    /// The text given.
    pub input: String,
    /// What is wrong and what was expected.
    pub reason: String,
}

impl DistError {
    fn new(input: &str, reason: impl Into<String>) -> DistError {
        DistError {
            input: input.to_string(),
            reason: reason.into(),
        }
    }
}

/// A distribution of `f64` values (sizes in bytes, gaps in seconds, record indices).
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Always this value.
    Fixed(f64),
    /// Uniform on [0, max).
    Uniform { max: f64 },
    /// Normal.
    Normal { mean: f64, sd: f64 },
    /// Exponential with rate `lambda` (mean 1/lambda).
    Exponential { lambda: f64 },
    /// Generalized Pareto: F(x) = 1 − (1 + shape·(x−loc)/scale)^(−1/shape), x ≥ loc.
    Pareto { loc: f64, scale: f64, shape: f64 },
    /// Generalized extreme value: F(x) = exp(−(1 + shape·(x−loc)/scale)^(−1/shape)).
    Gev { loc: f64, scale: f64, shape: f64 },
    /// `table` (probability, value) pairs tried in order with one uniform; with the remaining
    /// probability a fresh draw from `rest` (mutilate's `Discrete`, used by `fb_value`).
    Discrete {
        table: Vec<(f64, f64)>,
        rest: Box<Dist>,
    },
    /// Zipf record index in 0..n (rank − 1).
    Zipf(Zipf),
}

/// A uniform in the open interval (0, 1): the inverse transforms below take logs of it.
fn open01<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    loop {
        let u: f64 = rng.random();
        if u > 0.0 {
            return u;
        }
    }
}

fn gpd_from_u(loc: f64, scale: f64, shape: f64, u: f64) -> f64 {
    if shape == 0.0 {
        loc - scale * u.ln()
    } else {
        loc + scale * (u.powf(-shape) - 1.0) / shape
    }
}

fn gev_from_u(loc: f64, scale: f64, shape: f64, u: f64) -> f64 {
    let y = -u.ln();
    if shape == 0.0 {
        loc - scale * y.ln()
    } else {
        loc + scale * (y.powf(-shape) - 1.0) / shape
    }
}

/// (Γ(1−ξ) − 1)/ξ: the mean of a standard GEV (Euler's γ at ξ = 0).
fn gev_mean_factor(shape: f64) -> f64 {
    if shape == 0.0 {
        special::EULER_GAMMA
    } else {
        (gamma(1.0 - shape) - 1.0) / shape
    }
}

impl Dist {
    /// Facebook ETC key sizes, mutilate's `fb_key`.
    pub fn fb_key() -> Dist {
        let [loc, scale, shape] = FB_KEY_GEV;
        Dist::Gev { loc, scale, shape }
    }

    /// Facebook ETC value sizes, mutilate's `fb_value`.
    pub fn fb_value() -> Dist {
        let [loc, scale, shape] = FB_VALUE_PARETO;
        Dist::Discrete {
            table: FB_VALUE_TABLE.to_vec(),
            rest: Box::new(Dist::Pareto { loc, scale, shape }),
        }
    }

    /// Facebook ETC inter-arrival gaps, mutilate's `fb_ia` (before rescaling by the rate).
    pub fn fb_ia() -> Dist {
        let [loc, scale, shape] = FB_IA_PARETO;
        Dist::Pareto { loc, scale, shape }
    }

    /// Zipf(s) record index over `records` records. `s` > 0, `records` ≥ 1.
    pub fn zipf(s: f64, records: u64) -> Result<Dist, DistError> {
        let input = format!("zipf:{s},{records}");
        if !(s > 0.0 && s.is_finite()) {
            return Err(DistError::new(&input, "the exponent S must be > 0"));
        }
        if records == 0 {
            return Err(DistError::new(&input, "the record count N must be >= 1"));
        }
        Ok(Dist::Zipf(Zipf::new(s, records)))
    }

    /// The same distribution over `records` records when it is a Zipf (`zipf:S` is parsed with
    /// [`DEFAULT_RECORDS`]); other distributions are returned unchanged.
    pub fn with_records(self, records: u64) -> Result<Dist, DistError> {
        match self {
            Dist::Zipf(z) => Dist::zipf(z.exponent(), records),
            other => Ok(other),
        }
    }

    /// Inter-arrival gaps in seconds for `rate_per_s` requests per second, as mutilate's `-i`:
    /// the spec's shape is kept and its scale set so the mean gap is 1/rate (`fixed` → 1/rate,
    /// `uniform` → max 2/rate, `normal` → mean 1/rate, `exponential` → rate, `pareto`/`fb_ia` →
    /// scale (1−shape)(1/rate − loc), `gev` → scale so the mean is 1/rate). A rate of 0 means
    /// "no pacing" and gives `Fixed(0)`, as in mutilate.
    pub fn interarrival(spec: &str, rate_per_s: f64) -> Result<Dist, DistError> {
        if !(rate_per_s >= 0.0 && rate_per_s.is_finite()) {
            return Err(DistError::new(
                spec,
                format!("the rate must be a finite number >= 0, got {rate_per_s}"),
            ));
        }
        let dist: Dist = spec.parse()?;
        if rate_per_s == 0.0 {
            return Ok(Dist::Fixed(0.0));
        }
        let mean = 1.0 / rate_per_s;
        let scaled = match dist {
            Dist::Fixed(_) => Dist::Fixed(mean),
            Dist::Uniform { .. } => Dist::Uniform { max: 2.0 * mean },
            Dist::Normal { sd, .. } => Dist::Normal { mean, sd },
            Dist::Exponential { .. } => Dist::Exponential { lambda: rate_per_s },
            Dist::Pareto { loc, shape, .. } => {
                if shape >= 1.0 {
                    return Err(DistError::new(
                        spec,
                        "an inter-arrival pareto needs SHAPE < 1 (a finite mean)",
                    ));
                }
                let scale = (1.0 - shape) * (mean - loc);
                if scale <= 0.0 {
                    return Err(DistError::new(
                        spec,
                        format!("LOC {loc} s must be below the mean gap 1/rate = {mean} s"),
                    ));
                }
                Dist::Pareto { loc, scale, shape }
            }
            Dist::Gev { loc, shape, .. } => {
                let factor = gev_mean_factor(shape);
                if shape >= 1.0 || factor <= 0.0 || !factor.is_finite() {
                    return Err(DistError::new(
                        spec,
                        "an inter-arrival gev needs -1 < SHAPE < 1 (a finite, scalable mean)",
                    ));
                }
                let scale = (mean - loc) / factor;
                if scale <= 0.0 {
                    return Err(DistError::new(
                        spec,
                        format!("LOC {loc} s must be below the mean gap 1/rate = {mean} s"),
                    ));
                }
                Dist::Gev { loc, scale, shape }
            }
            Dist::Discrete { .. } | Dist::Zipf(_) => {
                return Err(DistError::new(
                    spec,
                    "not an inter-arrival distribution (expected fixed, uniform, normal, \
                     exponential, pareto, gev or fb_ia)",
                ))
            }
        };
        Ok(scaled)
    }

    /// One draw.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> f64 {
        match self {
            Dist::Discrete { table, rest } => {
                let u = open01(rng);
                let mut sum = 0.0;
                for &(p, v) in table {
                    sum += p;
                    if u < sum {
                        return v;
                    }
                }
                rest.sample(rng)
            }
            Dist::Zipf(z) => (z.sample_rank(rng) - 1) as f64,
            Dist::Fixed(v) => *v,
            other => other.from_uniform(open01(rng)),
        }
    }

    /// A draw as a length in bytes: truncated toward zero like mutilate's `(int)` conversion,
    /// negative or NaN draws give 0, and at most `max`.
    pub fn sample_len<R: Rng + ?Sized>(&self, rng: &mut R, max: usize) -> usize {
        let v = self.sample(rng);
        if v >= 1.0 {
            (v.trunc().min(max as f64)) as usize
        } else {
            0
        }
    }

    /// mutilate's `generate(U)`: the value for a given uniform `u` in (0, 1), the mapping its
    /// KeyGenerator uses with U = FNV-64(index) / 2⁶⁴. Pareto and exponential map U to the upper
    /// tail (x = loc + scale·(U^−shape − 1)/shape), gev and uniform to the lower one; a discrete
    /// table passes the same U on to its rest; zipf (not in mutilate) uses an O(1) approximate
    /// quantile ([`Zipf::approx_rank_at`]).
    pub fn from_uniform(&self, u: f64) -> f64 {
        match *self {
            Dist::Fixed(v) => v,
            Dist::Uniform { max } => max * u,
            Dist::Normal { mean, sd } => mean + sd * normal_quantile(u),
            Dist::Exponential { lambda } => -u.ln() / lambda,
            Dist::Pareto { loc, scale, shape } => gpd_from_u(loc, scale, shape, u),
            Dist::Gev { loc, scale, shape } => gev_from_u(loc, scale, shape, u),
            Dist::Discrete {
                ref table,
                ref rest,
            } => {
                let mut sum = 0.0;
                for &(p, v) in table {
                    sum += p;
                    if u < sum {
                        return v;
                    }
                }
                rest.from_uniform(u)
            }
            Dist::Zipf(ref z) => (z.approx_rank_at(u) - 1) as f64,
        }
    }

    /// Analytic mean; `None` where it is infinite (heavy tails: shape ≥ 1).
    pub fn mean(&self) -> Option<f64> {
        match *self {
            Dist::Fixed(v) => Some(v),
            Dist::Uniform { max } => Some(max / 2.0),
            Dist::Normal { mean, .. } => Some(mean),
            Dist::Exponential { lambda } => Some(1.0 / lambda),
            Dist::Pareto { loc, scale, shape } => {
                (shape < 1.0).then(|| loc + scale / (1.0 - shape))
            }
            Dist::Gev { loc, scale, shape } => {
                (shape < 1.0).then(|| loc + scale * gev_mean_factor(shape))
            }
            Dist::Discrete {
                ref table,
                ref rest,
            } => {
                let (p_table, m_table) = table_moments(table, 1);
                let rest_mean = if p_table < 1.0 { rest.mean()? } else { 0.0 };
                Some(m_table + (1.0 - p_table).max(0.0) * rest_mean)
            }
            Dist::Zipf(ref z) => Some(z.rank_moments().0 - 1.0),
        }
    }

    /// Analytic variance; `None` where it is infinite (shape ≥ 1/2).
    pub fn variance(&self) -> Option<f64> {
        match *self {
            Dist::Fixed(_) => Some(0.0),
            Dist::Uniform { max } => Some(max * max / 12.0),
            Dist::Normal { sd, .. } => Some(sd * sd),
            Dist::Exponential { lambda } => Some(1.0 / (lambda * lambda)),
            Dist::Pareto { scale, shape, .. } => {
                (shape < 0.5).then(|| scale * scale / ((1.0 - shape).powi(2) * (1.0 - 2.0 * shape)))
            }
            Dist::Gev { scale, shape, .. } => (shape < 0.5).then(|| {
                if shape == 0.0 {
                    scale * scale * std::f64::consts::PI.powi(2) / 6.0
                } else {
                    let g1 = gamma(1.0 - shape);
                    let g2 = gamma(1.0 - 2.0 * shape);
                    scale * scale * (g2 - g1 * g1) / (shape * shape)
                }
            }),
            Dist::Discrete {
                ref table,
                ref rest,
            } => {
                let (p_table, m1) = table_moments(table, 1);
                let (_, m2) = table_moments(table, 2);
                let p_rest = (1.0 - p_table).max(0.0);
                let (rest_m1, rest_m2) = if p_rest > 0.0 {
                    let m = rest.mean()?;
                    (m, rest.variance()? + m * m)
                } else {
                    (0.0, 0.0)
                };
                let mean = m1 + p_rest * rest_m1;
                Some(m2 + p_rest * rest_m2 - mean * mean)
            }
            Dist::Zipf(ref z) => {
                let (m1, m2) = z.rank_moments();
                Some(m2 - m1 * m1)
            }
        }
    }

    /// Cumulative distribution function P(X ≤ x).
    pub fn cdf(&self, x: f64) -> Option<f64> {
        if x.is_nan() {
            return None;
        }
        let step = |at: f64| if x >= at { 1.0 } else { 0.0 };
        let p = match *self {
            Dist::Fixed(v) => step(v),
            Dist::Uniform { max } if max <= 0.0 => step(0.0),
            Dist::Uniform { max } => (x / max).clamp(0.0, 1.0),
            Dist::Normal { mean, sd } if sd <= 0.0 => step(mean),
            Dist::Normal { mean, sd } => normal_cdf((x - mean) / sd),
            Dist::Exponential { lambda } => {
                if x <= 0.0 {
                    0.0
                } else {
                    -(-lambda * x).exp_m1()
                }
            }
            Dist::Pareto { loc, scale, shape } => {
                if x <= loc {
                    0.0
                } else {
                    let z = (x - loc) / scale;
                    if shape == 0.0 {
                        -(-z).exp_m1()
                    } else {
                        let t = 1.0 + shape * z;
                        if t <= 0.0 {
                            1.0 // beyond the upper end of a negative-shape support
                        } else {
                            1.0 - t.powf(-1.0 / shape)
                        }
                    }
                }
            }
            Dist::Gev { loc, scale, shape } => {
                let z = (x - loc) / scale;
                if shape == 0.0 {
                    (-(-z).exp()).exp()
                } else {
                    let t = 1.0 + shape * z;
                    if t <= 0.0 {
                        if shape > 0.0 {
                            0.0
                        } else {
                            1.0
                        }
                    } else {
                        (-t.powf(-1.0 / shape)).exp()
                    }
                }
            }
            Dist::Discrete {
                ref table,
                ref rest,
            } => {
                let p_table: f64 = table.iter().map(|&(p, _)| p).sum();
                let below: f64 = table
                    .iter()
                    .filter(|&&(_, v)| v <= x)
                    .map(|&(p, _)| p)
                    .sum();
                below + (1.0 - p_table).max(0.0) * rest.cdf(x)?
            }
            Dist::Zipf(ref z) => {
                if x < 0.0 {
                    0.0
                } else {
                    z.rank_cdf(x.floor() as u64 + 1)
                }
            }
        };
        Some(p)
    }

    /// Quantile function (inverse cdf) for `p` in (0, 1); `None` for discrete distributions.
    pub fn quantile(&self, p: f64) -> Option<f64> {
        if !(p > 0.0 && p < 1.0) {
            return None;
        }
        match *self {
            Dist::Fixed(v) => Some(v),
            Dist::Uniform { max } => Some(max * p),
            Dist::Normal { mean, sd } => Some(mean + sd * normal_quantile(p)),
            Dist::Exponential { lambda } => Some(-(-p).ln_1p() / lambda),
            Dist::Pareto { loc, scale, shape } => Some(gpd_from_u(loc, scale, shape, 1.0 - p)),
            Dist::Gev { loc, scale, shape } => Some(gev_from_u(loc, scale, shape, p)),
            Dist::Discrete { .. } | Dist::Zipf(_) => None,
        }
    }

    /// True when the distribution has a continuous cdf (fit tests such as KS apply).
    pub fn is_continuous(&self) -> bool {
        match *self {
            Dist::Uniform { max } => max > 0.0,
            Dist::Normal { sd, .. } => sd > 0.0,
            Dist::Exponential { .. } | Dist::Pareto { .. } | Dist::Gev { .. } => true,
            Dist::Fixed(_) | Dist::Discrete { .. } | Dist::Zipf(_) => false,
        }
    }
}

/// (Σ p, Σ p·vᵏ) of a discrete table.
fn table_moments(table: &[(f64, f64)], k: i32) -> (f64, f64) {
    table
        .iter()
        .fold((0.0, 0.0), |(ps, ms), &(p, v)| (ps + p, ms + p * v.powi(k)))
}

#[cfg(test)]
mod tests;
