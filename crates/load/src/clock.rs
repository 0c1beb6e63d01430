//! Time for the engine: a raw CLOCK_MONOTONIC in nanoseconds (the same clock the send timer,
//! `headroom_host::timer::Timer`, uses, so a send time can be armed as an absolute deadline),
//! the wake-up lead and thread timer slack.

use headroom_host::timer::sleep_until;

/// CLOCK_MONOTONIC now, in nanoseconds.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall-clock Unix time in milliseconds (for logs and the feed).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How early to wake before a send: a running estimate of the timer's wake-up lateness.
///
/// On this VM a timerfd expiry reaches the thread 20–60 µs late, more than the gap between sends
/// at tens of thousands of QPS; waking that much early and busy-polling (epoll with a zero
/// timeout, so replies keep being read and timestamped) the rest puts sends on their schedule.
/// The estimate tracks the 90th percentile of observed lateness (stochastic approximation: up by
/// 0.9·step when a wake-up was later than the estimate, down by 0.1·step otherwise), so one wake-up
/// in ten comes late by its excess and the busy-poll per wake-up averages the gap between the
/// 90th percentile and the actual lateness, a few µs.
#[derive(Clone, Copy, Debug)]
pub struct WakeLead {
    estimate_ns: f64,
    /// CPU time one sleep and wake-up costs the thread (measured by [`Self::calibrated`]; 0
    /// when not measured).
    sleep_cpu_ns: u64,
}

impl WakeLead {
    /// Target quantile of the lateness.
    const QUANTILE: f64 = 0.9;
    /// Step of the estimate per observation (ns).
    const STEP_NS: f64 = 2_000.0;
    /// Largest lead: beyond it the machine is stalling, and polling longer would not help.
    pub const MAX_NS: u64 = 150_000;
    /// Starting lead (the typical lateness seen here).
    const INITIAL_NS: f64 = 40_000.0;

    pub fn new() -> WakeLead {
        WakeLead {
            estimate_ns: Self::INITIAL_NS,
            sleep_cpu_ns: 0,
        }
    }

    /// Sleeps taken by [`WakeLead::calibrated`] and their length.
    const CALIBRATION_SLEEPS: usize = 40;
    const CALIBRATION_SLEEP_NS: u64 = 100_000;

    /// A lead measured on the calling thread (its CPU, its class, its timer slack): the 90th
    /// percentile of the overshoot of [`Self::CALIBRATION_SLEEPS`] short absolute sleeps (~5 ms
    /// in all), instead of a guess; [`Self::observe`] follows it from there. The same sleeps
    /// give the thread CPU one sleep and wake-up costs (see [`Self::sleep_cpu_ns`]).
    pub fn calibrated() -> WakeLead {
        let cpu_before = thread_cpu_ns();
        let mut late: Vec<u64> = (0..Self::CALIBRATION_SLEEPS)
            .map(|_| {
                let at = now_ns() + Self::CALIBRATION_SLEEP_NS;
                sleep_until(at);
                now_ns().saturating_sub(at)
            })
            .collect();
        let sleep_cpu_ns =
            thread_cpu_ns().saturating_sub(cpu_before) / Self::CALIBRATION_SLEEPS as u64;
        late.sort_unstable();
        let rank = (late.len() * 9).div_ceil(10).max(1);
        WakeLead::from_lateness(late[rank - 1]).with_sleep_cpu(sleep_cpu_ns)
    }

    /// A lead starting at `late_ns` (capped at [`Self::MAX_NS`]).
    pub fn from_lateness(late_ns: u64) -> WakeLead {
        WakeLead {
            estimate_ns: late_ns.min(Self::MAX_NS) as f64,
            sleep_cpu_ns: 0,
        }
    }

    /// The same lead with a sleep costing `ns` of CPU (capped at [`Self::MAX_NS`]).
    pub fn with_sleep_cpu(self, ns: u64) -> WakeLead {
        WakeLead {
            sleep_cpu_ns: ns.min(Self::MAX_NS),
            ..self
        }
    }

    /// CPU one sleep and wake-up costs the thread: a wait shorter than this is cheaper polled
    /// than slept (on a nested VM a timer sleep costs ~20 µs of CPU, whatever its length).
    pub fn sleep_cpu_ns(&self) -> u64 {
        self.sleep_cpu_ns
    }

    /// A timer armed for `armed_ns` was seen to expire at `now_ns`.
    pub fn observe(&mut self, armed_ns: u64, now_ns: u64) {
        let late = now_ns.saturating_sub(armed_ns) as f64;
        if late > self.estimate_ns {
            self.estimate_ns += Self::STEP_NS * Self::QUANTILE;
        } else {
            self.estimate_ns -= Self::STEP_NS * (1.0 - Self::QUANTILE);
        }
        self.estimate_ns = self.estimate_ns.clamp(0.0, Self::MAX_NS as f64);
    }

    /// Current lead in ns.
    pub fn ns(&self) -> u64 {
        self.estimate_ns as u64
    }
}

impl Default for WakeLead {
    fn default() -> Self {
        WakeLead::new()
    }
}

/// CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID), in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; the thread CPU clock always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Timer slack of the calling thread: 1 ns so sleeps end when asked (default is 50 µs).
pub fn tighten_timer_slack() {
    // A refusal (none is known) leaves sleeps ending up to 50 µs late: measured, not fatal.
    let _ = headroom_host::sched::set_timer_slack_ns(1);
}

/// Number of CPUs this process may run on.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

#[cfg(test)]
mod wake_lead_tests {
    use super::WakeLead;

    #[test]
    fn lead_tracks_the_90th_percentile_of_lateness() {
        // Lateness cycling 10, 20, …, 100 µs: the 90th percentile is 90–100 µs.
        let mut lead = WakeLead::new();
        for i in 0..20_000u64 {
            let late = (i % 10 + 1) * 10_000;
            lead.observe(1_000_000, 1_000_000 + late);
        }
        assert!((85_000..=102_000).contains(&lead.ns()), "{}", lead.ns());
        // A stalling machine does not push it past the cap.
        for _ in 0..10_000 {
            lead.observe(0, 10_000_000);
        }
        assert_eq!(lead.ns(), WakeLead::MAX_NS);
    }

    #[test]
    fn a_calibrated_lead_is_measured_and_capped() {
        super::tighten_timer_slack();
        let lead = WakeLead::calibrated();
        assert!(lead.ns() <= WakeLead::MAX_NS);
        assert_eq!(WakeLead::from_lateness(10_000_000).ns(), WakeLead::MAX_NS);
        assert_eq!(WakeLead::from_lateness(7_000).ns(), 7_000);
        // The sleeps' CPU is measured (a sleep costs some) and capped like the lead.
        assert!(lead.sleep_cpu_ns() > 0 && lead.sleep_cpu_ns() <= WakeLead::MAX_NS);
        assert_eq!(WakeLead::from_lateness(7_000).sleep_cpu_ns(), 0);
        let costly = WakeLead::from_lateness(7_000).with_sleep_cpu(u64::MAX);
        assert_eq!(
            (costly.ns(), costly.sleep_cpu_ns()),
            (7_000, WakeLead::MAX_NS)
        );
    }
}
