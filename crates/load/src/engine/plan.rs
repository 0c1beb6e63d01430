//! What a run hands its workers (the shared settings, each worker's connections) and what the
//! workers hand back (per-second intervals, their histograms and counters).

use std::net::SocketAddr;
use std::time::Duration;

use super::EngineKind;
use crate::dist::{Dist, KeyGenerator};
use crate::keys::KeyChooser;
use crate::protocol::Protocol;
use crate::results::{Counters, OpHists};
use crate::stats::LatencyHist;

/// Settings every worker reads (immutable once the run starts).
#[derive(Clone, Debug)]
pub struct WorkerShared {
    pub protocol: Protocol,
    pub keys: KeyGenerator,
    pub chooser: KeyChooser,
    pub valuesize: Dist,
    pub update: f64,
    /// Monotonic ns: run start, end of warmup, end of sending, end of waiting for replies.
    pub t0: u64,
    pub warm_end: u64,
    pub end: u64,
    pub drain_end: u64,
    pub spin_ns: u64,
    /// Wake early by the timer's measured lateness and busy-poll the rest (off: `--sleep-only`).
    pub adaptive_lead: bool,
    /// Keep (scheduled, latency) of every measured request of the reported class.
    pub save: bool,
    /// `-S`: a connection more than 5 ms behind at its depth cap skips sends (mutilate's rule).
    pub skip: bool,
    /// `--moderate`: no send within 250 µs of the connection's last reply (mutilate's rule).
    pub moderate: bool,
    /// TCP_NODELAY on the connections (off with `--no_nodelay`).
    pub nodelay: bool,
    /// The event loop every worker runs.
    pub engine: EngineKind,
    /// `-c auto`: a send that finds its connection and every other one to its server at the
    /// depth cap goes out on a new connection (up to `grow_cap` per server per worker).
    pub grow: bool,
    pub grow_cap: usize,
    /// `-c auto`: connections per server opened before the run with no schedule (they take
    /// sends that find their own connection at the depth cap; counted under `grow_cap`).
    pub reserve: usize,
    /// How long a connection opened during the run may take to connect (the send path waits).
    pub grow_connect_timeout: Duration,
    /// `--fifo PRIO`: the class each worker asks for (see [`crate::sched`]).
    pub fifo: Option<u32>,
}

/// One connection a worker opens.
#[derive(Clone, Debug)]
pub struct ConnPlan {
    pub addr: SocketAddr,
    /// Requests per second on this connection; 0 = as fast as the depth allows.
    pub rate: f64,
    pub depth: usize,
    /// A measurement connection (`-C`), as opposed to a load connection.
    pub measure: bool,
    /// Inter-arrival distribution at `rate` (None when `rate` is 0).
    pub ia: Option<Dist>,
    /// Whether this connection's latencies are the reported ones (feed the interval histogram).
    pub reported: bool,
}

/// One worker's connections and placement.
#[derive(Clone, Debug)]
pub struct WorkerPlan {
    pub conns: Vec<ConnPlan>,
    pub cpu: Option<usize>,
    pub seed: u64,
}

/// A measured request kept for `--save`: scheduled time since start, latency, SET or GET.
#[derive(Clone, Copy, Debug)]
pub struct SavedSample {
    pub sched_ns: u64,
    pub latency_ns: u64,
    pub update: bool,
}

/// Per-second report of one worker.
#[derive(Debug)]
pub struct IntervalMsg {
    pub worker: usize,
    pub index: u64,
    /// Corrected latencies of the reported class completed in this interval.
    pub hist: LatencyHist,
    /// The same requests' latencies from their actual send (`--hdr`'s `actual-send` lines:
    /// what a server-side or kernel-stamped sensor can see, without the client's send lag).
    pub actual_send: LatencyHist,
    /// The same requests' send lag (the client's own lateness; `--hdr`'s `send-lag` lines).
    pub send_lag: LatencyHist,
    /// Requests of all classes completed in this interval.
    pub completed: u64,
}

/// What a worker hands back at the end.
#[derive(Debug, Default)]
pub struct WorkerOut {
    pub load: OpHists,
    pub measure: OpHists,
    pub send_lag: LatencyHist,
    pub counters: Counters,
    pub ia_samples: Vec<f64>,
    pub saved: Vec<SavedSample>,
    /// Time spent busy-polling with nothing to do, waiting for a send to fall due.
    pub busy_poll_ns: u64,
    /// The worker's scheduling class and why.
    pub sched: crate::sched::SchedInfo,
    /// What the kernel refused of the timestamps asked for (the first refusal), if anything.
    pub stamps_refused: Option<String>,
}
