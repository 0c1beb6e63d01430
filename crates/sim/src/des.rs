//! Exact per-request simulation of an FCFS M/G/k queue: the reference the closed-form
//! [`crate::queue`] model is checked against (tests, `sim validate`'s self-check). Too slow for a
//! fleet, fast enough for a few hundred thousand requests.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::queue::ServiceDist;

/// Draws one service time from `dist`.
pub fn sample_service(dist: &ServiceDist, rng: &mut impl Rng) -> f64 {
    let u: f64 = rng.random();
    let (p0, r0) = dist.phases[0];
    let (_, r1) = dist.phases[1];
    let rate = if u < p0 { r0 } else { r1 };
    dist.shift_us + exp_sample(rate, rng)
}

fn exp_sample(rate: f64, rng: &mut impl Rng) -> f64 {
    let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    -u.ln() / rate
}

/// Response times (µs) of `requests` Poisson arrivals at `lambda_per_us` through `k` FCFS servers,
/// after discarding the first `warmup` requests.
pub fn simulate_mgk(
    k: u32,
    lambda_per_us: f64,
    service: &ServiceDist,
    requests: usize,
    warmup: usize,
    seed: u64,
) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // free times of the k servers, earliest first (integer ns so the heap orders exactly)
    let mut free: BinaryHeap<Reverse<u64>> = (0..k.max(1)).map(|_| Reverse(0)).collect();
    let mut now = 0.0f64;
    let mut out = Vec::with_capacity(requests);
    for i in 0..requests + warmup {
        now += exp_sample(lambda_per_us, &mut rng);
        let Reverse(earliest_ns) = free.pop().expect("k >= 1 servers");
        let start = now.max(earliest_ns as f64 / 1000.0);
        let done = start + sample_service(service, &mut rng);
        free.push(Reverse((done * 1000.0) as u64));
        if i >= warmup {
            out.push(done - now);
        }
    }
    out
}

/// The `q`-quantile of `samples` (sorts them).
pub fn percentile(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_unstable_by(f64::total_cmp);
    let idx = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
    samples[idx]
}
