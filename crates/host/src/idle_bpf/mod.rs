//! Per-CPU idle time to the nanosecond, and the watched CPUs' idle count with events on
//! threshold crossings.
//!
//! `/proc/stat` reports idle in USER_HZ (10 ms) units and busy time by the tick (4 ms at
//! HZ=250), so a 1 ms poll cannot see a CPU turn busy for 10+ ms; cgroup CPU usage lags by up
//! to a tick too. PerfIso's blind isolation reads per-core idle directly; the mainline way to do
//! that is a BPF program on the `power:cpu_idle` raw tracepoint (fired by the idle loop on
//! every idle entry and exit, with or without a cpuidle driver). It keeps, per CPU, the total
//! idle nanoseconds so far, when the current idle period began and whether the CPU is in it
//! (an mmap'ed array: reading every CPU costs no syscall), and for the watched CPUs the count of
//! idle ones, waking the agent through a ring buffer only when that count crosses the policy's
//! thresholds (see [`program`]). The agent sleeps in between: no polling.
//!
//! The program is attached with `BPF_RAW_TRACEPOINT_OPEN`, whose fd is a link: the kernel
//! detaches it when the last fd closes, so a killed agent leaves nothing behind.
//!
//! Needs CAP_BPF/CAP_PERFMON (root), CONFIG_BPF_EVENTS and (for the atomics and the ring
//! buffer) Linux 5.12+; callers fall back to `/proc/stat` polling.

mod loaded;
pub mod program;
pub mod ring;
mod tracker;

pub use loaded::{EventCounters, IdleProgram};
pub use program::{control, slot};
pub use ring::{Direction, IdleEvent, Ready, RingReader};
pub use tracker::{BpfIdleSampler, BpfIdleTracker};

/// Monotonic clock, ns: the clock `bpf_ktime_get_ns` uses.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec we pass (vDSO, no syscall).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests;
