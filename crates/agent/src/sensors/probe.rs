//! The agent's own LC latency prober: one dedicated connection, requests sent open-loop at
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
//! probe is in flight at a time: a probe sent behind an unanswered one waits behind it at the
//! LC (one connection is served in order) and its reply, merged in the socket with the earlier
//! one, carries the later receive stamp — the prober's own queue, not the LC's; such sends are
//! passed (counted in the cell's detail). A read without the kernel's receive stamp is no
//! sample (never the prober's own, late, read time). A window
//! is refused only for too few replies. Where the kernel gives no transmit stamps (said once, as
//! the cell's detail) latencies run from the prober's own send and the old bound applies: a
//! window whose send lag p99 (actual − scheduled send) exceeds `max_send_lag_us` is refused —
//! stale, not a slow LC. SCHED_FIFO (reset on fork) is asked for and its refusal only noted.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_load::protocol::{Op, Protocol};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::sensors::lc_signal::{LatencyWindow, Refusal, SignalCell, StopFlag};
use headroom_control::config::ProbeProtocol;

mod http;
mod stamps;
pub use http::parse_http_response;
use stamps::Stamps;

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
        unstamped_rx: 0,
        described_counts: (0, 0),
    };
    let mut request = Vec::new();
    match &spec.wire {
        ProbeWire::Kv(p) => p.encode(Op::Get, PROBE_KEY, 0, &mut request),
        ProbeWire::Http { host, path } => request.extend_from_slice(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: headroom-probe\r\n\r\n")
                .as_bytes(),
        ),
    }
    // Buffers for the whole run: a probe allocates nothing.
    let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(4);
    // A probe unanswered for a whole window is lost (its window cannot use it anyway): the
    // connection is reopened.
    let reply_timeout = Duration::from_secs_f64(spec.window_s.max(1.0));
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let conn = match connect(&spec.address) {
            Ok(c) => c,
            Err(e) => {
                cell.error("probe", format!("connecting to {}: {e}", spec.address));
                sleep_unless_stopped(Duration::from_millis(500), stop);
                continue;
            }
        };
        in_flight.clear();
        buf.clear();
        let stamps = stamps::enable(conn.as_raw_fd()).ok();
        state.stamps = stamps;
        if stamps.is_none() {
            // no stamps on this connection: whatever the last one had, no longer
            state.tx_stamps_seen = false;
        }
        state.describe(cell);
        let mut next_send = Instant::now();
        let mut sent_bytes: u32 = 0;
        // The length of one reply (learnt): replies are read one at a time, so each gets the
        // receive stamp of its own packet.
        let mut read_len = chunk.len();
        let outcome: Result<(), ProbeConnError> = loop {
            if stop.load(Ordering::Relaxed) {
                break Ok(());
            }
            let now = Instant::now();
            state.publish_due(now, &spec, cell);
            // What arrived since the last wake-up, stamped by the kernel: reading it late
            // changes nothing. Transmit stamps first (a reply's stamp precedes its reply).
            if stamps == Some(Stamps::TxRx) {
                drain_tx_stamps(&conn, &mut in_flight, &mut state.tx_stamps_seen);
            }
            match read_replies(
                &conn,
                &spec.wire,
                stamps.is_some(),
                &mut chunk,
                &mut read_len,
                &mut buf,
                &mut in_flight,
                &mut state,
            ) {
                Ok(true) => {}
                Ok(false) => break Err(ProbeConnError::Closed),
                Err(e) => break Err(e),
            }
            // Send what is due (one wake-up for all; a prober far behind skips probes rather
            // than bursting them at the LC).
            if now >= next_send && !in_flight.is_empty() {
                // One probe at a time: a probe sent behind an unanswered one waits behind it
                // at the LC (one connection is served in order) and its reply may reach the
                // prober's socket merged with the earlier one, under the later one's receive
                // stamp — either way it would time the prober's own queue. The send is drawn
                // and passed, as a late prober's are.
                let oldest = in_flight.front().map_or(now, |r| r.scheduled);
                if now.saturating_duration_since(oldest) > reply_timeout {
                    break Err(ProbeConnError::NoReply {
                        timeout: reply_timeout,
                    });
                }
                while next_send <= now {
                    next_send += gap();
                }
                state.passed_busy += 1;
            } else if now >= next_send {
                let scheduled = next_send;
                let sent_ns = stamps::realtime_ns();
                let sent = Instant::now();
                if !spec.delay_sends.is_zero() {
                    // test hook: the thread is late between deciding to send and sending
                    std::thread::sleep(spec.delay_sends);
                }
                if let Err(e) = (&conn).write_all(&request) {
                    break Err(ProbeConnError::Send(e));
                }
                let after = Instant::now();
                sent_bytes = sent_bytes.wrapping_add(request.len() as u32);
                let s = scheduled.saturating_duration_since(state.epoch).as_secs();
                state
                    .lag
                    .slot(s)
                    .record_ns(sent.saturating_duration_since(scheduled).as_nanos() as u64);
                in_flight.push_back(InFlight {
                    scheduled,
                    sent_ns,
                    key: sent_bytes.wrapping_sub(1),
                    tx_ns: None,
                });
                next_send += gap();
                let mut skipped = 0;
                while next_send <= after && skipped < MAX_SKIP {
                    next_send += gap();
                    skipped += 1;
                }
                next_send = next_send.max(after);
            }
            // Sleep until the next send (or the next second's publication): its reply and
            // stamps are read at the next wake-up. Where replies carry no kernel stamp, wake on
            // each to time it.
            let now = Instant::now();
            let until = next_send.min(state.next_publication());
            if stamps.is_some() {
                sleep_until(until, now);
            } else {
                wait_readable(&conn, until.saturating_duration_since(now));
            }
        };
        if let Err(e) = outcome {
            cell.error("probe", format!("{}: {e}", spec.address));
            sleep_unless_stopped(Duration::from_millis(100), stop);
        }
    }
}

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

/// Replies read without any transmit stamp having been seen before the prober says the kernel
/// gives none (and falls back to its own send times, under the send-lag bound).
const NO_TX_STAMPS_AFTER: u64 = 50;

/// A request in flight.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    /// Its scheduled send (its window second).
    scheduled: Instant,
    /// `CLOCK_REALTIME` ns just before the write (the fallback's send time).
    sent_ns: u64,
    /// `OPT_ID` key of its last byte (the byte counter, wrapping).
    key: u32,
    /// The kernel's transmit stamp, ns.
    tx_ns: Option<u64>,
}

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
    /// Sends passed because the previous probe was still unanswered.
    passed_busy: u64,
    /// Replies read without the kernel's receive stamp where the kernel gives them: dropped,
    /// never timed by the prober's own (late) read.
    unstamped_rx: u64,
    /// The counts last described.
    described_counts: (u64, u64),
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
        let counts = (self.passed_busy, self.unstamped_rx);
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
            "{}; {}; {} sends passed behind an unanswered probe, {} replies without a kernel receive stamp dropped",
            t.describe(),
            self.sched,
            counts.0,
            counts.1
        ));
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

/// Reads every waiting transmit stamp and gives it to the requests it covers: a stamp's key is
/// the last byte of the packet, so requests the kernel sent in one packet share it.
fn drain_tx_stamps(conn: &TcpStream, in_flight: &mut VecDeque<InFlight>, seen: &mut bool) {
    // A stamp covers every request up to its key: once the newest has one, all have (so a
    // wake-up costs no read that finds the queue empty).
    while in_flight.back().is_some_and(|r| r.tx_ns.is_none()) {
        match stamps::read_tx_stamp(conn.as_raw_fd()) {
            Ok(Some((key, ns))) => {
                *seen = true;
                for r in in_flight.iter_mut() {
                    // wrapping order: r.key at or before `key`
                    if key.wrapping_sub(r.key) < (1 << 31) {
                        if r.tx_ns.is_none() {
                            r.tx_ns = Some(ns);
                        }
                    } else {
                        break;
                    }
                }
            }
            Ok(None) => {}
            Err(_) => return,
        }
    }
}

/// Reads every waiting reply and records its latency (reading only while replies are owed, so
/// a wake-up costs no read that finds nothing). `Ok(false)`: the server closed.
#[allow(clippy::too_many_arguments)]
fn read_replies(
    conn: &TcpStream,
    wire: &ProbeWire,
    kernel_rx: bool,
    chunk: &mut [u8],
    read_len: &mut usize,
    buf: &mut Vec<u8>,
    in_flight: &mut VecDeque<InFlight>,
    state: &mut ProbeState,
) -> Result<bool, ProbeConnError> {
    while !in_flight.is_empty() {
        let want = (*read_len).clamp(1, chunk.len());
        let received = if kernel_rx {
            stamps::read_stamped(conn.as_raw_fd(), &mut chunk[..want])
        } else {
            (&*conn)
                .read(&mut chunk[..want])
                .map(|n| (n, Some(stamps::realtime_ns())))
        };
        let rx_ns = match received {
            Ok((0, _)) => return Ok(false),
            Ok((n, at)) => {
                buf.extend_from_slice(&chunk[..n]);
                at
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(ProbeConnError::Receive(e)),
        };
        loop {
            let parsed = match wire {
                ProbeWire::Kv(p) => p
                    .parse(Op::Get, buf)
                    .map(|r| r.map(|r| r.consumed))
                    .map_err(ProbeConnError::from),
                ProbeWire::Http { .. } => parse_http_response(buf).map_err(ProbeConnError::from),
            };
            match parsed? {
                Some(consumed) => {
                    buf.drain(..consumed);
                    *read_len = consumed;
                    let Some(r) = in_flight.pop_front() else {
                        continue;
                    };
                    // With kernel receive stamps, a read that carries none is the prober's
                    // own (late) reap time: no sample rather than its lateness.
                    let Some(rx_ns) = rx_ns else {
                        state.unstamped_rx += 1;
                        continue;
                    };
                    let from = match r.tx_ns {
                        Some(tx) => tx,
                        None if state.kernel_tx() => {
                            state.replies_without_tx += 1;
                            continue; // its stamp was lost: no sample rather than a wrong one
                        }
                        None => r.sent_ns,
                    };
                    let s = r.scheduled.saturating_duration_since(state.epoch).as_secs();
                    state.window.slot(s).record_ns(rx_ns.saturating_sub(from));
                }
                None => break,
            }
        }
    }
    Ok(true)
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

fn connect(address: &str) -> std::io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = address.to_socket_addrs()?.collect();
    let addr = addrs.first().ok_or_else(|| {
        std::io::Error::new(ErrorKind::InvalidInput, "address resolves to nothing")
    })?;
    let s = TcpStream::connect_timeout(addr, Duration::from_millis(500))?;
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

/// Waits up to `timeout` for `conn` to become readable (µs precision through ppoll).
fn wait_readable(conn: &TcpStream, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: conn.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
    n > 0
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
