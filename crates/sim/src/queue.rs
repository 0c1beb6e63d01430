//! The LC's queue in closed form: Erlang C for the chance of waiting, an exponential waiting time
//! (exact for M/M/k, the Allen–Cunneen scaling for M/G/k), and a service-time distribution that is
//! a shift plus a mix of exponentials, so the response-time tail `P(T > t)` is a sum of
//! exponentials and a percentile is a bisection. Per-request simulation of every server of a
//! fleet would be far too slow; [`crate::des`] checks these formulas against an exact simulation.

use serde::{Deserialize, Serialize};

/// Probability that an arrival finds all `k` servers busy in a loss system (Erlang B), offered
/// load `a` (= λ·E[S], in servers); in an overflow system (arrivals that find the `k` busy go
/// elsewhere instead of queueing) it is the overflow fraction, and `a·B` the overflow traffic —
/// Erlang's and Wilkinson's overflow model. Defined for every `a ≥ 0`, also `a ≥ k`.
pub fn erlang_b(k: u32, a: f64) -> f64 {
    if a <= 0.0 {
        return if k == 0 { 1.0 } else { 0.0 };
    }
    let mut b = 1.0;
    for i in 1..=k {
        b = a * b / (i as f64 + a * b);
    }
    b
}

/// Probability that an arrival waits in an M/M/k queue (Erlang C), `k` servers, offered load `a`
/// (= λ·E[S], in servers). 1.0 when `a >= k` (the queue is unstable).
pub fn erlang_c(k: u32, a: f64) -> f64 {
    if k == 0 || a >= k as f64 {
        return 1.0;
    }
    if a <= 0.0 {
        return 0.0;
    }
    // Erlang B by its stable recurrence, then C from B.
    let mut b = 1.0;
    for i in 1..=k {
        b = a * b / (i as f64 + a * b);
    }
    let rho = a / k as f64;
    b / (1.0 - rho + rho * b)
}

/// A service time: `shift_us` plus an exponential phase chosen with probability `p` (at most two
/// phases: one for 0 < cv ≤ 1, a balanced hyperexponential for cv > 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServiceDist {
    pub shift_us: f64,
    /// (probability, rate per µs) of each phase; unused phases have probability 0.
    pub phases: [(f64, f64); 2],
}

impl ServiceDist {
    /// The distribution with mean `mean_us` and coefficient of variation `cv`.
    pub fn with_mean_cv(mean_us: f64, cv: f64) -> ServiceDist {
        let mean = mean_us.max(1e-9);
        if cv <= 1.0 {
            // shifted exponential: the exponential part has mean cv·mean, std cv·mean
            let cv = cv.max(1e-3);
            ServiceDist {
                shift_us: mean * (1.0 - cv),
                phases: [(1.0, 1.0 / (cv * mean)), (0.0, 1.0)],
            }
        } else {
            // balanced-means H2
            let c2 = cv * cv;
            let p1 = 0.5 * (1.0 + ((c2 - 1.0) / (c2 + 1.0)).sqrt());
            ServiceDist {
                shift_us: 0.0,
                phases: [(p1, 2.0 * p1 / mean), (1.0 - p1, 2.0 * (1.0 - p1) / mean)],
            }
        }
    }

    pub fn mean_us(&self) -> f64 {
        self.shift_us
            + self
                .phases
                .iter()
                .filter(|(p, _)| *p > 0.0)
                .map(|(p, r)| p / r)
                .sum::<f64>()
    }

    /// The same shape, every time multiplied by `factor` (a slower core).
    pub fn stretched(&self, factor: f64) -> ServiceDist {
        ServiceDist {
            shift_us: self.shift_us * factor,
            phases: [
                (self.phases[0].0, self.phases[0].1 / factor),
                (self.phases[1].0, self.phases[1].1 / factor),
            ],
        }
    }

    /// Squared coefficient of variation.
    pub fn scv(&self) -> f64 {
        let m = self.mean_us();
        let second: f64 = self
            .phases
            .iter()
            .filter(|(p, _)| *p > 0.0)
            .map(|(p, r)| {
                // E[(d + X)^2] for X ~ Exp(r)
                let d = self.shift_us;
                p * (d * d + 2.0 * d / r + 2.0 / (r * r))
            })
            .sum();
        ((second - m * m) / (m * m)).max(0.0)
    }
}

/// `P(X + Y > x)` for independent `X ~ Exp(a)`, `Y ~ Exp(b)`.
/// `e^(−y)` for `y ≥ 0`, 0 where it would underflow: libm's underflow path (`xflow`) cost an
/// eighth of a fleet run's CPU time, for terms that are 0 in every sum they enter.
fn exp_neg(y: f64) -> f64 {
    if y > 700.0 {
        0.0
    } else {
        (-y).exp()
    }
}

fn hypo_tail(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    if ((a - b) / a).abs() < 1e-9 {
        return (1.0 + a * x) * exp_neg(a * x); // Erlang-2
    }
    (b * exp_neg(a * x) - a * exp_neg(b * x)) / (b - a)
}

/// What `server.stall_fraction` is a share of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StallForm {
    /// Of requests: that share meets a stall whatever the load.
    #[default]
    Requests,
    /// Of time: the host stops the LC's CPUs that share of the time (a server vacation).
    /// Requests that arrive during a stall of length D, and those that arrive while the backlog
    /// it left drains, wait: at utilization ρ a request arriving u after the stall began waits
    /// D − (1 − ρ)u more, for u up to D/(1 − ρ). Over exponential stall lengths (a request
    /// meets a stall with probability in proportion to its length) that wait is again
    /// exponential with the stalls' mean, and the share of requests that meet it is the time
    /// share over 1 − ρ: stalls hurt a busy server's tail more than an idle one's.
    Time,
}

impl StallForm {
    /// What the fraction is a share of, in words.
    pub fn noun(self) -> &'static str {
        match self {
            StallForm::Requests => "requests",
            StallForm::Time => "time",
        }
    }
}

/// The response-time distribution of one LC queue over one tick.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResponseTail {
    /// Probability of waiting for a server.
    pub p_wait: f64,
    /// Rate of the (exponential) waiting time given a wait, per µs.
    pub wait_rate: f64,
    pub service: ServiceDist,
    /// Requests that also meet a scheduling delay (woken on a core BE holds) ...
    pub p_delay: f64,
    /// ... of this many µs (Leverich's scheduling-delay effect).
    pub delay_us: f64,
    /// The share of its servers' time the queue keeps busy (1 when it cannot keep up).
    pub utilization: f64,
    /// Requests that also meet a host stall (`server.stall_fraction` amplified by the
    /// backlog the stall leaves, see [`ResponseTail::with_stall`]) ...
    pub p_stall: f64,
    /// ... exponentially distributed with this mean, µs.
    pub stall_mean_us: f64,
}

impl ResponseTail {
    /// A queue of `k` identical servers (fractional k interpolates between ⌊k⌋ and ⌈k⌉) with
    /// Poisson arrivals at `lambda_per_us` and service `service`. `None` when the queue is
    /// unstable (offered load ≥ k).
    pub fn mgk(k: f64, lambda_per_us: f64, service: ServiceDist) -> Option<ResponseTail> {
        let mean = service.mean_us();
        let a = lambda_per_us * mean;
        if k <= 0.0 || a >= k {
            return None;
        }
        let lo = k.floor().max(1.0);
        let frac = (k - k.floor()).clamp(0.0, 1.0);
        let c_lo = if (lo as u32) as f64 > a {
            erlang_c(lo as u32, a)
        } else {
            1.0
        };
        let c_hi = erlang_c(lo as u32 + 1, a);
        let p_wait = if k < 1.0 {
            1.0f64.min(a / k)
        } else {
            c_lo + frac * (c_hi - c_lo)
        };
        // Allen–Cunneen: M/G/k waits scale with (1 + cv²)/2 of the M/M/k wait.
        let ac = (1.0 + service.scv()) / 2.0;
        let wait_rate = (k / mean - lambda_per_us) / ac;
        Some(ResponseTail {
            p_wait,
            wait_rate,
            utilization: a / k,
            service,
            p_delay: 0.0,
            delay_us: 0.0,
            p_stall: 0.0,
            stall_mean_us: 0.0,
        })
    }

    /// A queue that cannot keep up over a tick of `tick_us`: everyone waits, on average half of
    /// the backlog built over the tick (the model carries no backlog across ticks).
    pub fn saturated(k: f64, lambda_per_us: f64, service: ServiceDist, tick_us: f64) -> Self {
        let capacity = k.max(1e-3) / service.mean_us();
        let excess = (lambda_per_us - capacity).max(capacity * 0.01);
        let mean_wait = (excess / capacity * tick_us / 2.0).max(service.mean_us());
        ResponseTail {
            p_wait: 1.0,
            wait_rate: 1.0 / mean_wait,
            utilization: 1.0,
            service,
            p_delay: 0.0,
            delay_us: 0.0,
            p_stall: 0.0,
            stall_mean_us: 0.0,
        }
    }

    /// With a fraction `p` of requests delayed by `delay_us` more.
    pub fn with_delay(mut self, p: f64, delay_us: f64) -> Self {
        self.p_delay = p.clamp(0.0, 1.0);
        self.delay_us = delay_us.max(0.0);
        self
    }

    /// With host stalls of exponential length with mean `mean_us` (see [`StallForm`]).
    pub fn with_stall(mut self, form: StallForm, fraction: f64, mean_us: f64) -> Self {
        let f = fraction.clamp(0.0, 1.0);
        self.p_stall = match form {
            StallForm::Requests => f,
            StallForm::Time => {
                let drain = (1.0 - self.utilization).max(0.0);
                if f <= 0.0 {
                    0.0
                } else if drain <= f {
                    1.0
                } else {
                    f / drain
                }
            }
        };
        self.stall_mean_us = mean_us.max(0.0);
        self
    }

    fn tail_undelayed(&self, t_us: f64) -> f64 {
        let x = t_us - self.service.shift_us;
        if x <= 0.0 {
            return 1.0;
        }
        let mut out = 0.0;
        for &(p, r) in &self.service.phases {
            if p <= 0.0 {
                continue;
            }
            let no_wait = exp_neg(r * x);
            let waited = hypo_tail(r, self.wait_rate, x);
            out += p * ((1.0 - self.p_wait) * no_wait + self.p_wait * waited);
        }
        out.clamp(0.0, 1.0)
    }

    /// `P(T > t)` with the scheduling delay, without host stalls.
    fn survival_unstalled(&self, t_us: f64) -> f64 {
        let plain = self.tail_undelayed(t_us);
        if self.p_delay <= 0.0 {
            return plain;
        }
        (1.0 - self.p_delay) * plain + self.p_delay * self.tail_undelayed(t_us - self.delay_us)
    }

    fn mean_unstalled_us(&self) -> f64 {
        self.service.mean_us() + self.p_wait / self.wait_rate + self.p_delay * self.delay_us
    }

    /// `P(T > t)`.
    ///
    /// A stalled request's time is T + E, E exponential with mean m. Where m is much longer
    /// than T (the case stalls are for: ms on a VM against tens of µs of service), T + E > t
    /// is close to E > t − E[T]; below that it is at least P(T > t).
    pub fn survival(&self, t_us: f64) -> f64 {
        let unstalled = self.survival_unstalled(t_us);
        if self.p_stall <= 0.0 || self.stall_mean_us <= 0.0 {
            return unstalled;
        }
        let x = t_us - self.mean_unstalled_us();
        let stalled = if x <= 0.0 {
            1.0
        } else {
            exp_neg(x / self.stall_mean_us).max(unstalled)
        };
        (1.0 - self.p_stall) * unstalled + self.p_stall * stalled
    }

    /// Mean response time, µs.
    pub fn mean_us(&self) -> f64 {
        self.mean_unstalled_us() + self.p_stall * self.stall_mean_us
    }

    /// The `q`-quantile (0.99 = p99), µs.
    pub fn quantile(&self, q: f64) -> f64 {
        quantile_of_mix(&[(1.0, *self)], q)
    }
}

/// The `q`-quantile of a request-weighted mix of response-time distributions (the ticks of a
/// window), µs.
pub fn quantile_of_mix(mix: &[(f64, ResponseTail)], q: f64) -> f64 {
    let total: f64 = mix.iter().map(|(w, _)| w).sum();
    if total <= 0.0 {
        return 0.0;
    }
    let target = 1.0 - q;
    let survival = |t: f64| mix.iter().map(|(w, r)| w * r.survival(t)).sum::<f64>() / total;
    let mut hi = mix.iter().map(|(_, r)| r.mean_us()).fold(1.0f64, f64::max);
    let mut lo = 0.0;
    while survival(hi) > target && hi < 1e12 {
        lo = hi;
        hi *= 2.0;
    }
    // Illinois (regula falsi with halving) on ln P(T > t) − ln(1 − q), which is close to linear
    // in t (exponential tails): 4–6 evaluations where bisection to the same precision took 15+.
    let f = |t: f64| survival(t).max(1e-300).ln() - target.ln();
    let (mut a, mut fa) = (lo, f(lo));
    let (mut b, mut fb) = (hi, f(hi));
    if fa <= 0.0 {
        return 0.0;
    }
    let mut side = 0i8;
    for _ in 0..100 {
        // relative precision 1e-4 is far below the model's own error
        if b - a <= b * 1e-4 {
            break;
        }
        let mut c = (a * fb - b * fa) / (fb - fa);
        if !(c > a && c < b) {
            c = 0.5 * (a + b);
        }
        let fc = f(c);
        if fc.abs() < 1e-7 {
            return c;
        }
        if fc > 0.0 {
            (a, fa) = (c, fc);
            if side == -1 {
                fb *= 0.5;
            }
            side = -1;
        } else {
            (b, fb) = (c, fc);
            if side == 1 {
                fa *= 0.5;
            }
            side = 1;
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erlang_c_known_values() {
        // one server: P(wait) = ρ
        assert!((erlang_c(1, 0.7) - 0.7).abs() < 1e-12);
        // k = 2, a = 1: C = 1/3
        assert!((erlang_c(2, 1.0) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(erlang_c(4, 4.0), 1.0);
    }

    #[test]
    fn mm1_p99_is_the_closed_form() {
        // M/M/1: T ~ Exp(μ − λ)
        let mu = 1.0 / 100.0;
        let lambda = 0.7 * mu;
        let r = ResponseTail::mgk(1.0, lambda, ServiceDist::with_mean_cv(100.0, 1.0)).unwrap();
        let want = (100.0f64).ln() / (mu - lambda);
        assert!(
            (r.quantile(0.99) - want).abs() / want < 1e-3,
            "{}",
            r.quantile(0.99)
        );
    }

    #[test]
    fn service_shapes_keep_their_mean_and_cv() {
        for cv in [0.3, 1.0, 2.0] {
            let s = ServiceDist::with_mean_cv(50.0, cv);
            assert!((s.mean_us() - 50.0).abs() < 1e-9);
            assert!(
                (s.scv().sqrt() - cv).abs() < 1e-6,
                "cv {cv}: {}",
                s.scv().sqrt()
            );
        }
    }
}
