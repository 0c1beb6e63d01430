//! A real-time load thread's busy-polling kept under the kernel's real-time budget.
//!
//! A SCHED_FIFO/RR thread that busy-polls most of a second exhausts the real-time budget
//! (`sched_rt_runtime_us` of every `sched_rt_period_us`, 950 ms of 1 s by default) and the
//! kernel throttles it for the rest of the period: every send then waits ~50 ms. On the 2-vCPU
//! VM a FIFO client at 140k QPS used 96% of its CPU (2.9 s of 8 busy-polling) and read p99 41.8
//! ms with send lag p99 41.3 ms where the same run under SCHED_OTHER read 145 µs and 18 µs: a
//! 1-second probe passes before the first throttle, an 8-second window never does. So a
//! real-time thread watches its own CPU share every [`TICK_NS`] and, while the share is above
//! its budget, sleeps every wait instead of polling it: sends go out late by a wake-up, never
//! by a throttled period.

use crate::clock::thread_cpu_ns;

/// How often the thread's CPU share is judged (wall time).
pub const TICK_NS: u64 = 10_000_000;
/// The budget's margin below the kernel's real-time share, and its ceiling: the CPU's kernel
/// threads (softirq, RCU, kworkers) need some of every period.
const MARGIN: f64 = 0.10;
const CEILING: f64 = 0.90;

/// The busy-poll allowance of one load thread.
#[derive(Debug, Clone)]
pub struct PollBudget {
    /// Largest CPU share per tick at which polling stays allowed; `None`: no limit (not a
    /// real-time thread).
    max_share: Option<f64>,
    tick_wall: u64,
    tick_cpu: u64,
    allowed: bool,
    /// Ticks in which polling was stopped (for the report).
    pub stopped_ticks: u64,
}

impl PollBudget {
    /// No limit: a thread the kernel does not throttle.
    pub fn unlimited() -> PollBudget {
        PollBudget {
            max_share: None,
            tick_wall: 0,
            tick_cpu: 0,
            allowed: true,
            stopped_ticks: 0,
        }
    }

    /// A budget of `share` of the CPU per tick.
    pub fn with_share(share: f64) -> PollBudget {
        PollBudget {
            max_share: Some(share),
            ..PollBudget::unlimited()
        }
    }

    /// The calling thread's budget: limited when it runs SCHED_FIFO or SCHED_RR, from the
    /// kernel's real-time share (the global one, and its v1 `cpu` group's where it has one).
    pub fn for_current_thread() -> PollBudget {
        use headroom_host::sched::{sched, SchedPolicy};
        let policy = sched(0).ok().and_then(|a| a.policy());
        if !matches!(
            policy,
            Some(SchedPolicy::Fifo { .. } | SchedPolicy::RoundRobin { .. })
        ) {
            return PollBudget::unlimited();
        }
        let budget = headroom_host::rt_budget::RtBudget::of_this_process(std::path::Path::new("/"));
        let (global, group) = (budget.global, budget.group);
        PollBudget::with_share(budget_from(global, group))
    }

    /// Whether waits may be busy-polled now.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// At wall time `now_ns`: judges the tick that ended, reading the thread's CPU clock once
    /// per [`TICK_NS`] (no system call in between).
    pub fn tick(&mut self, now_ns: u64) {
        if self.max_share.is_none() || now_ns < self.tick_wall + TICK_NS {
            return;
        }
        self.observe(now_ns, thread_cpu_ns());
    }

    /// The tick from the last observation to (`wall_ns`, `cpu_ns`): polling is allowed for the
    /// next tick when this one's CPU share stayed within the budget.
    pub fn observe(&mut self, wall_ns: u64, cpu_ns: u64) {
        let Some(max) = self.max_share else {
            return;
        };
        if self.tick_wall != 0 {
            let wall = wall_ns.saturating_sub(self.tick_wall).max(1) as f64;
            let share = cpu_ns.saturating_sub(self.tick_cpu) as f64 / wall;
            self.allowed = share <= max;
            if !self.allowed {
                self.stopped_ticks += 1;
            }
        }
        self.tick_wall = wall_ns;
        self.tick_cpu = cpu_ns;
    }
}

/// The busy-poll budget from the global real-time share and the thread's group's (either
/// unknown: the other; both: the smaller), [`MARGIN`] below it, at most [`CEILING`].
fn budget_from(global: Option<f64>, group: Option<f64>) -> f64 {
    let share = match (global, group) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => 1.0,
    };
    (share - MARGIN).clamp(0.0, CEILING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_stops_for_a_tick_after_one_above_the_budget_and_resumes_below_it() {
        let mut b = PollBudget::with_share(0.85);
        assert!(b.allowed());
        b.observe(1_000_000_000, 0);
        // 9.6 ms of CPU in 10 ms: above 85%
        b.observe(1_010_000_000, 9_600_000);
        assert!(!b.allowed());
        assert_eq!(b.stopped_ticks, 1);
        // 6 ms in the next 10 ms: polling again
        b.observe(1_020_000_000, 15_600_000);
        assert!(b.allowed());
        assert_eq!(b.stopped_ticks, 1);
    }

    #[test]
    fn an_unlimited_budget_never_stops_polling() {
        let mut b = PollBudget::unlimited();
        b.observe(1, 0);
        b.observe(TICK_NS + 1, TICK_NS);
        assert!(b.allowed());
        // and reads no clock
        b.tick(u64::MAX / 2);
        assert!(b.allowed());
    }

    #[test]
    fn the_budget_is_below_the_smaller_real_time_share() {
        assert!((budget_from(Some(0.95), None) - 0.85).abs() < 1e-9);
        assert!((budget_from(Some(0.95), Some(0.5)) - 0.40).abs() < 1e-9);
        assert!((budget_from(Some(1.0), None) - CEILING).abs() < 1e-9);
        assert!((budget_from(None, None) - CEILING).abs() < 1e-9);
        assert_eq!(budget_from(Some(0.0), None), 0.0);
    }
}
