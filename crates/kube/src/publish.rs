//! The I/O edge of `[kubernetes] advertise`: a thread that keeps the node's
//! `headroom.io/be-cpu` and `headroom.io/be-memory` (capacity and allocatable, both in one merge
//! patch of `nodes/<node>/status`) at the values the agent last set, and their floors (the sums
//! requested by the node's bound pods, [`crate::floor`]) current from a watch of the node's pods.
//!
//! An error is said once per kind (a 403 names the RBAC rule it needs) and retried with backoff;
//! while the API is away the node keeps the last value patched (nothing removes it) and the
//! agent goes on. The value is re-patched every `refresh` even when unchanged, since kubelet
//! may reset extended resources it does not manage when it re-registers the node.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

use crate::floor::{BoundPod, Floor, BE_CPU, BE_MEMORY};
use crate::watch::{client, KubeError};

/// Where and how to advertise.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishOptions {
    pub node: String,
    pub kubeconfig: Option<PathBuf>,
    /// The first retry after an error; it doubles up to `retry_max`.
    pub retry: Duration,
    pub retry_max: Duration,
    /// How often the value is patched again unchanged.
    pub refresh: Duration,
}

impl PublishOptions {
    pub fn new(node: &str) -> PublishOptions {
        PublishOptions {
            node: node.to_string(),
            kubeconfig: None,
            retry: Duration::from_secs(1),
            retry_max: Duration::from_secs(30),
            refresh: Duration::from_secs(60),
        }
    }
}

/// The values to advertise: be-cpu, and be-memory where the agent has one (absent: the patch
/// leaves the node's be-memory as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub millicpu: u64,
    pub memory_bytes: Option<u64>,
}

/// What the publisher has done (for `ctl status` and the tests).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PublishState {
    /// The value the agent asked for last.
    pub wanted_millicpu: Option<u64>,
    pub wanted_memory_bytes: Option<u64>,
    /// The value the API last accepted.
    pub published_millicpu: Option<u64>,
    pub published_memory_bytes: Option<u64>,
    pub patches: u64,
    pub errors: u64,
    /// The last error, while it lasts (cleared by a patch that succeeds).
    pub last_error: Option<String>,
    /// Errors said (logged): once per kind of error in a row.
    pub errors_said: u64,
    /// The floors: the sums requested by the bound pods, and whether the first list arrived.
    pub floor_millicpu: u64,
    pub floor_memory_bytes: u64,
    pub floor_synced: bool,
    pub bound_pods: Vec<BoundPod>,
    /// Pods whose request could not be read.
    pub refused_pods: Vec<String>,
    /// Bound pods the floor could not keep ([`crate::floor::MAX_BOUND_PODS`] kept already) since
    /// its last list: while not 0 the floor never goes lower (the last whole one stands, raised
    /// by what the kept pods request), until a list within the cap.
    pub floor_over_cap: u64,
}

/// Why a status patch did not take.
#[derive(Debug, thiserror::Error)]
enum PatchError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// A 200 whose Node is not the one patched, or does not hold the value sent (a proxy that
    /// routes to another cluster, a hostile server): the value is not taken as published.
    #[error("the API server answered the patch of nodes/{node}/status with {what}")]
    Answer { node: String, what: String },
}

/// Whether `answer`, the API's answer to a status patch of `node` with `value`, is that node
/// holding that value in its allocatable.
fn check_answer(answer: &Node, node: &str, value: Wanted) -> Result<(), PatchError> {
    let bad = |what: String| PatchError::Answer {
        node: node.to_string(),
        what,
    };
    let name = answer.metadata.name.as_deref().unwrap_or("");
    if name != node {
        return Err(bad(format!(
            "the Node {:?} (not taken as published)",
            crate::pod::shown(name)
        )));
    }
    let allocatable = answer.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let held = |resource: &str| {
        allocatable
            .and_then(|a| a.get(resource))
            .and_then(|q| crate::floor::parse_count(&q.0).ok())
    };
    let mut wanted = vec![(BE_CPU, value.millicpu)];
    wanted.extend(value.memory_bytes.map(|b| (BE_MEMORY, b)));
    for (resource, sent) in wanted {
        let got = held(resource);
        if got != Some(sent) {
            return Err(bad(format!(
                "{resource} = {got:?} in its allocatable, not the {sent} sent (not taken as published)"
            )));
        }
    }
    Ok(())
}

/// The kind of a patch error (an error is said again only when its kind changes).
fn error_kind(e: &PatchError) -> (String, String) {
    let e = match e {
        PatchError::Api(e) => e,
        answer @ PatchError::Answer { .. } => {
            return ("wrong answer".into(), answer.to_string());
        }
    };
    match e {
        kube::Error::Api(s) if s.code == 403 => (
            "forbidden".into(),
            format!(
                "forbidden (403): the agent's service account needs `patch` on `nodes/status` (deploy/kubernetes/headroom-daemonset.yaml, ClusterRole headroom-node-status-patcher): {}",
                crate::pod::shown(&s.message)
            ),
        ),
        kube::Error::Api(s) => (format!("api {}", s.code), format!("API refused ({}): {}", s.code, crate::pod::shown(&s.message))),
        other => ("unreachable".into(), format!("API unreachable: {}", crate::watch::error_text(other))),
    }
}

/// Whether the API said the Node is not there (404): it keeps nothing then.
fn is_not_found(e: &PatchError) -> bool {
    matches!(e, PatchError::Api(kube::Error::Api(s)) if s.code == 404)
}

/// What the node keeps while patches fail, in the units `ctl status` uses (`700m`, bytes),
/// or that the Node is gone (after a 404 nothing of it is kept).
pub fn kept_text(
    node: &str,
    millicpu: Option<u64>,
    memory_bytes: Option<u64>,
    node_gone: bool,
) -> String {
    let node = crate::pod::escaped(node);
    if node_gone {
        return format!(
            "the Node {node} is not there (deleted, or not yet registered): nothing is \
             advertised until it is"
        );
    }
    let cpu = match millicpu {
        Some(m) => format!("{m}m"),
        None => "nothing (not patched by this agent yet)".into(),
    };
    let memory = match memory_bytes {
        Some(b) => format!("{b} bytes"),
        None => "as it was (not patched by this agent)".into(),
    };
    format!("the node {node} keeps {BE_CPU} {cpu}, {BE_MEMORY} {memory}")
}

fn lock(s: &Mutex<PublishState>) -> std::sync::MutexGuard<'_, PublishState> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

impl PublishState {
    fn wanted(&self) -> Option<Wanted> {
        self.wanted_millicpu.map(|millicpu| Wanted {
            millicpu,
            memory_bytes: self.wanted_memory_bytes,
        })
    }

    fn published(&self) -> Option<Wanted> {
        self.published_millicpu.map(|millicpu| Wanted {
            millicpu,
            memory_bytes: self.published_memory_bytes,
        })
    }
}

/// A status patch under way.
type PatchFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), PatchError>> + Send>>;

/// The merge patch that sets be-cpu (and be-memory, where given) in capacity and allocatable.
pub fn status_patch(millicpu: u64, memory_bytes: Option<u64>) -> serde_json::Value {
    let mut values = serde_json::Map::new();
    values.insert(BE_CPU.into(), millicpu.to_string().into());
    if let Some(b) = memory_bytes {
        values.insert(BE_MEMORY.into(), b.to_string().into());
    }
    serde_json::json!({"status": {"capacity": values, "allocatable": values}})
}

async fn run(
    client: Client,
    opts: PublishOptions,
    shared: Arc<Mutex<PublishState>>,
    mut want: tokio::sync::watch::Receiver<Option<Wanted>>,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client);
    let selector = format!("spec.nodeName={}", opts.node);
    // The server ends each watch by its timeoutSeconds: one kept open longer is cut (and said).
    let timeout = crate::watch::ApiBounds::default().watch_timeout.as_secs() as u32;
    let config = watcher::Config::default()
        .fields(&selector)
        .timeout(timeout);
    let mut pod_events = watcher(pods, config).default_backoff().boxed();
    let mut floor = Floor::of_node(&opts.node);
    // The kind of pod-watch error last said: the floor's watch failing is said once per kind,
    // and once when it recovers (before, only at debug: an advertiser whose floor never came
    // said nothing).
    let mut watch_said: Option<String> = None;
    let mut relisting = false;
    let mut said: Option<String> = None;
    let mut retry = opts.retry;
    // When to patch next (the wanted value differs, a retry, or a refresh).
    let mut next = tokio::time::Instant::now();
    // The patch under way and the value it carries: awaited beside the pod watch, so a server
    // that holds a patch (up to the request deadline) does not stop the floor.
    let mut sending: Option<(Wanted, PatchFuture)> = None;
    loop {
        let idle = sending.is_none();
        let patch_done = async {
            match sending.as_mut() {
                Some((_, f)) => f.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = pod_events.next() => match ev {
                Some(Ok(e)) => {
                    // `Init` only says a list begins (it comes before each try): not a recovery.
                    let answered = !matches!(e, watcher::Event::Init);
                    if let Some(kind) = watch_said.take_if(|_| answered) {
                        tracing::info!(node = %opts.node, "kubernetes advertise: the API server answers the pods of {} again (after {kind}): the floor follows them", opts.node);
                    }
                    match e {
                        watcher::Event::Init => {
                            floor.reset();
                            relisting = true;
                        }
                        watcher::Event::InitApply(p) | watcher::Event::Apply(p) => {
                            if let Some(err) = floor.apply(&p) {
                                tracing::warn!("kubernetes advertise: {err}: the pod counts nothing in the floor");
                            }
                        }
                        watcher::Event::InitDone => {
                            floor.synced = true;
                            relisting = false;
                        }
                        watcher::Event::Delete(p) => floor.delete(&p),
                    }
                    // A (re-)list half-read would be a floor too low: the last whole one stands.
                    if relisting {
                        continue;
                    }
                    let mut s = lock(&shared);
                    if floor.over_cap() > 0 {
                        // The sums lack the pods past the cap: a floor too low. Never lower
                        // than the last whole one (nor than the kept pods' sums).
                        if s.floor_over_cap == 0 {
                            tracing::warn!(node = %opts.node, "kubernetes advertise: the API server sent more than {} bound pods of {} (a node runs a few hundred: a broken or hostile API server); the floor is not lowered until a list within the cap (said once)", crate::floor::MAX_BOUND_PODS, opts.node);
                        }
                        s.floor_over_cap = floor.over_cap();
                        s.floor_millicpu = s.floor_millicpu.max(floor.millicpu());
                        s.floor_memory_bytes = s.floor_memory_bytes.max(floor.memory_bytes());
                        continue;
                    }
                    if s.floor_over_cap > 0 {
                        tracing::info!(node = %opts.node, "kubernetes advertise: the bound pods of {} are within the cap again: the floor follows them", opts.node);
                    }
                    s.floor_over_cap = 0;
                    s.floor_millicpu = floor.millicpu();
                    s.floor_memory_bytes = floor.memory_bytes();
                    s.floor_synced = floor.synced;
                    s.bound_pods = floor.pods();
                    s.refused_pods = floor.refused();
                }
                // The floor stays as last known while the API is away.
                Some(Err(e)) => {
                    let kind = crate::watch::watch_error_kind(&e);
                    if watch_said.as_deref() != Some(kind.as_str()) && !kind.ends_with(" 410") {
                        tracing::warn!(node = %opts.node, "kubernetes advertise: watching pods of {} (the floor): {}; retried with backoff, the floor stays as last known (said again only when the error changes)", opts.node, crate::pod::escaped(&e.to_string()));
                        watch_said = Some(kind);
                    }
                }
                None => return,
            },
            changed = want.changed() => {
                if changed.is_err() {
                    return;
                }
                let (w, published) = {
                    let w = *want.borrow_and_update();
                    let mut s = lock(&shared);
                    s.wanted_millicpu = w.map(|w| w.millicpu);
                    s.wanted_memory_bytes = w.and_then(|w| w.memory_bytes);
                    (w, s.published())
                };
                // A new value goes out at once, unless an error's backoff runs.
                if w.is_some() && w != published && said.is_none() {
                    next = tokio::time::Instant::now();
                }
            }
            _ = tokio::time::sleep_until(next), if idle => {
                let Some(value) = lock(&shared).wanted() else {
                    next = tokio::time::Instant::now() + opts.refresh;
                    continue;
                };
                let (api, node) = (nodes.clone(), opts.node.clone());
                let patch = status_patch(value.millicpu, value.memory_bytes);
                sending = Some((
                    value,
                    Box::pin(async move {
                        let answer: Node = api
                            .patch_status(&node, &PatchParams::default(), &Patch::Merge(patch))
                            .await?;
                        check_answer(&answer, &node, value)
                    }),
                ));
            }
            result = patch_done => {
                let Some((value, _)) = sending.take() else {
                    continue;
                };
                match result {
                    Ok(()) => {
                        let mut s = lock(&shared);
                        if s.published() != Some(value) {
                            tracing::info!(node = %opts.node, millicpu = value.millicpu, memory_bytes = ?value.memory_bytes, "kubernetes advertise: {BE_CPU} = {}m, {BE_MEMORY} = {}", value.millicpu, value.memory_bytes.map_or("not advertised".into(), |b| format!("{b} bytes")));
                        }
                        if said.take().is_some() {
                            tracing::info!(node = %opts.node, "kubernetes advertise: the API accepts the patch again");
                        }
                        s.published_millicpu = Some(value.millicpu);
                        if value.memory_bytes.is_some() {
                            s.published_memory_bytes = value.memory_bytes;
                        }
                        s.patches += 1;
                        s.last_error = None;
                        retry = opts.retry;
                        let w = s.wanted();
                        next = tokio::time::Instant::now() + if w != Some(value) { Duration::ZERO } else { opts.refresh };
                    }
                    Err(e) => {
                        let (kind, text) = error_kind(&e);
                        let mut s = lock(&shared);
                        s.errors += 1;
                        if said.as_deref() != Some(kind.as_str()) {
                            let kept = kept_text(&opts.node, s.published_millicpu, s.published_memory_bytes, is_not_found(&e));
                            tracing::warn!(node = %opts.node, "kubernetes advertise: patching nodes/{}/status: {text}; retrying, {kept}", opts.node);
                            s.errors_said += 1;
                            said = Some(kind);
                        }
                        s.last_error = Some(text);
                        next = tokio::time::Instant::now() + retry;
                        retry = (retry * 2).min(opts.retry_max);
                    }
                }
            }
        }
    }
}

/// A running publisher: a thread with its own small async runtime.
pub struct Publisher {
    shared: Arc<Mutex<PublishState>>,
    want: tokio::sync::watch::Sender<Option<Wanted>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Connects (errors in the kubeconfig come back here) and starts; nothing is patched
    /// before the first [`Publisher::set`].
    pub fn start(opts: PublishOptions) -> Result<Publisher, KubeError> {
        if opts.node.trim().is_empty() {
            return Err(KubeError::NoNode);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| KubeError::Runtime(e.to_string()))?;
        let client = rt.block_on(client(opts.kubeconfig.as_deref()))?;
        let shared = Arc::new(Mutex::new(PublishState::default()));
        let (want_tx, want_rx) = tokio::sync::watch::channel(None);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("kube-advertise".into())
            .spawn(move || {
                rt.block_on(async move {
                    tokio::select! {
                        _ = run(client, opts, s, want_rx) => {}
                        _ = stop_rx => {}
                    }
                })
            })
            .map_err(|e| KubeError::Runtime(e.to_string()))?;
        Ok(Publisher {
            shared,
            want: want_tx,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The be-cpu value to advertise (patched when it differs from the last one published);
    /// be-memory, where set before, stays as it was.
    pub fn set(&self, millicpu: u64) {
        let memory_bytes = self.want.borrow().and_then(|w| w.memory_bytes);
        self.set_both(Wanted {
            millicpu,
            memory_bytes,
        });
    }

    /// Both values to advertise, patched together in one patch when either differs from the
    /// last one published.
    pub fn set_both(&self, wanted: Wanted) {
        self.want.send_if_modified(|w| {
            let changed = *w != Some(wanted);
            *w = Some(wanted);
            changed
        });
    }

    pub fn state(&self) -> PublishState {
        self.shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The floor now (0 until the first pod list arrived).
    pub fn floor_millicpu(&self) -> u64 {
        self.state().floor_millicpu
    }

    /// The be-memory floor now, bytes (0 until the first pod list arrived).
    pub fn floor_memory_bytes(&self) -> u64 {
        self.state().floor_memory_bytes
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shutdown();
    }
}
