//! `-c auto`: connections × depth sized from the measured round trip and the target rate.
//!
//! Little's law: requests in flight = rate × round trip. A host whose idle server takes longer to
//! wake needs more connections for the same rate; a fixed `-c` that suffices on one machine
//! starves on another, and the run is thrown away instead of fixed. Before the run a short ping
//! phase measures the round trip (with gaps, so the server goes idle between pings as it does
//! between the load's sends); the sizing provides for rate × RTT p99 × [`HEADROOM`] + [`SPARE`]
//! in flight. During the run a send that finds its connection and every other one to its server
//! at the depth cap opens a new connection (counted), up to [`grow_cap`].

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use crate::clock::now_ns;
use crate::error::LoadError;
use crate::protocol::{Op, Protocol};

/// Multiplies rate × RTT p99 (the tail's headroom over Little's mean).
pub const HEADROOM: f64 = 2.0;
/// Extra slots for the variability of a small number in flight (Poisson arrivals).
pub const SPARE: f64 = 2.0;
/// Most connections `-c auto` opens per server per thread at the start.
pub const MAX_AUTO: usize = 256;
/// Pings of the ping phase and the gap between them.
pub const PINGS: usize = 100;
pub const PING_GAP: Duration = Duration::from_micros(200);

/// The chosen connections per server per thread and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Sizing {
    pub per_thread: usize,
    pub needed_in_flight: f64,
    pub reason: String,
}

/// Connections per server per thread for `rate` requests/s over them (one thread's share for
/// one server), each with `depth` in flight, when a round trip's p99 is `rtt_p99_ns`.
pub fn size_connections(rate: f64, rtt_p99_ns: u64, depth: usize) -> Sizing {
    let depth = depth.max(1);
    if rate <= 0.0 {
        return Sizing {
            per_thread: 1,
            needed_in_flight: depth as f64,
            reason: "peak mode (no target rate): 1 connection, -d in flight".into(),
        };
    }
    let rtt_s = rtt_p99_ns as f64 * 1e-9;
    let needed = rate * rtt_s * HEADROOM + SPARE;
    let want = (needed / depth as f64).ceil() as usize;
    let per_thread = want.clamp(1, MAX_AUTO);
    let capped = if want > MAX_AUTO {
        format!(" (capped at {MAX_AUTO})")
    } else {
        String::new()
    };
    Sizing {
        per_thread,
        needed_in_flight: needed,
        reason: format!(
            "{rate:.0}/s × RTT p99 {:.1} µs × {HEADROOM} + {SPARE} = {needed:.1} in flight: {per_thread} connection(s) × depth {depth}{capped}",
            rtt_p99_ns as f64 * 1e-3
        ),
    }
}

/// Connections opened before the run beside the scheduled ones, with no schedule of their own:
/// room for rate × this in flight, so a server that stalls this long finds the schedule going
/// on without a connect in the send path (see [`grow_cap`] for why not later). Replies that
/// stalled ~4–6 ms at 20k/s found 4× the start (24 connections of depth 1) full and put the
/// run's send lag p99 at 67–110 µs.
pub const RESERVE_S: f64 = 0.005;
/// Most reserve connections per server, over all threads: a server's connection limit is shared
/// (memcached's default is 1 024; a connection past it is accepted and closed).
pub const MAX_RESERVE: usize = 128;

/// Most load connections per server per thread a run may grow to, whatever the start.
pub const MAX_GROWN: usize = 1024;
/// A connection opened during the run is given this long (at least; 4× the round trip's p99 if
/// longer, at most [`GROW_CONNECT_MAX`]) to connect: the send path waits for it. One that does
/// not connect in time pauses growth for [`GROW_PAUSE`] (a server slow to accept made single
/// blocking connects take 24 ms to 2 s, the whole schedule waiting behind them).
pub const GROW_CONNECT_MIN: Duration = Duration::from_millis(2);
pub const GROW_CONNECT_MAX: Duration = Duration::from_millis(20);
pub const GROW_PAUSE: Duration = Duration::from_millis(100);

/// Most load connections per server per thread a run may grow to from `initial`: 4× the start
/// (16 more where that is few).
///
/// Not sized to ride out a stalled server. Rate × 25 ms in flight was tried (memcached's vCPU
/// stalls ~25 ms now and then on the 2-vCPU VM; at 20k/s 28 connections of depth 1 then fill and
/// the run's send lag p99 reads ~614 µs): `headroom load -c auto` at 50k/s went from 10 of 10
/// runs valid to 1 of 10, send lag p99 0.6–13 ms. A connection opened in the send path takes
/// longer than the gap between sends, so the sends due meanwhile find every connection full and
/// open more: each stall grew the run to the cap (512), the connects being the stall.
pub fn grow_cap(initial: usize) -> usize {
    (initial * 4).max(initial + 16).min(MAX_GROWN).max(initial)
}

/// Reserve connections per server per thread for `rate` requests/s (one thread's share) over
/// `initial` scheduled connections of `depth` each: what rate × [`RESERVE_S`] in flight needs
/// beyond them, within the thread's share of [`MAX_RESERVE`].
pub fn reserve(initial: usize, rate: f64, depth: usize, threads: usize) -> usize {
    if !(rate.is_finite() && rate > 0.0) {
        return 0;
    }
    let want = (rate * RESERVE_S / depth.max(1) as f64).ceil() as usize;
    want.saturating_sub(initial)
        .min(MAX_RESERVE / threads.max(1))
}

/// How long a connection opened during the run may take to connect (see [`GROW_CONNECT_MIN`]).
pub fn grow_connect_timeout(rtt_p99_ns: u64) -> Duration {
    Duration::from_nanos(rtt_p99_ns.saturating_mul(4)).clamp(GROW_CONNECT_MIN, GROW_CONNECT_MAX)
}

/// Round trips of the ping phase, sorted (ns).
#[derive(Clone, Debug, PartialEq)]
pub struct Rtt {
    pub sorted_ns: Vec<u64>,
}

impl Rtt {
    /// The `q`-quantile (0..=1) by nearest rank.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.sorted_ns.is_empty() {
            return 0;
        }
        let n = self.sorted_ns.len();
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        self.sorted_ns[rank - 1]
    }
}

/// Measures the round trip to `addr`: `count` GETs of `key`, one at a time, `gap` apart.
pub fn ping(
    addr: SocketAddr,
    protocol: Protocol,
    key: &[u8],
    count: usize,
    gap: Duration,
) -> Result<Rtt, LoadError> {
    let err = |reason: String| LoadError::Preload {
        addr: addr.to_string(),
        reason: format!("ping phase (-c auto): {reason}"),
    };
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|source| {
            LoadError::Connect {
                addr: addr.to_string(),
                source,
            }
        })?;
    let _ = s.set_nodelay(true);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut req = Vec::new();
    protocol.encode(Op::Get, key, 0, &mut req);
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        std::thread::sleep(gap);
        let start = now_ns();
        s.write_all(&req)
            .map_err(|e| err(format!("sending: {e}")))?;
        let mut end = 0usize;
        loop {
            match protocol.parse(Op::Get, &buf[..end]) {
                Ok(Some(_)) => break,
                Ok(None) => {}
                Err(e) => return Err(err(format!("malformed reply: {e}"))),
            }
            if end == buf.len() {
                buf.resize(buf.len() * 2, 0);
            }
            match s.read(&mut buf[end..]) {
                Ok(0) => return Err(err("server closed the connection".into())),
                Ok(n) => end += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(err(format!("reading: {e}"))),
            }
        }
        out.push(now_ns() - start);
    }
    out.sort_unstable();
    Ok(Rtt { sorted_ns: out })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slower_round_trip_gets_more_connections() {
        let fast = size_connections(20_000.0, 30_000, 1);
        let slow = size_connections(20_000.0, 300_000, 1);
        assert!(slow.per_thread > fast.per_thread, "{fast:?} {slow:?}");
        // 20k/s × 30 µs × 2 + 2 = 3.2 in flight: 4 connections of depth 1, or 1 of depth 4.
        assert_eq!(fast.per_thread, 4);
        assert_eq!(size_connections(20_000.0, 30_000, 4).per_thread, 1);
        assert!(fast.reason.contains("RTT p99 30.0 µs"), "{}", fast.reason);
    }

    #[test]
    fn sizing_is_capped_and_peak_mode_keeps_one() {
        assert_eq!(size_connections(1e7, 10_000_000, 1).per_thread, MAX_AUTO);
        assert_eq!(size_connections(0.0, 100_000, 4).per_thread, 1);
    }

    #[test]
    fn the_reserve_holds_five_ms_of_the_rate_beyond_the_scheduled_connections() {
        // 20k/s, depth 1, 6 scheduled: 100 in flight for 5 ms, 94 more connections.
        assert_eq!(reserve(6, 20_000.0, 1, 1), 94);
        // Depth 4: 25 connections hold it; 6 are there.
        assert_eq!(reserve(6, 20_000.0, 4, 1), 19);
        // Enough scheduled already, no rate, or a rate past the bound.
        assert_eq!(reserve(200, 20_000.0, 1, 1), 0);
        assert_eq!(reserve(6, 0.0, 1, 1), 0);
        assert_eq!(reserve(6, 1e9, 1, 1), MAX_RESERVE);
        // The bound is the server's, shared by the threads.
        assert_eq!(reserve(6, 1e9, 1, 8), MAX_RESERVE / 8);
    }

    #[test]
    fn growth_is_four_times_the_start_or_sixteen_more_bounded() {
        assert_eq!(grow_cap(4), 20);
        assert_eq!(grow_cap(100), 400);
        assert_eq!(grow_cap(600), MAX_GROWN);
        assert_eq!(grow_cap(2000), 2000);
    }

    #[test]
    fn a_grown_connection_waits_for_its_connect_a_bounded_time() {
        assert_eq!(grow_connect_timeout(0), GROW_CONNECT_MIN);
        assert_eq!(grow_connect_timeout(1_000_000), Duration::from_millis(4));
        assert_eq!(grow_connect_timeout(u64::MAX), GROW_CONNECT_MAX);
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let r = Rtt {
            sorted_ns: (1..=100).collect(),
        };
        assert_eq!(r.quantile_ns(0.5), 50);
        assert_eq!(r.quantile_ns(0.99), 99);
        assert_eq!(Rtt { sorted_ns: vec![] }.quantile_ns(0.5), 0);
    }
}
