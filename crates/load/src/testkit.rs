//! Servers with known behaviour, for checking the generator against closed-form answers.
//!
//! [`Mm1Server`] is an M/M/1 FIFO queue speaking the memcached ASCII protocol: each request is
//! given an Exp(μ) service time when it is read, requests are served one at a time in the order
//! they arrived (over all connections), and the reply leaves when the *modelled* completion time
//! comes (a timer, not CPU work), so CPU noise does not move it. Under Poisson arrivals at λ its
//! response time is Exp(μ − λ): the q-quantile is −ln(1 − q)/(μ − λ)
//! ([`crate::stats::batch::mm1_quantile_us`]). What the client measures adds the loopback round
//! trip, its own send lag and the timer's wake-up, tens of µs: keep 1/(μ − λ) in milliseconds.

use std::collections::VecDeque;
use std::io::{ErrorKind, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use rand::{Rng, SeedableRng};

use crate::clock::{now_ns, tighten_timer_slack};
use headroom_host::net::timestamps;
use headroom_host::sched::pin_this_thread;
use headroom_host::timer::Timer;

const LISTENER: Token = Token(usize::MAX - 1);
const TIMER: Token = Token(usize::MAX);
/// Busy-wait the last stretch before a completion instead of trusting the timer's wake-up.
const SPIN_NS: u64 = 80_000;

/// A running M/M/1 memcached-protocol server on loopback; stops when dropped.
pub struct Mm1Server {
    addr: SocketAddr,
    lateness: Arc<Lateness>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Mm1Server {
    /// Starts serving on 127.0.0.1 (a free port) with service rate `mu` per second.
    pub fn start(mu: f64, seed: u64) -> std::io::Result<Mm1Server> {
        Mm1Server::start_on(mu, seed, None)
    }

    /// [`Mm1Server::start`] with the server thread pinned to `cpu` (keeps it off the client's CPU:
    /// two busy-polling threads at one real-time priority on one CPU would wait for each other).
    pub fn start_on(mu: f64, seed: u64, cpu: Option<usize>) -> std::io::Result<Mm1Server> {
        if !(mu.is_finite() && mu > 0.0) {
            return Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                format!("M/M/1 service rate {mu}: must be a positive number"),
            ));
        }
        Mm1Server::spawn(Model::Queue { mu }, seed, cpu)
    }

    /// The same server without a queue: every reply leaves exactly `delay` after its request
    /// arrived (M/D/∞). What a client measures beyond `delay` is its own overhead (loopback,
    /// send lag, its wake-up for the reply), the calibration of the M/M/1 figures.
    pub fn start_delay(delay: Duration, cpu: Option<usize>) -> std::io::Result<Mm1Server> {
        Mm1Server::spawn(
            Model::Delay {
                ns: delay.as_nanos() as u64,
            },
            0,
            cpu,
        )
    }

    fn spawn(model: Model, seed: u64, cpu: Option<usize>) -> std::io::Result<Mm1Server> {
        let listener = TcpListener::bind("127.0.0.1:0".parse().expect("literal address"))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let lateness = Arc::new(Lateness::default());
        let (flag, late) = (stop.clone(), lateness.clone());
        let thread = std::thread::Builder::new()
            .name("mm1-server".into())
            .spawn(move || {
                if let Some(cpu) = cpu {
                    if let Err(e) = pin_this_thread(cpu) {
                        tracing::warn!("pinning the M/M/1 server to CPU {cpu}: {e}");
                    }
                }
                if let Err(e) = serve(listener, model, seed, &flag, &late) {
                    tracing::warn!("M/M/1 server: {e}");
                }
            })?;
        Ok(Mm1Server {
            addr,
            lateness,
            stop,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Mean and largest delay (µs) of a reply past its modelled completion time, and how many
    /// replies were sent: the fixture's own error, part of what the client measures.
    pub fn lateness_us(&self) -> (f64, f64, u64) {
        let n = self.lateness.count.load(Ordering::Relaxed);
        let sum = self.lateness.sum_ns.load(Ordering::Relaxed);
        let max = self.lateness.max_ns.load(Ordering::Relaxed);
        (sum as f64 / n.max(1) as f64 / 1e3, max as f64 / 1e3, n)
    }
}

/// When a request's reply leaves.
#[derive(Clone, Copy, Debug)]
enum Model {
    /// One FIFO server with Exp(mu) service times.
    Queue { mu: f64 },
    /// No queue: a fixed delay after the arrival.
    Delay { ns: u64 },
}

/// Reply lateness totals, written by the server thread.
#[derive(Default)]
struct Lateness {
    count: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Drop for Mm1Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Client {
    stream: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
}

/// A reply due at a modelled completion time.
struct Due {
    at: u64,
    conn: usize,
    reply: &'static [u8],
}

/// One complete request at the front of `buf`: its reply and length, None when incomplete.
fn parse_request(buf: &[u8]) -> Option<(&'static [u8], usize)> {
    let eol = memchr::memmem::find(buf, b"\r\n")?;
    let line = &buf[..eol];
    let mut words = line.split(|b| *b == b' ').filter(|w| !w.is_empty());
    match words.next() {
        Some(b"get") | Some(b"gets") => Some((b"END\r\n", eol + 2)),
        Some(b"set") | Some(b"add") | Some(b"replace") => {
            let len = words
                .nth(3)
                .and_then(|w| std::str::from_utf8(w).ok())
                .and_then(|w| w.parse::<usize>().ok());
            match len {
                Some(len) if buf.len() >= eol + 2 + len + 2 => {
                    Some((b"STORED\r\n", eol + 2 + len + 2))
                }
                Some(_) => None,
                None => Some((b"CLIENT_ERROR bad data chunk\r\n", eol + 2)),
            }
        }
        _ => Some((b"ERROR\r\n", eol + 2)),
    }
}

fn serve(
    mut listener: TcpListener,
    model: Model,
    seed: u64,
    stop: &AtomicBool,
    lateness: &Lateness,
) -> std::io::Result<()> {
    tighten_timer_slack();
    let mut poll = Poll::new()?;
    let mut timer = Timer::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    poll.registry()
        .register(&mut SourceFd(&timer.raw_fd()), TIMER, Interest::READABLE)?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut clients: Vec<Option<Client>> = Vec::new();
    let mut queue: VecDeque<Due> = VecDeque::new();
    let mut last_departure = 0u64;
    let mut events = Events::with_capacity(256);
    let mut chunk = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        // Send every reply whose completion time has come.
        let now = now_ns();
        while queue.front().is_some_and(|f| f.at <= now) {
            let due = queue.pop_front().expect("front exists");
            let late = now_ns().saturating_sub(due.at);
            lateness.count.fetch_add(1, Ordering::Relaxed);
            lateness.sum_ns.fetch_add(late, Ordering::Relaxed);
            lateness.max_ns.fetch_max(late, Ordering::Relaxed);
            if let Some(Some(c)) = clients.get_mut(due.conn) {
                c.wbuf.extend_from_slice(due.reply);
                flush(c);
            }
        }
        // The last stretch before a completion is busy-polled (requests arriving meanwhile are
        // still read at once); before it the thread sleeps on the timer, armed early.
        let timeout = match queue.front() {
            Some(front) if front.at <= now + SPIN_NS => Duration::ZERO,
            Some(front) => {
                timer.arm(front.at - SPIN_NS)?;
                Duration::from_millis(50)
            }
            None => Duration::from_millis(20),
        };
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for ev in events.iter() {
            match ev.token() {
                TIMER => timer.fired(),
                LISTENER => loop {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let _ = stream.set_nodelay(true);
                            enable_rx_timestamps(stream.as_raw_fd());
                            let id = clients.len();
                            poll.registry().register(
                                &mut stream,
                                Token(id),
                                Interest::READABLE | Interest::WRITABLE,
                            )?;
                            clients.push(Some(Client {
                                stream,
                                rbuf: Vec::new(),
                                wbuf: Vec::new(),
                            }));
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                },
                Token(id) => {
                    let Some(Some(c)) = clients.get_mut(id) else {
                        continue;
                    };
                    if ev.is_writable() {
                        flush(c);
                    }
                    let mut closed = false;
                    let mut arrival = None;
                    loop {
                        match read_stamped(c.stream.as_raw_fd(), &mut chunk) {
                            Ok((0, _)) => {
                                closed = true;
                                break;
                            }
                            Ok((n, stamp)) => {
                                c.rbuf.extend_from_slice(&chunk[..n]);
                                arrival = arrival.or(stamp);
                            }
                            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                            Err(_) => {
                                closed = true;
                                break;
                            }
                        }
                    }
                    // Arrival = when the kernel received the request (SO_TIMESTAMPNS, so the
                    // server's own wake-up is not part of the model), else when it was read;
                    // FIFO over every connection.
                    let arrival = arrival.map_or_else(now_ns, |a| a.min(now_ns()));
                    let mut used = 0;
                    while let Some((reply, len)) = parse_request(&c.rbuf[used..]) {
                        used += len;
                        last_departure = match model {
                            Model::Queue { mu } => {
                                let u: f64 = rng.random();
                                let service = (-(1.0 - u).ln() / mu * 1e9) as u64;
                                last_departure.max(arrival) + service
                            }
                            Model::Delay { ns } => (arrival + ns).max(last_departure),
                        };
                        queue.push_back(Due {
                            at: last_departure,
                            conn: id,
                            reply,
                        });
                    }
                    c.rbuf.drain(..used);
                    if closed {
                        clients[id] = None;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Asks the kernel to stamp received data (SO_TIMESTAMPNS, CLOCK_REALTIME); a refusal leaves
/// reads unstamped (timed when read).
fn enable_rx_timestamps(fd: RawFd) {
    let _ = timestamps::enable_timestampns(fd);
}

/// One read into `buf`: bytes read and, when the kernel stamped them, their receive time on
/// CLOCK_MONOTONIC ns.
fn read_stamped(fd: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Option<u64>)> {
    let (n, stamp) = timestamps::recv_stamped(fd, buf)?;
    Ok((
        n,
        stamp.and_then(|s| s.monotonic_ns(timestamps::realtime_offset_ns())),
    ))
}

fn flush(c: &mut Client) {
    while !c.wbuf.is_empty() {
        match c.stream.write(&c.wbuf) {
            Ok(n) => {
                c.wbuf.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

/// A server that accepts every connection and closes it at once (for reconnect back-off tests).
/// Counts the connections it accepted; stops when dropped.
pub struct ClosingServer {
    addr: SocketAddr,
    accepted: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ClosingServer {
    pub fn start() -> std::io::Result<ClosingServer> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, flag) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        count.fetch_add(1, Ordering::Relaxed);
                        drop(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_micros(200)),
                }
            }
        });
        Ok(ClosingServer {
            addr,
            accepted,
            stop,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for ClosingServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A loopback TCP port that refuses connections for as long as this value lives: a socket is
/// bound to it and never listens, so no other process can take the port (a port merely "free a
/// moment ago" may be another test's server by the time it is used).
pub struct RefusingPort {
    fd: std::os::fd::OwnedFd,
    port: u16,
}

impl RefusingPort {
    pub fn new() -> std::io::Result<RefusingPort> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the fd is owned at once.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh, valid descriptor nobody else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: `sin` is a valid sockaddr_in of `len` bytes.
        if unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sin as *const _ as *const libc::sockaddr,
                len,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        let mut out: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut out_len = len;
        // SAFETY: `out` has room for a sockaddr_in.
        if unsafe {
            libc::getsockname(
                fd.as_raw_fd(),
                &mut out as *mut _ as *mut libc::sockaddr,
                &mut out_len,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(RefusingPort {
            fd,
            port: u16::from_be(out.sin_port),
        })
    }

    pub fn port(&self) -> u16 {
        let _ = &self.fd;
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}
