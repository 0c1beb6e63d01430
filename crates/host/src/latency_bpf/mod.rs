//! A passive sensor of the LC's own request latency: BPF times each request on the LC's TCP
//! connections from its arrival in the kernel to the LC's reply, and keeps a log-linear
//! histogram the agent reads per window. It sees the LC's real clients, adds no traffic and
//! depends on no thread's scheduling.
//!
//! What is timed: on a socket whose local port is one of the LC's, from the first data
//! segment processed by TCP (`tcp:tcp_probe`, in `tcp_rcv_established`) while no request is
//! pending, to the LC's next successful `sendmsg` on that socket (`sock:sock_send_length`).
//! Segments arriving before that reply (a request in several segments, pipelined requests)
//! are one timed request from the first one's arrival; they are counted as segments. A
//! segment arriving after the socket sent (its `snd_nxt` moved) but before the reply's
//! `sendmsg` returned — the client's next request, held in the backlog while the LC owned
//! the lock — is queued as the next request, not merged into the answered one.
//! `sock:inet_sock_set_state` to `TCP_CLOSE` forgets a socket. Not seen: replies sent with
//! `sendfile`/`splice`; a segment that arrives while the LC holds the socket lock is timed
//! from when the kernel processes its backlog (when the LC releases the lock).
//!
//! Field offsets are read from each tracepoint's `format` file at load time
//! ([`tracefs::layout`]); the programs are attached with `perf_event_open` +
//! `PERF_EVENT_IOC_SET_BPF`, so closing the fds (dropping [`LatencySensor`], or the process
//! dying) detaches them, and a failure part-way closes what was made.
//!
//! Needs root (CAP_BPF + CAP_PERFMON), tracefs, the three tracepoints (`sock_send_length`:
//! Linux 6.3+) and BPF atomics (5.12+).

mod histogram;
mod loaded;
pub mod program;
pub mod tracefs;

pub use histogram::{Counters, LatencySnapshot};
pub use loaded::{LatencyPrograms, LatencySensor, MAX_PORTS, MAX_SOCKETS};

use std::path::Path;

/// Whether some TCP socket listens on `port` in this network namespace (`/proc/net/tcp`,
/// `/proc/net/tcp6` under `root`). `None` when neither file could be read.
pub fn listening(root: &Path, port: u16) -> Option<bool> {
    let mut read_any = false;
    for f in ["proc/net/tcp", "proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(root.join(f)) else {
            continue;
        };
        read_any = true;
        let found = text.lines().skip(1).any(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.len() > 3
                && cols[3] == "0A"
                && cols[1]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                    == Some(port)
        });
        if found {
            return Some(true);
        }
    }
    read_any.then_some(false)
}

/// Why the sensor cannot run here (`None`: it loaded and attached, then detached): the
/// check `doctor` and the agent's start make.
pub fn unavailable_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (CAP_BPF and CAP_PERFMON) to load BPF".into());
    }
    LatencySensor::attach(&[]).err().map(|e| e.to_string())
}

#[cfg(test)]
mod tests;
