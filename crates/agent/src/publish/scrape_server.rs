//! The metrics endpoint's HTTP/1.1 responder: one thread, non-blocking sockets and poll(2).
//! Every connection is served as its bytes arrive, so a slow or idle client delays nobody: a
//! thread per scrape (32 at most) with the rest answered one by one in the accept thread let
//! slow connections queue ahead of an honest scrape (7.2 s worst scrape, third hostile pass,
//! issue 42). Each connection has one deadline for its request and answer together; at most
//! [`MAX_CONNECTIONS`] are kept, a new one closing the oldest, so a flood of connections
//! cannot keep an honest scraper out either: it sends its request at once and is answered in
//! the round that sees it.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_host::poll::{wait, Wait, Want};
use prometheus_client::registry::Registry;

use crate::sensors::lc_signal::StopFlag;

/// How long a scrape may take, request and answer together (not per read: a byte a second
/// does not keep a connection).
pub const SCRAPE_DEADLINE: Duration = Duration::from_secs(2);
/// Connections kept at once; one more closes the oldest.
pub const MAX_CONNECTIONS: usize = 128;
/// The longest request read (its head: a scrape is a GET).
const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// Connections accepted per round (the others wait for the next round, after this one's
/// connections are served).
const ACCEPT_PER_ROUND: usize = 64;

/// Serves `registry` on `addr` (`GET /metrics`, any path) until `stop`; returns the bound address.
pub fn serve(
    addr: SocketAddr,
    registry: Registry,
    stop: StopFlag,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    serve_with_deadline(addr, registry, stop, SCRAPE_DEADLINE)
}

/// [`serve`] with another whole-request deadline (tests that must not depend on how fast the
/// host is use a long one).
pub fn serve_with_deadline(
    addr: SocketAddr,
    registry: Registry,
    stop: StopFlag,
    deadline: Duration,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let handle = std::thread::Builder::new()
        .name("headroom-metrics".into())
        .spawn(move || serve_loop(&listener, &registry, &stop, deadline))?;
    Ok((bound, handle))
}

/// One client connection: its request until the blank line, then the answer being sent.
struct Connection {
    stream: TcpStream,
    deadline: Instant,
    request: Vec<u8>,
    /// The page and how much of it is sent (`None` while the request is read).
    answer: Option<(Arc<[u8]>, usize)>,
}

/// What a connection needs next.
#[derive(PartialEq)]
enum Next {
    /// Its next bytes (or room to send).
    Wait,
    /// Nothing: answered, closed by the client, or refused.
    Done,
}

impl Connection {
    /// Reads what has arrived, and answers once the request is whole; never blocks.
    fn progress(&mut self, registry: &Registry, page: &mut Option<Arc<[u8]>>) -> Next {
        if self.answer.is_none() {
            let mut buf = [0u8; 4096];
            loop {
                match self.stream.read(&mut buf) {
                    // Closed: a request that came whole before the close is answered.
                    Ok(0) if self.request.is_empty() => return Next::Done,
                    Ok(0) => break,
                    Ok(n) => {
                        self.request.extend_from_slice(&buf[..n]);
                        if self.request.windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                        if self.request.len() > MAX_REQUEST_BYTES {
                            return Next::Done;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Wait,
                    Err(_) => return Next::Done,
                }
            }
            // One rendering per round, shared by the connections answered in it.
            let text = page.get_or_insert_with(|| Arc::from(http_page(registry)));
            self.answer = Some((text.clone(), 0));
        }
        let Some((text, sent)) = self.answer.as_mut() else {
            return Next::Done;
        };
        while *sent < text.len() {
            match self.stream.write(&text[*sent..]) {
                Ok(0) => return Next::Done,
                Ok(n) => *sent += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Wait,
                Err(_) => return Next::Done,
            }
        }
        Next::Done
    }
}

/// The answer: the exposition with its HTTP head.
fn http_page(registry: &Registry) -> Vec<u8> {
    let body = super::metrics::render(registry);
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

fn serve_loop(listener: &TcpListener, registry: &Registry, stop: &StopFlag, deadline: Duration) {
    let mut conns: Vec<Connection> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // Sleep until a connection can progress, the nearest deadline, or 1 s (to see `stop`;
        // the agent connects once when it stops, so that is seen at once).
        let wait_ms = conns
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now).as_millis() + 1)
            .min()
            .map_or(crate::publish::control::ACCEPT_WAIT_MS, |ms| {
                ms.min(u128::from(crate::publish::control::ACCEPT_WAIT_MS)) as u64
            });
        let mut fds: Vec<Wait> = std::iter::once(Wait::new(listener.as_raw_fd(), Want::Read))
            .chain(conns.iter().map(|c| {
                let want = if c.answer.is_some() {
                    Want::Write
                } else {
                    Want::Read
                };
                Wait::new(c.stream.as_raw_fd(), want)
            }))
            .collect();
        let _ = wait(&mut fds, Duration::from_millis(wait_ms));
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let mut page = None;
        let mut done = vec![false; conns.len()];
        for ((c, fd), done) in conns.iter_mut().zip(&fds[1..]).zip(done.iter_mut()) {
            if fd.ready() {
                *done = c.progress(registry, &mut page) == Next::Done;
            }
        }
        let mut done = done.into_iter();
        let now = Instant::now();
        conns.retain(|c| !done.next().unwrap_or(true) && now < c.deadline);
        if fds[0].ready() {
            accept_round(listener, registry, &mut conns, &mut page, deadline);
        }
    }
}

/// Accepts up to [`ACCEPT_PER_ROUND`] connections, serving each at once (a scraper's request
/// is usually there already); the oldest connection is closed when one more would pass
/// [`MAX_CONNECTIONS`].
fn accept_round(
    listener: &TcpListener,
    registry: &Registry,
    conns: &mut Vec<Connection>,
    page: &mut Option<Arc<[u8]>>,
    deadline: Duration,
) {
    for _ in 0..ACCEPT_PER_ROUND {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) => {
                // Out of descriptors, most likely: the oldest connection makes room; with
                // none to close, the next round tries again after a pause.
                if conns.is_empty() {
                    tracing::warn!("metrics: accepting a scrape failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    return;
                }
                conns.remove(0);
                continue;
            }
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let mut c = Connection {
            stream,
            deadline: Instant::now() + deadline,
            request: Vec::new(),
            answer: None,
        };
        if c.progress(registry, page) == Next::Done {
            continue;
        }
        if conns.len() >= MAX_CONNECTIONS {
            // Kept in accept order: the first is the oldest.
            conns.remove(0);
        }
        conns.push(c);
    }
}
