//! Memory antagonists: `llc` / `dram` stream through an array (Heracles' stream-LLC and
//! stream-DRAM); `memory` grows its footprint at a given rate (the BE memory pressure PerfIso
//! guards against).

use std::time::{Duration, Instant};

use super::{AntagonistError, RunState, Workload};

const MIB: u64 = 1 << 20;
const LINE: usize = 64;

/// Streams through `total_bytes` split evenly across threads, each thread owning its slice.
pub struct Stream {
    per_thread: usize,
    /// Allocated and filled before the clock starts, so the first second measures streaming.
    arrays: Vec<std::sync::Mutex<Vec<u8>>>,
}

impl Stream {
    pub fn new(total_bytes: u64, threads: usize) -> Result<Self, AntagonistError> {
        if total_bytes < 4096 {
            return Err(AntagonistError::Usage(format!(
                "stream array of {total_bytes} bytes is too small (need at least 4096)"
            )));
        }
        if total_bytes > 64 << 30 {
            return Err(AntagonistError::Usage(format!(
                "stream array of {} MiB is larger than this antagonist allows (64 GiB)",
                total_bytes >> 20
            )));
        }
        let per_thread = ((total_bytes as usize / threads.max(1)) / LINE).max(64) * LINE;
        let arrays = (0..threads.max(1))
            .map(|_| std::sync::Mutex::new(vec![1u8; per_thread]))
            .collect();
        Ok(Stream { per_thread, arrays })
    }
}

impl Stream {
    /// Streams through worker `index`'s array from `*pos`, one op per MiB, until `mib` MiB are
    /// done (None: until the run stops); `*pos` is left where it stopped for the next call.
    pub(super) fn stream(&self, index: usize, state: &RunState, mib: Option<u64>, pos: &mut usize) {
        let mut buf = self.arrays[index].lock().unwrap_or_else(|p| p.into_inner());
        let mut bytes_done = 0u64;
        let mut counted = 0u64;
        while !state.stopped() && mib.is_none_or(|m| counted < m) {
            // Read-modify-write one byte per cache line: every line is loaded and dirtied, so
            // the array occupies the cache (llc) or saturates DRAM bandwidth (dram).
            let end = (*pos + MIB as usize).min(buf.len());
            let mut i = *pos;
            while i < end {
                buf[i] = buf[i].wrapping_add(1);
                i += LINE;
            }
            bytes_done += (end - *pos) as u64;
            *pos = if end == buf.len() { 0 } else { end };
            if bytes_done >= MIB {
                state.add(bytes_done / MIB);
                counted += bytes_done / MIB;
                bytes_done %= MIB;
            }
        }
        std::hint::black_box(&*buf);
    }
}

impl Workload for Stream {
    fn detail(&self) -> String {
        format!("{} KiB array per thread", self.per_thread >> 10)
    }

    fn run_thread(&self, index: usize, state: &RunState) -> Result<(), AntagonistError> {
        self.stream(index, state, None, &mut 0);
        Ok(())
    }
}

/// Grows to `mb` MiB at `rate_mb_s`, then keeps re-touching every page at that rate so the
/// memory stays resident and the op rate stays steady.
pub struct Memory {
    per_thread_bytes: usize,
    per_thread_rate: f64,
}

impl Memory {
    pub fn new(mb: u64, rate_mb_s: f64, threads: usize) -> Result<Self, AntagonistError> {
        if mb == 0 {
            return Err(AntagonistError::Usage("--mb must be at least 1".into()));
        }
        if rate_mb_s.is_nan() || rate_mb_s < 0.0 || !rate_mb_s.is_finite() {
            return Err(AntagonistError::Usage(format!(
                "--rate-mb-s {rate_mb_s}: expected a finite number ≥ 0 (0 = as fast as possible)"
            )));
        }
        Ok(Memory {
            per_thread_bytes: ((mb * MIB) as usize / threads.max(1)).max(MIB as usize),
            per_thread_rate: rate_mb_s / threads.max(1) as f64,
        })
    }
}

const PAGE: usize = 4096;

impl Workload for Memory {
    fn detail(&self) -> String {
        format!(
            "{} MiB per thread at {:.1} MiB/s per thread",
            self.per_thread_bytes >> 20,
            self.per_thread_rate
        )
    }

    fn run_thread(&self, _index: usize, state: &RunState) -> Result<(), AntagonistError> {
        // Capacity is reserved (virtual) up front and becomes resident only as it is touched.
        let mut buf: Vec<u8> = Vec::new();
        buf.try_reserve_exact(self.per_thread_bytes).map_err(|e| {
            AntagonistError::io(
                format!("reserving {} MiB", self.per_thread_bytes >> 20),
                std::io::Error::new(std::io::ErrorKind::OutOfMemory, e.to_string()),
            )
        })?;
        let start = Instant::now();
        let mut touched_mib = 0u64;
        let mut pos = 0usize;
        let mut pass = 1u8;
        while !state.stopped() {
            let end = (pos + MIB as usize).min(self.per_thread_bytes);
            let ptr = buf.as_mut_ptr();
            let mut i = pos;
            while i < end {
                // SAFETY: `i` < reserved capacity; writing a u8 into reserved (possibly
                // uninitialised) capacity through the raw pointer is valid, and the Vec never
                // reads it as initialised (its len stays 0).
                unsafe { ptr.add(i).write_volatile(pass) };
                i += PAGE;
            }
            pos = if end == self.per_thread_bytes {
                pass = pass.wrapping_add(1);
                0
            } else {
                end
            };
            touched_mib += 1;
            state.add(1);
            if self.per_thread_rate > 0.0 {
                let due =
                    start + Duration::from_secs_f64(touched_mib as f64 / self.per_thread_rate);
                while !state.stopped() {
                    let now = Instant::now();
                    if now >= due {
                        break;
                    }
                    std::thread::sleep((due - now).min(Duration::from_millis(20)));
                }
            }
        }
        Ok(())
    }
}
