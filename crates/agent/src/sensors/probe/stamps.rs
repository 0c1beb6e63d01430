//! The kernel's software timestamps on the prober's socket (`SO_TIMESTAMPING`): when each
//! request left (the transmit stamp, read from the socket's error queue and matched to its
//! request by `OPT_ID`'s byte counter) and when each reply arrived (the receive stamp, a control
//! message of the read). Both are `CLOCK_REALTIME` nanoseconds taken by the kernel, so their
//! difference does not depend on when the prober's thread ran. Plain syscalls into buffers on
//! the stack: nothing here allocates.

use std::io;
use std::os::fd::RawFd;

/// `SO_TIMESTAMPING` (`SO_TIMESTAMPING_OLD`: 64-bit `timespec`s on 64-bit kernels) and the
/// newer spelling a 32-bit build with 64-bit time gets back.
const SO_TIMESTAMPING: libc::c_int = 37;
const SO_TIMESTAMPING_NEW: libc::c_int = 65;
/// `SCM_TSTAMP_SND`: the stamp taken when the driver took the packet.
const SCM_TSTAMP_SND: u32 = 0;

/// Which stamps the kernel gives this socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamps {
    /// Transmit and receive stamps: latency = kernel RX − kernel TX.
    TxRx,
    /// Receive stamps only (the transmit flags were refused).
    Rx,
}

/// Asks for software receive stamps and, with `OPT_ID`/`OPT_TSONLY`, software transmit stamps
/// (the byte counter starting at the socket's next byte: `OPT_ID_TCP` where the kernel knows it).
pub fn enable(fd: RawFd) -> io::Result<Stamps> {
    let rx = libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE;
    let tx = libc::SOF_TIMESTAMPING_TX_SOFTWARE
        | libc::SOF_TIMESTAMPING_OPT_ID
        | libc::SOF_TIMESTAMPING_OPT_TSONLY;
    if set(fd, rx | tx | libc::SOF_TIMESTAMPING_OPT_ID_TCP).is_ok() || set(fd, rx | tx).is_ok() {
        return Ok(Stamps::TxRx);
    }
    set(fd, rx).map(|()| Stamps::Rx)
}

fn set(fd: RawFd, flags: libc::c_uint) -> io::Result<()> {
    let flags = flags as libc::c_int;
    // SAFETY: a valid int option value and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_TIMESTAMPING,
            (&raw const flags).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Room for the control messages of one read: a `scm_timestamping` (3 timespecs) and a
/// `sock_extended_err` with its offender address, each with a header.
#[repr(C, align(8))]
struct CmsgBuf([u8; 256]);

/// The software stamp (ns, `CLOCK_REALTIME`) in a `SCM_TIMESTAMPING` message, and the
/// `OPT_ID` key of a transmit stamp's `sock_extended_err` (`None` for other errors).
#[derive(Debug, Default, Clone, Copy)]
struct Parsed {
    stamp_ns: Option<u64>,
    tx_key: Option<u32>,
}

/// Walks the control messages of `msg`.
fn parse_cmsgs(msg: &libc::msghdr) -> Parsed {
    let mut out = Parsed::default();
    // SAFETY: `msg` was filled by recvmsg; CMSG_* walk within msg_control/msg_controllen, and
    // each payload is read unaligned with its size checked against the header's length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            let h = &*c;
            let data = libc::CMSG_DATA(c);
            let len = h.cmsg_len as usize - (data as usize - c as usize);
            if h.cmsg_level == libc::SOL_SOCKET
                && (h.cmsg_type == SO_TIMESTAMPING || h.cmsg_type == SO_TIMESTAMPING_NEW)
                && len >= std::mem::size_of::<libc::timespec>()
            {
                let ts: libc::timespec = std::ptr::read_unaligned(data.cast());
                if ts.tv_sec != 0 || ts.tv_nsec != 0 {
                    out.stamp_ns = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                }
            } else if ((h.cmsg_level == libc::SOL_IP && h.cmsg_type == libc::IP_RECVERR)
                || (h.cmsg_level == libc::SOL_IPV6 && h.cmsg_type == libc::IPV6_RECVERR))
                && len >= std::mem::size_of::<libc::sock_extended_err>()
            {
                let e: libc::sock_extended_err = std::ptr::read_unaligned(data.cast());
                if e.ee_errno == libc::ENOMSG as u32
                    && e.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING
                    && e.ee_info == SCM_TSTAMP_SND
                {
                    out.tx_key = Some(e.ee_data);
                }
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    out
}

fn recv(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, Parsed)> {
    let mut cbuf = CmsgBuf([0; 256]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is valid; its pointers are set to live buffers below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = cbuf.0.len() as _;
    // SAFETY: msg points at `iov` (into `buf`) and `cbuf`, both alive for the call.
    let n = unsafe { libc::recvmsg(fd, &raw mut msg, flags | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((n as usize, parse_cmsgs(&msg)))
}

/// Reads one transmit stamp from the error queue: `(OPT_ID key, ns)`; `Ok(None)` when it holds
/// something else (read and dropped); `WouldBlock` when it is empty.
pub fn read_tx_stamp(fd: RawFd) -> io::Result<Option<(u32, u64)>> {
    let mut none = [0u8; 0];
    let (_, p) = recv(fd, &mut none, libc::MSG_ERRQUEUE)?;
    Ok(p.tx_key.zip(p.stamp_ns))
}

/// Reads into `buf` (at most its length): the bytes and the receive stamp of the last packet
/// the read took them from (ns; `None` when the kernel gave none). `WouldBlock` when empty.
pub fn read_stamped(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
    let (n, p) = recv(fd, buf, 0)?;
    Ok((n, p.stamp_ns))
}

/// `CLOCK_REALTIME` now, ns (the clock of the kernel's software stamps).
pub fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
