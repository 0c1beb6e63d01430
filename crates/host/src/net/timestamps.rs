//! The kernel's software timestamps on a TCP socket, for the load generator and the agent's
//! prober alike: asking for them (`SO_TIMESTAMPING`, `SO_TIMESTAMPNS`), reading a send's
//! transmit stamp from the socket's error queue (`MSG_ERRQUEUE`) and a read's receive stamp from
//! its control data. Transmit stamps are keyed by byte offset (`SOF_TIMESTAMPING_OPT_ID`: the
//! offset of the send's last byte since the option was set, counted by the kernel) and carry no
//! payload (`OPT_TSONLY`), so pipelined requests that left in one send share its stamp.
//!
//! Every stamp is `CLOCK_REALTIME` as the kernel took it ([`KernelStamp`]); a caller timing on
//! `CLOCK_MONOTONIC` maps it with [`realtime_offset_ns`]. Plain syscalls into buffers on the
//! stack: nothing here allocates (both callers read on their hot path).

use std::io;
use std::os::fd::RawFd;

/// `SO_TIMESTAMPING_NEW`: the control message type a 32-bit build with 64-bit time gets back
/// (64-bit kernels send `SCM_TIMESTAMPING`, the old number, to 64-bit builds).
const SO_TIMESTAMPING_NEW: libc::c_int = 65;
/// `ee_info` of a transmit stamp taken when the device took the packet (linux/errqueue.h: the
/// scheduler's is 1, the acknowledgement's 2).
const SCM_TSTAMP_SND: u32 = 0;
#[cfg(test)]
const SCM_TSTAMP_ACK: u32 = 2;

/// A kernel software timestamp: the `CLOCK_REALTIME` instant the kernel took, in ns (never 0:
/// a zero stamp is the kernel's "none").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelStamp {
    realtime_ns: i64,
}

impl KernelStamp {
    /// A stamp at `realtime_ns` (`None` for 0, the kernel's "no stamp").
    pub fn from_realtime_ns(realtime_ns: i64) -> Option<KernelStamp> {
        (realtime_ns != 0).then_some(KernelStamp { realtime_ns })
    }

    fn from_timespec(ts: &libc::timespec) -> Option<KernelStamp> {
        Self::from_realtime_ns(ts.tv_sec * 1_000_000_000 + ts.tv_nsec)
    }

    /// The stamp on `CLOCK_REALTIME`, ns.
    #[inline]
    pub fn realtime_ns(self) -> u64 {
        self.realtime_ns as u64
    }

    /// The stamp on `CLOCK_MONOTONIC`, given [`realtime_offset_ns`] (`None` for a stamp before
    /// the monotonic clock's start).
    #[inline]
    pub fn monotonic_ns(self, realtime_offset_ns: i64) -> Option<u64> {
        u64::try_from(self.realtime_ns - realtime_offset_ns).ok()
    }
}

/// `CLOCK_REALTIME` now, ns (the clock of the kernel's software stamps).
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME) as u64
}

/// `CLOCK_REALTIME` − `CLOCK_MONOTONIC` now, ns (the realtime read between two monotonic ones,
/// set against their middle).
pub fn realtime_offset_ns() -> i64 {
    let m0 = clock_ns(libc::CLOCK_MONOTONIC);
    let r = clock_ns(libc::CLOCK_REALTIME);
    let m1 = clock_ns(libc::CLOCK_MONOTONIC);
    r - (m0 + (m1 - m0) / 2)
}

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; both clocks always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Which software stamps [`enable_timestamping`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timestamping {
    /// Transmit stamps, keyed by byte offset, stamp only.
    Tx,
    /// Receive stamps (`SCM_TIMESTAMPING` on every read).
    Rx,
    /// Both.
    TxRx,
}

impl Timestamping {
    fn flags(self) -> libc::c_uint {
        let report = libc::SOF_TIMESTAMPING_SOFTWARE;
        let tx = libc::SOF_TIMESTAMPING_TX_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
        let rx = libc::SOF_TIMESTAMPING_RX_SOFTWARE;
        match self {
            Timestamping::Tx => report | tx,
            Timestamping::Rx => report | rx,
            Timestamping::TxRx => report | tx | rx,
        }
    }

    fn tx(self) -> bool {
        self != Timestamping::Rx
    }
}

/// Asks for the software stamps `what` on `fd` (a connected TCP socket nothing was sent on yet:
/// transmit keys count its bytes from 0). With transmit stamps, `OPT_ID_TCP` (Linux 6.2: keys
/// count the bytes written rather than those acknowledged) is asked for first; the two agree on
/// a socket nothing was sent on, so an older kernel gets the plain `OPT_ID`.
pub fn enable_timestamping(fd: RawFd, what: Timestamping) -> io::Result<()> {
    let flags = what.flags();
    if what.tx()
        && set_int(
            fd,
            libc::SO_TIMESTAMPING,
            flags | libc::SOF_TIMESTAMPING_OPT_ID_TCP,
        )
        .is_ok()
    {
        return Ok(());
    }
    set_int(fd, libc::SO_TIMESTAMPING, flags)
}

/// Asks for receive stamps as `SCM_TIMESTAMPNS` (`SO_TIMESTAMPNS`), apart from
/// `SO_TIMESTAMPING`: kept where the kernel refuses the latter.
pub fn enable_timestampns(fd: RawFd) -> io::Result<()> {
    set_int(fd, libc::SO_TIMESTAMPNS, 1)
}

fn set_int(fd: RawFd, option: libc::c_int, value: libc::c_uint) -> io::Result<()> {
    // SAFETY: setsockopt reads an int option value we own, of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One message read from a socket's error queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrQueue {
    /// A transmit stamp: the key (byte offset of the send's last byte, wrapping at 2³²; see
    /// [`key_covers`]) and when the device took the packet.
    Stamp { key: u32, stamp: KernelStamp },
    /// Something else (another error, a stamp of another kind): read and dropped.
    Other,
    /// The queue is empty.
    Empty,
}

/// Whether a transmit stamp keyed `key` covers the byte at offset `end` (keys wrap at 2³²: a
/// key up to 2³¹ bytes past the offset covers it).
#[inline]
pub fn key_covers(key: u32, end: u64) -> bool {
    (key.wrapping_sub(end as u32) as i32) >= 0
}

/// Room for the error queue's control data: SCM_TIMESTAMPING (three timespecs) and IP_RECVERR
/// (sock_extended_err + the offender's address), each with its header.
const ERRQ_CONTROL_LEN: usize = 256;

/// Room for a received message's stamps: SCM_TIMESTAMPNS, and SCM_TIMESTAMPING (three
/// timespecs), which TCP adds on a socket that also reports software transmit stamps. A
/// caller that receives with its own `recvmsg` (io_uring's multishot) gives it this much.
pub const RX_CONTROL_LEN: usize = 128;

/// Reads one message from `fd`'s error queue without blocking.
pub fn read_errqueue(fd: RawFd) -> io::Result<ErrQueue> {
    let mut control = [0u64; ERRQ_CONTROL_LEN / 8];
    let mut data = [0u8; 64];
    match recv(fd, &mut data, &mut control, libc::MSG_ERRQUEUE) {
        Ok((_, control)) => Ok(errqueue_message(control)),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(ErrQueue::Empty),
        Err(e) => Err(e),
    }
}

/// Reads what `fd` has (non-blocking) into `buf` with the kernel's receive stamp: the byte
/// count (0 at end of stream) and the stamp (`None` where the kernel gave none). `WouldBlock`
/// when there is nothing to read.
pub fn recv_stamped(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<KernelStamp>)> {
    let mut control = [0u64; RX_CONTROL_LEN / 8];
    let (n, control) = recv(fd, buf, &mut control, 0)?;
    Ok((n, rx_stamp(control)))
}

/// `recvmsg(fd, flags | MSG_DONTWAIT)` into `buf`, with `control` for the control data: the
/// byte count and the control data received.
fn recv<'c>(
    fd: RawFd,
    buf: &mut [u8],
    control: &'c mut [u64],
    flags: libc::c_int,
) -> io::Result<(usize, &'c [u8])> {
    let room = std::mem::size_of_val(control);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid (empty) header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = room as _;
    // SAFETY: every buffer the header points at (`buf`, `control`) outlives the call.
    let rc = unsafe { libc::recvmsg(fd, &raw mut msg, flags | libc::MSG_DONTWAIT) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let len = (msg.msg_controllen as usize).min(room);
    let control: &'c [u64] = control;
    // SAFETY: `control` is `room` bytes long, of which the kernel filled `len`; u8 has no
    // alignment to keep.
    let bytes = unsafe { std::slice::from_raw_parts(control.as_ptr().cast::<u8>(), len) };
    Ok((rc as usize, bytes))
}

/// The stamps and the transmit key found in one message's control data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Found {
    /// `SCM_TIMESTAMPNS`.
    ns: Option<KernelStamp>,
    /// The software stamp (`ts[0]`) of `SCM_TIMESTAMPING`.
    software: Option<KernelStamp>,
    /// The `OPT_ID` key of a transmit stamp's `sock_extended_err`.
    tx_key: Option<u32>,
}

/// `CMSG_ALIGN`: control messages and their data start at multiples of `size_t`.
const fn cmsg_align(len: usize) -> usize {
    let a = std::mem::size_of::<libc::size_t>();
    (len + a - 1) & !(a - 1)
}

/// Walks the control messages in `control` (a length past the data ends the walk: what was
/// found before it stands); the first of each kind counts.
fn walk(control: &[u8]) -> Found {
    const HDR: usize = std::mem::size_of::<libc::cmsghdr>();
    const DATA: usize = cmsg_align(HDR);
    const TS: usize = std::mem::size_of::<libc::timespec>();
    const EE: usize = std::mem::size_of::<libc::sock_extended_err>();
    let mut found = Found::default();
    let mut rest = control;
    while rest.len() >= HDR {
        // SAFETY: at least HDR bytes; read_unaligned copes with any alignment.
        let h: libc::cmsghdr = unsafe { std::ptr::read_unaligned(rest.as_ptr().cast()) };
        let len = h.cmsg_len as usize;
        if len < DATA || len > rest.len() {
            break;
        }
        let body = &rest[DATA..len];
        let socket = h.cmsg_level == libc::SOL_SOCKET;
        if socket && h.cmsg_type == libc::SCM_TIMESTAMPNS && body.len() >= TS {
            // SAFETY: the timespec lies inside the message (checked above).
            let ts: libc::timespec = unsafe { std::ptr::read_unaligned(body.as_ptr().cast()) };
            found.ns = found.ns.or(KernelStamp::from_timespec(&ts));
        } else if socket
            && (h.cmsg_type == libc::SCM_TIMESTAMPING || h.cmsg_type == SO_TIMESTAMPING_NEW)
            && body.len() >= TS
        {
            // ts[0] is the software stamp.
            // SAFETY: the timespec lies inside the message (checked above).
            let ts: libc::timespec = unsafe { std::ptr::read_unaligned(body.as_ptr().cast()) };
            found.software = found.software.or(KernelStamp::from_timespec(&ts));
        } else if ((h.cmsg_level == libc::SOL_IP && h.cmsg_type == libc::IP_RECVERR)
            || (h.cmsg_level == libc::SOL_IPV6 && h.cmsg_type == libc::IPV6_RECVERR))
            && body.len() >= EE
        {
            // SAFETY: the structure lies inside the message (checked above).
            let ee: libc::sock_extended_err =
                unsafe { std::ptr::read_unaligned(body.as_ptr().cast()) };
            if ee.ee_errno == libc::ENOMSG as u32
                && ee.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING
                && ee.ee_info == SCM_TSTAMP_SND
            {
                found.tx_key = found.tx_key.or(Some(ee.ee_data));
            }
        }
        match rest.get(cmsg_align(len)..) {
            Some(r) => rest = r,
            None => break,
        }
    }
    found
}

/// The transmit stamp in an error-queue message's control data.
fn errqueue_message(control: &[u8]) -> ErrQueue {
    let found = walk(control);
    match (found.tx_key, found.software) {
        (Some(key), Some(stamp)) => ErrQueue::Stamp { key, stamp },
        _ => ErrQueue::Other,
    }
}

/// The receive stamp in a received message's control data: `SCM_TIMESTAMPNS`, or the software
/// stamp of `SCM_TIMESTAMPING` (the kernel puts the same instant in both).
pub fn rx_stamp(control: &[u8]) -> Option<KernelStamp> {
    let found = walk(control);
    found.ns.or(found.software)
}

#[cfg(test)]
mod tests;
