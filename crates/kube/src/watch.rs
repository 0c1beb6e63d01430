//! The I/O edge: the API client, the watch of the node's pods, and a thread that keeps the LC set
//! current for a synchronous agent (snapshot + change events on a channel).

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use headroom_types::discovery::{LayoutChoice, LcChange, LcSet, LcSetEvent};
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Config};

use crate::layout::{group_exists, resolve};
use crate::pod::PodFacts;
use crate::state::{Discoverer, PodEvent};

/// Where and how to discover.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveryOptions {
    /// The node whose pods are watched (`spec.nodeName`).
    pub node: String,
    /// A kubeconfig file; `None`: in-cluster (the pod's service account), else `KUBECONFIG` or
    /// `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Where the cgroup hierarchies are mounted (`/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
    pub layout: LayoutChoice,
    /// How often pod groups are looked for again without a pod event (a pod's group appears
    /// just after it runs, and goes when it stops even if the API is unreachable).
    pub recheck: Duration,
}

impl DiscoveryOptions {
    pub fn new(node: &str) -> DiscoveryOptions {
        DiscoveryOptions {
            node: node.to_string(),
            kubeconfig: None,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            layout: LayoutChoice::Auto,
            recheck: Duration::from_secs(1),
        }
    }
}

/// Why the discovery could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubernetes discovery: no node name (set [kubernetes] node_name, --node, or NODE_NAME from the downward API)")]
    NoNode,
    #[error("reading kubeconfig {path}: {reason}")]
    Kubeconfig { path: String, reason: String },
    #[error("kubernetes API access: {0}")]
    Access(String),
    #[error("kubernetes discovery: {0}")]
    Runtime(String),
}

/// An API client: from `kubeconfig` when given, else inferred (in-cluster service account,
/// then `KUBECONFIG` / `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| KubeError::Kubeconfig {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Kubeconfig {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?
        }
        None => Config::infer()
            .await
            .map_err(|e| KubeError::Access(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| KubeError::Access(e.to_string()))
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn reduce(e: watcher::Event<Pod>) -> PodEvent {
    match e {
        watcher::Event::Init => PodEvent::Init,
        watcher::Event::InitApply(p) => PodEvent::InitApply(PodFacts::from_pod(&p)),
        watcher::Event::InitDone => PodEvent::InitDone,
        watcher::Event::Apply(p) => PodEvent::Apply(PodFacts::from_pod(&p)),
        watcher::Event::Delete(p) => PodEvent::Delete(PodFacts::from_pod(&p)),
    }
}

fn log_changes(ev: &LcSetEvent) {
    for c in &ev.changes {
        match c {
            LcChange::Added { lc } => tracing::info!(
                lc = %lc.name, cgroup = %lc.cgroup, target_us = lc.target_us,
                ports = ?lc.latency_ports(), priority = lc.priority, "kubernetes: LC pod added"
            ),
            LcChange::Changed { lc } => tracing::info!(
                lc = %lc.name, cgroup = %lc.cgroup, target_us = lc.target_us,
                ports = ?lc.latency_ports(), priority = lc.priority, "kubernetes: LC pod changed"
            ),
            LcChange::Removed { name } => {
                tracing::info!(lc = %name, "kubernetes: LC pod gone")
            }
            LcChange::Refused { refusal } => {
                tracing::warn!("kubernetes: pod refused as an LC: {refusal}")
            }
        }
        if let LcChange::Added { lc } | LcChange::Changed { lc } = c {
            if lc.latency_ports().is_empty() {
                tracing::warn!(
                    "kubernetes: LC pod {}: {}: its latency is unknown, BE is held for it",
                    lc.name,
                    headroom_types::discovery::NO_LATENCY_PORT
                );
            }
        }
    }
}

/// Watches the node's pods until the watch stream ends (it retries API errors with backoff, so
/// in practice until the future is dropped), calling `publish` with every change of the set.
/// A pod that cannot be an LC is refused on its own; the others go on.
pub async fn run(client: Client, opts: &DiscoveryOptions, mut publish: impl FnMut(LcSetEvent)) {
    let api: Api<Pod> = Api::all(client);
    let selector = format!("spec.nodeName={}", opts.node);
    let mut pods = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    let mut discoverer = Discoverer::new(&opts.node);
    let mut recheck = tokio::time::interval(opts.recheck.max(Duration::from_millis(10)));
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watch_errors = 0u64;
    loop {
        tokio::select! {
            event = pods.next() => match event {
                Some(Ok(e)) => discoverer.apply(reduce(e)),
                Some(Err(e)) => {
                    // The set stays as last known: pods do not go because the API is away.
                    watch_errors += 1;
                    tracing::warn!(errors = watch_errors, "kubernetes: watching pods of {}: {e}", opts.node);
                    continue;
                }
                None => return,
            },
            _ = recheck.tick() => {}
        }
        let layout = resolve(opts.layout, &opts.cgroup_root);
        let root = &opts.cgroup_root;
        if let Some(ev) = discoverer.evaluate(layout, |g| group_exists(root, g), now_unix_ms()) {
            log_changes(&ev);
            publish(ev);
        }
    }
}

/// A running discovery: a thread with its own small async runtime, the current set, and the
/// change events sent to whoever asked for them.
pub struct Discovery {
    set: Arc<Mutex<LcSet>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Discovery {
    /// Connects (errors in the kubeconfig or API access come back here) and starts watching.
    /// Every change of the set is sent on `events` (when given) and kept for
    /// [`Discovery::snapshot`].
    pub fn start(
        opts: DiscoveryOptions,
        events: Option<mpsc::Sender<LcSetEvent>>,
    ) -> Result<Discovery, KubeError> {
        if opts.node.trim().is_empty() {
            return Err(KubeError::NoNode);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| KubeError::Runtime(e.to_string()))?;
        let client = rt.block_on(client(opts.kubeconfig.as_deref()))?;
        let set = Arc::new(Mutex::new(LcSet {
            node: opts.node.clone(),
            ..LcSet::default()
        }));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shared = set.clone();
        let thread = std::thread::Builder::new()
            .name("kube-discovery".into())
            .spawn(move || {
                rt.block_on(async move {
                    let publish = |ev: LcSetEvent| {
                        *shared.lock().unwrap_or_else(|p| p.into_inner()) = ev.set.clone();
                        if let Some(tx) = &events {
                            let _ = tx.send(ev);
                        }
                    };
                    tokio::select! {
                        _ = run(client, &opts, publish) => {}
                        _ = stop_rx => {}
                    }
                })
            })
            .map_err(|e| KubeError::Runtime(e.to_string()))?;
        Ok(Discovery {
            set,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The current set (empty and `synced = false` until the first list arrived).
    pub fn snapshot(&self) -> LcSet {
        self.set.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stops the watch and waits for the thread.
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

impl Drop for Discovery {
    fn drop(&mut self) {
        self.shutdown();
    }
}
