//! CPU antagonists: spin (PerfIso's CPU bully), power (Heracles' power virus), square (Leverich's
//! square wave). `ht` is spin placed on an SMT sibling by the driver.

use std::time::{Duration, Instant};

use super::{AntagonistError, RunState, Workload};
use crate::serve::work::thread_cpu_time;

/// Iterations in one spin op.
pub const SPIN_OP_ITERS: u64 = 1 << 16;

/// One spin op: a chain of dependent integer multiply-adds (registers only, no memory traffic).
#[inline(never)]
fn spin_op(seed: u64) -> u64 {
    let mut x = seed;
    for i in 0..SPIN_OP_ITERS {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i | 1);
    }
    std::hint::black_box(x)
}

pub struct Spin;

impl Spin {
    /// Runs `ops` spin ops (None: until the run stops), counting each; returns the chain's value
    /// to seed the next call.
    pub(super) fn spin(state: &RunState, ops: Option<u64>, mut x: u64) -> u64 {
        let mut done = 0u64;
        while !state.stopped() && ops.is_none_or(|n| done < n) {
            x = spin_op(x);
            state.add(1);
            done += 1;
        }
        x
    }
}

impl Workload for Spin {
    fn run_thread(&self, index: usize, state: &RunState) -> Result<(), AntagonistError> {
        Spin::spin(state, None, index as u64 + 1);
        Ok(())
    }
}

/// FMA vector instructions per power op.
pub const POWER_OP_FMAS: u64 = 1 << 20;

/// Independent accumulator chains: enough to cover FMA latency on two FMA ports.
const CHAINS: usize = 8;

pub struct Power {
    avx2_fma: bool,
}

impl Power {
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        let avx2_fma = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let avx2_fma = false;
        Power { avx2_fma }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn power_op_avx2(seed: f64) -> f64 {
    use std::arch::x86_64::*;
    // x ← x·m + c converges to c/(1−m) = 0.1: values stay finite and normal forever.
    let m = _mm256_set1_pd(0.999_999);
    let c = _mm256_set1_pd(1e-7);
    let mut acc = [_mm256_set1_pd(seed); CHAINS];
    for (i, a) in acc.iter_mut().enumerate() {
        *a = _mm256_add_pd(*a, _mm256_set1_pd(i as f64 * 1e-3));
    }
    for _ in 0..POWER_OP_FMAS / CHAINS as u64 {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_pd(*a, m, c);
        }
    }
    let mut out = [0f64; 4];
    let mut sum = _mm256_setzero_pd();
    for a in acc {
        sum = _mm256_add_pd(sum, a);
    }
    // SAFETY: `out` holds exactly four f64s, unaligned store allowed.
    unsafe { _mm256_storeu_pd(out.as_mut_ptr(), sum) };
    out.iter().sum()
}

/// Portable fallback: the same recurrence on plain arrays (the compiler vectorises it with the
/// baseline SIMD of the target).
fn power_op_portable(seed: f64) -> f64 {
    let mut acc = [[seed; 4]; CHAINS];
    for _ in 0..POWER_OP_FMAS / CHAINS as u64 {
        for lane in acc.iter_mut() {
            for v in lane.iter_mut() {
                *v = *v * 0.999_999 + 1e-7;
            }
        }
    }
    std::hint::black_box(acc.iter().flatten().sum())
}

impl Workload for Power {
    fn detail(&self) -> String {
        if self.avx2_fma {
            "AVX2+FMA (256-bit fused multiply-add)".into()
        } else {
            "portable SIMD (no AVX2/FMA on this CPU)".into()
        }
    }

    fn run_thread(&self, index: usize, state: &RunState) -> Result<(), AntagonistError> {
        let mut x = 0.5 + index as f64 * 1e-3;
        while !state.stopped() {
            #[cfg(target_arch = "x86_64")]
            {
                x = if self.avx2_fma {
                    // SAFETY: the CPU supports AVX2 and FMA (checked at runtime in `detect`).
                    unsafe { power_op_avx2(x) }
                } else {
                    power_op_portable(x)
                };
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                x = power_op_portable(x);
            }
            x = std::hint::black_box(x).fract() + 0.5;
            state.add(1);
        }
        Ok(())
    }
}

/// Leverich's square wave: at the start of every period, spin until this thread has consumed `on`
/// of CPU time, then sleep until the next period. Periods are anchored to absolute times, so the
/// duty cycle stays on/(on+off) even when the spinning phase is stretched by preemption.
pub struct Square {
    on: Duration,
    period: Duration,
}

impl Square {
    pub fn new(on: Duration, off: Duration) -> Result<Self, AntagonistError> {
        if on.is_zero() {
            return Err(AntagonistError::Usage("--on-ms must be positive".into()));
        }
        Ok(Square {
            on,
            period: on + off,
        })
    }
}

/// Spin iterations between checks of the thread CPU clock (a few µs of work).
const SQUARE_CHUNK: u64 = 1 << 12;

impl Workload for Square {
    fn run_thread(&self, index: usize, state: &RunState) -> Result<(), AntagonistError> {
        let start = Instant::now();
        let mut period_start = start;
        let mut x = index as u64 + 1;
        let mut iters = 0u64;
        while !state.stopped() {
            let next = period_start + self.period;
            let cpu0 = thread_cpu_time();
            while thread_cpu_time().saturating_sub(cpu0) < self.on && Instant::now() < next {
                for i in 0..SQUARE_CHUNK {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(i | 1);
                }
                iters += SQUARE_CHUNK;
                if iters >= SPIN_OP_ITERS {
                    state.add(iters / SPIN_OP_ITERS);
                    iters %= SPIN_OP_ITERS;
                }
            }
            std::hint::black_box(x);
            // Sleep in slices so a stop request is seen quickly.
            loop {
                let now = Instant::now();
                if now >= next || state.stopped() {
                    break;
                }
                std::thread::sleep((next - now).min(Duration::from_millis(20)));
            }
            period_start = next;
            // If we fell far behind (suspended), restart the schedule rather than burst.
            let now = Instant::now();
            if now > period_start + self.period {
                period_start = now;
            }
        }
        Ok(())
    }
}
