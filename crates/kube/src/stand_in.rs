//! A stand-in kube-apiserver on 127.0.0.1 (no real one can be installed on these machines): it
//! answers the pod list and watch endpoints as kube-apiserver does (a `PodList`, then a chunked
//! stream of watch events) and `GET`/`PATCH nodes/<n>/status` (`headroom.io/be-cpu` and
//! `headroom.io/be-memory` land in the Node's status as patched). Behind the `stand-in` feature:
//! used by this crate's tests, the agent's and `kube-discover`'s tests in `crates/cli/tests`,
//! and `headroom bench advertise` (docs/kubernetes.md).

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

/// `pod` whose container requests `be_cpu` of `headroom.io/be-cpu` (requests and limits, as
/// a batch pod opts in).
pub fn with_be_cpu(mut pod: Value, be_cpu: &str) -> Value {
    pod["spec"]["containers"][0]["resources"] = json!({
        "requests": {"headroom.io/be-cpu": be_cpu}, "limits": {"headroom.io/be-cpu": be_cpu}});
    pod
}

/// `pod` whose container requests `be_memory` of `headroom.io/be-memory` besides what it
/// requests already (requests and limits).
pub fn with_be_memory(mut pod: Value, be_memory: &str) -> Value {
    let r = &mut pod["spec"]["containers"][0]["resources"];
    for m in ["requests", "limits"] {
        r[m]["headroom.io/be-memory"] = json!(be_memory);
    }
    pod
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
    /// The Node objects (status patches land here).
    pub nodes: Arc<Mutex<Nodes>>,
    /// Whether `fieldSelector=spec.nodeName=…` is applied (as kube-apiserver does); a test of
    /// the client's own defence clears it to be sent other nodes' pods.
    pub select_fields: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// [`StandIn::listing`]'s own sender (its watches then stay open, not ended).
    _silent: Option<mpsc::Sender<Value>>,
}

/// One request as read.
struct Request {
    method: String,
    /// The path with its query.
    path: String,
    content_type: String,
    body: Vec<u8>,
}

/// Reads one request, `None` at the end of the connection.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut len = 0usize;
    let mut content_type = String::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        if h == "\r\n" {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
        if let Some(v) = lower.strip_prefix("content-type:") {
            content_type = v.trim().to_string();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    let mut words = line.split_whitespace();
    Some(Request {
        method: words.next().unwrap_or("").to_string(),
        path: words.next().unwrap_or("").to_string(),
        content_type,
        body,
    })
}

/// The stand-in's Node objects and how it answers their status patches.
#[derive(Default)]
pub struct Nodes {
    /// By name (a node exists once [`StandIn::add_node`] made it).
    pub objects: std::collections::BTreeMap<String, Value>,
    /// The next this many status patches are refused with 403 (RBAC).
    pub forbid: u32,
    /// Every status patch taken: (content type, body).
    pub patches: Vec<(String, Value)>,
}

/// RFC 7386 JSON merge patch (`null` deletes a key).
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().unwrap();
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// A JSON patch op the stand-in refuses (kube-apiserver answers 422): the op, its path, why.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {reason}")]
pub struct JsonPatchError {
    pub op: String,
    pub path: String,
    pub reason: String,
}

/// RFC 6902 JSON patch: add, replace, remove (what a status patch uses); pointer tokens
/// unescaped (`~1` = `/`, `~0` = `~`). An error names the failing op.
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), JsonPatchError> {
    let err = |op: &str, path: &str, reason: String| JsonPatchError {
        op: op.to_string(),
        path: path.to_string(),
        reason,
    };
    let ops = ops
        .as_array()
        .ok_or_else(|| err("patch", "", "a JSON patch is an array".into()))?;
    for op in ops {
        let kind = op["op"]
            .as_str()
            .ok_or_else(|| err("?", "", "op without \"op\"".into()))?;
        let path = op["path"]
            .as_str()
            .ok_or_else(|| err(kind, "", "op without \"path\"".into()))?;
        let tokens: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        let (last, parents) = tokens
            .split_last()
            .ok_or_else(|| err(kind, path, "empty path".into()))?;
        let mut cur = &mut *target;
        for t in parents {
            cur = cur
                .get_mut(t.as_str())
                .ok_or_else(|| err(kind, path, format!("no {t}")))?;
        }
        let obj = cur
            .as_object_mut()
            .ok_or_else(|| err(kind, path, "parent is not an object".into()))?;
        match kind {
            "add" => {
                obj.insert(last.clone(), op["value"].clone());
            }
            "replace" => {
                if !obj.contains_key(last) {
                    return Err(err(kind, path, "no such key".into()));
                }
                obj.insert(last.clone(), op["value"].clone());
            }
            "remove" => {
                obj.remove(last)
                    .ok_or_else(|| err(kind, path, "no such key".into()))?;
            }
            other => return Err(err(other, path, "op not supported by the stand-in".into())),
        }
    }
    Ok(())
}

fn respond(w: &mut TcpStream, code: u16, body: &Value) {
    let text = body.to_string();
    let reason = match code {
        200 => "OK",
        403 => "Forbidden",
        404 => "Not Found",
        415 => "Unsupported Media Type",
        _ => "Unprocessable Entity",
    };
    let _ = write!(
        w,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
        text.len()
    );
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

/// `GET /api/v1/nodes/<n>[/status]` and `PATCH /api/v1/nodes/<n>/status` as kube-apiserver
/// answers them: the patch's content type picks its semantics (merge and strategic merge are
/// the same for the status maps; json patch is RFC 6902); only `status` changes.
fn serve_node(w: &mut TcpStream, req: &Request, nodes: &Mutex<Nodes>) {
    let path = req.path.split('?').next().unwrap_or("");
    let rest = path.strip_prefix("/api/v1/nodes/").unwrap_or("");
    let (name, sub) = rest.split_once('/').unwrap_or((rest, ""));
    let mut nodes = nodes.lock().unwrap();
    if req.method == "PATCH" && sub == "status" && nodes.forbid > 0 {
        nodes.forbid -= 1;
        let m = format!("nodes \"{name}\" is forbidden: User \"system:serviceaccount:headroom:headroom\" cannot patch resource \"nodes/status\" in API group \"\" at the cluster scope");
        respond(w, 403, &status(403, "Forbidden", &m));
        return;
    }
    let Some(node) = nodes.objects.get(name).cloned() else {
        respond(
            w,
            404,
            &status(404, "NotFound", &format!("nodes \"{name}\" not found")),
        );
        return;
    };
    match (req.method.as_str(), sub) {
        ("GET", "" | "status") => respond(w, 200, &node),
        ("PATCH", "status") => {
            let Ok(patch) = serde_json::from_slice::<Value>(&req.body) else {
                respond(w, 422, &status(422, "Invalid", "body is not JSON"));
                return;
            };
            let mut updated = node.clone();
            let result = match req.content_type.as_str() {
                "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                    merge_patch(&mut updated, &patch);
                    Ok(())
                }
                "application/json-patch+json" => json_patch(&mut updated, &patch),
                other => {
                    respond(w, 415, &status(415, "UnsupportedMediaType", &format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got {other}")));
                    return;
                }
            };
            if let Err(e) = result {
                respond(w, 422, &status(422, "Invalid", &e.to_string()));
                return;
            }
            // The status subresource changes status only.
            let mut stored = node;
            stored["status"] = updated["status"].clone();
            let rv = stored["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            stored["metadata"]["resourceVersion"] = json!(rv.to_string());
            nodes.patches.push((req.content_type.clone(), patch));
            nodes.objects.insert(name.to_string(), stored.clone());
            respond(w, 200, &stored);
        }
        _ => respond(
            w,
            404,
            &status(404, "NotFound", "not served by the stand-in"),
        ),
    }
}

fn chunk(w: &mut TcpStream, data: &str) -> std::io::Result<()> {
    write!(w, "{:x}\r\n{}\r\n", data.len(), data)?;
    w.flush()
}

/// The node a pod list or watch selects (`fieldSelector=spec.nodeName=<node>`, as the agent
/// asks), the API server applying it as kube-apiserver does; `None`: every pod.
fn node_selector(path: &str) -> Option<String> {
    let query = path.split_once('?')?.1;
    query.split('&').find_map(|kv| {
        let v = kv.strip_prefix("fieldSelector=")?;
        let v = v.replace("%3D", "=").replace("%3d", "=");
        v.split(',')
            .find_map(|term| term.strip_prefix("spec.nodeName=").map(str::to_string))
    })
}

/// Serves one connection: lists and (one) watch.
fn serve(
    conn: TcpStream,
    list: &[Value],
    requests: &Mutex<Vec<String>>,
    stop: &AtomicBool,
    events: &Mutex<Option<mpsc::Receiver<Value>>>,
    nodes: &Mutex<Nodes>,
    select_fields: &AtomicBool,
) {
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    while let Some(req) = read_request(&mut r) {
        // A stopped server answers nothing more, even on a kept-alive connection.
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let path = req.path.clone();
        requests.lock().unwrap().push(path.clone());
        if path.starts_with("/api/v1/nodes/") {
            serve_node(&mut w, &req, nodes);
            continue;
        }
        if !path.starts_with("/api/v1/pods") {
            let _ = write!(w, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
            continue;
        }
        let node = node_selector(&path).filter(|_| select_fields.load(Ordering::SeqCst));
        let selected = |pod: &Value| {
            node.as_deref()
                .is_none_or(|n| pod["spec"]["nodeName"].as_str() == Some(n))
        };
        if !path.contains("watch=true") {
            let items: Vec<&Value> = list.iter().filter(|p| selected(p)).collect();
            let body = json!({"apiVersion": "v1", "kind": "PodList",
                              "metadata": {"resourceVersion": "10"}, "items": items})
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
                    // An object of another node is not this watch's (ERROR and BOOKMARK
                    // events carry no pod and always go out).
                    Ok(ev) if ev["object"]["kind"] == "Pod" && !selected(&ev["object"]) => {}
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
    pub fn start(list: Vec<Value>, events: mpsc::Receiver<Value>) -> std::io::Result<StandIn> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(Mutex::new(Some(events)));
        let nodes = Arc::new(Mutex::new(Nodes::default()));
        let select_fields = Arc::new(AtomicBool::new(true));
        let (reqs, stopped, all_nodes, selecting) = (
            requests.clone(),
            stop.clone(),
            nodes.clone(),
            select_fields.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming().take(MAX_CONNECTIONS) {
                let Ok(conn) = conn else { continue };
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let (list, reqs, stopped, events, nodes, selecting) = (
                    list.clone(),
                    reqs.clone(),
                    stopped.clone(),
                    events.clone(),
                    all_nodes.clone(),
                    selecting.clone(),
                );
                std::thread::spawn(move || {
                    serve(conn, &list, &reqs, &stopped, &events, &nodes, &selecting)
                });
            }
        });
        Ok(StandIn {
            port,
            requests,
            nodes,
            select_fields,
            stop,
            _silent: None,
        })
    }

    /// A stand-in serving `list` whose watches stay silent.
    pub fn listing(list: Vec<Value>) -> std::io::Result<StandIn> {
        let (tx, rx) = mpsc::channel();
        let mut s = StandIn::start(list, rx)?;
        s._silent = Some(tx);
        Ok(s)
    }

    /// Adds a Node `name` with `cpu` CPUs (and 4 GiB per CPU of memory, as kubelet writes it) in
    /// its capacity and allocatable.
    pub fn add_node(&self, name: &str, cpu: u32) {
        let memory = format!("{}Ki", u64::from(cpu) * 4 * 1024 * 1024);
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": "1"},
            "status": {"capacity": {"cpu": cpu.to_string(), "memory": memory, "pods": "110"},
                       "allocatable": {"cpu": cpu.to_string(), "memory": memory, "pods": "110"}}});
        self.nodes
            .lock()
            .unwrap()
            .objects
            .insert(name.to_string(), node);
    }

    /// The node's `status.capacity[resource]` and `status.allocatable[resource]`.
    pub fn node_resource(&self, name: &str, resource: &str) -> (Option<String>, Option<String>) {
        let nodes = self.nodes.lock().unwrap();
        let n = &nodes.objects[name];
        let get = |m: &str| n["status"][m][resource].as_str().map(str::to_string);
        (get("capacity"), get("allocatable"))
    }

    /// Writes a kubeconfig for this server into `dir` (as JSON, which YAML readers take); its
    /// path.
    pub fn kubeconfig(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join("kubeconfig");
        let server = format!("http://127.0.0.1:{}", self.port);
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": server}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "nobody"}}],
            "current-context": "stand-in",
            "users": [{"name": "nobody", "user": {}}],
        });
        std::fs::write(&path, config.to_string())?;
        Ok(path)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // wakes the accept loop so it sees the flag
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
