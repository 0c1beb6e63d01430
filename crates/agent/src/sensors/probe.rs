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
//! So that it measures the LC and not itself: replies are timed from the kernel's software
//! receive timestamp (`SO_TIMESTAMPING`; where the kernel refuses it, from user space, said once
//! as a sensor note), each latency runs from the request's actual send, and the prober's own
//! lateness (actual send − scheduled send) is kept per window: a window whose send lag p99
//! exceeds `max_send_lag_us` is refused — stale, not a slow LC. The thread asks for SCHED_FIFO
//! (reset on fork) so a BE filling its CPU cannot delay it; nice -20 where FIFO is refused.

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

use crate::config::ProbeProtocol;
use crate::sensors::lc_signal::{LatencyWindow, SignalCell, StopFlag};

/// The key the prober reads (a miss is as good as a hit for timing).
pub const PROBE_KEY: &[u8] = b"headroom:probe";
/// Requests outstanding beyond this count as lost: the connection is reopened.
const MAX_IN_FLIGHT: usize = 10_000;

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
    raise_priority(spec.fifo_priority);
    let mean_gap_s = 1.0 / spec.rate_hz.max(0.001);
    let mut rng = SmallRng::seed_from_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()),
    );
    // exponential gaps: −ln(U)·mean, U in (0, 1]
    let mut gap = move || Duration::from_secs_f64(-(1.0 - rng.random::<f64>()).ln() * mean_gap_s);
    let epoch = Instant::now();
    let mut window = LatencyWindow::new(spec.window_s, spec.min_samples);
    let mut lag = LatencyWindow::new(spec.window_s, 1);
    let mut published_sec = 0u64;
    let mut kernel_stamps_noted = false;
    let mut request = Vec::new();
    match &spec.wire {
        ProbeWire::Kv(p) => p.encode(Op::Get, PROBE_KEY, 0, &mut request),
        ProbeWire::Http { host, path } => request.extend_from_slice(
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: headroom-probe\r\n\r\n")
                .as_bytes(),
        ),
    }
    while !stop.load(Ordering::Relaxed) {
        let mut conn = match connect(&spec.address) {
            Ok(c) => c,
            Err(e) => {
                cell.error("probe", format!("connecting to {}: {e}", spec.address));
                sleep_unless_stopped(Duration::from_millis(500), stop);
                continue;
            }
        };
        let kernel_stamps = enable_rx_timestamps(&conn);
        if let (Err(e), false) = (&kernel_stamps, kernel_stamps_noted) {
            kernel_stamps_noted = true;
            tracing::warn!(error = %e, "prober: no kernel receive timestamps; timing replies in user space");
        }
        let kernel_stamps = kernel_stamps.is_ok();
        let mut next_send = Instant::now();
        // (scheduled, actual) send times of the requests in flight
        let mut in_flight: VecDeque<(Instant, Instant)> = VecDeque::new();
        let mut buf: Vec<u8> = Vec::with_capacity(4096);
        let mut chunk = [0u8; 4096];
        let outcome: Result<(), String> = loop {
            if stop.load(Ordering::Relaxed) {
                break Ok(());
            }
            let now = Instant::now();
            // Publish the window once per second of the agent's clock.
            let sec = now.duration_since(epoch).as_secs();
            if sec > published_sec {
                published_sec = sec;
                let last = sec.saturating_sub(1);
                let send_lag = lag.percentile_us(last, 99.0);
                match (window.percentile_us(last, spec.percentile), send_lag) {
                    (Some(_), Some(l)) if l > spec.max_send_lag_us => cell.error(
                        "probe",
                        format!(
                            "window refused: the prober's own send lag p99 {l:.0} µs exceeds {:.0} µs (its CPU is busy): stale, not a slow LC",
                            spec.max_send_lag_us
                        ),
                    ),
                    (Some(p), _) => cell.publish(p, epoch + Duration::from_secs(sec)),
                    (None, _) => {}
                }
            }
            if now >= next_send {
                if in_flight.len() >= MAX_IN_FLIGHT {
                    break Err(format!("{} requests unanswered", in_flight.len()));
                }
                let sent = Instant::now();
                if let Err(e) = conn.write_all(&request) {
                    break Err(format!("sending: {e}"));
                }
                let s = next_send.saturating_duration_since(epoch).as_secs();
                lag.slot(s)
                    .record_ns(sent.saturating_duration_since(next_send).as_nanos() as u64);
                in_flight.push_back((next_send, sent));
                next_send += gap();
                continue;
            }
            if !wait_readable(&conn, next_send - now) {
                continue;
            }
            let received = if kernel_stamps {
                recv_stamped(&conn, &mut chunk)
            } else {
                conn.read(&mut chunk).map(|n| (n, Instant::now()))
            };
            let done = match received {
                Ok((0, _)) => break Err("server closed the connection".into()),
                Ok((n, at)) => {
                    buf.extend_from_slice(&chunk[..n]);
                    at
                }
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted =>
                {
                    continue
                }
                Err(e) => break Err(format!("receiving: {e}")),
            };
            let mut failed = None;
            loop {
                let parsed = match &spec.wire {
                    ProbeWire::Kv(p) => p
                        .parse(Op::Get, &buf)
                        .map(|r| r.map(|r| r.consumed))
                        .map_err(|e| e.to_string()),
                    ProbeWire::Http { .. } => parse_http_response(&buf),
                };
                match parsed {
                    Ok(Some(consumed)) => {
                        buf.drain(..consumed);
                        if let Some((scheduled, sent)) = in_flight.pop_front() {
                            let ns = done.saturating_duration_since(sent).as_nanos() as u64;
                            let s = scheduled.saturating_duration_since(epoch).as_secs();
                            window.slot(s).record_ns(ns);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                break Err(e);
            }
        };
        if let Err(e) = outcome {
            cell.error("probe", format!("{}: {e}", spec.address));
            sleep_unless_stopped(Duration::from_millis(100), stop);
        }
    }
}

/// Asks the kernel to stamp every received packet in software (`SO_TIMESTAMPING`).
fn enable_rx_timestamps(conn: &TcpStream) -> nix::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt::Timestamping, TimestampingFlag};
    setsockopt(
        conn,
        Timestamping,
        &(TimestampingFlag::SOF_TIMESTAMPING_RX_SOFTWARE
            | TimestampingFlag::SOF_TIMESTAMPING_SOFTWARE),
    )
}

/// Reads into `chunk`; returns the bytes and when the kernel received them (the software
/// stamp, CLOCK_REALTIME, carried over to the monotonic clock by its age now).
fn recv_stamped(conn: &TcpStream, chunk: &mut [u8]) -> std::io::Result<(usize, Instant)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrStorage};
    let mut cmsg = nix::cmsg_space!(nix::sys::socket::Timestamps);
    let mut iov = [std::io::IoSliceMut::new(chunk)];
    let msg = recvmsg::<SockaddrStorage>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::empty(),
    )
    .map_err(std::io::Error::from)?;
    let now = Instant::now();
    let mut at = now;
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmTimestampsns(t) = c {
                let stamp = Duration::new(t.system.tv_sec() as u64, t.system.tv_nsec() as u32);
                let wall = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                if !stamp.is_zero() {
                    at = now.checked_sub(wall.saturating_sub(stamp)).unwrap_or(now);
                }
            }
        }
    }
    Ok((msg.bytes, at))
}

/// SCHED_FIFO at `priority` for this thread, reset on fork; nice -20 where FIFO is refused.
fn raise_priority(priority: u8) {
    use headroom_host::sched::{set_sched_reset_on_fork, SchedPolicy};
    if priority == 0 {
        return;
    }
    let fifo = SchedPolicy::Fifo {
        priority: u32::from(priority),
    };
    if let Err(e) = set_sched_reset_on_fork(0, fifo) {
        let nice = SchedPolicy::Other {
            nice: -20,
            slice_ns: None,
        };
        if set_sched_reset_on_fork(0, nice).is_err() {
            tracing::warn!(error = %e, "prober: neither SCHED_FIFO nor nice -20; BE may delay its sends (windows with a late prober are refused)");
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

fn sleep_unless_stopped(d: Duration, stop: &StopFlag) {
    let end = Instant::now() + d;
    while Instant::now() < end && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The length of one complete HTTP/1.1 response at the start of `buf` (`Content-Length` bodies
/// and bodiless statuses); `Ok(None)` = need more bytes.
pub fn parse_http_response(buf: &[u8]) -> Result<Option<usize>, String> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > 64 * 1024 {
            return Err("HTTP header longer than 64 KiB".into());
        }
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    if !status.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x response: {status:?}"));
    }
    let mut length = 0usize;
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            if k == "content-length" {
                length = v
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad Content-Length {v:?}"))?;
            } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                return Err("chunked HTTP responses are not supported by the prober".into());
            }
        }
    }
    let total = end + 4 + length;
    Ok((buf.len() >= total).then_some(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_responses_are_framed() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1";
        assert_eq!(parse_http_response(r).unwrap(), Some(40));
        assert_eq!(parse_http_response(&r[..30]).unwrap(), None);
        assert!(parse_http_response(b"SSH-2.0\r\n\r\n").is_err());
    }
}
