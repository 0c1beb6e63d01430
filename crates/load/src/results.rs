//! Raw, mergeable results of a run: histograms and counters, never percentiles. Threads, and
//! remote agents, each produce one; they are merged before anything is summarized.

use serde::{Deserialize, Serialize};

use crate::error::LoadError;
use crate::stats::{BlockHists, LatencyHist};

/// Latency histograms of one class of connections (load or measurement).
#[derive(Clone, Debug, Default)]
pub struct OpHists {
    /// GETs, scheduled → done.
    pub read: LatencyHist,
    /// GETs, sent → done.
    pub read_uncorrected: LatencyHist,
    /// SETs, scheduled → done.
    pub update: LatencyHist,
    /// SETs, sent → done.
    pub update_uncorrected: LatencyHist,
    /// GETs, scheduled → done, per time block of the measured interval (for batch-means CIs).
    pub read_blocks: BlockHists,
    /// SETs, likewise.
    pub update_blocks: BlockHists,
}

impl OpHists {
    pub fn merge(&mut self, other: &OpHists) {
        self.read.merge(&other.read);
        self.read_uncorrected.merge(&other.read_uncorrected);
        self.update.merge(&other.update);
        self.update_uncorrected.merge(&other.update_uncorrected);
        self.read_blocks.merge(&other.read_blocks);
        self.update_blocks.merge(&other.update_blocks);
    }

    /// GETs and SETs together (scheduled → done) with their time blocks: what the checks judge.
    pub fn all_corrected(&self) -> (LatencyHist, BlockHists) {
        let mut all = self.read.clone();
        all.merge(&self.update);
        let mut blocks = self.read_blocks.clone();
        blocks.merge(&self.update_blocks);
        (all, blocks)
    }
}

/// Event counts over the measured interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// Measured requests sent (due inside the measured interval, sent before its end).
    pub sent: u64,
    /// Requests due inside the measured interval (sent or not): what the schedule asked for.
    #[serde(default)]
    pub scheduled: u64,
    /// Replies received for measured requests.
    pub completed: u64,
    pub gets: u64,
    pub sets: u64,
    /// GETs answered "not found".
    pub misses: u64,
    /// Lost requests: malformed replies, closed connections, no reply by the end of the drain.
    pub errors: u64,
    /// Of `errors`, the requests still unanswered when the drain ended: the server stopped
    /// answering them (the client waited on it, not on its own connections).
    #[serde(default)]
    pub stalled: u64,
    /// Times the server closed a load connection (EOF or reset; each re-opened after a pause).
    #[serde(default)]
    pub closed: u64,
    /// Requests that found their connection at the depth cap when they were due.
    pub late: u64,
    /// Connections re-opened after a fault.
    pub reconnects: u64,
    /// Sends skipped by `-S` (due, never sent; counted in `scheduled`).
    #[serde(default)]
    pub skipped: u64,
    pub bytes_tx: u64,
    pub bytes_rx: u64,
    /// Load connections opened during the run (`-c auto`: a send found its connection and every
    /// other one to its server at the depth cap).
    #[serde(default)]
    pub grown: u64,
    /// Sends that found every connection full with growth at its cap (they waited, late).
    #[serde(default)]
    pub growth_refused: u64,
    /// Measured requests timed from the kernel's transmit stamp of their send (the rest from the
    /// user-space send).
    #[serde(default)]
    pub tx_stamped: u64,
    /// Measured requests whose reply was timed by the kernel's receive stamp (the rest by when
    /// the thread read it).
    #[serde(default)]
    pub rx_stamped: u64,
    /// Of the measured sends that found no room when due (a depth cap) or went behind one that
    /// found none: how long the server held them (schedule → when it let them go), summed (ns).
    #[serde(default)]
    pub room_server_ns: u64,
    /// The same sends' send lag, summed (ns): the client's share of their lateness (it sent
    /// the room's request late, or reacted late to its reply).
    #[serde(default)]
    pub room_client_ns: u64,
    /// How many sends those are (what the server's share is averaged over).
    #[serde(default)]
    pub room_waits: u64,
}

impl Counters {
    pub fn add(&mut self, o: &Counters) {
        self.sent += o.sent;
        self.scheduled += o.scheduled;
        self.completed += o.completed;
        self.gets += o.gets;
        self.sets += o.sets;
        self.misses += o.misses;
        self.errors += o.errors;
        self.stalled += o.stalled;
        self.closed += o.closed;
        self.late += o.late;
        self.reconnects += o.reconnects;
        self.skipped += o.skipped;
        self.bytes_tx += o.bytes_tx;
        self.bytes_rx += o.bytes_rx;
        self.grown += o.grown;
        self.growth_refused += o.growth_refused;
        self.tx_stamped += o.tx_stamped;
        self.rx_stamped += o.rx_stamped;
        self.room_server_ns = self.room_server_ns.saturating_add(o.room_server_ns);
        self.room_client_ns = self.room_client_ns.saturating_add(o.room_client_ns);
        self.room_waits += o.room_waits;
    }
}

/// Most inter-arrival samples kept for the goodness-of-fit check (per thread and merged).
pub const MAX_IA_SAMPLES: usize = 5000;

/// Everything one client (all its threads) measured.
#[derive(Clone, Debug, Default)]
pub struct RawResults {
    /// Load connections.
    pub load: OpHists,
    /// Measurement connections (`-C/-Q/-D`); empty when there are none.
    pub measure: OpHists,
    pub has_measure: bool,
    /// The client's own send lag, all connections: the kernel's transmit stamp of a request −
    /// when it could go (its scheduled time, or when a connection at its depth cap got room).
    pub send_lag: LatencyHist,
    /// What the kernel refused of the timestamps asked for (the first refusal of any thread or
    /// agent): requests it concerns were timed in user space.
    pub stamps_refused: Option<String>,
    pub counters: Counters,
    /// Target aggregate QPS (0 = peak).
    pub target_qps: f64,
    /// Seconds measured (after warmup).
    pub measured_s: f64,
    /// CPU seconds the client processes spent while the load ran.
    pub cpu_s: f64,
    /// Of `cpu_s`, seconds spent busy-polling for a send to fall due (precision, not load).
    pub busy_poll_s: f64,
    /// Wall seconds the load ran (warmup included), per client.
    pub wall_s: f64,
    /// Load threads of all clients together.
    pub threads: usize,
    /// Actual send intervals multiplied by their connection's rate (unit-rate samples).
    pub ia_samples: Vec<f64>,
    /// Clients merged into this (1 + agents).
    pub clients: usize,
    /// The event loop this client ran ("io_uring" or "epoll"; empty when unknown, e.g. an agent
    /// of an older version).
    pub engine: String,
    /// Why this client runs epoll when io_uring was wanted (None when it was not wanted or ran).
    pub engine_fallback_reason: Option<String>,
    /// The load threads' scheduling class and why (this client's; agents keep their own).
    pub sched: Option<crate::sched::SchedInfo>,
    /// This client's load connections: how many, why, grown to (agents keep their own).
    pub connections: Option<headroom_types::load_result::ConnectionSizing>,
}

impl RawResults {
    /// The histograms the reported latency comes from: measurement connections when present.
    pub fn reported(&self) -> &OpHists {
        if self.has_measure {
            &self.measure
        } else {
            &self.load
        }
    }

    /// Adds another client's (or thread's) results.
    pub fn merge(&mut self, o: &RawResults) {
        self.load.merge(&o.load);
        self.measure.merge(&o.measure);
        self.has_measure |= o.has_measure;
        self.send_lag.merge(&o.send_lag);
        self.counters.add(&o.counters);
        self.target_qps += o.target_qps;
        self.measured_s = self.measured_s.max(o.measured_s);
        self.cpu_s += o.cpu_s;
        self.busy_poll_s += o.busy_poll_s;
        self.wall_s = self.wall_s.max(o.wall_s);
        self.threads += o.threads;
        self.clients += o.clients;
        // Clients on different engines are listed, each once ("io_uring, epoll").
        for name in o.engine.split(", ").filter(|n| !n.is_empty()) {
            if !self.engine.split(", ").any(|n| n == name) {
                if !self.engine.is_empty() {
                    self.engine.push_str(", ");
                }
                self.engine.push_str(name);
            }
        }
        if self.engine_fallback_reason.is_none() {
            self.engine_fallback_reason = o.engine_fallback_reason.clone();
        }
        if self.stamps_refused.is_none() {
            self.stamps_refused = o.stamps_refused.clone();
        }
        if self.sched.is_none() {
            self.sched = o.sched.clone();
        }
        if self.connections.is_none() {
            self.connections = o.connections.clone();
        }
        let room = MAX_IA_SAMPLES.saturating_sub(self.ia_samples.len());
        self.ia_samples
            .extend(o.ia_samples.iter().take(room).copied());
    }

    /// The form sent by a load agent (histograms as base64 HDR V2 deflate).
    pub fn to_wire(&self) -> WireResults {
        let h = |x: &OpHists| WireHists {
            read: x.read.to_base64(),
            read_uncorrected: x.read_uncorrected.to_base64(),
            update: x.update.to_base64(),
            update_uncorrected: x.update_uncorrected.to_base64(),
            read_blocks: x.read_blocks.to_base64(),
            update_blocks: x.update_blocks.to_base64(),
        };
        WireResults {
            load: h(&self.load),
            measure: if self.has_measure {
                Some(h(&self.measure))
            } else {
                None
            },
            send_lag: self.send_lag.to_base64(),
            counters: self.counters,
            target_qps: self.target_qps,
            measured_s: self.measured_s,
            cpu_s: self.cpu_s,
            busy_poll_s: self.busy_poll_s,
            wall_s: self.wall_s,
            threads: self.threads,
            ia_samples: self.ia_samples.clone(),
            clients: self.clients,
            engine: self.engine.clone(),
            engine_fallback_reason: self.engine_fallback_reason.clone(),
            stamps_refused: self.stamps_refused.clone(),
        }
    }

    /// Decodes an agent's results; `peer` names it in errors.
    pub fn from_wire(w: &WireResults, peer: &str) -> Result<RawResults, LoadError> {
        let dec = |name: &str, s: &str| {
            LatencyHist::from_base64(s)
                .map_err(|e| LoadError::agent(peer, format!("undecodable {name} histogram: {e}")))
        };
        let dec_blocks = |name: &str, s: &[String]| {
            BlockHists::from_base64(s)
                .map_err(|e| LoadError::agent(peer, format!("undecodable {name} histograms: {e}")))
        };
        let h = |x: &WireHists| -> Result<OpHists, LoadError> {
            Ok(OpHists {
                read: dec("read", &x.read)?,
                read_uncorrected: dec("read_uncorrected", &x.read_uncorrected)?,
                update: dec("update", &x.update)?,
                update_uncorrected: dec("update_uncorrected", &x.update_uncorrected)?,
                read_blocks: dec_blocks("read_blocks", &x.read_blocks)?,
                update_blocks: dec_blocks("update_blocks", &x.update_blocks)?,
            })
        };
        Ok(RawResults {
            load: h(&w.load)?,
            measure: match &w.measure {
                Some(m) => h(m)?,
                None => OpHists::default(),
            },
            has_measure: w.measure.is_some(),
            send_lag: dec("send_lag", &w.send_lag)?,
            counters: w.counters,
            target_qps: w.target_qps,
            measured_s: w.measured_s,
            cpu_s: w.cpu_s,
            busy_poll_s: w.busy_poll_s,
            wall_s: w.wall_s,
            threads: w.threads,
            ia_samples: w.ia_samples.clone(),
            clients: w.clients,
            engine: w.engine.clone(),
            engine_fallback_reason: w.engine_fallback_reason.clone(),
            stamps_refused: w.stamps_refused.clone(),
            sched: None,
            connections: None,
        })
    }
}

/// Histograms of one connection class on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireHists {
    pub read: String,
    pub read_uncorrected: String,
    pub update: String,
    pub update_uncorrected: String,
    /// Per-time-block histograms (absent from agents before they were added: no batching then).
    #[serde(default)]
    pub read_blocks: Vec<String>,
    #[serde(default)]
    pub update_blocks: Vec<String>,
}

/// [`RawResults`] on the wire (agent → master).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireResults {
    pub load: WireHists,
    pub measure: Option<WireHists>,
    pub send_lag: String,
    pub counters: Counters,
    pub target_qps: f64,
    pub measured_s: f64,
    pub cpu_s: f64,
    #[serde(default)]
    pub busy_poll_s: f64,
    pub wall_s: f64,
    pub threads: usize,
    pub ia_samples: Vec<f64>,
    pub clients: usize,
    /// The agent's event loop (absent from agents before io_uring).
    #[serde(default)]
    pub engine: String,
    #[serde(default)]
    pub engine_fallback_reason: Option<String>,
    /// What the agent's kernel refused of the timestamps (absent from older agents).
    #[serde(default)]
    pub stamps_refused: Option<String>,
}

/// One second (or the last, partial interval) of a run, merged over the threads.
#[derive(Clone, Debug)]
pub struct Interval {
    /// 0-based interval number since the start of the run (warmup included).
    pub index: u64,
    /// Seconds since the start at the end of this interval.
    pub t_s: f64,
    pub interval_s: f64,
    /// Replies per second in this interval (all connections).
    pub qps: f64,
    /// Corrected latencies of the reported connections completed in this interval.
    pub hist: LatencyHist,
    /// The same requests from their actual send (the kernel's transmit stamp).
    pub actual_send: LatencyHist,
    /// The same requests' send lag: the client's own lateness, not part of either latency.
    pub send_lag: LatencyHist,
    /// The interval ends inside the warmup.
    pub warmup: bool,
}
