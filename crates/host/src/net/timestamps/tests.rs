use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use super::*;

fn cmsg(level: i32, kind: i32, body: &[u8]) -> Vec<u8> {
    const HDR: usize = std::mem::size_of::<libc::cmsghdr>();
    // SAFETY: cmsghdr is plain data.
    let mut h: libc::cmsghdr = unsafe { std::mem::zeroed() };
    h.cmsg_len = (HDR + body.len()) as _;
    h.cmsg_level = level;
    h.cmsg_type = kind;
    let mut out = vec![0u8; cmsg_align(HDR + body.len())];
    // SAFETY: the buffer holds the header.
    unsafe { std::ptr::write_unaligned(out.as_mut_ptr().cast(), h) };
    out[HDR..HDR + body.len()].copy_from_slice(body);
    out
}

fn as_bytes<T>(v: &T) -> Vec<u8> {
    // SAFETY: reading the plain-data value's own bytes.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}

fn timespec(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

fn stamp_message(key: u32, origin: u8, info: u32, sec: i64) -> Vec<u8> {
    let ts = [
        timespec(sec, if sec == 0 { 0 } else { 7 }),
        timespec(0, 0),
        timespec(0, 0),
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

fn stamp(realtime_ns: i64) -> KernelStamp {
    KernelStamp::from_realtime_ns(realtime_ns).expect("a non-zero stamp")
}

#[test]
fn a_stamp_maps_onto_the_monotonic_clock_and_zero_is_none() {
    assert_eq!(KernelStamp::from_realtime_ns(0), None);
    let s = stamp(1_000_000_000_007);
    assert_eq!(s.realtime_ns(), 1_000_000_000_007);
    // Realtime 400 s ahead of monotonic: 600 s + 7 ns.
    assert_eq!(s.monotonic_ns(400_000_000_000), Some(600_000_000_007));
    // Before the monotonic clock's start: no instant on it.
    assert_eq!(s.monotonic_ns(2_000_000_000_000), None);
}

#[test]
fn a_transmit_stamp_is_read_with_its_key() {
    let m = stamp_message(41, libc::SO_EE_ORIGIN_TIMESTAMPING, SCM_TSTAMP_SND, 1_000);
    assert_eq!(
        errqueue_message(&m),
        ErrQueue::Stamp {
            key: 41,
            stamp: stamp(1_000_000_000_007)
        }
    );
    // A scheduler or ACK stamp, or another origin, is not the transmit stamp.
    let m = stamp_message(41, libc::SO_EE_ORIGIN_TIMESTAMPING, SCM_TSTAMP_ACK, 1_000);
    assert_eq!(errqueue_message(&m), ErrQueue::Other);
    let m = stamp_message(41, libc::SO_EE_ORIGIN_LOCAL, SCM_TSTAMP_SND, 1_000);
    assert_eq!(errqueue_message(&m), ErrQueue::Other);
    // A key without a stamp (all three timespecs zero) is none either.
    let m = stamp_message(41, libc::SO_EE_ORIGIN_TIMESTAMPING, SCM_TSTAMP_SND, 0);
    assert_eq!(errqueue_message(&m), ErrQueue::Other);
    assert_eq!(errqueue_message(&[]), ErrQueue::Other);
}

#[test]
fn keys_cover_the_requests_up_to_them_across_the_wrap() {
    assert!(key_covers(99, 99));
    assert!(key_covers(100, 99));
    assert!(!key_covers(98, 99));
    // 2³² + 5 bytes into the connection, the key has wrapped to 5.
    let end = (1u64 << 32) + 5;
    assert!(key_covers(5, end));
    assert!(key_covers(6, end));
    assert!(!key_covers(4, end));
    assert!(key_covers(3, (1u64 << 32) - 2));
}

#[test]
fn receive_stamps_are_read_from_either_control_message() {
    let mut control = cmsg(
        libc::SOL_SOCKET,
        libc::SCM_TIMESTAMPNS,
        &as_bytes(&timespec(1_000, 5)),
    );
    control.resize(RX_CONTROL_LEN, 0);
    assert_eq!(rx_stamp(&control), Some(stamp(1_000_000_000_005)));
    // SCM_TIMESTAMPING's software stamp, and its newer number.
    let ts = [timespec(2_000, 9), timespec(0, 0), timespec(0, 0)];
    for kind in [libc::SCM_TIMESTAMPING, SO_TIMESTAMPING_NEW] {
        let m = cmsg(libc::SOL_SOCKET, kind, &as_bytes(&ts));
        assert_eq!(rx_stamp(&m), Some(stamp(2_000_000_000_009)), "type {kind}");
    }
    // Another message type, or none, gives no stamp.
    let other = cmsg(
        libc::SOL_SOCKET,
        libc::SCM_RIGHTS,
        &as_bytes(&timespec(1_000, 5)),
    );
    assert_eq!(rx_stamp(&other), None);
    assert_eq!(rx_stamp(&[]), None);
    // A length past the buffer is not trusted.
    // SAFETY: cmsghdr is plain data.
    let mut h: libc::cmsghdr = unsafe { std::ptr::read_unaligned(control.as_ptr().cast()) };
    h.cmsg_len = 4096;
    // SAFETY: the buffer holds the header.
    unsafe { std::ptr::write_unaligned(control.as_mut_ptr().cast(), h) };
    assert_eq!(rx_stamp(&control), None);
}

/// A connected loopback pair: (client, the server's end).
fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let client = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    client.set_nodelay(true).unwrap();
    (client, server)
}

/// The transmit stamp of the client's sends, read from its error queue (bounded wait).
fn next_tx_stamp(fd: RawFd) -> Option<(u32, KernelStamp)> {
    for _ in 0..2_000 {
        match read_errqueue(fd).expect("read the error queue") {
            ErrQueue::Stamp { key, stamp } => return Some((key, stamp)),
            ErrQueue::Other => {}
            ErrQueue::Empty => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
    None
}

/// The next read of `fd` with its receive stamp (bounded wait).
fn next_read(fd: RawFd, buf: &mut [u8]) -> (usize, Option<KernelStamp>) {
    for _ in 0..2_000 {
        match recv_stamped(fd, buf) {
            Ok(got) => return got,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(1))
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    panic!("nothing to read after 2 s");
}

/// `server` sends `reply` until `client` reads one with a receive stamp (bounded): the kernel
/// turns receive stamping on for the whole host a moment after the first socket asks, so the
/// first packets after that may carry none.
fn stamped_reply(client: RawFd, server: &mut TcpStream, reply: &[u8]) -> KernelStamp {
    let mut buf = [0u8; 64];
    for _ in 0..200 {
        server.write_all(reply).unwrap();
        let (n, rx) = next_read(client, &mut buf);
        assert_eq!(&buf[..n], reply);
        if let Some(rx) = rx {
            return rx;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("no receive stamp on 200 replies");
}

/// Live, on loopback: both ways of asking (the prober's `TxRx`; the load generator's `Tx` with
/// `SO_TIMESTAMPNS`) give a send's stamp keyed by its last byte and a read's receive stamp.
#[test]
fn a_loopback_send_and_its_reply_are_stamped_by_the_kernel() {
    const TEST: &str = "a_loopback_send_and_its_reply_are_stamped_by_the_kernel";
    for tx_with_ns in [false, true] {
        let (mut client, mut server) = pair();
        let fd = client.as_raw_fd();
        let enabled = if tx_with_ns {
            enable_timestampns(fd).and_then(|()| enable_timestamping(fd, Timestamping::Tx))
        } else {
            enable_timestamping(fd, Timestamping::TxRx)
        };
        if let Err(e) = enabled {
            eprintln!("SKIP {TEST}: the kernel refuses software stamps ({e})");
            return;
        }
        client.write_all(b"0123456789").unwrap();
        let (key, tx) = next_tx_stamp(fd).expect("a transmit stamp within 2 s");
        // Keyed by the offset of the send's last byte.
        assert_eq!(key, 9, "ns {tx_with_ns}");
        assert!(key_covers(key, 9) && !key_covers(key, 10));
        let rx = stamped_reply(fd, &mut server, b"reply");
        // The reply was sent after the request left: the kernel stamped it later.
        assert!(rx >= tx, "rx {rx:?} before tx {tx:?}");
        assert!(rx.monotonic_ns(realtime_offset_ns()).is_some());
    }
}

#[test]
fn rx_only_stamps_give_reads_a_stamp_and_no_transmit_stamps() {
    const TEST: &str = "rx_only_stamps_give_reads_a_stamp_and_no_transmit_stamps";
    let (mut client, mut server) = pair();
    let fd = client.as_raw_fd();
    if let Err(e) = enable_timestamping(fd, Timestamping::Rx) {
        eprintln!("SKIP {TEST}: the kernel refuses software receive stamps ({e})");
        return;
    }
    client.write_all(b"ping").unwrap();
    stamped_reply(fd, &mut server, b"pong");
    assert_eq!(read_errqueue(fd).unwrap(), ErrQueue::Empty);
}
