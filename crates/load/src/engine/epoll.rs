//! The epoll engine (the fallback where io_uring is unavailable): one mio poll per worker, the
//! send timer a timerfd in the same poll, one `write` per flush and one `read` per readable event.

use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use super::{Io, Wait, Worker};
use crate::clock::now_ns;
use crate::error::LoadError;
use headroom_host::net::timestamps::recv_stamped;
use headroom_host::timer::Timer;

const TIMER_TOKEN: Token = Token(usize::MAX);

/// A worker's epoll instance and send timer.
pub(super) struct EpollIo {
    poll: Poll,
    timer: Timer,
}

impl EpollIo {
    pub(super) fn new() -> Result<EpollIo, LoadError> {
        let poll = Poll::new().map_err(|e| LoadError::system("creating the epoll instance", e))?;
        let timer = Timer::new().map_err(|e| LoadError::system("creating a timerfd", e))?;
        poll.registry()
            .register(
                &mut SourceFd(&timer.raw_fd()),
                TIMER_TOKEN,
                Interest::READABLE,
            )
            .map_err(|e| LoadError::system("registering the timerfd", e))?;
        Ok(EpollIo { poll, timer })
    }
}

impl Worker<'_> {
    fn epoll(&mut self) -> &mut EpollIo {
        match &mut self.io {
            Io::Epoll(e) => e,
            Io::Uring(_) => unreachable!("epoll call on an io_uring worker"),
        }
    }

    pub(super) fn epoll_attach(&mut self, i: usize) -> std::io::Result<()> {
        let Io::Epoll(e) = &mut self.io else {
            unreachable!("epoll call on an io_uring worker")
        };
        match self.conns[i].stream.as_mut() {
            Some(s) => {
                e.poll
                    .registry()
                    .register(s, Token(i), Interest::READABLE | Interest::WRITABLE)
            }
            None => Ok(()),
        }
    }

    pub(super) fn epoll_detach(&mut self, i: usize) {
        let Io::Epoll(e) = &mut self.io else {
            unreachable!("epoll call on an io_uring worker")
        };
        if let Some(mut s) = self.conns[i].stream.take() {
            let _ = e.poll.registry().deregister(&mut s);
        }
    }

    pub(super) fn epoll_loop(&mut self) -> Result<(), LoadError> {
        let mut events = Events::with_capacity(1024);
        loop {
            let now = now_ns();
            let Some(wake) = self.step(now) else {
                break;
            };
            if wake <= now {
                continue;
            }
            // The last `lead` before something is due, and any wait shorter than a sleep's CPU,
            // is busy-polled (epoll with a zero timeout: replies keep being read and
            // timestamped); before that the thread sleeps on the timer, armed `lead` early
            // because its wake-ups come late.
            let plan = self.wait_plan(now, wake);
            let busy = plan == Wait::Poll;
            let timeout = match plan {
                Wait::Poll => Duration::ZERO,
                Wait::SleepUntil(at) => {
                    self.epoll()
                        .timer
                        .arm(at)
                        .map_err(|e| LoadError::system("arming the send timer", e))?;
                    Duration::from_millis(200)
                }
            };
            match self.epoll().poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(LoadError::system("waiting on epoll", e)),
            }
            if busy && events.is_empty() {
                // Polling for precision, not work: kept apart from the load's CPU.
                self.out.busy_poll_ns += now_ns() - now;
            }
            let now = now_ns();
            for ev in events.iter() {
                if ev.token() == TIMER_TOKEN {
                    let e = self.epoll();
                    let armed = e.timer.armed_at();
                    e.timer.fired();
                    self.lead.observe(armed, now);
                    continue;
                }
                let i = ev.token().0;
                if i >= self.conns.len() {
                    continue;
                }
                if ev.is_writable() {
                    self.epoll_write(i, now);
                }
                if ev.is_readable() || ev.is_read_closed() {
                    self.on_readable(i);
                } else if ev.is_error() {
                    // The error queue has something: a transmit stamp (one per send) or a
                    // socket error. Stamps are taken now (the reply then needs no read of the
                    // queue); a socket error shows in the read.
                    if self.collect_tx_stamps(i) == 0 {
                        self.on_readable(i);
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes what is buffered for connection `i`.
    pub(super) fn epoll_write(&mut self, i: usize, now: u64) {
        let c = &mut self.conns[i];
        let Some(stream) = c.stream.as_mut() else {
            return;
        };
        while c.wpos < c.wbuf.len() {
            match stream.write(&c.wbuf[c.wpos..]) {
                Ok(0) => {
                    self.out.counters.closed += 1;
                    self.fault(i, now, "server closed the connection");
                    return;
                }
                Ok(n) => c.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.io_fault(i, now, "write failed", &e);
                    return;
                }
            }
        }
        c.wbuf.clear();
        c.wpos = 0;
    }

    /// Reads and parses replies of connection `i`, completing requests in order. Each read
    /// carries the kernel's receive stamp (`SO_TIMESTAMPNS`), which times its replies; where the
    /// kernel gives none, the time the read returned does.
    fn on_readable(&mut self, i: usize) {
        let sh = self.shared;
        let offset = self.realtime_offset_ns;
        loop {
            let c = &mut self.conns[i];
            let Some(stream) = c.stream.as_ref() else {
                return;
            };
            let fd = stream.as_raw_fd();
            if c.rend == c.rbuf.len() {
                if c.rpos > 0 {
                    c.rbuf.copy_within(c.rpos..c.rend, 0);
                    c.rend -= c.rpos;
                    c.rpos = 0;
                } else {
                    let n = c.rbuf.len();
                    c.rbuf.resize(n * 2, 0);
                }
            }
            let rend = c.rend;
            match recv_stamped(fd, &mut c.rbuf[rend..]) {
                Ok((0, _)) => {
                    let now = now_ns();
                    self.out.counters.closed += 1;
                    self.fault(i, now, "server closed the connection");
                    return;
                }
                Ok((n, stamp)) => {
                    // A read that did not fill the buffer drained the socket: with edge-triggered
                    // epoll, later bytes raise a new event, so skip the read that would say EAGAIN.
                    let drained = rend + n < c.rbuf.len();
                    c.rend += n;
                    let now = now_ns();
                    if now >= sh.warm_end {
                        self.out.counters.bytes_rx += n as u64;
                    }
                    // Never later than now (a stamp mapped past it: the clock slewed).
                    let (at, kernel_rx) = match stamp.and_then(|s| s.monotonic_ns(offset)) {
                        Some(t) => (t.min(now), true),
                        None => (now, false),
                    };
                    if !self.parse_replies(i, at, kernel_rx) || drained {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    let now = now_ns();
                    self.io_fault(i, now, "read failed", &e);
                    return;
                }
            }
        }
    }
}
