//! The sensor's programs run by the kernel: on made-up events (`BPF_PROG_TEST_RUN`), and
//! attached, on loopback servers that answer after known delays.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::*;
use crate::bpf_sys::{map_exists, next_program_id, object_info, program_by_id, program_loaded};

/// One attached sensor test at a time: the fault test counts the programs loaded.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP {test}: needs root (BPF)");
        return false;
    }
    true
}

fn test_programs(test: &str, max_sockets: u32) -> Option<LatencyPrograms> {
    if !root(test) {
        return None;
    }
    match LatencyPrograms::load_for_test(max_sockets) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("SKIP {test}: the kernel refused the programs: {e}");
            None
        }
    }
}

fn attached(test: &str, ports: &[u16]) -> Option<LatencySensor> {
    if !root(test) {
        return None;
    }
    match LatencySensor::attach(ports) {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("SKIP {test}: the sensor cannot attach here: {e}");
            None
        }
    }
}

const TCP_CLOSE: i32 = 7;
const TCP_CLOSE_WAIT: i32 = 8;

/// The real bytecode on made-up events: only data segments on a watched port start a
/// request; segments before the reply are one request; the first reply times it, later
/// sends are unmatched; failed sends and unknown sockets change nothing; a full map counts a
/// drop; a close forgets the socket and counts what was pending as abandoned.
#[test]
fn in_the_kernel_requests_are_timed_from_first_arrival_to_first_reply() {
    const TEST: &str = "in_the_kernel_requests_are_timed_from_first_arrival_to_first_reply";
    let Some(p) = test_programs(TEST, 2) else {
        return;
    };
    let (s1, s2, s3) = (
        0xffff_8880_0000_1000u64,
        0xffff_8880_0000_2000,
        0xffff_8880_0000_3000,
    );
    p.test_arrival(8080, 100, s1).unwrap();
    assert_eq!(
        p.snapshot().unwrap().counters,
        Counters::default(),
        "no port watched yet"
    );
    p.set_ports(&[8080, 11211]).unwrap();
    p.test_arrival(8080, 0, s1).unwrap(); // an ACK
    p.test_arrival(9090, 100, s1).unwrap(); // another port
    assert_eq!(p.snapshot().unwrap().counters, Counters::default());

    p.test_arrival(8080, 100, s1).unwrap();
    p.test_arrival(8080, 60, s1).unwrap(); // pipelined: same burst
    assert!(p.pending(s1).unwrap() > 0);
    std::thread::sleep(Duration::from_millis(2));
    p.test_reply(s1, -11).unwrap(); // EAGAIN: nothing sent
    p.test_reply(0xdead_0000, 10).unwrap(); // not an LC socket
    let c = p.snapshot().unwrap().counters;
    assert_eq!(
        (c.requests, c.segments, c.replies, c.unmatched),
        (1, 2, 0, 0)
    );
    p.test_reply(s1, 50).unwrap();
    p.test_reply(s1, 50).unwrap(); // a second send for the same request
    let s = p.snapshot().unwrap();
    assert_eq!(
        (
            s.counters.requests,
            s.counters.replies,
            s.counters.unmatched,
            s.count()
        ),
        (1, 1, 1, 1)
    );
    assert!(
        s.quantile_ns(0.5).unwrap() >= 2_000_000 * 31 / 32,
        "{:?}",
        s.quantile_ns(0.5)
    );
    assert_eq!(p.pending(s1), Some(0), "known, nothing pending");

    // the map holds two sockets
    p.test_arrival(11211, 10, s2).unwrap();
    p.test_arrival(11211, 10, s3).unwrap();
    assert_eq!(p.snapshot().unwrap().counters.map_full, 1);
    assert_eq!(p.pending(s3), None);
    // closing: CLOSE_WAIT keeps the socket; CLOSE forgets it, counting a pending request
    p.test_state(s2, TCP_CLOSE_WAIT).unwrap();
    assert!(p.pending(s2).unwrap() > 0);
    p.test_state(s2, TCP_CLOSE).unwrap();
    p.test_state(s1, TCP_CLOSE).unwrap(); // nothing pending there
    assert_eq!((p.pending(s1), p.pending(s2)), (None, None));
    p.test_arrival(11211, 10, s3).unwrap(); // room again
    let c = p.snapshot().unwrap().counters;
    assert_eq!(
        (c.abandoned, c.map_full, c.requests, c.segments),
        (1, 1, 3, 5)
    );
}

/// The next request held in the socket's backlog while the server's `sendmsg` still owned the
/// lock: it is processed (and seen by the arrival program) after the reply went out
/// (`snd_nxt` moved) but before the reply event fires. It is queued, not merged into the
/// answered request, and the next reply times it from its own arrival; a continuation
/// segment of it (`snd_nxt` unchanged since) starts nothing more. A close with a request
/// pending and one queued counts both as abandoned.
#[test]
fn in_the_kernel_a_request_arriving_before_the_reply_event_is_queued_not_lost() {
    const TEST: &str = "in_the_kernel_a_request_arriving_before_the_reply_event_is_queued_not_lost";
    let Some(p) = test_programs(TEST, 4) else {
        return;
    };
    let s = 0xffff_8880_0000_4000u64;
    p.set_ports(&[11211]).unwrap();
    p.test_arrival_after_sending(11211, 20, s, 1000).unwrap(); // request 1
    let first = p.pending(s).unwrap();
    std::thread::sleep(Duration::from_millis(3));
    // the reply to 1 is out (snd_nxt 1000 -> 1002); request 2 arrives before its event
    p.test_arrival_after_sending(11211, 20, s, 1002).unwrap();
    p.test_arrival_after_sending(11211, 20, s, 1002).unwrap(); // 2's second segment
    assert_eq!(p.pending(s), Some(first), "1 is still the pending one");
    let queued = p.queued(s).unwrap();
    assert!(queued > first, "2 is queued from its own arrival");
    p.test_reply(s, 2).unwrap(); // the event of reply 1
    assert_eq!((p.pending(s), p.queued(s)), (Some(queued), Some(0)));
    p.test_reply(s, 2).unwrap(); // reply 2
    let snap = p.snapshot().unwrap();
    let c = snap.counters;
    assert_eq!(
        (c.segments, c.requests, c.replies, c.unmatched),
        (3, 2, 2, 0)
    );
    // 1 waited ≥ 3 ms; 2 was answered at once, far under that
    assert!(snap.quantile_ns(1.0).unwrap() >= 3_000_000 * 31 / 32);
    assert!(snap.quantile_ns(0.5).unwrap() < 3_000_000);
    assert_eq!(p.pending(s), Some(0));

    // a close with one pending and one queued: both abandoned
    p.test_arrival_after_sending(11211, 20, s, 2000).unwrap();
    p.test_arrival_after_sending(11211, 20, s, 2010).unwrap();
    p.test_state(s, TCP_CLOSE).unwrap();
    assert_eq!(p.pending(s), None);
    assert_eq!(p.snapshot().unwrap().counters.abandoned, 2);
}

/// A loopback server answering each `u32` request after the delay (µs) the request names;
/// `answer = false`: it reads and never answers. Returns its port.
fn server(answer: bool) -> (u16, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let Ok((mut c, _)) = l.accept() else {
            return;
        };
        c.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let mut req = [0u8; 4];
        while c.read_exact(&mut req).is_ok() {
            if answer {
                std::thread::sleep(Duration::from_micros(u64::from(u32::from_le_bytes(req))));
                if c.write_all(b"ok").is_err() {
                    return;
                }
            }
        }
    });
    (port, h)
}

/// Sends each delay as a request and waits for the answer; returns the round trips, ns.
fn client(port: u16, delays_us: &[u32]) -> Vec<u64> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_nodelay(true).ok();
    c.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut rtts = Vec::new();
    for d in delays_us {
        let t = Instant::now();
        c.write_all(&d.to_le_bytes()).expect("send");
        let mut ok = [0u8; 2];
        c.read_exact(&mut ok).expect("answer");
        rtts.push(t.elapsed().as_nanos() as u64);
    }
    rtts
}

fn quantile(v: &mut [u64], q: f64) -> u64 {
    v.sort_unstable();
    v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

/// Attached: a server answering 90 requests after 2 ms and 10 after 10 ms. The sensor counts
/// exactly those 100 (the local port is `sport`: the client's socket, whose remote port is the
/// server's, counts nothing), and its p50/p99 lie between the server's delay and the client's
/// round trip (the interval the kernel saw is inside the round trip), to a bucket's width. A
/// second server on a port not watched is not counted.
#[test]
fn attached_the_sensor_times_a_loopback_servers_replies() {
    const TEST: &str = "attached_the_sensor_times_a_loopback_servers_replies";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (port, h) = server(true);
    let (other, h2) = server(true);
    let Some(s) = attached(TEST, &[port]) else {
        return;
    };
    let before = s.snapshot().unwrap();
    let delays: Vec<u32> = (0..100)
        .map(|i| if i % 10 == 9 { 10_000 } else { 2_000 })
        .collect();
    let mut rtts = client(port, &delays);
    client(other, &[1_000; 20]);
    h.join().ok();
    h2.join().ok();
    let w = s.snapshot().unwrap().since(&before);
    let (p50, p99) = (w.quantile_ns(0.5).unwrap(), w.quantile_ns(0.99).unwrap());
    let (c50, c99) = (quantile(&mut rtts, 0.5), quantile(&mut rtts, 0.99));
    eprintln!(
        "{TEST}: sensor p50 {:.3} ms p99 {:.3} ms; client round trip p50 {:.3} ms p99 {:.3} ms; {:?}",
        p50 as f64 / 1e6,
        p99 as f64 / 1e6,
        c50 as f64 / 1e6,
        c99 as f64 / 1e6,
        w.counters
    );
    assert_eq!(
        (w.counters.requests, w.counters.replies, w.count()),
        (100, 100, 100)
    );
    assert_eq!(w.counters.segments, 100);
    assert_eq!(w.counters.unmatched, 0);
    let slack = |x: u64| x + x / 30;
    assert!(
        slack(p50) >= 2_000_000 && p50 <= slack(c50),
        "p50 {p50} vs rtt {c50}"
    );
    assert!(
        slack(p99) >= 10_000_000 && p99 <= slack(c99),
        "p99 {p99} vs rtt {c99}"
    );
}

/// A server that reads and never answers: its requests are counted as segments and one
/// pending request, no latency sample appears, and when the connection closes the pending
/// request is counted as abandoned.
#[test]
fn attached_a_server_that_never_answers_gives_no_samples() {
    const TEST: &str = "attached_a_server_that_never_answers_gives_no_samples";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (port, h) = server(false);
    let Some(s) = attached(TEST, &[port]) else {
        return;
    };
    let before = s.snapshot().unwrap();
    {
        let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        c.set_nodelay(true).ok();
        for _ in 0..5 {
            c.write_all(&1u32.to_le_bytes()).expect("send");
            std::thread::sleep(Duration::from_millis(2));
        }
    } // closed: the server reads EOF and closes too
    h.join().ok();
    let t = Instant::now();
    let mut w = s.snapshot().unwrap().since(&before);
    while w.counters.abandoned == 0 && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
        w = s.snapshot().unwrap().since(&before);
    }
    assert_eq!(w.count(), 0, "{:?}", w.counters);
    assert_eq!(
        (w.counters.requests, w.counters.segments),
        (1, 5),
        "{:?}",
        w.counters
    );
    assert_eq!(w.counters.abandoned, 1, "{:?}", w.counters);
}

/// Dropping the sensor detaches and unloads everything: its programs and maps are gone.
#[test]
fn dropping_the_sensor_removes_its_programs_and_maps() {
    const TEST: &str = "dropping_the_sensor_removes_its_programs_and_maps";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(s) = attached(TEST, &[1]) else {
        return;
    };
    let (progs, maps) = s.ids().unwrap();
    assert!(progs.iter().all(|&id| program_loaded(id)));
    assert!(maps.iter().all(|&id| map_exists(id)));
    drop(s);
    // the kernel frees them after an RCU grace period
    let t = Instant::now();
    while (progs.iter().any(|&id| program_loaded(id)) || maps.iter().any(|&id| map_exists(id)))
        && t.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !progs.iter().any(|&id| program_loaded(id)),
        "programs {progs:?} still loaded"
    );
    assert!(
        !maps.iter().any(|&id| map_exists(id)),
        "maps {maps:?} still exist"
    );
}

/// Ids of loaded programs whose name starts with `hr_lat`.
fn sensor_programs() -> Vec<u32> {
    let mut out = Vec::new();
    let mut id = 0u32;
    // bounded: ids only grow, and a host holds far fewer programs
    for _ in 0..100_000 {
        let Some(next) = next_program_id(id) else {
            break;
        };
        id = next;
        let Ok(fd) = program_by_id(id) else {
            continue;
        };
        let mut info = [0u8; 80]; // bpf_prog_info up to name[16] at 64
        if object_info(&fd, &mut info).is_ok() && info[64..].starts_with(b"hr_lat") {
            out.push(id);
        }
    }
    out
}

/// A sensor whose second attachment fails (a tracepoint id that does not exist) returns the
/// error naming that hook and leaves none of its programs loaded or attached; a kernel
/// without a hook is refused before anything is loaded.
#[test]
fn a_failed_attach_leaves_nothing_behind() {
    const TEST: &str = "a_failed_attach_leaves_nothing_behind";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !root(TEST) {
        return;
    }
    let Some(real) = tracefs::events_dir(Path::new("/")) else {
        eprintln!("SKIP {TEST}: tracefs is not mounted");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (sys, ev, _) in tracefs::HOOKS {
        let from = real.join(sys).join(ev);
        let to = dir.path().join(sys).join(ev);
        std::fs::create_dir_all(&to).unwrap();
        let Ok(format) = std::fs::read_to_string(from.join("format")) else {
            eprintln!("SKIP {TEST}: no tracepoint {sys}:{ev} here");
            return;
        };
        std::fs::write(to.join("format"), format).unwrap();
        let id = std::fs::read_to_string(from.join("id")).unwrap();
        let id = if ev == "sock_send_length" {
            "999999999\n".to_owned()
        } else {
            id
        };
        std::fs::write(to.join("id"), id).unwrap();
    }
    let before = sensor_programs();
    let err = LatencySensor::attach_at(dir.path(), &[1])
        .unwrap_err()
        .to_string();
    assert!(err.contains("sock:sock_send_length"), "{err}");
    let t = Instant::now();
    let mut left: Vec<u32> = Vec::new();
    while t.elapsed() < Duration::from_secs(5) {
        left = sensor_programs()
            .into_iter()
            .filter(|id| !before.contains(id))
            .collect();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(left.is_empty(), "programs {left:?} left loaded");

    std::fs::remove_dir_all(dir.path().join("sock/sock_send_length")).unwrap();
    let err = LatencySensor::attach_at(dir.path(), &[1])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sock:sock_send_length") && err.contains("6.3"),
        "{err}"
    );
}

#[test]
fn a_listening_port_is_found_in_proc_net_tcp() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().unwrap().port();
    assert_eq!(listening(Path::new("/"), port), Some(true));
    drop(l);
    assert_eq!(listening(Path::new("/"), port), Some(false));
    assert_eq!(listening(Path::new("/nonexistent"), port), None);
}
