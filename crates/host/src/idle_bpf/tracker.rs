//! The attached idle tracker (the program on the `power:cpu_idle` raw tracepoint, as a link)
//! and the per-CPU idle-fraction sampler built on it.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use crate::bpf_sys::raw_tracepoint_open;
use crate::error::{HostError, IoOp, Result};
use headroom_types::values::CpuSet;

use super::loaded::IdleProgram;
use super::monotonic_ns;

/// The attached idle tracker. Detached (link, program, mappings and maps closed) on drop.
#[derive(Debug)]
pub struct BpfIdleTracker {
    // Field order is drop order: detach before unmapping and closing the maps.
    _link: OwnedFd,
    program: IdleProgram,
    online: Vec<usize>,
    idle: Vec<u64>,
}

impl BpfIdleTracker {
    /// Loads and attaches the program, watching every online CPU. `root` is where
    /// `sys/devices/system/cpu/{possible,online}` are read (`/` in production).
    pub fn attach(root: &Path) -> Result<BpfIdleTracker> {
        Self::attach_watching(root, None)
    }

    /// As [`BpfIdleTracker::attach`], counting only `watched` CPUs (`None`: every online one).
    pub fn attach_watching(root: &Path, watched: Option<&[usize]>) -> Result<BpfIdleTracker> {
        let cpu_list = |name: &str| -> Result<CpuSet> {
            let path = root.join("sys/devices/system/cpu").join(name);
            let text = std::fs::read_to_string(&path)
                .map_err(|e| HostError::io(IoOp::Read, &path, None, e))?;
            CpuSet::parse_list(text.trim()).map_err(|_| HostError::Parse {
                path: path.clone(),
                content: text.trim().to_owned(),
                reason: "not a CPU list".to_owned(),
            })
        };
        let possible = cpu_list("possible")?.last().map_or(1, |m| m as usize + 1);
        let online: Vec<usize> = cpu_list("online")?.iter().map(|c| c as usize).collect();
        let program = IdleProgram::load(possible, watched.unwrap_or(&online))?;

        let link = raw_tracepoint_open(("power", "cpu_idle"), &program.program, "idle program")?;
        let tracker = BpfIdleTracker {
            _link: link,
            program,
            idle: vec![0; possible],
            online,
        };
        tracker.prime();
        Ok(tracker)
    }

    /// Visits every online CPU once so each leaves idle and re-enters it with the program
    /// attached: an idle period begun before the attach is otherwise unknown (no entry seen)
    /// until the CPU next wakes, which under NO_HZ may take seconds — and the idle count would
    /// miss it.
    fn prime(&self) {
        let mut original: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: sched_{get,set}affinity on the calling thread with a properly sized set.
        unsafe {
            if libc::sched_getaffinity(0, size, &mut original) != 0 {
                return;
            }
            for &cpu in &self.online {
                let mut one: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut one);
                if libc::sched_setaffinity(0, size, &one) == 0 {
                    libc::sched_yield();
                }
            }
            libc::sched_setaffinity(0, size, &original);
        }
    }

    /// The online CPUs (as at attach).
    pub fn online(&self) -> &[usize] {
        &self.online
    }

    /// The program and its maps (the idle count, thresholds, counters, ring buffer).
    pub fn program(&self) -> &IdleProgram {
        &self.program
    }

    pub fn program_mut(&mut self) -> &mut IdleProgram {
        &mut self.program
    }

    /// Waits up to `timeout` for a threshold crossing; true when one (or more) is waiting.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        self.program.ring.wait(timeout)
    }

    /// Whether events wait in the ring buffer now (no syscall).
    pub fn pending(&self) -> bool {
        self.program.ring.pending()
    }

    /// Sleeps until an event, a readable fd added with [`super::RingReader::watch`], or `timeout`.
    pub fn wait_any(&self, timeout: Option<Duration>) -> io::Result<super::Ready> {
        self.program.ring.wait_any(timeout)
    }

    /// Cumulative idle ns of every possible CPU (index = CPU) up to `now_ns` (CLOCK_MONOTONIC,
    /// see [`monotonic_ns`]), the ongoing idle period included. A CPU not yet seen entering
    /// idle since the attach reads 0.
    pub fn read(&mut self, now_ns: u64) -> Result<&[u64]> {
        for cpu in 0..self.program.possible {
            self.idle[cpu] = self.program.idle_ns(cpu, now_ns);
        }
        Ok(&self.idle)
    }
}

/// Per-CPU idle fractions between successive reads of a [`BpfIdleTracker`].
#[derive(Debug)]
pub struct BpfIdleSampler {
    tracker: BpfIdleTracker,
    prev_ns: u64,
    prev: Vec<u64>,
    out: Vec<(usize, f64)>,
}

impl BpfIdleSampler {
    pub fn attach(root: &Path) -> Result<BpfIdleSampler> {
        let mut tracker = BpfIdleTracker::attach(root)?;
        let now = monotonic_ns();
        let prev = tracker.read(now)?.to_vec();
        let out = Vec::with_capacity(tracker.online().len());
        Ok(BpfIdleSampler {
            tracker,
            prev_ns: now,
            prev,
            out,
        })
    }

    /// The tracker (the idle count and its events).
    pub fn tracker(&self) -> &BpfIdleTracker {
        &self.tracker
    }

    pub fn tracker_mut(&mut self) -> &mut BpfIdleTracker {
        &mut self.tracker
    }

    /// `(cpu, idle fraction 0..=1)` of each online CPU since the previous sample (allocation
    /// free). Two samples closer than 1 µs apart keep the previous fractions.
    pub fn sample(&mut self) -> Result<&[(usize, f64)]> {
        let now = monotonic_ns();
        let dt = now.saturating_sub(self.prev_ns);
        if dt < 1_000 && !self.out.is_empty() {
            return Ok(&self.out);
        }
        self.tracker.read(now)?;
        let tracker = &self.tracker;
        self.out.clear();
        for &cpu in tracker.online.iter() {
            let d = tracker.idle[cpu].saturating_sub(self.prev[cpu]);
            self.out
                .push((cpu, (d as f64 / dt.max(1) as f64).clamp(0.0, 1.0)));
        }
        self.prev.copy_from_slice(&tracker.idle);
        self.prev_ns = now;
        Ok(&self.out)
    }
}
