//! One probe connection: at most one probe in flight on it, its reply buffer, and the kernel
//! stamps that time the probe. On one connection the LC serves requests in order, so a probe
//! written behind an unanswered one would wait behind it at the LC and its reply, merged in
//! the socket with the earlier one, would carry the later receive stamp — the prober's own
//! queue, not the LC's. The prober keeps a few of these instead (see `super::MAX_CONNS`).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use headroom_host::net::timestamps::{self, enable_timestamping, ErrQueue, Timestamping};
use headroom_host::poll::{wait, Wait, Want};
use headroom_load::protocol::Op;

use super::{parse_http_response, ProbeConnError, ProbeState, ProbeWire};

/// Which kernel stamps a connection got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamps {
    /// Transmit and receive stamps: latency = kernel RX − kernel TX.
    TxRx,
    /// Receive stamps only (the transmit flags were refused).
    Rx,
}

/// Asks for software transmit and receive stamps on `fd`, or receive stamps alone where the
/// kernel refuses the transmit flags.
fn enable_stamps(fd: RawFd) -> std::io::Result<Stamps> {
    if enable_timestamping(fd, Timestamping::TxRx).is_ok() {
        return Ok(Stamps::TxRx);
    }
    enable_timestamping(fd, Timestamping::Rx).map(|()| Stamps::Rx)
}

/// The probe in flight on a connection.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    /// Its scheduled send (its window second).
    pub scheduled: Instant,
    /// `CLOCK_REALTIME` ns just before the write (the fallback's send time).
    pub sent_ns: u64,
    /// `OPT_ID` key of its last byte (the connection's byte counter, wrapping).
    pub key: u32,
    /// The kernel's transmit stamp, ns.
    pub tx_ns: Option<u64>,
}

/// A connection to the LC with at most one probe in flight.
pub(super) struct ProbeConn {
    stream: TcpStream,
    /// What the kernel stamps on it (`None`: nothing).
    pub stamps: Option<Stamps>,
    pub in_flight: Option<InFlight>,
    sent_bytes: u32,
    buf: Vec<u8>,
    /// The length of one reply (learnt): replies are read one at a time, so each gets the
    /// receive stamp of its own packet.
    read_len: usize,
}

impl ProbeConn {
    /// Connects (500 ms at most), non-blocking, no Nagle, kernel stamps asked for.
    pub fn connect(address: &str) -> std::io::Result<ProbeConn> {
        let addrs: Vec<SocketAddr> = address.to_socket_addrs()?.collect();
        let addr = addrs.first().ok_or_else(|| {
            std::io::Error::new(ErrorKind::InvalidInput, "address resolves to nothing")
        })?;
        let stream = TcpStream::connect_timeout(addr, Duration::from_millis(500))?;
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let stamps = enable_stamps(stream.as_raw_fd()).ok();
        Ok(ProbeConn {
            stream,
            stamps,
            in_flight: None,
            sent_bytes: 0,
            buf: Vec::with_capacity(4 * 1024),
            read_len: usize::MAX,
        })
    }

    /// Writes `request` as the probe scheduled at `scheduled`.
    pub fn send(&mut self, request: &[u8], scheduled: Instant) -> Result<(), ProbeConnError> {
        let sent_ns = timestamps::realtime_ns();
        (&self.stream)
            .write_all(request)
            .map_err(ProbeConnError::Send)?;
        self.sent_bytes = self.sent_bytes.wrapping_add(request.len() as u32);
        self.in_flight = Some(InFlight {
            scheduled,
            sent_ns,
            key: self.sent_bytes.wrapping_sub(1),
            tx_ns: None,
        });
        Ok(())
    }

    /// Reads the transmit stamp of the probe in flight if the kernel has queued it (a stamp's
    /// key is the last byte of the packet it covers).
    pub fn drain_tx_stamp(&mut self, seen: &mut bool) {
        let Some(r) = self.in_flight.as_mut() else {
            return;
        };
        while r.tx_ns.is_none() {
            match timestamps::read_errqueue(self.stream.as_raw_fd()) {
                Ok(ErrQueue::Stamp { key, stamp }) => {
                    *seen = true;
                    if timestamps::key_covers(key, u64::from(r.key)) {
                        r.tx_ns = Some(stamp.realtime_ns());
                    }
                }
                Ok(ErrQueue::Other | ErrQueue::Empty) | Err(_) => return,
            }
        }
    }

    /// Reads the reply to the probe in flight if it has come and records its latency (reading
    /// only while a reply is owed, so a wake-up costs no read that finds nothing).
    /// `Ok(false)`: the server closed.
    pub fn read_reply(
        &mut self,
        wire: &ProbeWire,
        kernel_rx: bool,
        chunk: &mut [u8],
        state: &mut ProbeState,
    ) -> Result<bool, ProbeConnError> {
        while self.in_flight.is_some() {
            let want = self.read_len.clamp(1, chunk.len());
            let received = if kernel_rx {
                timestamps::recv_stamped(self.stream.as_raw_fd(), &mut chunk[..want])
                    .map(|(n, at)| (n, at.map(|s| s.realtime_ns())))
            } else {
                (&self.stream)
                    .read(&mut chunk[..want])
                    .map(|n| (n, Some(timestamps::realtime_ns())))
            };
            let rx_ns = match received {
                Ok((0, _)) => return Ok(false),
                Ok((n, at)) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    at
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(ProbeConnError::Receive(e)),
            };
            let parsed = match wire {
                ProbeWire::Kv(p) => p
                    .parse(Op::Get, &self.buf)
                    .map(|r| r.map(|r| r.consumed))
                    .map_err(ProbeConnError::from),
                ProbeWire::Http { .. } => {
                    parse_http_response(&self.buf).map_err(ProbeConnError::from)
                }
            };
            let Some(consumed) = parsed? else {
                continue; // the rest of the reply has not come yet
            };
            self.buf.drain(..consumed);
            self.read_len = consumed;
            let Some(r) = self.in_flight.take() else {
                continue;
            };
            state.record_reply(&r, rx_ns);
        }
        Ok(true)
    }

    pub fn fd(&self) -> std::os::fd::RawFd {
        self.stream.as_raw_fd()
    }
}

/// Waits up to `timeout` for any of `conns` awaiting a reply to become readable (µs precision
/// through ppoll).
pub(super) fn wait_readable(conns: &[ProbeConn], timeout: Duration) {
    let mut waits = [Wait::NONE; super::MAX_CONNS];
    for (w, c) in waits.iter_mut().zip(conns) {
        if c.in_flight.is_some() {
            *w = Wait::new(c.fd(), Want::Read);
        }
    }
    let _ = wait(&mut waits, timeout);
}
