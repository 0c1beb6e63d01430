//! Kernel software receive timestamps (SO_TIMESTAMPNS) for the io_uring engine: read from a
//! received message's control data and mapped from CLOCK_REALTIME onto CLOCK_MONOTONIC.

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

/// The SCM_TIMESTAMPNS in a received message's control data, on the monotonic clock.
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
            let real = ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
            return u64::try_from(real - realtime_offset_ns).ok();
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
