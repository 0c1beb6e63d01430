//! A hostile HTTP server on 127.0.0.1 for tests (issue 42's hostile passes): it accepts a bounded
//! number of connections, answers each on its own thread as the test says, and stops when the
//! test drops it. What it answers is the test's; this crate holds the plumbing the tests shared
//! (accepting, reading a request, JSON and chunked answers, a kubeconfig naming the server).

use std::io::{BufRead, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A list answer with no pods (the watches' start).
pub const EMPTY_POD_LIST: &str =
    r#"{"apiVersion":"v1","kind":"PodList","metadata":{"resourceVersion":"1"},"items":[]}"#;

/// A running server: its port, the counts its answers keep, and the stop flag its answers see.
pub struct Server<C = ()> {
    pub port: u16,
    /// What the test's answers counted (requests, bytes sent, ...).
    pub counts: Arc<C>,
    stop: Arc<AtomicBool>,
}

impl<C> Drop for Server<C> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // wakes the accept loop so that it sees the flag
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Serves at most `conns` connections on 127.0.0.1 (a port of the system's choice), each by
/// `answer(conn, stop, counts)` on its own thread; `stop` turns true when the server is dropped.
pub fn serve<C, F>(conns: usize, counts: C, answer: F) -> Server<C>
where
    C: Send + Sync + 'static,
    F: Fn(TcpStream, &AtomicBool, &C) + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(counts);
    let answer = Arc::new(answer);
    let (flag, c) = (stop.clone(), counts.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming().take(conns) {
            if flag.load(Ordering::SeqCst) {
                break;
            }
            let Ok(conn) = conn else { continue };
            let (flag, c, answer) = (flag.clone(), c.clone(), answer.clone());
            std::thread::spawn(move || answer(conn, &flag, &c));
        }
    });
    Server { port, counts, stop }
}

/// One request: its first line (`GET /api/v1/pods?... HTTP/1.1`) and its body.
pub struct Request {
    pub line: String,
    pub body: Vec<u8>,
}

/// Reads one request: its head (at most 100 lines) and a body of its `Content-Length` (at most
/// 1 MiB). `None` when the connection closed first.
pub fn read_request(r: &mut impl BufRead) -> Option<Request> {
    let mut line = String::new();
    if r.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let mut length = 0usize;
    for _ in 0..100 {
        let mut header = String::new();
        if r.read_line(&mut header).unwrap_or(0) == 0 {
            return None;
        }
        if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if header == "\r\n" {
            break;
        }
    }
    let mut body = vec![0u8; length.min(1 << 20)];
    r.read_exact(&mut body).ok()?;
    Some(Request { line, body })
}

/// One JSON answer with its length; `status` is the status line's code and reason ("200 OK").
pub fn answer_json(w: &mut impl Write, status: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    w.write_all(head.as_bytes())?;
    w.write_all(body.as_bytes())
}

/// The head of a 200 answer whose JSON body comes in chunks (a watch, an endless list).
pub fn start_chunked(w: &mut impl Write) -> std::io::Result<()> {
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
}

/// One chunk of a chunked body.
pub fn chunk(w: &mut impl Write, data: &str) -> std::io::Result<()> {
    w.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())
}

/// Waits until `stop` or for `at_most` (a server that holds a request unanswered).
pub fn hold(stop: &AtomicBool, at_most: Duration) {
    let end = Instant::now() + at_most;
    while Instant::now() < end && !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes a kubeconfig naming `http://127.0.0.1:<port>` (no credentials) into `dir`.
pub fn kubeconfig(dir: &Path, port: u16) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hostile\n  cluster:\n    server: http://127.0.0.1:{port}\n\
         contexts:\n- name: hostile\n  context:\n    cluster: hostile\n    user: nobody\n\
         current-context: hostile\nusers:\n- name: nobody\n  user: {{}}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// An error and its sources, `: `-joined.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        text.push_str(&format!(": {s}"));
        src = s.source();
    }
    text
}

/// Polls `f` every 50 ms for up to `within`: a hang detector, not a timing claim.
pub fn wait(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
