//! The agent's own LC latency prober: a few dedicated connections, requests sent open-loop at
//! scheduled times (`rate_hz` on average, Poisson), kept in per-second HDR histograms (by
//! scheduled second) over a sliding window of `lc.slo.window_s`. The window's percentile is
//! published once per second.
//!
//! Poisson, not periodic: a prober at fixed intervals samples the server at fixed phases of
//! whatever else on the host is periodic (the scheduler tick, a BE's time slice, a hypervisor's
//! timer) and reads a tail that is that phase's, not the server's. Poisson arrivals see time
//! averages (PASTA), as the load generator's do.
//!
//! So that it measures the LC and not itself: each latency runs from the kernel's software
//! transmit stamp of the request (`SO_TIMESTAMPING` with `OPT_ID`/`OPT_TSONLY`, read from the
//! socket's error queue, matched by the byte counter) to the kernel's software receive stamp of
//! its reply. A late prober thread then changes when a probe is sent, not what it measures, and
//! the thread wakes only to send: what arrived meanwhile is read then, already stamped. One
//! probe is in flight per connection (`conn.rs`): a probe due while the LC has not answered the
//! one before goes out on another connection (up to [`MAX_CONNS`]), so a stall of the LC holds
//! up every probe due during it, as it holds a load generator's requests, and none waits
//! behind the prober's own earlier probe. With every connection awaiting its reply the sends
//! due are passed (counted in the cell's detail). A read without the kernel's receive stamp is no
//! sample (never the prober's own, late, read time). A window
//! is refused only for too few replies. Where the kernel gives no transmit stamps (said once, as
//! the cell's detail) latencies run from the prober's own send and the old bound applies: a
//! window whose send lag p99 (actual − scheduled send) exceeds `max_send_lag_us` is refused —
//! stale, not a slow LC. SCHED_FIFO (reset on fork) is asked for and its refusal only noted.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_load::protocol::{Op, Protocol};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::sensors::lc_signal::{LatencyWindow, Refusal, SignalCell, StopFlag};
use headroom_control::config::ProbeProtocol;

mod conn;
mod http;
use conn::{InFlight, ProbeConn, Stamps};
pub use http::parse_http_response;

/// The key the prober reads (a miss is as good as a hit for timing).
pub const PROBE_KEY: &[u8] = b"headroom:probe";

/// What the prober speaks.
#[derive(Debug, Clone)]
pub enum ProbeWire {
    Kv(Protocol),
    /// HTTP/1.1 GET of `path` (keep-alive, Content-Length bodies).
    Http {
        host: String,
        path: String,
    },
}

/// Settings of one prober.
#[derive(Debug, Clone)]
pub struct ProbeSpec {
    pub address: String,
    pub wire: ProbeWire,
    pub rate_hz: f64,
    pub percentile: f64,
    pub window_s: f64,
    /// Samples the window needs before its percentile is published.
    pub min_samples: u64,
    /// A window whose prober send lag p99 exceeds this (µs) is refused.
    pub max_send_lag_us: f64,
    /// SCHED_FIFO priority of the prober thread (0: leave its scheduling alone).
    pub fifo_priority: u8,
    /// Tests: sleep this long between deciding to send and sending (a late prober thread).
    pub delay_sends: Duration,
}

impl ProbeSpec {
    /// From `[lc.latency]` (`address` = `host:port`, or for http a URL `http://host:port/path`).
    pub fn new(
        protocol: ProbeProtocol,
        address: &str,
        rate_hz: f64,
        percentile: f64,
        window_s: f64,
    ) -> ProbeSpec {
        let (address, wire) = match protocol {
            ProbeProtocol::Memcache => {
                (address.to_string(), ProbeWire::Kv(Protocol::MemcacheAscii))
            }
            ProbeProtocol::Redis => (address.to_string(), ProbeWire::Kv(Protocol::Resp)),
            ProbeProtocol::Http => {
                let rest = address.strip_prefix("http://").unwrap_or(address);
                let (hostport, path) = match rest.find('/') {
                    Some(i) => (&rest[..i], &rest[i..]),
                    None => (rest, "/"),
                };
                (
                    hostport.to_string(),
                    ProbeWire::Http {
                        host: hostport.to_string(),
                        path: path.to_string(),
                    },
                )
            }
        };
        ProbeSpec {
            address,
            wire,
            rate_hz,
            percentile,
            window_s,
            min_samples: headroom_load::stats::min_samples_for(percentile),
            max_send_lag_us: f64::INFINITY,
            fifo_priority: 0,
            delay_sends: Duration::ZERO,
        }
    }
}

/// Starts the prober thread; it publishes into `cell` until `stop` is set.
pub fn spawn(
    spec: ProbeSpec,
    cell: Arc<SignalCell>,
    stop: StopFlag,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("headroom-probe".into())
        .spawn(move || run(spec, &cell, &stop))
}

fn run(spec: ProbeSpec, cell: &SignalCell, stop: &StopFlag) {
    let sched = raise_priority(spec.fifo_priority);
    let mean_gap_s = 1.0 / spec.rate_hz.max(0.001);
    let mut rng = SmallRng::seed_from_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()),
    );
    // exponential gaps: −ln(U)·mean, U in (0, 1]
    let mut gap = move || Duration::from_secs_f64(-(1.0 - rng.random::<f64>()).ln() * mean_gap_s);
    let mut state = ProbeState {
        epoch: Instant::now(),
        window: LatencyWindow::new(spec.window_s, spec.min_samples),
        lag: LatencyWindow::new(spec.window_s, 1),
        published_sec: 0,
        stamps: None,
        tx_stamps_seen: false,
        replies_without_tx: 0,
        sched,
        described: None,
        passed_busy: 0,
        connections: 0,
        unstamped_rx: 0,
        described_counts: (0, 0, 0),
    };
    let mut request = Vec::new();
    match &spec.wire {
        ProbeWire::Kv(p) => p.encode(Op::Get, PROBE_KEY, 0, &mut request),
        ProbeWire::Http { host, path } => request.extend_from_slice(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: headroom-probe\r\n\r\n")
                .as_bytes(),
        ),
    }
    // A probe unanswered for a whole window is lost (its window cannot use it anyway): the
    // connections are reopened.
    let reply_timeout = Duration::from_secs_f64(spec.window_s.max(1.0));
    // Buffers for the whole run: a probe allocates nothing (a connection's, when it opens).
    let mut chunk = vec![0u8; 16 * 1024];
    let mut conns: Vec<ProbeConn> = Vec::with_capacity(MAX_CONNS);
    while !stop.load(Ordering::Relaxed) {
        conns.clear();
        match ProbeConn::connect(&spec.address) {
            Ok(c) => conns.push(c),
            Err(e) => {
                cell.error("probe", format!("connecting to {}: {e}", spec.address));
                sleep_unless_stopped(Duration::from_millis(500), stop);
                continue;
            }
        }
        let stamps = conns[0].stamps;
        state.stamps = stamps;
        if stamps.is_none() {
            // no stamps on this connection: whatever the last one had, no longer
            state.tx_stamps_seen = false;
        }
        state.connections = 1;
        state.describe(cell);
        let mut next_send = Instant::now();
        // a connection the LC refused (or that timed out) is not tried again for a while: each
        // try holds the prober up to the connect timeout
        let mut grow_after = next_send;
        let outcome: Result<(), ProbeConnError> = loop {
            if stop.load(Ordering::Relaxed) {
                break Ok(());
            }
            let now = Instant::now();
            state.publish_due(now, &spec, cell);
            // What arrived since the last wake-up, stamped by the kernel: reading it late
            // changes nothing. Transmit stamps first (a reply's stamp precedes its reply).
            if let Err(e) = read_all(&mut conns, &spec.wire, stamps, &mut chunk, &mut state) {
                break Err(e);
            }
            if now >= next_send {
                let oldest = conns
                    .iter()
                    .filter_map(|c| c.in_flight.map(|r| r.scheduled))
                    .min();
                if oldest.is_some_and(|o| now.saturating_duration_since(o) > reply_timeout) {
                    break Err(ProbeConnError::NoReply {
                        timeout: reply_timeout,
                    });
                }
                match free_connection(&mut conns, &spec.address, stamps, &mut grow_after) {
                    Some(i) => {
                        let scheduled = next_send;
                        let sent = Instant::now();
                        if !spec.delay_sends.is_zero() {
                            // test hook: the thread is late between deciding to send and sending
                            std::thread::sleep(spec.delay_sends);
                        }
                        if let Err(e) = conns[i].send(&request, scheduled) {
                            break Err(e);
                        }
                        let after = Instant::now();
                        let s = scheduled.saturating_duration_since(state.epoch).as_secs();
                        state
                            .lag
                            .slot(s)
                            .record_ns(sent.saturating_duration_since(scheduled).as_nanos() as u64);
                        next_send += gap();
                        let mut skipped = 0;
                        while next_send <= after && skipped < MAX_SKIP {
                            next_send += gap();
                            skipped += 1;
                        }
                        next_send = next_send.max(after);
                    }
                    None => {
                        // Every connection awaits its reply (the LC holds MAX_CONNS probes):
                        // the sends due are drawn and passed, as a late prober's are.
                        while next_send <= now {
                            next_send += gap();
                        }
                        state.passed_busy += 1;
                    }
                }
                state.connections = conns.len();
            }
            // Sleep until the next send (or the next second's publication): its reply and
            // stamps are read at the next wake-up. Where replies carry no kernel stamp, wake on
            // each to time it.
            let now = Instant::now();
            let until = next_send.min(state.next_publication());
            if stamps.is_some() {
                sleep_until(until, now);
            } else {
                conn::wait_readable(&conns, until.saturating_duration_since(now));
            }
        };
        if let Err(e) = outcome {
            cell.error("probe", format!("{}: {e}", spec.address));
            sleep_unless_stopped(Duration::from_millis(100), stop);
        }
    }
}

/// Reads the stamps and replies that came on every connection.
fn read_all(
    conns: &mut [ProbeConn],
    wire: &ProbeWire,
    stamps: Option<Stamps>,
    chunk: &mut [u8],
    state: &mut ProbeState,
) -> Result<(), ProbeConnError> {
    for c in conns.iter_mut() {
        if stamps == Some(Stamps::TxRx) {
            c.drain_tx_stamp(&mut state.tx_stamps_seen);
        }
        if !c.read_reply(wire, stamps.is_some(), chunk, state)? {
            return Err(ProbeConnError::Closed);
        }
    }
    Ok(())
}

/// A connection with no probe in flight: an open one, else a new one while there are fewer
/// than [`MAX_CONNS`] (one the kernel stamps as it does the first) and no new one failed in the
/// last [`GROW_BACKOFF`], else none.
fn free_connection(
    conns: &mut Vec<ProbeConn>,
    address: &str,
    stamps: Option<Stamps>,
    grow_after: &mut Instant,
) -> Option<usize> {
    if let Some(i) = conns.iter().position(|c| c.in_flight.is_none()) {
        return Some(i);
    }
    if conns.len() >= MAX_CONNS || Instant::now() < *grow_after {
        return None;
    }
    match ProbeConn::connect(address) {
        Ok(c) if c.stamps == stamps => {
            conns.push(c);
            Some(conns.len() - 1)
        }
        _ => {
            *grow_after = Instant::now() + GROW_BACKOFF;
            None
        }
    }
}

/// How long the prober waits before it tries again to open a connection the LC refused.
const GROW_BACKOFF: Duration = Duration::from_secs(5);

/// Why the prober gave up a connection (it reconnects): said in the sensor's errors with the
/// address.
#[derive(Debug, thiserror::Error)]
enum ProbeConnError {
    #[error("server closed the connection")]
    Closed,
    #[error("no reply in {:.1} s (the probe is given up; the window keeps what it has)", timeout.as_secs_f64())]
    NoReply { timeout: Duration },
    #[error("sending: {0}")]
    Send(#[source] std::io::Error),
    #[error("receiving: {0}")]
    Receive(#[source] std::io::Error),
    /// A reply that does not parse as the key-value protocol's.
    #[error("malformed reply: {0}")]
    KvReply(#[from] headroom_load::protocol::ProtocolError),
    #[error("malformed reply: {0}")]
    HttpReply(#[from] http::HttpFramingError),
}

/// A prober that wakes behind its schedule sends one probe and skips (draws and passes) the
/// others that are due, rather than bursting them at the LC; at most this many.
const MAX_SKIP: usize = 1000;

/// Connections the prober keeps at most, one probe in flight on each: a probe due while the
/// LC has not answered the one before goes out on another connection and waits at the LC as a
/// load generator's would — so a stall of the LC is sampled by every probe due during it, not
/// by the one probe in flight (which read the tail low under stalls). Beyond this many
/// unanswered probes the sends due are passed and counted.
const MAX_CONNS: usize = 8;

/// Replies read without any transmit stamp having been seen before the prober says the kernel
/// gives none (and falls back to its own send times, under the send-lag bound).
const NO_TX_STAMPS_AFTER: u64 = 50;

/// The prober's windows and what it has said.
struct ProbeState {
    epoch: Instant,
    window: LatencyWindow,
    /// The prober's own lateness (actual − scheduled send), for the fallback and the notes.
    lag: LatencyWindow,
    published_sec: u64,
    /// What the kernel stamps on this connection.
    stamps: Option<Stamps>,
    tx_stamps_seen: bool,
    replies_without_tx: u64,
    /// The thread's scheduling, as [`raise_priority`] got it.
    sched: String,
    /// The timing last described to the cell.
    described: Option<Timing>,
    /// Sends passed because every connection awaited its reply.
    passed_busy: u64,
    /// Connections open now (at most [`MAX_CONNS`]).
    connections: usize,
    /// Replies read without the kernel's receive stamp where the kernel gives them: dropped,
    /// never timed by the prober's own (late) read.
    unstamped_rx: u64,
    /// The counts last described.
    described_counts: (u64, u64, usize),
}

/// What the prober's latencies run between (said in `ctl status` through the cell's detail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// Kernel transmit stamp to kernel receive stamp: independent of the prober's scheduling.
    KernelTxRx,
    /// The prober's own send to the kernel's receive stamp (no transmit stamps).
    KernelRx,
    /// The prober's own send to its own read (no kernel stamps at all).
    User,
}

impl Timing {
    /// How `ctl status` says it (tests look for these words).
    pub fn describe(self) -> &'static str {
        match self {
            Timing::KernelTxRx => "timed by kernel TX+RX stamps",
            Timing::KernelRx => {
                "timed from the prober's own sends (no kernel transmit stamps): windows with a late prober are refused"
            }
            Timing::User => {
                "timed in user space (no kernel stamps): windows with a late prober are refused"
            }
        }
    }
}

impl ProbeState {
    fn next_publication(&self) -> Instant {
        self.epoch + Duration::from_secs(self.published_sec + 1)
    }

    /// Whether latencies run from the kernel's transmit stamps.
    fn kernel_tx(&self) -> bool {
        self.tx_stamps_seen || self.replies_without_tx < NO_TX_STAMPS_AFTER
    }

    /// `None` while transmit stamps are asked for but none has come back yet.
    fn timing(&self) -> Option<Timing> {
        match self.stamps {
            None => Some(Timing::User),
            Some(Stamps::TxRx) if self.tx_stamps_seen => Some(Timing::KernelTxRx),
            Some(Stamps::TxRx) if self.kernel_tx() => None,
            Some(_) => Some(Timing::KernelRx),
        }
    }

    /// Tells the cell how the prober times (when that changed; a fallback is said once, as a
    /// sensor note).
    fn describe(&mut self, cell: &SignalCell) {
        let Some(t) = self.timing() else {
            return;
        };
        let counts = (self.passed_busy, self.unstamped_rx, self.connections);
        if self.described == Some(t) && self.described_counts == counts {
            return;
        }
        if t != Timing::KernelTxRx && self.described != Some(t) {
            tracing::warn!(timing = t.describe(), "prober");
        }
        self.described = Some(t);
        self.described_counts = counts;
        // what the prober set aside rather than time itself (said beside how it times)
        cell.set_detail(&format!(
            "{}; {}; {} connection(s), one probe in flight on each; {} sends passed with every connection awaiting its reply, {} replies without a kernel receive stamp dropped",
            t.describe(),
            self.sched,
            counts.2,
            counts.0,
            counts.1
        ));
    }

    /// Records the latency of `r`, answered at `rx_ns` (the kernel's receive stamp where the
    /// kernel gives them).
    fn record_reply(&mut self, r: &InFlight, rx_ns: Option<u64>) {
        // With kernel receive stamps, a read that carries none is the prober's own (late)
        // reap time: no sample rather than its lateness.
        let Some(rx_ns) = rx_ns else {
            self.unstamped_rx += 1;
            return;
        };
        let from = match r.tx_ns {
            Some(tx) => tx,
            None if self.kernel_tx() => {
                self.replies_without_tx += 1;
                return; // its stamp was lost: no sample rather than a wrong one
            }
            None => r.sent_ns,
        };
        let s = r.scheduled.saturating_duration_since(self.epoch).as_secs();
        self.window.slot(s).record_ns(rx_ns.saturating_sub(from));
    }

    /// Publishes the window once per second of the agent's clock (or says why not).
    fn publish_due(&mut self, now: Instant, spec: &ProbeSpec, cell: &SignalCell) {
        let sec = now.duration_since(self.epoch).as_secs();
        if sec <= self.published_sec {
            return;
        }
        self.published_sec = sec;
        self.describe(cell);
        let last = sec.saturating_sub(1);
        let send_lag = self.lag.percentile_us(last, 99.0);
        let kernel_tx = self.kernel_tx();
        cell.set_send_lag_us(send_lag);
        match (self.window.percentile_us(last, spec.percentile), send_lag) {
            // Only timing from the prober's own sends depends on when its thread ran.
            (Some(_), Some(l)) if !kernel_tx && l > spec.max_send_lag_us => cell.refuse(
                Refusal::SendLag,
                format!(
                    "window refused: the prober's own send lag p99 {l:.0} µs exceeds {:.0} µs (its CPU is busy; no kernel transmit stamps): stale, not a slow LC",
                    spec.max_send_lag_us
                ),
            ),
            (Some(p), _) => cell.publish(p, self.epoch + Duration::from_secs(sec)),
            (None, _) if self.window_filled(last) => {
                let n = self.window.count(last);
                cell.refuse(
                    Refusal::TooFewSamples,
                    format!(
                        "window refused: {n} replies, fewer than the {} the percentile needs",
                        spec.min_samples
                    ),
                );
            }
            (None, _) => {}
        }
    }

    /// Whether the window has been running a whole window's length (before that, nothing is
    /// expected).
    fn window_filled(&self, last: u64) -> bool {
        self.lag.percentile_us(last, 0.0).is_some()
    }
}

/// SCHED_FIFO at `priority` for this thread, reset on fork; nice -20 where FIFO is refused.
/// A nicety: kernel stamps make the figure independent of when the thread runs. Returns what
/// it got, for `ctl status`.
fn raise_priority(priority: u8) -> String {
    use headroom_host::sched::{set_sched_reset_on_fork, SchedPolicy};
    if priority == 0 {
        return "scheduling: left alone".into();
    }
    let fifo = SchedPolicy::Fifo {
        priority: u32::from(priority),
    };
    match set_sched_reset_on_fork(0, fifo) {
        Ok(()) => format!("scheduling: SCHED_FIFO {priority}"),
        Err(e) => {
            let nice = SchedPolicy::Other {
                nice: -20,
                slice_ns: None,
            };
            let got = if set_sched_reset_on_fork(0, nice).is_ok() {
                "nice -20"
            } else {
                "its default"
            };
            tracing::info!(error = %e, "prober: SCHED_FIFO refused (kernel stamps time it anyway); {got}");
            format!("scheduling: SCHED_FIFO refused ({e}), {got}")
        }
    }
}

/// Sleeps until `until` (one wake-up: the prober's sends are its only wake-ups).
fn sleep_until(until: Instant, now: Instant) {
    let d = until.saturating_duration_since(now);
    if !d.is_zero() {
        std::thread::sleep(d.min(Duration::from_millis(100)));
    }
}

fn sleep_unless_stopped(d: Duration, stop: &StopFlag) {
    let end = Instant::now() + d;
    while Instant::now() < end && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
}
