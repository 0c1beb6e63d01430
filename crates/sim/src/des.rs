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

/// Response times (µs) of `requests` Poisson arrivals at `lambda_per_us` through one FCFS server
/// that the host stops a fraction `stall_time_fraction` of the time, in stalls of exponential
/// length with mean `stall_mean_us` (the server makes no progress during one and resumes the
/// request it was serving after it), after discarding the first `warmup` requests. The
/// reference for [`crate::queue::StallForm::Time`].
pub fn simulate_mg1_with_stalls(
    lambda_per_us: f64,
    service: &ServiceDist,
    stall_time_fraction: f64,
    stall_mean_us: f64,
    requests: usize,
    warmup: usize,
    seed: u64,
) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let up_mean = stall_mean_us * (1.0 - stall_time_fraction) / stall_time_fraction;
    // the current or next stall: [stall_start, stall_end)
    let mut stall_start = exp_sample(1.0 / up_mean, &mut rng);
    let mut stall_end = stall_start + exp_sample(1.0 / stall_mean_us, &mut rng);
    let mut free_at = 0.0f64;
    let mut now = 0.0f64;
    let mut out = Vec::with_capacity(requests);
    for i in 0..requests + warmup {
        now += exp_sample(lambda_per_us, &mut rng);
        let mut t = now.max(free_at);
        let mut work = sample_service(service, &mut rng);
        // run `work` µs of service from t, skipping the stalls
        loop {
            if t >= stall_end {
                stall_start = stall_end + exp_sample(1.0 / up_mean, &mut rng);
                stall_end = stall_start + exp_sample(1.0 / stall_mean_us, &mut rng);
                continue;
            }
            if t >= stall_start {
                t = stall_end;
                continue;
            }
            if t + work <= stall_start {
                t += work;
                break;
            }
            work -= stall_start - t;
            t = stall_end;
        }
        free_at = t;
        if i >= warmup {
            out.push(t - now);
        }
    }
    out
}
