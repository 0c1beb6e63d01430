//! The control socket (`headroom ctl`): a Unix stream socket, mode 0600, that serves only peers
//! with the agent's own uid or root (checked with SO_PEERCRED). One JSON request line, one JSON
//! response line per connection. Requests are handed to the agent loop, which answers between
//! ticks, so a command never races a reconciliation.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_host::poll::{wait, Doorbell, Wait, Want};

use crate::sensors::lc_signal::StopFlag;

pub use headroom_types::control::{Request, Response};

/// A request waiting for the agent loop, with the channel its answer goes back on.
pub type Pending = (Request, Sender<Response>);

/// The agent loop's end of the control socket: the queued requests and the doorbell that says
/// some wait.
#[derive(Debug)]
pub struct Requests {
    rx: Receiver<Pending>,
    bell: Arc<Doorbell>,
}

impl Requests {
    /// Every request queued now; with `clear_bell` the doorbell is cleared first (a request
    /// queued after the clear rings it again, so none waits for the periodic duty). Without,
    /// no syscall: a loop that was not woken by the bell leaves it for its next wait.
    pub fn take(&self, clear_bell: bool) -> Vec<Pending> {
        if clear_bell {
            self.bell.clear();
        }
        self.rx.try_iter().collect()
    }

    /// Waits up to `timeout` for one request (a caller without an epoll loop).
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Pending, mpsc::RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }

    /// The fd that turns readable when a request is queued.
    pub fn wake_fd(&self) -> std::os::fd::RawFd {
        self.bell.raw_fd()
    }
}

/// Errors of the control socket, naming the socket path.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("agent at {path} answered something that is not a response: {detail}")]
    BadResponse { path: PathBuf, detail: String },
    /// `api.socket` names what is not the agent's to replace (exit 2: nothing was touched).
    #[error("refusing to replace api.socket = {path:?}: {refusal}; give the socket a path of its own (e.g. /run/headroom/ctl.sock)")]
    Refused {
        path: PathBuf,
        refusal: crate::socket_file::Refusal,
    },
    /// The socket is served by another user (not root, not this one): not the agent.
    #[error("{path} is served by uid {uid}, neither root, this user nor the owner of its directory (counted only where no one else could have made it: not under /tmp): not the agent (another user bound its path?); nothing was sent")]
    NotTheAgent { path: PathBuf, uid: String },
    /// The one deadline passed; `stage`: what had not happened by then. (The server side's
    /// words, "the request did not arrive whole in time", were said here: seventeenth pass.)
    #[error("no answer within {deadline_s} s from the agent at {path}: {stage} when the deadline passed (one deadline for the request and the whole answer; the agent is stopped, e.g. SIGSTOP, or hung, or the server trickles its answer)")]
    NoAnswer {
        path: PathBuf,
        stage: &'static str,
        deadline_s: u64,
    },
}

/// Binds the socket (replacing a stale one), sets it 0600, and serves it in a thread; requests
/// arrive on the returned [`Requests`].
pub fn serve(path: &Path, stop: StopFlag) -> Result<(Requests, JoinHandle<()>), ControlError> {
    let io = |what, source| ControlError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io("creating the directory of", e))?;
    }
    // A stale socket is replaced; any other file is not the agent's to delete (a socket
    // path naming the config file or another agent's state file deleted it: fifth hostile
    // pass; journald's datagram /dev/log taken for stale: sixth).
    crate::socket_file::clear_stale(path).map_err(|r| match r {
        Refusal::InUse => io(
            "another agent is serving",
            std::io::Error::new(std::io::ErrorKind::AddrInUse, "socket in use"),
        ),
        refusal => ControlError::Refused {
            path: path.to_path_buf(),
            refusal,
        },
    })?;
    let listener = bind(path).map_err(|(what, e)| io(what, e))?;
    let bell = Arc::new(Doorbell::new().map_err(|e| io("creating the doorbell (eventfd) of", e))?);
    let (tx, rx) = mpsc::channel();
    let path = path.to_path_buf();
    let client_bell = bell.clone();
    let handle = std::thread::Builder::new()
        .name("headroom-ctl".into())
        .spawn(move || accept_loop(listener, &path, tx, &client_bell, stop))
        .map_err(|e| ControlError::Io {
            what: "starting the thread of",
            path: PathBuf::new(),
            source: e,
        })?;
    Ok((Requests { rx, bell }, handle))
}

/// Binds `path` (0600, non-blocking); on failure what failed.
fn bind(path: &Path) -> Result<UnixListener, (&'static str, std::io::Error)> {
    let listener = UnixListener::bind(path).map_err(|e| ("binding", e))?;
    headroom_host::net::chmod_socket(path, 0o600).map_err(|e| ("chmod 0600", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| ("configuring", e))?;
    Ok(listener)
}

/// The (device, inode) the path names now.
use crate::socket_file::{file_id, Refusal};

/// The control socket, bound again when its file was removed (a cleanup of /run, an operator's
/// `rm`): the kill switch was unreachable, silently, until the agent restarted (third hostile
/// pass, issue 42). A path now naming something else is left alone, said once.
struct Bound {
    listener: UnixListener,
    id: Option<(u64, u64)>,
    said: bool,
}

impl Bound {
    fn keep_in_place(&mut self, path: &Path) {
        let now = file_id(path);
        if now == self.id {
            return;
        }
        if now.is_some() {
            if !self.said {
                tracing::warn!(socket = %path.display(), "the control socket's path names another file now: ctl cannot reach this agent (SIGTERM still runs the exit action)");
                self.said = true;
            }
            return;
        }
        // Its directory removed too (`rm -r /run/headroom`): made again where the start's rule
        // still holds for what is above it (only root or this user can write there); the
        // socket was never bound again, and ctl could not reach the agent (hostile pass 33).
        if let Some(dir) = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.exists())
        {
            let me = headroom_host::process::effective_uid();
            if crate::socket_file::dir_refusal(path, me).is_none() {
                let _ = std::fs::create_dir_all(dir);
            }
        }
        match bind(path) {
            Ok(l) => {
                tracing::warn!(socket = %path.display(), "the control socket was removed: bound it again");
                self.listener = l;
                self.id = file_id(path);
                self.said = false;
            }
            Err((what, e)) if !self.said => {
                tracing::warn!(socket = %path.display(), error = %e, "the control socket was removed and {what} it again failed: ctl cannot reach this agent");
                self.said = true;
            }
            Err(_) => {}
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    path: &Path,
    tx: Sender<Pending>,
    bell: &Arc<Doorbell>,
    stop: StopFlag,
) {
    let me = headroom_host::process::effective_uid();
    let active = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut bound = Bound {
        listener,
        id: file_id(path),
        said: false,
    };
    // The reserved slot's clients, read alongside the accepts: waiting on each in turn let a
    // queue of slow ones hold `off` past ctl's 15 s (256 clients: hostile pass 28).
    let mut reserved = Reserved {
        cap: reserved_cap(
            headroom_host::process::open_files_limit(),
            headroom_host::process::open_files_count().unwrap_or(0),
        ),
        ..Reserved::default()
    };
    while !stop.load(Ordering::Relaxed) {
        let listener = &bound.listener;
        match listener.accept() {
            Ok(_) if stop.load(Ordering::Relaxed) => break,
            Ok((stream, _)) => {
                // Each client in its own thread (an idle one must not hold up the next), at
                // most MAX_CLIENTS at once; requests still reach the agent loop one by one.
                // With every slot held (slow clients, each cut at its deadline) the reserved
                // slot, this thread, still serves the kill switch.
                if active.load(Ordering::Relaxed) >= MAX_CLIENTS {
                    reserved.admit(stream, me, &tx, bell);
                    reserved.serve(&tx, bell, false);
                    continue;
                }
                active.fetch_add(1, Ordering::Relaxed);
                let (tx, active, bell) = (tx.clone(), active.clone(), bell.clone());
                let spawned = std::thread::Builder::new()
                    .name("headroom-ctl-client".into())
                    .spawn(move || {
                        serve_client(stream, me, &tx, &bell);
                        active.fetch_sub(1, Ordering::Relaxed);
                    });
                if spawned.is_err() {
                    tracing::warn!("ctl: could not start a client thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Sleep until a client connects or writes (or 1 s, to see `stop`; the agent
                // connects once when it stops, so that is seen at once): polling the listener
                // every few ms would cost the agent more than its 1 ms control loop.
                let fd = std::os::fd::AsRawFd::as_raw_fd(listener);
                let mut waits = vec![Wait::new(fd, Want::Read)];
                waits.extend(reserved.waits());
                let _ = wait(
                    &mut waits,
                    reserved.timeout(Duration::from_millis(ACCEPT_WAIT_MS)),
                );
                reserved.serve(&tx, bell, true);
                bound.keep_in_place(path);
            }
            Err(e) => {
                tracing::warn!(socket = %path.display(), error = %e, "ctl accept failed");
                // Out of fds (EMFILE) the reserved clients must still be cut at their
                // deadline: they held the fds, and with a connect left queued the accepts
                // failed, and they were kept, for as long as clients came (hostile pass 30).
                reserved.serve(&tx, bell, true);
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // Only this agent's own socket file (one put there since is not this agent's to remove).
    if file_id(path) == bound.id {
        let _ = std::fs::remove_file(path);
    }
}

/// How long the accept loop sleeps at most without a client (it then looks at `stop`).
pub const ACCEPT_WAIT_MS: u64 = 1000;

/// Clients served at once (besides the reserved slot for `off`).
const MAX_CLIENTS: usize = 16;
/// The longest request line accepted (a `set` with a long value fits many times over).
pub const MAX_REQUEST_BYTES: u64 = 64 * 1024;
/// How long a client may take to send its whole request (not per read: a byte a second does
/// not keep a slot).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// The same in the reserved slot: `headroom ctl` writes its request at once; a slow client
/// that lands there is cut this long after its connect (read alongside the others).
pub const RESERVED_DEADLINE: Duration = Duration::from_millis(500);
/// How long the answer may take to go out.
const REPLY_DEADLINE: Duration = Duration::from_secs(2);

/// Whether the peer is this agent's uid or root (SO_PEERCRED).
fn peer_allowed(stream: &UnixStream, me: u32) -> bool {
    headroom_host::net::peer_uid(stream).is_some_and(|uid| uid == me || uid == 0)
}

/// Reads one bounded request line by `deadline`; the error is the answer to send.
fn read_request(stream: &mut UnixStream, deadline: Instant) -> Result<Request, Response> {
    let _ = stream.set_nonblocking(false);
    let max = MAX_REQUEST_BYTES as usize;
    let got = super::deadline::read_until(stream, deadline, max, |b| b.contains(&b'\n'))
        .map_err(|e| Response::error(format!("reading the request: {e}")))?;
    parse_request(&got)
}

/// The request line in `got` (what a client sent); the error is the answer to send.
fn parse_request(got: &[u8]) -> Result<Request, Response> {
    if got.len() > MAX_REQUEST_BYTES as usize {
        return Err(Response::error(format!(
            "request longer than {MAX_REQUEST_BYTES} bytes: refused"
        )));
    }
    let end = got.iter().position(|&b| b == b'\n').unwrap_or(got.len());
    let line = String::from_utf8_lossy(&got[..end]);
    serde_json::from_str::<Request>(line.trim()).map_err(|e| {
        let shown: String = line.trim().chars().take(200).collect();
        Response::error(format!("bad request {shown:?}: {e}"))
    })
}

/// Hands `req` to the agent loop and waits for its answer.
fn forward(req: Request, tx: &Sender<Pending>, bell: &Doorbell) -> Response {
    let (rtx, rrx) = mpsc::channel();
    if tx.send((req, rtx)).is_err() {
        return Response::error("agent is shutting down");
    }
    bell.ring();
    rrx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| Response::error("agent did not answer within 10 s"))
}

/// Checks the peer, reads one request by its deadline, hands it to the agent loop, replies.
fn serve_client(mut stream: UnixStream, me: u32, tx: &Sender<Pending>, bell: &Doorbell) {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    if !peer_allowed(&stream, me) {
        tracing::warn!("ctl: refused a peer with another uid");
        let _ = reply(&mut stream, &Response::error("permission denied: peer uid"));
        return;
    }
    let response = match read_request(&mut stream, deadline) {
        Ok(req) => forward(req, tx, bell),
        Err(answer) => answer,
    };
    let _ = reply(&mut stream, &response);
}

/// The reserved slot, served by the accept thread when every client slot is held: `off` (the
/// kill switch) is served; anything else is told to come back. Its clients are read without
/// blocking, each until [`RESERVED_DEADLINE`], so none holds up the accepts or the others.
#[derive(Default)]
struct Reserved {
    clients: Vec<(UnixStream, Instant, Vec<u8>)>,
    last_pass: Option<Instant>,
    /// [`reserved_cap`] of this process's fd limit.
    cap: usize,
}

/// Clients held in the reserved slot at most: past it the oldest is dropped (a flood's; `off`
/// sends its line as it connects, and every client is read before one is dropped).
const MAX_RESERVED: usize = 1024;

/// The reserved slot's clients at most, for the soft fd limit `nofile` with `open` files held
/// already (the agent's own at rest: ~70): an eighth of what is left, so the agent keeps the
/// files its ticks and its restore open. 1024 of them under the shipped unit's default limit
/// (1024) took every fd: the state file, the sensors and `restore`'s cgroup writes failed with
/// EMFILE (hostile pass 30); an eighth of the whole limit was most of what was left under a
/// limit of 100.
fn reserved_cap(nofile: Option<u64>, open: u64) -> usize {
    let eighth = nofile.map_or(MAX_RESERVED as u64, |n| n.saturating_sub(open) / 8);
    usize::try_from(eighth).map_or(MAX_RESERVED, |e| e.clamp(1, MAX_RESERVED))
}

/// The most read from one reserved client: `off` is a few bytes, and anything else is told
/// "busy" (1024 clients of 64 KiB each would have held 64 MiB).
const MAX_RESERVED_BYTES: usize = 4096;

impl Reserved {
    fn admit(&mut self, mut stream: UnixStream, me: u32, tx: &Sender<Pending>, bell: &Doorbell) {
        if !peer_allowed(&stream, me) {
            let _ = reply(&mut stream, &Response::error("permission denied: peer uid"));
            return;
        }
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        if self.clients.len() >= self.cap.max(1) {
            // Whoever sent a whole request (`off`) is answered before the oldest is dropped.
            self.serve(tx, bell, true);
        }
        if self.clients.len() >= self.cap.max(1) {
            self.clients.remove(0);
        }
        let deadline = Instant::now() + RESERVED_DEADLINE;
        self.clients.push((stream, deadline, Vec::new()));
    }

    fn waits(&self) -> impl Iterator<Item = Wait> + '_ {
        use std::os::fd::AsRawFd;
        self.clients
            .iter()
            .map(|(s, _, _)| Wait::new(s.as_raw_fd(), Want::Read))
    }

    /// `most`, or less when a client's deadline comes sooner.
    fn timeout(&self, most: Duration) -> Duration {
        let now = Instant::now();
        self.clients
            .iter()
            .map(|(_, d, _)| d.saturating_duration_since(now))
            .fold(most, Duration::min)
    }

    /// Reads what each client sent; answers those whose request is whole, or whose deadline
    /// passed. Without `always`, at most every 10 ms (a flood of connects comes here for each).
    fn serve(&mut self, tx: &Sender<Pending>, bell: &Doorbell, always: bool) {
        let now = Instant::now();
        if !always
            && self
                .last_pass
                .is_some_and(|t| now.duration_since(t) < Duration::from_millis(10))
        {
            return;
        }
        self.last_pass = Some(now);
        self.clients.retain_mut(|(stream, deadline, got)| {
            let max = MAX_RESERVED_BYTES;
            let mut buf = [0u8; 4096];
            let mut closed = false;
            while !got.contains(&b'\n') && got.len() <= max {
                match std::io::Read::read(stream, &mut buf) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    // A reset peer stays readable: answered now, not polled until its deadline.
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
            }
            let whole = closed || got.contains(&b'\n') || got.len() > max;
            if !whole && now < *deadline {
                return true;
            }
            let busy = || {
                Response::error(format!(
                    "busy: too many ctl clients ({MAX_CLIENTS}); only `off` is served until one ends"
                ))
            };
            let response = if got.len() > max {
                busy()
            } else if whole {
                match parse_request(got) {
                    Ok(Request::Off) => {
                        tracing::warn!(
                            "ctl: every client slot is held; serving `off` in the reserved slot"
                        );
                        forward(Request::Off, tx, bell)
                    }
                    Ok(_) => busy(),
                    Err(answer) => answer,
                }
            } else {
                Response::error("reading the request: the request did not arrive whole in time")
            };
            let _ = stream.set_nonblocking(false);
            let _ = reply(stream, &response);
            false
        });
    }
}

fn reply(stream: &mut UnixStream, response: &Response) -> std::io::Result<()> {
    let mut text = serde_json::to_string(response).expect("response serializes");
    text.push('\n');
    super::deadline::write_all_by(stream, text.as_bytes(), Instant::now() + REPLY_DEADLINE)
}

/// How long apart connects are retried while the socket's backlog is full.
const CONNECT_RETRY: Duration = Duration::from_millis(50);

/// Sends one request to the agent at `path` and returns its response (the client of `ctl`).
pub fn request(path: &Path, req: &Request) -> Result<Response, ControlError> {
    request_by(path, req, Instant::now() + ANSWER_DEADLINE)
}

/// [`request`] with its one deadline given: connecting, sending and the whole answer. (The
/// deadline once started after the connect loop, so `ctl` could wait twice its bound: up to
/// ~30 s, seventeenth hostile pass's low.)
pub fn request_by(path: &Path, req: &Request, deadline: Instant) -> Result<Response, ControlError> {
    let io = |what, source| ControlError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    // A full backlog (the agent stopped, or too many clients) is waited for until the
    // deadline: a blocking connect there never returned (ninth hostile pass).
    let mut stream = loop {
        match headroom_host::net::connect_unix_now(path) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(CONNECT_RETRY.min(deadline.saturating_duration_since(Instant::now())));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Err(io(
                "no room to connect before the deadline (15 s for the whole request; the agent is stopped, e.g. SIGSTOP, or hung) at",
                e,
            )),
            other => break other.map_err(|e| io("connecting to the agent at", e))?,
        }
    };
    // Whoever serves the socket must be root, this user or the owner of the socket's
    // directory (an agent run as its own user): in a directory others can write, another user
    // bound the path after a cleanup removed it and answered `off` with "ok" while the agent
    // went on (eighth hostile pass). The directory's owner counts only where no one else could
    // have made that directory: a stranger's `/tmp/x` took the agent's socket (ninth pass).
    let me = headroom_host::process::effective_uid();
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let dir_owner = crate::socket_file::dir_owner(dir.unwrap_or(Path::new(".")), me).ok();
    match headroom_host::net::peer_uid(&stream) {
        Some(uid) if uid == me || uid == 0 || Some(uid) == dir_owner => {}
        other => {
            return Err(ControlError::NotTheAgent {
                path: path.to_path_buf(),
                uid: other.map_or("unknown".to_string(), |u| u.to_string()),
            })
        }
    }
    // One deadline for the request and the whole answer: a read timeout reset with every
    // byte let a server that trickles its answer keep `ctl` as long as it liked (fourteenth
    // hostile pass, "Found, not fixed").
    let no_answer = |stage| ControlError::NoAnswer {
        path: path.to_path_buf(),
        stage,
        deadline_s: ANSWER_DEADLINE.as_secs(),
    };
    let timed_out = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    let mut text = serde_json::to_string(req).expect("request serializes");
    text.push('\n');
    super::deadline::write_all_by(&mut stream, text.as_bytes(), deadline).map_err(|e| {
        if timed_out(&e) {
            no_answer("the request was not yet written whole")
        } else {
            io("writing to", e)
        }
    })?;
    // Bounded: whatever answers on the socket (not the agent: another program's socket, a
    // hostile one) cannot make the client buffer without end.
    let got = super::deadline::read_until(&mut stream, deadline, MAX_REPLY_BYTES, |b| {
        b.contains(&b'\n')
    })
    .map_err(|e| {
        // A read timeout surfaces as EAGAIN ("Resource temporarily unavailable"): say what
        // it means (fourth hostile pass: an agent stopped by SIGSTOP).
        if timed_out(&e) {
            no_answer("the answer had not arrived whole")
        } else {
            io("reading from", e)
        }
    })?;
    let end = got
        .iter()
        .position(|&b| b == b'\n')
        .map_or(got.len(), |i| i + 1);
    let line = String::from_utf8(got[..end].to_vec()).map_err(|e| {
        io(
            "reading from",
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })?;
    serde_json::from_str(line.trim()).map_err(|e| {
        // What came back, shortened: a stranger's reply may be megabytes of anything.
        let shown: String = line.trim().chars().take(200).collect();
        let more = line.trim().chars().count() > 200;
        ControlError::BadResponse {
            path: path.to_path_buf(),
            detail: format!(
                "{e}: {shown:?}{}",
                if more {
                    format!(" (first 200 of {} bytes)", line.len())
                } else {
                    String::new()
                }
            ),
        }
    })
}

/// The longest reply `request` reads: a status of a node with many LCs is a few hundred KiB.
const MAX_REPLY_BYTES: usize = 16 << 20;

/// How long `request` waits for the whole exchange: sending the request and reading the
/// whole answer, however the server paces its bytes.
const ANSWER_DEADLINE: Duration = Duration::from_secs(15);

#[cfg(test)]
#[path = "control_tests.rs"]
mod tests;
