//! The receive side of a worker: replies parsed off a connection, the kernel's transmit stamps
//! matched to their requests, and each completed request timed and recorded.

use std::os::fd::AsRawFd;

use headroom_host::net::timestamps::{self, ErrQueue};

use super::conn::Inflight;
use super::plan::SavedSample;
use super::Worker;
use crate::protocol::Op;
use crate::stats::BlockHists;

impl Worker<'_> {
    /// Completes every whole reply in the buffer, received at `now` (`kernel_rx`: the kernel's
    /// receive stamp, else when the thread read it). False when the connection was faulted.
    pub(super) fn parse_replies(&mut self, i: usize, now: u64, kernel_rx: bool) -> bool {
        let sh = self.shared;
        loop {
            let c = &mut self.conns[i];
            let Some(front) = c.inflight.front() else {
                if c.rpos < c.rend {
                    self.fault(i, now, "reply without a request");
                    return false;
                }
                break;
            };
            let unstamped = front.tx == 0 && c.tx_stamps;
            match sh.protocol.parse(front.op, &c.rbuf[c.rpos..c.rend]) {
                Ok(Some(reply)) => {
                    if unstamped {
                        self.collect_tx_stamps(i);
                    }
                    let c = &mut self.conns[i];
                    c.rpos += reply.consumed;
                    let was_full = c.inflight.len() >= c.plan.depth;
                    let req = c.inflight.pop_front().expect("front exists");
                    c.backoff_ns = 0;
                    c.last_rx = now;
                    c.room.replied(was_full, now, req.client_lateness(now));
                    let measure = c.plan.measure;
                    let reported = c.plan.reported;
                    self.offer(i);
                    self.complete(req, reply.hit, measure, reported, now, kernel_rx);
                }
                Ok(None) => break,
                Err(e) => {
                    self.fault(i, now, &format!("malformed reply: {e}"));
                    return false;
                }
            }
        }
        let c = &mut self.conns[i];
        if c.rpos == c.rend {
            c.rpos = 0;
            c.rend = 0;
        }
        true
    }

    /// Reads connection `i`'s error queue for transmit stamps until the request at the front of
    /// its queue has one (or the queue is empty): each stamp goes to every request whose last
    /// byte it covers. Returns how many messages it read.
    pub(super) fn collect_tx_stamps(&mut self, i: usize) -> usize {
        let offset = self.realtime_offset_ns;
        let c = &mut self.conns[i];
        let Some(fd) = c.stream.as_ref().map(|s| s.as_raw_fd()) else {
            return 0;
        };
        let mut read = 0;
        // Bounded: the queue holds at most one stamp per send still in flight, and others.
        for _ in 0..1024 {
            if c.inflight.front().is_none_or(|f| f.tx != 0) {
                break;
            }
            match timestamps::read_errqueue(fd) {
                Ok(ErrQueue::Stamp { key, stamp }) => {
                    read += 1;
                    // A stamp before the monotonic clock's start times nothing.
                    let Some(ns) = stamp.monotonic_ns(offset) else {
                        continue;
                    };
                    for r in c.inflight.iter_mut() {
                        if r.tx != 0 {
                            continue;
                        }
                        if !timestamps::key_covers(key, r.end) {
                            break;
                        }
                        r.tx = ns;
                    }
                }
                Ok(ErrQueue::Other) => read += 1,
                Ok(ErrQueue::Empty) => break,
                Err(e) => {
                    tracing::debug!("reading the error queue of {}: {e}", c.plan.addr);
                    break;
                }
            }
        }
        read
    }

    /// Records a completed request. Its latency is from its transmit stamp (the user-space send
    /// where there is none) to its reply's receive stamp, plus the wait the server imposed before
    /// the send (corrected); the uncorrected figure leaves that wait out. The time between the
    /// server letting it go and its transmit stamp is the client's own: the send lag.
    pub(super) fn complete(
        &mut self,
        req: Inflight,
        hit: bool,
        measure: bool,
        reported: bool,
        now: u64,
        kernel_rx: bool,
    ) {
        let kernel_tx = req.tx != 0;
        let tx = req.went_at(now);
        let uncorrected = now.saturating_sub(tx);
        let server_wait = req.ready.saturating_sub(req.sched);
        let corrected = uncorrected + server_wait;
        let lag = req.send_lag(now);
        if reported {
            self.interval.record_ns(corrected);
            self.interval_actual_send.record_ns(uncorrected);
            self.interval_send_lag.record_ns(lag);
        }
        self.interval_completed += 1;
        if req.sched < self.shared.warm_end {
            return;
        }
        self.out.send_lag.record_ns(lag);
        if req.waited_for_room {
            let c = &mut self.out.counters;
            c.room_server_ns = c.room_server_ns.saturating_add(server_wait);
            c.room_client_ns = c.room_client_ns.saturating_add(req.client_lateness(now));
            c.room_waits += 1;
        }
        self.out.counters.tx_stamped += u64::from(kernel_tx);
        self.out.counters.rx_stamped += u64::from(kernel_rx);
        let hists = if measure {
            &mut self.out.measure
        } else {
            &mut self.out.load
        };
        let is_set = matches!(req.op, Op::Set);
        let block = BlockHists::block_of(
            req.sched - self.shared.warm_end,
            self.shared.end - self.shared.warm_end,
        );
        if is_set {
            hists.update.record_ns(corrected);
            hists.update_blocks.record_ns(block, corrected);
            hists.update_uncorrected.record_ns(uncorrected);
            self.out.counters.sets += 1;
        } else {
            hists.read.record_ns(corrected);
            hists.read_blocks.record_ns(block, corrected);
            hists.read_uncorrected.record_ns(uncorrected);
            self.out.counters.gets += 1;
            if !hit {
                self.out.counters.misses += 1;
            }
        }
        self.out.counters.completed += 1;
        if self.shared.save && reported && self.out.saved.len() < 10_000_000 {
            self.out.saved.push(SavedSample {
                sched_ns: req.sched - self.shared.t0,
                latency_ns: corrected,
                update: is_set,
            });
        }
    }
}
