//! Kernel software transmit timestamps (`SO_TIMESTAMPING`) for both engines: the time the kernel
//! handed each send's last segment to the device (loopback included), read from the socket's
//! error queue (`MSG_ERRQUEUE`), keyed by byte offset (`SOF_TIMESTAMPING_OPT_ID`: the offset of
//! the send's last byte since the option was set, counted by the kernel) and without the payload
//! (`OPT_TSONLY`). A request is timed from the stamp of the first send whose key reaches its last
//! byte, so pipelined requests that left in one send share its stamp, and a request whose bytes
//! left late (the client's wake-up, a busy CPU, a full socket buffer) is timed from when they did.
//!
//! Where the kernel refuses the option (or `HEADROOM_LOAD_SIMULATE_TX_STAMP_ERROR` says to act as
//! if it did), requests are timed from the user-space send, and the result says so.

use std::os::fd::RawFd;

use super::rx_stamp::timespec_ns;

/// What is asked for: software transmit stamps, reported, keyed by byte offset, stamp only.
const FLAGS: libc::c_uint = libc::SOF_TIMESTAMPING_TX_SOFTWARE
    | libc::SOF_TIMESTAMPING_SOFTWARE
    | libc::SOF_TIMESTAMPING_OPT_ID
    | libc::SOF_TIMESTAMPING_OPT_TSONLY;

/// `ee_info` of a transmit stamp taken when the device took the packet (linux/errqueue.h: the
/// scheduler's is 1, the acknowledgement's 2).
const SCM_TSTAMP_SND: u32 = 0;
#[cfg(test)]
const SCM_TSTAMP_ACK: u32 = 2;

/// Test hook: an errno name (EPERM, EINVAL, ENOPROTOOPT, EOPNOTSUPP) makes [`enable`] fail so.
pub const SIMULATE_ENV: &str = "HEADROOM_LOAD_SIMULATE_TX_STAMP_ERROR";

fn simulated_error() -> Option<std::io::Error> {
    let name = std::env::var(SIMULATE_ENV).ok()?;
    let errno = match name.trim() {
        "EPERM" => libc::EPERM,
        "EINVAL" => libc::EINVAL,
        "ENOPROTOOPT" => libc::ENOPROTOOPT,
        "EOPNOTSUPP" => libc::EOPNOTSUPP,
        _ => libc::EINVAL,
    };
    Some(std::io::Error::from_raw_os_error(errno))
}

fn set_flags(fd: RawFd, flags: libc::c_uint) -> std::io::Result<()> {
    // SAFETY: setsockopt with a valid fd and an int option value we own.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPING,
            &flags as *const libc::c_uint as *const libc::c_void,
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// What [`enable`] got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Armed {
    /// Transmit stamps are on.
    pub tx: bool,
    /// What the kernel refused (transmit or receive stamps), in words.
    pub refused: Option<String>,
}

/// Asks for a transmit stamp of every send on `fd` (a connected TCP socket nothing was sent on
/// yet: the keys count its bytes from 0) and for receive stamps (`SO_TIMESTAMPNS`).
pub(super) fn enable(fd: RawFd) -> Armed {
    match enable_both(fd) {
        Ok(()) => Armed {
            tx: true,
            refused: None,
        },
        Err((tx, why)) => Armed {
            tx,
            refused: Some(why),
        },
    }
}

fn enable_both(fd: RawFd) -> Result<(), (bool, String)> {
    let on: libc::c_int = 1;
    // SAFETY: as in set_flags.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let rx = (rc != 0).then(std::io::Error::last_os_error);
    if let Some(e) = simulated_error() {
        return Err((
            false,
            format!(
                "setsockopt(SO_TIMESTAMPING, TX_SOFTWARE|OPT_ID|OPT_TSONLY) refused: {e} (simulated by {SIMULATE_ENV})"
            ),
        ));
    }
    // OPT_ID_TCP (Linux 6.2) counts from the bytes written rather than those acknowledged; the
    // two agree on a socket nothing was sent on, so older kernels get the plain OPT_ID.
    set_flags(fd, FLAGS | libc::SOF_TIMESTAMPING_OPT_ID_TCP)
        .or_else(|_| set_flags(fd, FLAGS))
        .map_err(|e| {
            (
                false,
                format!("setsockopt(SO_TIMESTAMPING, TX_SOFTWARE|OPT_ID|OPT_TSONLY) refused: {e}"),
            )
        })?;
    match rx {
        None => Ok(()),
        Some(e) => Err((true, format!("setsockopt(SO_TIMESTAMPNS) refused: {e}"))),
    }
}

/// One message read from a socket's error queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ErrQueue {
    /// A transmit stamp: the key (byte offset of the send's last byte, wrapping at 2³²) and the
    /// time on the monotonic clock.
    Stamp { key: u32, ns: u64 },
    /// Something else (another error, a stamp of another kind): skipped.
    Other,
    /// The queue is empty.
    Empty,
}

/// Room for the error queue's control data: SCM_TIMESTAMPING (three timespecs) and IP_RECVERR
/// (sock_extended_err + the offender's address), each with its header.
const ERRQ_CONTROL: usize = 256;

/// Reads one message from `fd`'s error queue without blocking.
pub(super) fn read_errqueue(fd: RawFd, realtime_offset_ns: i64) -> std::io::Result<ErrQueue> {
    let mut control = [0u64; ERRQ_CONTROL / 8];
    let mut data = [0u8; 64];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid (empty) header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = ERRQ_CONTROL as _;
    // SAFETY: every buffer the header points at lives on this stack frame.
    let rc = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(ErrQueue::Empty),
            _ => Err(e),
        };
    }
    let len = (msg.msg_controllen as usize).min(ERRQ_CONTROL);
    // SAFETY: `control` is ERRQ_CONTROL bytes long.
    let bytes = unsafe { std::slice::from_raw_parts(control.as_ptr().cast::<u8>(), len) };
    Ok(parse_errqueue(bytes, realtime_offset_ns))
}

/// The transmit stamp in an error-queue message's control data.
pub(super) fn parse_errqueue(control: &[u8], realtime_offset_ns: i64) -> ErrQueue {
    const HDR: usize = std::mem::size_of::<libc::cmsghdr>();
    const TS: usize = std::mem::size_of::<libc::timespec>();
    const EE: usize = std::mem::size_of::<libc::sock_extended_err>();
    let mut stamp = None;
    let mut key = None;
    let mut rest = control;
    while rest.len() >= HDR {
        // SAFETY: at least HDR bytes; read_unaligned copes with any alignment.
        let h: libc::cmsghdr = unsafe { std::ptr::read_unaligned(rest.as_ptr().cast()) };
        let len = h.cmsg_len as usize;
        if len < HDR || len > rest.len() {
            break;
        }
        let body = &rest[HDR..len];
        if h.cmsg_level == libc::SOL_SOCKET
            && h.cmsg_type == libc::SCM_TIMESTAMPING
            && body.len() >= TS
        {
            // ts[0] is the software stamp.
            // SAFETY: the timespec lies inside the message (checked above).
            let ts: libc::timespec = unsafe { std::ptr::read_unaligned(body.as_ptr().cast()) };
            stamp = timespec_ns(&ts, realtime_offset_ns);
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
                key = Some(ee.ee_data);
            }
        }
        let step = (len + 7) & !7;
        match rest.get(step..) {
            Some(r) => rest = r,
            None => break,
        }
    }
    match (key, stamp) {
        (Some(key), Some(ns)) => ErrQueue::Stamp { key, ns },
        _ => ErrQueue::Other,
    }
}

/// Whether a stamp keyed `key` covers a request whose last byte is at offset `end` (keys wrap at
/// 2³²: a key up to 2³¹ bytes past the offset covers it).
#[inline]
pub(super) fn covers(key: u32, end: u64) -> bool {
    (key.wrapping_sub(end as u32) as i32) >= 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(level: i32, kind: i32, body: &[u8]) -> Vec<u8> {
        const HDR: usize = std::mem::size_of::<libc::cmsghdr>();
        // SAFETY: cmsghdr is plain data.
        let mut h: libc::cmsghdr = unsafe { std::mem::zeroed() };
        h.cmsg_len = (HDR + body.len()) as _;
        h.cmsg_level = level;
        h.cmsg_type = kind;
        let mut out = vec![0u8; (HDR + body.len() + 7) & !7];
        // SAFETY: the buffer holds the header.
        unsafe { std::ptr::write_unaligned(out.as_mut_ptr().cast(), h) };
        out[HDR..HDR + body.len()].copy_from_slice(body);
        out
    }

    fn as_bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: reading the plain-data value's own bytes.
        unsafe {
            std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>())
        }
        .to_vec()
    }

    fn stamp_message(key: u32, origin: u8, info: u32, sec: i64) -> Vec<u8> {
        let ts = [
            libc::timespec {
                tv_sec: sec,
                tv_nsec: 7,
            },
            libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        ];
        // SAFETY: plain data.
        let mut ee: libc::sock_extended_err = unsafe { std::mem::zeroed() };
        ee.ee_errno = libc::ENOMSG as u32;
        ee.ee_origin = origin;
        ee.ee_info = info;
        ee.ee_data = key;
        let mut control = cmsg(libc::SOL_SOCKET, libc::SCM_TIMESTAMPING, &as_bytes(&ts));
        control.extend(cmsg(libc::SOL_IP, libc::IP_RECVERR, &as_bytes(&ee)));
        control
    }

    #[test]
    fn a_transmit_stamp_is_read_with_its_key() {
        let m = stamp_message(41, libc::SO_EE_ORIGIN_TIMESTAMPING, SCM_TSTAMP_SND, 1_000);
        // Realtime 1000 s + 7 ns with realtime 400 s ahead of monotonic: 600 s + 7 ns.
        assert_eq!(
            parse_errqueue(&m, 400_000_000_000),
            ErrQueue::Stamp {
                key: 41,
                ns: 600_000_000_007
            }
        );
        // A scheduler or ACK stamp, or another origin, is not the transmit stamp.
        let m = stamp_message(41, libc::SO_EE_ORIGIN_TIMESTAMPING, SCM_TSTAMP_ACK, 1_000);
        assert_eq!(parse_errqueue(&m, 0), ErrQueue::Other);
        let m = stamp_message(41, libc::SO_EE_ORIGIN_LOCAL, SCM_TSTAMP_SND, 1_000);
        assert_eq!(parse_errqueue(&m, 0), ErrQueue::Other);
        assert_eq!(parse_errqueue(&[], 0), ErrQueue::Other);
    }

    #[test]
    fn keys_cover_the_requests_up_to_them_across_the_wrap() {
        assert!(covers(99, 99));
        assert!(covers(100, 99));
        assert!(!covers(98, 99));
        // 2³² + 5 bytes into the connection, the key has wrapped to 5.
        let end = (1u64 << 32) + 5;
        assert!(covers(5, end));
        assert!(covers(6, end));
        assert!(!covers(4, end));
        assert!(covers(3, (1u64 << 32) - 2));
    }
}
