//! Kernel software receive timestamps (SO_TIMESTAMPNS) for both engines: read from a received
//! message's control data and mapped from CLOCK_REALTIME onto CLOCK_MONOTONIC (the io_uring
//! engine's multishot `recvmsg` carries them; the epoll engine reads with [`recv_stamped`]).

use std::os::fd::RawFd;

/// CLOCK_REALTIME − CLOCK_MONOTONIC now, in ns (kernel software timestamps are realtime).
pub(super) fn realtime_offset_ns() -> i64 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec we own.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec * 1_000_000_000 + ts.tv_nsec
    };
    let m0 = read(libc::CLOCK_MONOTONIC);
    let r = read(libc::CLOCK_REALTIME);
    let m1 = read(libc::CLOCK_MONOTONIC);
    r - (m0 + (m1 - m0) / 2)
}

/// A realtime timespec on the monotonic clock (None for a zero stamp or one before the clock).
pub(super) fn timespec_ns(ts: &libc::timespec, realtime_offset_ns: i64) -> Option<u64> {
    if ts.tv_sec == 0 && ts.tv_nsec == 0 {
        return None;
    }
    let real = ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
    u64::try_from(real - realtime_offset_ns).ok()
}

/// Room for a received message's stamps: SCM_TIMESTAMPNS, and SCM_TIMESTAMPING (three
/// timespecs), which TCP adds on a socket that also reports software transmit stamps.
pub(super) const RX_CONTROL_LEN: usize = 128;

/// Reads what `fd` has (non-blocking) into `buf` with its kernel receive stamp: the byte count
/// (0 at end of stream) and the stamp on the monotonic clock (None where the kernel gave none).
pub(super) fn recv_stamped(
    fd: RawFd,
    buf: &mut [u8],
    realtime_offset_ns: i64,
) -> std::io::Result<(usize, Option<u64>)> {
    let mut control = [0u64; RX_CONTROL_LEN / 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is a valid (empty) header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = RX_CONTROL_LEN as _;
    // SAFETY: every buffer the header points at outlives the call.
    let rc = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let len = (msg.msg_controllen as usize).min(RX_CONTROL_LEN);
    // SAFETY: `control` is RX_CONTROL_LEN bytes long.
    let bytes = unsafe { std::slice::from_raw_parts(control.as_ptr().cast::<u8>(), len) };
    Ok((rc as usize, rx_timestamp_ns(bytes, realtime_offset_ns)))
}

/// The receive stamp in a received message's control data (SCM_TIMESTAMPNS, or the software
/// stamp of SCM_TIMESTAMPING), on the monotonic clock.
pub(super) fn rx_timestamp_ns(control: &[u8], realtime_offset_ns: i64) -> Option<u64> {
    const HDR: usize = std::mem::size_of::<libc::cmsghdr>();
    let mut rest = control;
    while rest.len() >= HDR {
        // SAFETY: at least HDR bytes; read_unaligned copes with any alignment.
        let h: libc::cmsghdr = unsafe { std::ptr::read_unaligned(rest.as_ptr().cast()) };
        let len = h.cmsg_len as usize;
        if len < HDR || len > rest.len() {
            return None;
        }
        if h.cmsg_level == libc::SOL_SOCKET
            && h.cmsg_type == libc::SCM_TIMESTAMPNS
            && len >= HDR + std::mem::size_of::<libc::timespec>()
        {
            // SAFETY: the timespec lies inside the message (checked above).
            let ts: libc::timespec =
                unsafe { std::ptr::read_unaligned(rest[HDR..].as_ptr().cast()) };
            return timespec_ns(&ts, realtime_offset_ns);
        }
        if h.cmsg_level == libc::SOL_SOCKET
            && h.cmsg_type == libc::SCM_TIMESTAMPING
            && len >= HDR + std::mem::size_of::<libc::timespec>()
        {
            // SAFETY: as above; ts[0] is the software stamp.
            let ts: libc::timespec =
                unsafe { std::ptr::read_unaligned(rest[HDR..].as_ptr().cast()) };
            if let Some(t) = timespec_ns(&ts, realtime_offset_ns) {
                return Some(t);
            }
        }
        let step = (len + 7) & !7;
        rest = rest.get(step..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::uring::CONTROL_LEN;

    #[test]
    fn rx_timestamps_are_read_from_the_control_message() {
        const HDR: usize = std::mem::size_of::<libc::cmsghdr>();
        let mut control = vec![0u8; CONTROL_LEN];
        // SAFETY: cmsghdr is plain data.
        let mut h: libc::cmsghdr = unsafe { std::mem::zeroed() };
        h.cmsg_len = (HDR + 16) as _;
        h.cmsg_level = libc::SOL_SOCKET;
        h.cmsg_type = libc::SCM_TIMESTAMPNS;
        // SAFETY: the buffer holds a header and a timespec.
        unsafe {
            std::ptr::write_unaligned(control.as_mut_ptr().cast(), h);
            std::ptr::write_unaligned(
                control[HDR..].as_mut_ptr().cast(),
                libc::timespec {
                    tv_sec: 1_000,
                    tv_nsec: 5,
                },
            );
        }
        // Realtime 1000 s + 5 ns with realtime 400 s ahead of monotonic: 600 s + 5 ns.
        assert_eq!(
            rx_timestamp_ns(&control, 400_000_000_000),
            Some(600_000_000_005)
        );
        // Another message type, or none, gives no stamp.
        h.cmsg_type = libc::SCM_RIGHTS;
        // SAFETY: as above.
        unsafe { std::ptr::write_unaligned(control.as_mut_ptr().cast(), h) };
        assert_eq!(rx_timestamp_ns(&control, 0), None);
        assert_eq!(rx_timestamp_ns(&[], 0), None);
        // A length past the buffer is not trusted.
        h.cmsg_len = 4096;
        // SAFETY: as above.
        unsafe { std::ptr::write_unaligned(control.as_mut_ptr().cast(), h) };
        assert_eq!(rx_timestamp_ns(&control, 0), None);
    }
}
