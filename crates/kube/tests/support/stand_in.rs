//! A stand-in kube-apiserver on 127.0.0.1 for tests (no cluster runs here): it answers the pod
//! list and watch endpoints as kube-apiserver does (a `PodList`, then a chunked stream of watch
//! events). The one copy, used by `crates/kube/tests` (`mod support`) and by the agent's and
//! `kube-discover`'s tests in `crates/cli/tests` (`#[path = "../../kube/tests/support/stand_in.rs"]`,
//! the workspace's way of sharing test helpers between crates).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Connections the server takes at most (the watcher reconnects; several agents may come).
const MAX_CONNECTIONS: usize = 256;
/// How long one watch stays open at most.
const WATCH_MAX: Duration = Duration::from_secs(60);

/// A pod of `node` in namespace `shop`, as the API sends it, `annotations` as given, with one
/// container that declares no port ([`with_ports`] adds them).
pub fn pod(
    name: &str,
    uid: &str,
    node: &str,
    phase: &str,
    qos: &str,
    annotations: Value,
    rv: u32,
) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "shop", "name": name, "uid": uid,
                     "resourceVersion": rv.to_string(), "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": phase, "qosClass": qos}
    })
}

/// `pod` whose container declares `ports` (a JSON array of `{"containerPort": …}` objects).
pub fn with_ports(mut pod: Value, ports: Value) -> Value {
    pod["spec"]["containers"][0]["ports"] = ports;
    pod
}

/// The stand-in server: the list answers `list`; the first watch streams what the test sends
/// on `events`, later watches (the watcher's reconnects, another client) stay open and silent
/// until the server is dropped (at most [`WATCH_MAX`] each).
pub struct StandIn {
    pub port: u16,
    /// The request paths (with their query), in arrival order.
    pub requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    /// [`StandIn::listing`]'s own sender (its watches then stay open, not ended).
    _silent: Option<mpsc::Sender<Value>>,
}

/// Reads one request; its path (with query), `None` at the end of the connection.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<String> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        if h == "\r\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(line.split_whitespace().nth(1).unwrap_or("").to_string())
}

fn chunk(w: &mut TcpStream, data: &str) -> std::io::Result<()> {
    write!(w, "{:x}\r\n{}\r\n", data.len(), data)?;
    w.flush()
}

/// Serves one connection: lists and (one) watch.
fn serve(
    conn: TcpStream,
    list: &[Value],
    requests: &Mutex<Vec<String>>,
    stop: &AtomicBool,
    events: &Mutex<Option<mpsc::Receiver<Value>>>,
) {
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    while let Some(path) = read_request(&mut r) {
        requests.lock().unwrap().push(path.clone());
        if !path.starts_with("/api/v1/pods") {
            let _ = write!(w, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
            continue;
        }
        if !path.contains("watch=true") {
            let body = json!({"apiVersion": "v1", "kind": "PodList",
                              "metadata": {"resourceVersion": "10"}, "items": list})
            .to_string();
            let _ = write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            continue;
        }
        let _ = write!(w, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
        let _ = w.flush();
        let mine = events.lock().unwrap().take();
        let deadline = Instant::now() + WATCH_MAX;
        while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
            match &mine {
                Some(rx) => match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(ev) => {
                        if chunk(&mut w, &format!("{ev}\n")).is_err() {
                            return;
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                },
                None => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        let _ = chunk(&mut w, "");
        return;
    }
}

impl StandIn {
    /// Listens on 127.0.0.1 (a free port).
    pub fn start(list: Vec<Value>, events: mpsc::Receiver<Value>) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(Mutex::new(Some(events)));
        let (reqs, stopped) = (requests.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().take(MAX_CONNECTIONS) {
                let Ok(conn) = conn else { continue };
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let (list, reqs, stopped, events) =
                    (list.clone(), reqs.clone(), stopped.clone(), events.clone());
                std::thread::spawn(move || serve(conn, &list, &reqs, &stopped, &events));
            }
        });
        StandIn {
            port,
            requests,
            stop,
            _silent: None,
        }
    }

    /// A stand-in serving `list` whose watches stay silent.
    pub fn listing(list: Vec<Value>) -> StandIn {
        let (tx, rx) = mpsc::channel();
        let mut s = StandIn::start(list, rx);
        s._silent = Some(tx);
        s
    }

    /// Writes a kubeconfig for this server into `dir`; its path.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: http://127.0.0.1:{}\n\
             contexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: nobody\n\
             current-context: stand-in\nusers:\n- name: nobody\n  user: {{}}\n",
            self.port
        );
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // wakes the accept loop so it sees the flag
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
