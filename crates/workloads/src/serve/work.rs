//! Synthetic per-request work: `--service-time DIST` (CPU busy work) and `--footprint-mb N`
//! (a working set touched by every request), so `headroom serve` can play Leverich's 1 ms
//! event-based service or a cache-sensitive service like Heracles' memkeyval.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, RngCore};

/// A sampler of microseconds.
type Sampler = Arc<dyn Fn(&mut dyn RngCore) -> f64 + Send + Sync>;

/// Draws a per-request service time in microseconds.
#[derive(Clone)]
pub struct ServiceTime {
    spec: String,
    sampler: Sampler,
}

impl ServiceTime {
    /// A service time drawn by `sampler` (µs); `spec` is how it was written, for messages.
    pub fn from_fn<F>(spec: impl Into<String>, sampler: F) -> Self
    where
        F: Fn(&mut dyn RngCore) -> f64 + Send + Sync + 'static,
    {
        ServiceTime {
            spec: spec.into(),
            sampler: Arc::new(sampler),
        }
    }

    /// The load generator's distribution syntax (`fixed:50`, `exponential:100`, …), values in µs.
    /// A distribution whose fixed value is negative, or whose 99.9th percentile passes the
    /// [`MAX_SERVICE_US`] every draw is clamped to, is refused (`fixed:1e300` was taken, and
    /// every request then held its thread 10 s).
    pub fn parse(spec: &str) -> Result<Self, ServiceTimeError> {
        use headroom_load::dist::Dist;
        let dist: Dist = spec.parse()?;
        let (low, high) = match &dist {
            Dist::Fixed(v) => (Some(*v), Some(*v)),
            other => (None, other.quantile(0.999)),
        };
        let bad = low
            .filter(|v| *v < 0.0)
            .or(high.filter(|v| v.is_nan() || *v > MAX_SERVICE_US));
        if let Some(value_us) = bad {
            return Err(ServiceTimeError::OutOfRange {
                spec: spec.to_string(),
                value_us,
            });
        }
        Ok(Self::from_fn(spec, move |rng| dist.sample(rng)))
    }

    /// A constant service time.
    pub fn fixed_us(us: f64) -> Self {
        Self::from_fn(format!("fixed:{us}"), move |_| us)
    }

    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// One draw, clamped to [0, 10 s] so a heavy-tailed distribution cannot wedge a thread.
    pub fn draw(&self, rng: &mut dyn RngCore) -> Duration {
        let us = (self.sampler)(rng);
        let us = if us.is_finite() {
            us.clamp(0.0, MAX_SERVICE_US)
        } else {
            0.0
        };
        Duration::from_nanos((us * 1000.0) as u64)
    }
}

/// The longest service time one request is given (its draws are clamped to it), µs.
pub const MAX_SERVICE_US: f64 = 10e6;

/// A `--service-time` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ServiceTimeError {
    #[error(transparent)]
    Dist(#[from] headroom_load::dist::DistError),
    #[error("{spec:?} gives {value_us:e} µs: service times must be 0 to {MAX_SERVICE_US:e} µs (10 s) in 99.9% of requests")]
    OutOfRange { spec: String, value_us: f64 },
}

impl fmt::Debug for ServiceTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceTime({})", self.spec)
    }
}

/// Cache lines every request reads from the footprint (dependent loads, so their latency adds up
/// like a pointer-chasing lookup): 64 lines = 4 KiB per request.
pub const FOOTPRINT_LINES_PER_REQUEST: usize = 64;

const LINE_WORDS: usize = 8;

/// A read-only working set shared by all worker threads.
pub struct Footprint {
    words: Box<[u64]>,
    lines: usize,
}

impl Footprint {
    /// Allocates and fills `mb` MiB (every page touched, so it is resident before serving).
    pub fn new(mb: usize) -> Self {
        let n_words = (mb << 20) / 8;
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let words: Box<[u64]> = (0..n_words)
            .map(|_| {
                // xorshift: cheap pseudo-random contents so the chase below has no pattern.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect();
        let lines = (n_words / LINE_WORDS).max(1);
        Footprint { words, lines }
    }

    /// Reads [`FOOTPRINT_LINES_PER_REQUEST`] cache lines, each address depending on the previous
    /// load; returns a value so the loads cannot be optimised away.
    pub fn touch(&self, seed: u64) -> u64 {
        if self.words.is_empty() {
            return seed;
        }
        let mut h = seed | 1;
        for _ in 0..FOOTPRINT_LINES_PER_REQUEST {
            let line = (h % self.lines as u64) as usize;
            let w = self.words[line * LINE_WORDS];
            h = h.wrapping_mul(6364136223846793005).wrapping_add(w | 1);
        }
        h
    }
}

/// Spins on this thread's CPU clock until it has consumed `d` of CPU time: the request's work is
/// CPU work, so when the thread is preempted the work takes longer in wall time, as real work
/// would.
pub fn burn_cpu(d: Duration) {
    if d.is_zero() {
        return;
    }
    let start = thread_cpu_time();
    let mut acc = 0u64;
    loop {
        for i in 0..64u64 {
            acc = std::hint::black_box(acc.wrapping_mul(31).wrapping_add(i));
        }
        if thread_cpu_time().saturating_sub(start) >= d {
            break;
        }
    }
    std::hint::black_box(acc);
}

/// CPU time consumed by the calling thread.
pub fn thread_cpu_time() -> Duration {
    Duration::from_nanos(headroom_load::clock::thread_cpu_ns())
}

/// The per-request synthetic work of one server.
#[derive(Default)]
pub struct SyntheticWork {
    pub service_time: Option<ServiceTime>,
    pub footprint: Option<Footprint>,
}

impl SyntheticWork {
    pub fn is_empty(&self) -> bool {
        self.service_time.is_none() && self.footprint.is_none()
    }

    /// Does one request's worth of synthetic work.
    pub fn run(&self, rng: &mut dyn RngCore) {
        if let Some(fp) = &self.footprint {
            std::hint::black_box(fp.touch(rng.random()));
        }
        if let Some(st) = &self.service_time {
            burn_cpu(st.draw(rng));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn burn_cpu_consumes_about_the_requested_cpu_time() {
        let before = thread_cpu_time();
        burn_cpu(Duration::from_millis(5));
        let used = thread_cpu_time() - before;
        assert!(used >= Duration::from_millis(5), "used {used:?}");
        assert!(used < Duration::from_millis(50), "used {used:?}");
    }

    #[test]
    fn service_time_draws_are_clamped() {
        let st = ServiceTime::from_fn("weird", |_| -5.0);
        let mut rng = rand::rng();
        assert_eq!(st.draw(&mut rng), Duration::ZERO);
        let st = ServiceTime::fixed_us(20.0);
        assert_eq!(st.draw(&mut rng), Duration::from_micros(20));
        let st = ServiceTime::from_fn("nan", |_| f64::NAN);
        assert_eq!(st.draw(&mut rng), Duration::ZERO);
    }

    #[test]
    fn footprint_touch_depends_on_contents_and_is_quick() {
        let fp = Footprint::new(1);
        assert_eq!(fp.lines, (1 << 20) / 64);
        let t = Instant::now();
        let a = fp.touch(1);
        let b = fp.touch(2);
        assert_ne!(a, b);
        assert!(t.elapsed() < Duration::from_millis(50));
    }
}
