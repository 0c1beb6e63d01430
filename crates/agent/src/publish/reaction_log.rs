//! Per-event reaction times for `headroom bench agent`: when `HEADROOM_REACTION_LOG` names a
//! file, the agent appends one line per fall of the idle count below its low threshold that
//! a tick answered with a write, with the tick's phases (all CLOCK_MONOTONIC ns, the clock of
//! `bpf_ktime_get_ns`; see [`ReactionLog::record`] for the fields). Off (no file, no cost: one
//! thread-local flag read per phase) otherwise.

use std::io::Write;

/// The environment variable naming the log file.
pub const ENV: &str = "HEADROOM_REACTION_LOG";

pub struct ReactionLog {
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl ReactionLog {
    /// Opens the file `HEADROOM_REACTION_LOG` names (appending); off when unset or unopenable
    /// (said in the log). When on, the tick's phases are stamped ([`phase`]).
    pub fn from_env() -> ReactionLog {
        match std::env::var_os(ENV) {
            Some(path) => ReactionLog::to_path(std::path::Path::new(&path)),
            None => {
                phase::enable(false);
                ReactionLog { file: None }
            }
        }
    }

    /// Appends to `path` (off when it cannot be opened, said in the log); this thread stamps
    /// its ticks' phases while the file is open.
    pub fn to_path(path: &std::path::Path) -> ReactionLog {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .inspect_err(
                |e| tracing::warn!(path = %path.display(), error = %e, "reaction log not written"),
            )
            .ok()
            .map(std::io::BufWriter::new);
        phase::enable(file.is_some());
        ReactionLog { file }
    }

    pub fn enabled(&self) -> bool {
        self.file.is_some()
    }

    /// One answered crossing: `<mode> <crossing> <awake> <last write done> <sensed> <decided>
    /// <recorded> <reads> <read ns> <tick done> [<write start> <write end> <knob kind>]…` — the kernel's
    /// crossing stamp, the loop awake, the last knob write returned, the observation sampled,
    /// the policy's decision handed to the sink, the decision log done, how many knob reads
    /// (read-backs) and their time, the tick's end (metrics, status), and each write.
    pub fn record(&mut self, mode: &str, crossing_ns: u64, awake_ns: u64, s: &phase::Stamps) {
        let Some(f) = self.file.as_mut() else { return };
        let writes = &s.writes[..s.n_writes.min(phase::MAX_WRITES)];
        let last = writes.last().map_or(s.tick_done, |w| w.1);
        let _ = write!(
            f,
            "{mode} {crossing_ns} {awake_ns} {last} {} {} {} {} {} {}",
            s.sensed, s.decided, s.recorded, s.reads, s.read_ns, s.tick_done
        );
        for (a, b, kind) in writes {
            let _ = write!(f, " {a} {b} {kind}");
        }
        let _ = writeln!(f);
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

/// The control thread's stamps of one tick's phases, kept only while the reaction log is on:
/// the node (sample, knob reads and writes) and the sink (decision, decision log) stamp them
/// where they happen, without a clock in the pure controller between them.
pub mod phase {
    use std::cell::Cell;

    /// Writes stamped per tick (a plan writes a few knobs).
    pub const MAX_WRITES: usize = 8;

    #[derive(Debug, Clone, Copy, Default)]
    pub struct Stamps {
        pub sensed: u64,
        pub decided: u64,
        pub recorded: u64,
        pub reads: u32,
        pub read_ns: u64,
        pub n_writes: usize,
        /// (start, end, knob kind) of each write.
        pub writes: [(u64, u64, &'static str); MAX_WRITES],
        pub tick_done: u64,
    }

    thread_local! {
        static ON: Cell<bool> = const { Cell::new(false) };
        static STAMPS: Cell<Stamps> = Cell::new(Stamps::default());
    }

    pub(crate) fn enable(on: bool) {
        ON.with(|c| c.set(on));
    }

    /// Whether this thread stamps phases.
    pub fn on() -> bool {
        ON.with(Cell::get)
    }

    fn now() -> u64 {
        headroom_host::idle_bpf::monotonic_ns()
    }

    fn update(f: impl FnOnce(&mut Stamps)) {
        if on() {
            STAMPS.with(|c| {
                let mut s = c.get();
                f(&mut s);
                c.set(s);
            });
        }
    }

    /// A new tick: forgets the last one's stamps.
    pub fn start() {
        update(|s| *s = Stamps::default());
    }

    pub fn sensed() {
        update(|s| s.sensed = now());
    }

    pub fn decided() {
        update(|s| s.decided = now());
    }

    pub fn recorded() {
        update(|s| s.recorded = now());
    }

    /// Now, when stamping (the start of a read or write), else 0.
    pub fn begin() -> u64 {
        if on() {
            now()
        } else {
            0
        }
    }

    pub fn read_done(started: u64) {
        update(|s| {
            s.reads += 1;
            s.read_ns += now().saturating_sub(started);
        });
    }

    pub fn write_done(started: u64, kind: &'static str) {
        update(|s| {
            if s.n_writes < MAX_WRITES {
                s.writes[s.n_writes] = (started, now(), kind);
            }
            s.n_writes += 1;
        });
    }

    /// The tick's end; its stamps.
    pub fn tick_done() -> Stamps {
        update(|s| s.tick_done = now());
        STAMPS.with(Cell::get)
    }
}
