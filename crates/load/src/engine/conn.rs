//! One connection of a worker: its socket, what is in flight on it with each request's times,
//! its buffers, its kernel stamps and its reconnect back-off.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;

use mio::net::TcpStream;

use super::plan::ConnPlan;
use super::{tx_stamp, uring};
use crate::clock::now_ns;
use crate::protocol::Op;

/// Reconnect back-off after a connection fails again before answering anything: doubles from
/// the first to the last (the first fault of a working connection reconnects at once).
pub(super) const RECONNECT_BACKOFF_FIRST_NS: u64 = 1_000_000;
pub(super) const RECONNECT_BACKOFF_MAX_NS: u64 = 500_000_000;
pub(super) const READ_CHUNK: usize = 64 * 1024;

pub(super) struct Inflight {
    pub(super) op: Op,
    pub(super) sched: u64,
    /// When the thread made the send (user space: the fallback for a missing transmit stamp).
    pub(super) sent: u64,
    /// When the server let it go: `sched`, or later where it waited at the depth cap for a
    /// reply the server held (what follows is the client's: its send lag). A reply the client got
    /// late because it sent that request late is the client's wait, not the server's.
    pub(super) ready: u64,
    /// When it could go: `sched`, or the reply (or `--moderate`'s gap) it waited for. From then
    /// to its transmit stamp is the thread's reaction to it: its send lag.
    pub(super) could_go: u64,
    /// It found no room when due (or went behind a send that found none).
    pub(super) waited_for_room: bool,
    /// Offset of its last byte on the connection (what a transmit stamp's key is compared with).
    pub(super) end: u64,
    /// The kernel's transmit stamp (0: none yet).
    pub(super) tx: u64,
}

impl Inflight {
    /// When the bytes went: the kernel's transmit stamp, held between the thread's send and the
    /// reply at `rx` (a stamp mapped outside that: the realtime clock slewed since the offset
    /// was read), else the thread's send.
    pub(super) fn went_at(&self, rx: u64) -> u64 {
        if self.tx != 0 {
            self.tx.clamp(self.sent, rx.max(self.sent))
        } else {
            self.sent
        }
    }

    /// The thread's own lateness in sending it: from when it could go to when its bytes went.
    /// A backlog's waits owed to earlier sends' lateness are not in it: summed along the
    /// backlog they read as a client 16 ms late at the median behind a 20 ms server with `-c 1
    /// -d 1` (hostile pass 34), where each send was a reaction of microseconds.
    pub(super) fn send_lag(&self, rx: u64) -> u64 {
        self.went_at(rx).saturating_sub(self.could_go)
    }

    /// All of its lateness that was the client's: from when the server let it go (`ready`) to
    /// when its bytes went, its share of the wait for room included. A send that waited for
    /// this one's reply waited that much on the client.
    pub(super) fn client_lateness(&self, rx: u64) -> u64 {
        self.went_at(rx).saturating_sub(self.ready)
    }
}

/// A connection's room at its depth cap: a request that waited there was the server's wait
/// until the reply that made room, but for that reply's request's own send lag.
#[derive(Debug, Clone, Copy)]
pub(super) struct Room {
    /// When the connection last got room after sitting at its depth cap: the stamp of the first
    /// reply after the send that filled it, or when it was (re)opened. Later replies are not
    /// room made: a send due after the first had room (hostile pass 34: with every reply taken
    /// as room made, a send due while the connection had room, that a late thread reached only
    /// after a later reply, was charged that wait as the server's).
    pub(super) at: u64,
    /// The client's lateness in sending the request whose reply made room at `at` (0 for a
    /// connection (re)opened): its reply came that much later by the client's doing, so a send
    /// that waited for that room waited that much on the client, the rest on the server.
    pub(super) client_ns: u64,
    /// When a send last filled the connection to its depth cap (`u64::MAX`: never): a send due
    /// from then until `at` waited for room, seen late or not.
    pub(super) full_since: u64,
}

impl Room {
    /// A connection (re)opened at `now`: room at once, owed to no request.
    pub(super) fn opened(now: u64) -> Room {
        Room {
            at: now,
            client_ns: 0,
            full_since: u64::MAX,
        }
    }

    /// A send at `now` filled the connection to its depth cap.
    pub(super) fn filled(&mut self, now: u64) {
        self.full_since = now;
    }

    /// A reply stamped `rx`, to a request the client sent `client_lateness` late (see
    /// [`Inflight::client_lateness`]); `was_full`: the connection sat at its depth cap until it
    /// came (only then did it make room).
    pub(super) fn replied(&mut self, was_full: bool, rx: u64, client_lateness: u64) {
        if was_full {
            self.at = rx;
            self.client_ns = client_lateness;
        }
    }

    /// A send due at `sched` fell due while the connection sat at its depth cap (it waited for
    /// the room made at `at`, whenever the thread saw it due).
    pub(super) fn full_at(&self, sched: u64) -> bool {
        self.full_since <= sched && sched < self.at
    }
}

pub(super) struct Conn {
    pub(super) plan: ConnPlan,
    pub(super) stream: Option<TcpStream>,
    pub(super) reconnect_at: u64,
    /// Delay before the next reconnect; 0 while the connection last worked (a reply arrived
    /// since it was opened).
    pub(super) backoff_ns: u64,
    pub(super) next_sched: u64,
    /// The request due at `next_sched` has already been counted late.
    pub(super) late_marked: bool,
    pub(super) done_sending: bool,
    pub(super) inflight: VecDeque<Inflight>,
    pub(super) wbuf: Vec<u8>,
    pub(super) wpos: usize,
    pub(super) rbuf: Vec<u8>,
    pub(super) rpos: usize,
    pub(super) rend: usize,
    pub(super) last_sent: Option<u64>,
    /// When the last reply arrived (for `--moderate`).
    pub(super) last_rx: u64,
    /// When it last sat at its depth cap and when a reply made room (see [`Room`]).
    pub(super) room: Room,
    /// Bytes queued on the current socket so far (transmit stamps key on them).
    pub(super) tx_bytes: u64,
    /// The current socket reports transmit stamps.
    pub(super) tx_stamps: bool,
    /// What the kernel refused when stamps were asked for on one of this connection's sockets.
    pub(super) stamps_refused: Option<String>,
    /// The io_uring engine's send and receive state (unused by epoll).
    pub(super) ring: uring::ConnRing,
    /// Opened beside the schedule (`-c auto`: a reserve before the run, or grown during it): no
    /// schedule of its own, it carries sends that found the scheduled connections at their cap.
    pub(super) grown: bool,
    /// `-c auto`: its server's index in the worker's [`pool::ConnPool`] (None: not pooled, as a
    /// measurement connection or a fixed `-c`), and whether it is listed there now.
    pub(super) pool_server: Option<usize>,
    pub(super) pooled: bool,
}

impl Conn {
    pub(super) fn new(plan: ConnPlan, stream: TcpStream, next_sched: u64, grown: bool) -> Conn {
        Conn {
            plan,
            stream: Some(stream),
            reconnect_at: 0,
            backoff_ns: 0,
            next_sched,
            late_marked: false,
            done_sending: grown,
            inflight: VecDeque::new(),
            wbuf: Vec::with_capacity(4096),
            wpos: 0,
            rbuf: vec![0; READ_CHUNK],
            rpos: 0,
            rend: 0,
            last_sent: None,
            last_rx: 0,
            room: Room::opened(now_ns()),
            tx_bytes: 0,
            tx_stamps: false,
            stamps_refused: None,
            ring: uring::ConnRing::default(),
            grown,
            pool_server: None,
            pooled: false,
        }
        .with_stamps()
    }

    pub(super) fn with_stamps(mut self) -> Conn {
        self.arm_stamps();
        self
    }

    /// Asks for kernel transmit and receive stamps on a new socket (before anything is sent).
    pub(super) fn arm_stamps(&mut self) {
        self.tx_bytes = 0;
        self.tx_stamps = false;
        let Some(s) = self.stream.as_ref() else {
            return;
        };
        let armed = tx_stamp::enable(s.as_raw_fd());
        self.tx_stamps = armed.tx;
        if let (Some(why), None) = (armed.refused, &self.stamps_refused) {
            self.stamps_refused = Some(why);
        }
    }
}

impl Conn {
    /// Makes room for `len` more bytes after `rend` in the reply buffer (compacting, then growing).
    pub(super) fn make_room(&mut self, len: usize) {
        if self.rbuf.len() - self.rend >= len {
            return;
        }
        if self.rpos > 0 {
            self.rbuf.copy_within(self.rpos..self.rend, 0);
            self.rend -= self.rpos;
            self.rpos = 0;
        }
        if self.rbuf.len() - self.rend < len {
            let want = (self.rend + len).next_power_of_two();
            self.rbuf.resize(want, 0);
        }
    }

    /// Schedules the next reconnect: at once after a connection that worked, then 1 ms, 2 ms, …
    /// up to 0.5 s while it keeps failing (a server that accepts and closes is not hammered).
    pub(super) fn back_off(&mut self, now: u64) {
        self.reconnect_at = now + self.backoff_ns;
        self.backoff_ns = if self.backoff_ns == 0 {
            RECONNECT_BACKOFF_FIRST_NS
        } else {
            (self.backoff_ns * 2).min(RECONNECT_BACKOFF_MAX_NS)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::Room;

    /// Depth 2, filled at 0; replies at 10 (room made) and 50 (a second slot). A send due at 5
    /// found no room and waited for the reply at 10; one due at 30 had room, though a thread that
    /// slept until 60 saw it due only after the reply at 50.
    #[test]
    fn only_the_first_reply_after_the_cap_makes_room() {
        let mut room = Room::opened(0);
        room.filled(0);
        room.replied(true, 10, 3);
        room.replied(false, 50, 0);
        assert!(room.full_at(5));
        assert_eq!((room.at, room.client_ns), (10, 3));
        assert!(
            !room.full_at(30),
            "a send due with room counted as waiting for the reply at {}",
            room.at
        );
        // Filled again at 60: the sends due from then wait for the next reply.
        room.filled(60);
        assert!(!room.full_at(70), "no room made since the fill");
        room.replied(true, 80, 0);
        assert!(room.full_at(70) && !room.full_at(55));
    }

    #[test]
    fn a_reopened_connection_has_room_owed_to_no_request() {
        let room = Room::opened(7);
        assert_eq!((room.at, room.client_ns), (7, 0));
        assert!(!room.full_at(3));
    }
}
