//! The io_uring engine (the default where the kernel allows it).
//!
//! Per loop turn: the due sends of every connection become SEND entries in the submission queue,
//! and one `io_uring_enter` submits them all and waits, for the first completion or for the send
//! timer (the enter's own timeout, `IORING_ENTER_EXT_ARG`, so no timerfd and no extra syscall).
//! Replies arrive through one multishot receive per connection that picks its buffers from a
//! provided-buffer ring; a completion's bytes are copied into the connection's reply buffer (the
//! same parser as epoll's) and the buffer goes straight back to the ring. Nothing is allocated
//! per request: each connection has two send buffers that swap (one being filled by due
//! requests, one owned by the kernel while its SEND is in flight).
//!
//! Timestamps: the receive is a multishot `recvmsg` on sockets with SO_TIMESTAMPNS, so each
//! completion carries the kernel's software receive timestamp (CLOCK_REALTIME, mapped onto
//! CLOCK_MONOTONIC by the offset read when the worker starts; a reply is never stamped later than
//! when it was reaped). The epoll engine stamps a reply when its `read` returns. Because the stamp
//! does not depend on when the thread looks, a sleep towards the next send ignores replies (one
//! wake-up per send, not one per send and one per reply) whenever no send waits on a reply (see
//! `replies_can_wait`). Send times and latencies are from the schedule, exactly as with epoll.

use headroom_host::net::timestamps::rx_stamp;
use io_uring::types::{BufRingEntry, Fd, RecvMsgOut, SubmitArgs, Timespec};
use io_uring::{cqueue, opcode, squeue, IoUring};

mod completions;

use super::{Io, Wait, Worker};
use crate::clock::now_ns;
use crate::error::LoadError;

/// Buffers in the provided-buffer ring (a power of two), shared by a worker's connections.
const BUFFERS: u16 = 256;
/// Size of one provided buffer: many replies fit; a longer burst takes several buffers.
const BUFFER_LEN: usize = 16 * 1024;
/// The ring's buffer group id.
const BUFFER_GROUP: u16 = 0;
/// Longest single wait (the loop re-checks the interval boundary and the end at least this often).
const MAX_WAIT_NS: u64 = 200_000_000;
/// Room for the control messages in each received buffer: SCM_TIMESTAMPNS, and the
/// SCM_TIMESTAMPING TCP adds on a socket that reports software transmit stamps too.
pub(super) const CONTROL_LEN: usize = headroom_host::net::timestamps::RX_CONTROL_LEN;
/// A wait that should not end for replies asks for this many completions (the kernel caps it at
/// the completion queue's size); its timeout, the next send's time, ends it.
const WAIT_FOR_TIMER: usize = 1 << 16;

/// How long the end of the run waits for cancelled receives to hand their buffers back.
const CANCEL_DRAIN_NS: u64 = 100_000_000;

/// IORING_ENTER_GETEVENTS of <linux/io_uring.h> (the crate keeps its `sys` module private).
const ENTER_GETEVENTS: u32 = 1;

/// What a completion is for (the top byte of its user_data).
const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_CANCEL: u64 = 3;

fn user_data(kind: u64, generation: u32, conn: usize) -> u64 {
    kind << 56 | (u64::from(generation) & 0xff_ffff) << 32 | (conn as u64 & 0xffff_ffff)
}

fn unpack(data: u64) -> (u64, u32, usize) {
    (
        data >> 56,
        ((data >> 32) & 0xff_ffff) as u32,
        (data & 0xffff_ffff) as usize,
    )
}

/// A connection's io_uring state.
#[derive(Debug, Default)]
pub(super) struct ConnRing {
    /// Bumped whenever the connection's socket is replaced: completions of an older socket's
    /// operations are recognized by it and only their buffers are kept.
    generation: u32,
    /// A multishot receive is armed on the current socket.
    recv_armed: bool,
    /// A SEND from `sbuf` is in flight (the kernel may read `sbuf` until it completes, whatever
    /// the generation).
    send_busy: bool,
    /// The bytes of the SEND in flight, and how many of them the kernel has taken.
    sbuf: Vec<u8>,
    sent: usize,
    /// The socket gives kernel receive timestamps (SO_TIMESTAMPNS).
    rx_stamps: bool,
}

/// A worker's ring and its provided buffers.
pub(super) struct UringIo {
    // Declared first so it is dropped (closed) before the memory it reads and writes.
    ring: IoUring,
    entries: RingMemory,
    buffers: Vec<u8>,
    /// Buffers added to the ring so far (the ring's tail, as u16 wrapping).
    tail: u16,
    /// Receives cancelled (their socket replaced or closed) whose last completion has not come:
    /// the kernel may still write into a provided buffer for them.
    stale_recvs: usize,
    /// The receive's message header (no name, room for one control message): the kernel reads
    /// its lengths when each multishot receive is armed.
    msghdr: Box<libc::msghdr>,
    /// The last reap stopped for a due send with completions still queued: the next wait polls.
    replies_left: bool,
    /// Some connection's replies came without kernel receive stamps (sticky).
    unstamped: bool,
}

/// Page-aligned memory for the buffer ring's entries.
struct RingMemory {
    ptr: *mut BufRingEntry,
    layout: std::alloc::Layout,
}

impl RingMemory {
    fn new(entries: u16) -> std::io::Result<RingMemory> {
        let size = usize::from(entries) * std::mem::size_of::<BufRingEntry>();
        let layout = std::alloc::Layout::from_size_align(size, 4096)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut BufRingEntry;
        if ptr.is_null() {
            return Err(std::io::Error::from(std::io::ErrorKind::OutOfMemory));
        }
        Ok(RingMemory { ptr, layout })
    }
}

impl Drop for RingMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr as *mut u8, self.layout) };
    }
}

/// Sets up a ring as the workers do; the error says which step the kernel refused.
fn new_ring(entries: u32) -> std::io::Result<IoUring> {
    // SINGLE_ISSUER + DEFER_TASKRUN: completions are posted only inside our own enter calls
    // (no inter-processor interrupts to run task work); older kernels get a plain ring.
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(entries * 8)
        .build(entries)
        .or_else(|_| IoUring::builder().setup_cqsize(entries * 8).build(entries))
        .map_err(|e| std::io::Error::new(e.kind(), format!("io_uring_setup: {e}")))?;
    if !ring.params().is_feature_ext_arg() {
        return Err(std::io::Error::other(
            "io_uring_enter has no timeout argument (IORING_FEAT_EXT_ARG, Linux 5.11)",
        ));
    }
    if !ring.params().is_feature_nodrop() {
        return Err(std::io::Error::other(
            "the completion queue may drop events (IORING_FEAT_NODROP, Linux 5.5)",
        ));
    }
    Ok(ring)
}

/// Whether this process may use io_uring the way the engine does (a ring and a buffer ring).
pub(super) fn probe() -> Result<(), std::io::Error> {
    let ring = new_ring(8)?;
    let mem = RingMemory::new(8)?;
    // SAFETY: `mem` outlives the ring (the ring is dropped first, below).
    unsafe {
        ring.submitter()
            .register_buf_ring_with_flags(mem.ptr as u64, 8, BUFFER_GROUP, 0)
    }
    .map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("registering a provided-buffer ring (Linux 5.19): {e}"),
        )
    })?;
    drop(ring);
    drop(mem);
    Ok(())
}

impl UringIo {
    pub(super) fn new(conns: usize) -> Result<UringIo, LoadError> {
        let sys = |what: &str, e: std::io::Error| LoadError::system(what.to_string(), e);
        // Room for a SEND and a receive (or cancel) per connection in one turn.
        let entries = (conns * 4).next_power_of_two().clamp(64, 4096) as u32;
        let ring = new_ring(entries).map_err(|e| sys("setting up io_uring", e))?;
        let entries_mem =
            RingMemory::new(BUFFERS).map_err(|e| sys("allocating the buffer ring", e))?;
        let mut io = UringIo {
            ring,
            entries: entries_mem,
            buffers: vec![0; usize::from(BUFFERS) * BUFFER_LEN],
            tail: 0,
            stale_recvs: 0,
            // SAFETY: msghdr is plain data; all-zero is a valid (empty) header.
            msghdr: Box::new(unsafe { std::mem::zeroed() }),
            replies_left: false,
            unstamped: false,
        };
        io.msghdr.msg_controllen = CONTROL_LEN as _;
        // SAFETY: the entries stay allocated (and the buffers too) until after the ring closes.
        unsafe {
            io.ring.submitter().register_buf_ring_with_flags(
                io.entries.ptr as u64,
                BUFFERS,
                BUFFER_GROUP,
                0,
            )
        }
        .map_err(|e| sys("registering the provided-buffer ring", e))?;
        for bid in 0..BUFFERS {
            io.stage_buffer(bid);
        }
        io.publish();
        Ok(io)
    }

    /// Writes buffer `bid` into the ring's next free entry (visible to the kernel once published).
    fn stage_buffer(&mut self, bid: u16) {
        let index = usize::from(self.tail & (BUFFERS - 1));
        let addr = self.buffers.as_ptr() as u64 + u64::from(bid) * BUFFER_LEN as u64;
        // SAFETY: index < BUFFERS entries allocated; the kernel only reads entries behind the tail.
        let entry = unsafe { &mut *self.entries.ptr.add(index) };
        entry.set_addr(addr);
        entry.set_len(BUFFER_LEN as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes the staged buffers visible to the kernel.
    fn publish(&mut self) {
        // SAFETY: the tail field lives in the first entry, allocated and 2-byte aligned; the
        // release store orders the entries written above before it.
        unsafe {
            let tail = BufRingEntry::tail(self.entries.ptr) as *const std::sync::atomic::AtomicU16;
            (*tail).store(self.tail, std::sync::atomic::Ordering::Release);
        }
    }

    /// Queues an entry, submitting what is queued first when the queue is full.
    fn push(&mut self, entry: &squeue::Entry) -> Result<(), LoadError> {
        loop {
            // SAFETY: every buffer an entry points at outlives its operation (connection send
            // buffers are only reused after their SEND completes; provided buffers live as long
            // as the ring).
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            self.ring
                .submit()
                .map_err(|e| LoadError::system("submitting to io_uring", e))?;
        }
    }
}

impl Worker<'_> {
    fn uring(&mut self) -> &mut UringIo {
        match &mut self.io {
            Io::Uring(u) => u,
            Io::Epoll(_) => unreachable!("io_uring call on an epoll worker"),
        }
    }

    /// Arms a multishot receive on connection `i`'s socket.
    pub(super) fn uring_attach(&mut self, i: usize) -> std::io::Result<()> {
        let c = &mut self.conns[i];
        let Some(stream) = c.stream.as_ref() else {
            return Ok(());
        };
        use std::os::fd::AsRawFd;
        let fd = stream.as_raw_fd();
        // Kernel receive timestamps: a reply's time is when the kernel took it in, not when this
        // thread got round to it (so replies can wait for the next send's wake-up).
        let stamped = headroom_host::net::timestamps::enable_timestampns(fd).is_ok();
        c.ring.rx_stamps = stamped;
        let generation = c.ring.generation;
        c.ring.recv_armed = true;
        let u = self.uring();
        u.unstamped |= !stamped;
        let entry = opcode::RecvMsgMulti::new(Fd(fd), &*u.msghdr, BUFFER_GROUP)
            .build()
            .user_data(user_data(KIND_RECV, generation, i));
        u.push(&entry)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        // A reconnect may find requests buffered while the connection was down.
        self.uring_queue_send(i);
        Ok(())
    }

    /// Cancels connection `i`'s operations and closes its socket (the kernel keeps its own
    /// reference until they end; their completions carry the old generation).
    pub(super) fn uring_detach(&mut self, i: usize) {
        let c = &mut self.conns[i];
        let generation = c.ring.generation;
        let cancels = [
            c.ring
                .recv_armed
                .then(|| user_data(KIND_RECV, generation, i)),
            c.ring
                .send_busy
                .then(|| user_data(KIND_SEND, generation, i)),
        ];
        let was_armed = std::mem::replace(&mut c.ring.recv_armed, false);
        c.ring.generation = (generation + 1) & 0xff_ffff;
        c.stream = None;
        if was_armed {
            self.uring().stale_recvs += 1;
        }
        for target in cancels.into_iter().flatten() {
            let entry = opcode::AsyncCancel::new(target)
                .build()
                .user_data(user_data(KIND_CANCEL, generation, i));
            if let Err(e) = self.uring().push(&entry) {
                tracing::debug!("cancelling an operation: {e}");
            }
        }
    }

    /// Starts a SEND of what connection `i` has buffered, unless one is in flight (it follows
    /// when that one completes).
    pub(super) fn uring_queue_send(&mut self, i: usize) {
        let c = &mut self.conns[i];
        if c.ring.send_busy || c.wbuf.is_empty() {
            return;
        }
        let Some(stream) = c.stream.as_ref() else {
            return;
        };
        use std::os::fd::AsRawFd;
        let fd = stream.as_raw_fd();
        std::mem::swap(&mut c.wbuf, &mut c.ring.sbuf);
        c.wbuf.clear();
        c.ring.sent = 0;
        c.ring.send_busy = true;
        let entry = send_entry(fd, &c.ring, i);
        if let Err(e) = self.uring().push(&entry) {
            let now = now_ns();
            self.fault(i, now, &format!("queueing a send: {e}"));
        }
    }

    pub(super) fn uring_loop(&mut self) -> Result<(), LoadError> {
        loop {
            let now = now_ns();
            let Some(wake) = self.step(now) else {
                break;
            };
            self.due_at = wake;
            // Sleep (in the enter, with a timeout) until `lead` before the next due time, then
            // busy-poll (enters that wait for nothing) up to it, as the epoll engine does; a
            // wait shorter than a sleep's CPU is polled outright, and so is any wait while
            // replies are left in the queue.
            let mut plan = self.wait_plan(now, wake);
            if self.uring().replies_left {
                plan = Wait::Poll;
            }
            let busy = plan == Wait::Poll;
            let woke_at = if let Wait::SleepUntil(target) = plan {
                let capped = target > now + MAX_WAIT_NS;
                let want = if self.replies_can_wait(target) {
                    WAIT_FOR_TIMER
                } else {
                    1
                };
                self.enter_waiting(target.min(now + MAX_WAIT_NS) - now, want)?;
                // Only a wait for the due time itself tells how late the timer wakes us.
                (!capped && now_ns() >= target).then_some(target)
            } else {
                self.enter(None)?;
                None
            };
            let reaped = self.reap()?;
            if let Some(target) = woke_at {
                self.lead.observe(target, now_ns());
            }
            if busy && reaped == 0 {
                // Polling for precision, not work: kept apart from the load's CPU.
                self.out.busy_poll_ns += now_ns() - now;
            }
        }
        self.uring_shutdown();
        Ok(())
    }

    /// Whether a sleep until `until` can ignore replies: every connection's replies carry kernel
    /// timestamps and none is needed for a send due before then (no connection at its depth cap
    /// with a send due earlier, none in closed-loop mode, no `--moderate`, still sending). Replies
    /// are then read at the next wake-up: one wake-up per send instead of one per send and one
    /// per reply. Only while each connection has at most one request in flight: TCP gives one
    /// timestamp per read (its last segment's), so replies left to pile up in a socket would all
    /// get the last one's time.
    fn replies_can_wait(&self, until: u64) -> bool {
        !self.shared.moderate
            && self.conns.iter().all(|c| {
                if c.grown {
                    // No schedule of its own: only its replies' stamps matter.
                    return c.inflight.is_empty()
                        || (c.ring.rx_stamps && c.stream.is_some() && c.inflight.len() <= 1);
                }
                c.ring.rx_stamps
                    && c.stream.is_some()
                    && !c.done_sending
                    && c.plan.ia.is_some()
                    && c.inflight.len() <= 1
                    && (c.inflight.len() < c.plan.depth || c.next_sched >= until)
            })
    }

    /// Whether every connection's replies carry kernel receive stamps, so that handling them
    /// later does not add to their latency.
    fn replies_carry_stamps(&self) -> bool {
        match &self.io {
            Io::Uring(u) => !u.unstamped,
            Io::Epoll(_) => false,
        }
    }

    /// Submits what is queued and sleeps until `want` completions or `wait_ns`.
    fn enter_waiting(&mut self, wait_ns: u64, want: usize) -> Result<(), LoadError> {
        let ring = &mut self.uring().ring;
        let ts = Timespec::new()
            .sec(wait_ns / 1_000_000_000)
            .nsec((wait_ns % 1_000_000_000) as u32);
        let args = SubmitArgs::new().timespec(&ts);
        match ring.submitter().submit_with_args(want, &args) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(LoadError::system("io_uring_enter", e)),
        }
    }

    /// One io_uring_enter: submits what is queued and, with a timeout, waits for a completion or
    /// the timeout. True when the wait ended by its timeout.
    fn enter(&mut self, wait_ns: Option<u64>) -> Result<bool, LoadError> {
        let ring = &mut self.uring().ring;
        let result = match wait_ns {
            None => {
                // Zero-wait with GETEVENTS: runs deferred task work, so ready completions post.
                let queued = ring.submission().len() as u32;
                // SAFETY: plain enter with no argument.
                unsafe {
                    ring.submitter()
                        .enter::<libc::sigset_t>(queued, 0, ENTER_GETEVENTS, None)
                }
            }
            Some(ns) => {
                let ts = Timespec::new()
                    .sec(ns / 1_000_000_000)
                    .nsec((ns % 1_000_000_000) as u32);
                let args = SubmitArgs::new().timespec(&ts);
                ring.submitter().submit_with_args(1, &args)
            }
        };
        match result {
            Ok(_) => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::ETIME) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => Ok(false),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
            Err(e) => Err(LoadError::system("io_uring_enter", e)),
        }
    }

    /// Cancels every armed receive and SEND and waits (bounded) for them to end, so the kernel
    /// is done with the buffers before they are freed.
    fn uring_shutdown(&mut self) {
        for i in 0..self.conns.len() {
            if self.conns[i].stream.is_some() {
                self.uring_detach(i);
            }
        }
        let deadline = now_ns() + CANCEL_DRAIN_NS;
        loop {
            let pending =
                self.uring().stale_recvs > 0 || self.conns.iter().any(|c| c.ring.send_busy);
            let now = now_ns();
            if !pending || now >= deadline {
                break;
            }
            if self.enter(Some(deadline - now)).is_err() || self.reap().is_err() {
                break;
            }
        }
    }
}

fn send_entry(fd: i32, ring: &ConnRing, i: usize) -> squeue::Entry {
    let rest = &ring.sbuf[ring.sent..];
    opcode::Send::new(Fd(fd), rest.as_ptr(), rest.len() as u32)
        .flags(libc::MSG_NOSIGNAL)
        .build()
        .user_data(user_data(KIND_SEND, ring.generation, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_round_trips() {
        for (kind, generation, conn) in [
            (KIND_RECV, 0, 0),
            (KIND_SEND, 0xff_ffff, 65_535),
            (KIND_CANCEL, 7, 3),
        ] {
            assert_eq!(
                unpack(user_data(kind, generation, conn)),
                (kind, generation, conn)
            );
        }
    }
}
