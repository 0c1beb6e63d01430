//! Per-event reaction times for `headroom bench agent`: when `HEADROOM_REACTION_LOG` names a
//! file, the agent appends one line per fall of the idle count below its low threshold that
//! a tick answered with a write: `<mode> <crossing ktime ns> <agent awake ns> <write done ns>`,
//! all CLOCK_MONOTONIC (the clock of `bpf_ktime_get_ns`). Off (no file, no cost) otherwise.

use std::io::Write;

/// The environment variable naming the log file.
pub const ENV: &str = "HEADROOM_REACTION_LOG";

pub struct ReactionLog {
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl ReactionLog {
    /// Opens the file `HEADROOM_REACTION_LOG` names (appending); off when unset or unopenable
    /// (said in the log).
    pub fn from_env() -> ReactionLog {
        let file = std::env::var_os(ENV).and_then(|path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .inspect_err(|e| {
                    tracing::warn!(path = %std::path::Path::new(&path).display(), error = %e, "reaction log not written")
                })
                .ok()
                .map(std::io::BufWriter::new)
        });
        ReactionLog { file }
    }

    pub fn enabled(&self) -> bool {
        self.file.is_some()
    }

    pub fn record(&mut self, mode: &str, crossing_ns: u64, awake_ns: u64, written_ns: u64) {
        if let Some(f) = self.file.as_mut() {
            let _ = writeln!(f, "{mode} {crossing_ns} {awake_ns} {written_ns}");
        }
    }

    /// The idle program's counters at the end, and the falls the agent found to be its own
    /// wake-up: `counters <events> <suppressed> <overruns> <own_wakes>`.
    pub fn record_counters(&mut self, events: u64, suppressed: u64, overruns: u64, own: u64) {
        if let Some(f) = self.file.as_mut() {
            let _ = writeln!(f, "counters {events} {suppressed} {overruns} {own}");
        }
    }

    pub fn flush(&mut self) {
        if let Some(f) = self.file.as_mut() {
            let _ = f.flush();
        }
    }
}
