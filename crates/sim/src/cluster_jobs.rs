//! The cluster's job stream. The job shape is synthetic, documented and seeded, after the Google
//! 2019 trace's qualitative shape (most tasks small, durations heavy-tailed): sizes 0.5/1/2/4
//! CPUs with probabilities 0.45/0.30/0.15/0.10; durations (at full size) log-normal, median
//! 10 min, σ = 1.2, clamped to [1 min, 6 h]; Poisson arrivals.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sizes (CPUs) and their probabilities.
pub const JOB_SIZES: [(f64, f64); 4] = [(0.5, 0.45), (1.0, 0.30), (2.0, 0.15), (4.0, 0.10)];
pub const JOB_MEDIAN_S: f64 = 600.0;
pub const JOB_SIGMA: f64 = 1.2;
pub const JOB_MIN_S: f64 = 60.0;
pub const JOB_MAX_S: f64 = 6.0 * 3600.0;

/// One batch job (one pod).
#[derive(Debug, Clone)]
pub struct Job {
    pub submit_s: f64,
    /// CPUs it runs on at full speed (and requests, when placed by the advertised value).
    pub size: f64,
    /// CPU-seconds left.
    pub work: f64,
    /// Its length at full speed, s.
    pub duration_s: f64,
    /// Resident memory while bound, GiB (NodeCosts::draw_memory; 0 in `jobs`).
    pub mem_gib: f64,
    /// Times its pod was evicted, and when the Job controller makes the next one (its backoff).
    pub failures: u32,
    pub ready_s: f64,
}

/// The job stream (seeded).
pub fn jobs(seed: u64, rate_per_s: f64, duration_s: f64) -> Vec<Job> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6a6f_6273);
    let mut out = Vec::new();
    let mut t = 0.0;
    if rate_per_s <= 0.0 {
        return out;
    }
    // Bounded: at most the expected count four times over.
    let cap = (rate_per_s * duration_s * 4.0) as usize + 16;
    while out.len() < cap {
        t += -(1.0 - rng.random::<f64>()).ln() / rate_per_s;
        if t >= duration_s {
            break;
        }
        let u: f64 = rng.random();
        let mut acc = 0.0;
        let mut size = JOB_SIZES[JOB_SIZES.len() - 1].0;
        for (s, p) in JOB_SIZES {
            acc += p;
            if u < acc {
                size = s;
                break;
            }
        }
        // Box–Muller normal for the log-normal duration.
        let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let d = (JOB_MEDIAN_S * (JOB_SIGMA * z).exp()).clamp(JOB_MIN_S, JOB_MAX_S);
        out.push(Job {
            submit_s: t,
            size,
            work: size * d,
            duration_s: d,
            mem_gib: 0.0,
            failures: 0,
            ready_s: 0.0,
        });
    }
    out
}

/// The mean CPU-seconds one job brings (for the arrival rate).
pub fn mean_job_cpu_s(seed: u64) -> f64 {
    let sample = jobs(seed ^ 0x5eed, 1.0, 200_000.0);
    sample.iter().map(|j| j.work).sum::<f64>() / sample.len().max(1) as f64
}
