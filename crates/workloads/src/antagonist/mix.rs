//! `mix`: a batch job that alternates compute and memory phases, as real BE work does (an
//! analytics or ML job computes, then scans). Every worker runs `MIX_PHASE_OPS` spin ops, then
//! streams `MIX_PHASE_OPS` MiB through a DRAM-sized array, and again. The phases are fixed
//! amounts of work, not of time, so the mix of the two stays the same however the BE is
//! throttled, and its ops/s against its solo rate is a fraction of the same work.

use super::cpu::Spin;
use super::mem::Stream;
use super::{AntagonistError, RunState, Workload};

/// Ops per phase. A spin op (65 536 multiply-adds) and a streamed MiB each take ~50 µs on the
/// development VM, so a phase is ~50 ms: long enough to behave as a compute or a memory job,
/// short against the agent's seconds-long control steps.
pub const MIX_PHASE_OPS: u64 = 1000;

pub struct Mix {
    stream: Stream,
}

impl Mix {
    pub fn new(array_bytes: u64, threads: usize) -> Result<Self, AntagonistError> {
        Ok(Mix {
            stream: Stream::new(array_bytes, threads)?,
        })
    }
}

impl Workload for Mix {
    fn detail(&self) -> String {
        format!(
            "phases of {MIX_PHASE_OPS} spin ops and {MIX_PHASE_OPS} MiB streamed, {}",
            self.stream.detail()
        )
    }

    fn run_thread(&self, index: usize, state: &RunState) -> Result<(), AntagonistError> {
        let mut x = index as u64 + 1;
        let mut pos = 0usize;
        while !state.stopped() {
            x = Spin::spin(state, Some(MIX_PHASE_OPS), x);
            self.stream
                .stream(index, state, Some(MIX_PHASE_OPS), &mut pos);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use super::*;

    fn state() -> RunState {
        RunState {
            ops: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }

    #[test]
    fn a_spin_phase_counts_exactly_its_ops() {
        let s = state();
        Spin::spin(&s, Some(7), 1);
        assert_eq!(s.ops.load(Ordering::Relaxed), 7);
    }

    #[test]
    fn a_stream_phase_counts_exactly_its_mib_and_wraps_around_the_array() {
        // 3 MiB array, one thread: 5 MiB streamed wraps once and stops 2 MiB in.
        let stream = Stream::new(3 << 20, 1).unwrap();
        let s = state();
        let mut pos = 0;
        stream.stream(0, &s, Some(5), &mut pos);
        assert_eq!(s.ops.load(Ordering::Relaxed), 5);
        assert_eq!(pos, 2 << 20);
    }

    #[test]
    fn a_stopped_run_ends_inside_a_phase() {
        let mix = Mix::new(1 << 20, 1).unwrap();
        let s = state();
        s.stop.store(true, Ordering::Relaxed);
        mix.run_thread(0, &s).unwrap();
        assert_eq!(s.ops.load(Ordering::Relaxed), 0);
        assert!(mix.detail().contains("1000 spin ops"), "{}", mix.detail());
    }
}
