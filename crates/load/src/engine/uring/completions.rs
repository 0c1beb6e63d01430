//! The io_uring engine's completions: a receive's bytes into the connection's reply buffer
//! (with the kernel's receive stamp), a finished SEND's buffer back to the connection.

use super::*;

impl Worker<'_> {
    /// Handles every completion in the queue; returns how many.
    pub(super) fn reap(&mut self) -> Result<usize, LoadError> {
        let mut n = 0;
        self.uring().replies_left = false;
        loop {
            if n > 0 && now_ns() >= self.due_at && self.replies_carry_stamps() {
                // A send fell due: it goes before the rest, which keep their kernel stamps.
                self.uring().replies_left = true;
                break;
            }
            let Some(cqe) = self.uring().ring.completion().next() else {
                break;
            };
            n += 1;
            let (kind, generation, i) = unpack(cqe.user_data());
            let (result, flags) = (cqe.result(), cqe.flags());
            match kind {
                KIND_RECV => self.on_recv(i, generation, result, flags),
                KIND_SEND => self.on_send(i, generation, result),
                _ => {}
            }
        }
        if n > 0 {
            self.uring().publish();
        }
        Ok(n)
    }

    fn on_recv(&mut self, i: usize, generation: u32, result: i32, flags: u32) {
        let now = now_ns();
        let offset = self.realtime_offset_ns;
        let Io::Uring(u) = &mut self.io else {
            unreachable!("io_uring call on an epoll worker")
        };
        let bid = cqueue::buffer_select(flags);
        let current = i < self.conns.len() && self.conns[i].ring.generation == generation;
        // Payload bytes copied into the connection's reply buffer, and their kernel timestamp.
        let mut got = 0usize;
        let mut stamp = now;
        let mut kernel_rx = false;
        if current && result > 0 {
            let bid = bid.expect("a receive with data names its buffer");
            let start = usize::from(bid) * BUFFER_LEN;
            let raw = &u.buffers[start..start + result as usize];
            if let Ok(out) = RecvMsgOut::parse(raw, &u.msghdr) {
                let payload = out.payload_data();
                got = payload.len();
                let c = &mut self.conns[i];
                c.make_room(got);
                c.rbuf[c.rend..c.rend + got].copy_from_slice(payload);
                c.rend += got;
                if let Some(t) = rx_stamp(out.control_data()).and_then(|s| s.monotonic_ns(offset)) {
                    // Never later than now; never before the clock the stamps are mapped to.
                    stamp = t.min(now);
                    kernel_rx = true;
                }
            }
        }
        if let Some(bid) = bid {
            // Copied out (or stale): straight back to the kernel.
            u.stage_buffer(bid);
        }
        let more = cqueue::more(flags);
        if !current {
            if !more {
                u.stale_recvs = u.stale_recvs.saturating_sub(1);
            }
            return;
        }
        if !more {
            self.conns[i].ring.recv_armed = false;
        }
        if got > 0 {
            if now >= self.shared.warm_end {
                self.out.counters.bytes_rx += got as u64;
            }
            if !self.parse_replies(i, stamp, kernel_rx) {
                return;
            }
        } else if result >= 0 {
            self.out.counters.closed += 1;
            self.fault(i, now, "server closed the connection");
            return;
        } else if result != -libc::ENOBUFS {
            let e = std::io::Error::from_raw_os_error(-result);
            self.io_fault(i, now, "receive failed", &e);
            return;
        }
        // A multishot receive ends when the buffers run out (ENOBUFS) or the kernel says so:
        // re-arm it on the same socket.
        if !more && self.conns[i].stream.is_some() {
            if let Err(e) = self.uring_attach(i) {
                self.fault(i, now, &format!("re-arming the receive: {e}"));
            }
        }
    }

    fn on_send(&mut self, i: usize, generation: u32, result: i32) {
        let Some(c) = self.conns.get_mut(i) else {
            return;
        };
        let current = c.ring.generation == generation;
        if !current {
            // The old socket's SEND ended (cancelled or not): its buffer is ours again.
            c.ring.send_busy = false;
            c.ring.sbuf.clear();
            if c.stream.is_some() {
                self.uring_queue_send(i);
            }
            return;
        }
        let now = now_ns();
        if result <= 0 {
            c.ring.send_busy = false;
            c.ring.sbuf.clear();
            if result == 0 {
                self.fault(i, now, "server closed the connection");
            } else {
                let e = std::io::Error::from_raw_os_error(-result);
                self.io_fault(i, now, "send failed", &e);
            }
            return;
        }
        c.ring.sent += result as usize;
        if c.ring.sent < c.ring.sbuf.len() {
            // A short send: the rest goes next.
            use std::os::fd::AsRawFd;
            let Some(fd) = c.stream.as_ref().map(|s| s.as_raw_fd()) else {
                return;
            };
            let entry = send_entry(fd, &c.ring, i);
            if let Err(e) = self.uring().push(&entry) {
                self.fault(i, now, &format!("queueing a send: {e}"));
            }
            return;
        }
        c.ring.send_busy = false;
        c.ring.sbuf.clear();
        self.uring_queue_send(i);
    }
}
