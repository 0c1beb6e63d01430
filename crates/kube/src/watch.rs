//! The I/O edge: the API client, the watch of the node's pods, and a thread that keeps the LC set
//! current for a synchronous agent (snapshot + change events on a channel).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use headroom_types::discovery::{LayoutChoice, LcChange, LcSet, LcSetEvent};
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Config};

use crate::api_bounds::bounded;
pub use crate::api_bounds::{ApiBounds, ListBoundError};
use crate::kubeconfig_file;
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
    /// What one list answer may cost, and when a missing list is warned about.
    pub bounds: ApiBounds,
}

impl DiscoveryOptions {
    pub fn new(node: &str) -> DiscoveryOptions {
        DiscoveryOptions {
            node: node.to_string(),
            kubeconfig: None,
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            layout: LayoutChoice::Auto,
            recheck: Duration::from_secs(1),
            bounds: ApiBounds::default(),
        }
    }
}

/// Where a running discovery hands each new set: the binary connects the agent's "newest set"
/// cell here (a queue would grow by a whole set at each pod event while its reader stalls).
pub type EventSink = Box<dyn FnMut(LcSetEvent) + Send>;

/// Why the discovery could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubernetes discovery: no node name (set [kubernetes] node_name, --node, or NODE_NAME from the downward API)")]
    NoNode,
    #[error("reading kubeconfig {path}: {reason} (name a kubeconfig file this host has and can read, or leave it out: the pod's service account, KUBECONFIG or ~/.kube/config is used)")]
    Kubeconfig { path: String, reason: String },
    #[error("kubernetes API access: {0}")]
    Access(String),
    #[error("kubernetes discovery: {0}")]
    Runtime(String),
}

impl KubeError {
    /// An error of the config (no node name, a kubeconfig the host lacks or cannot read), not
    /// of the API: the binary exits 2 for it, as for the other config paths naming what the
    /// host lacks.
    pub fn is_config(&self) -> bool {
        matches!(self, KubeError::NoNode | KubeError::Kubeconfig { .. })
    }
}

/// An API client: from `kubeconfig` when given, else inferred (in-cluster service account,
/// then `KUBECONFIG` / `~/.kube/config`), its lists bounded by [`ApiBounds::default`].
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeError> {
    client_bounded(kubeconfig, ApiBounds::default()).await
}

/// [`client`] with the given bounds on every list (every request but a watch).
pub async fn client_bounded(
    kubeconfig: Option<&Path>,
    bounds: ApiBounds,
) -> Result<Client, KubeError> {
    let config = match kubeconfig {
        Some(path) => from_file(&[path.to_path_buf()]).await?,
        None => infer().await?,
    };
    if config.accept_invalid_certs {
        say_skip_verify(&config.cluster_url.to_string());
    }
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| KubeError::Access(e.to_string()))?;
    Ok(builder
        .with_layer(&bounded::BoundLayer::new(bounds))
        .build())
}

/// A config from kubeconfig files (merged as kube-rs merges `KUBECONFIG`'s), each read by
/// [`kubeconfig_file::read`] (a regular file of bounded size, root's or this user's, parsed
/// from what was read), the files they name taken by [`kubeconfig_file::take_named_files`]; an
/// error names the file.
async fn from_file(paths: &[PathBuf]) -> Result<Config, KubeError> {
    load(paths).await.map_err(|(e, _)| e)
}

/// [`from_file`], its error paired with whether a file was refused (its kind, size, owner or
/// mode, or a file it names refused): an operator's error wherever the kubeconfig was found,
/// never a reason to try another config.
async fn load(paths: &[PathBuf]) -> Result<Config, (KubeError, bool)> {
    let named = |path: &Path, reason: String| KubeError::Kubeconfig {
        path: path.display().to_string(),
        reason,
    };
    let mut merged = Kubeconfig::default();
    for path in paths {
        let kc =
            kubeconfig_file::read(path).map_err(|e| (named(path, e.to_string()), e.is_kind()))?;
        merged = merged
            .merge(kc)
            .map_err(|e| (named(path, e.to_string()), false))?;
    }
    let shown = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    // The files it names: checked as the kubeconfig is, and read bounded (kube-rs reads them
    // whole, and runs its exec plugin as this user).
    kubeconfig_file::take_named_files(&mut merged).map_err(|e| {
        let refused = e.is_kind();
        (named(Path::new(&shown), e.to_string()), refused)
    })?;
    Config::from_custom_kubeconfig(merged, &KubeConfigOptions::default())
        .await
        .map_err(|e| (named(Path::new(&shown), e.to_string()), false))
}

/// kube-rs's `Config::infer` with the kubeconfig read bounded: `KUBECONFIG`'s files or
/// `~/.kube/config` where there are, else (or when they do not make a config) the pod's service
/// account. A file refused (not a regular file, too large, another user's, or naming a file
/// refused so) is refused by name (exit 2), not passed over to the in-cluster config
/// (sixteenth hostile pass's low: a refused token file fell back to it, or exited 1).
async fn infer() -> Result<Config, KubeError> {
    let paths = kubeconfig_file::inferred_paths();
    let from_files = if paths.is_empty() {
        Err(KubeError::Access(
            "no KUBECONFIG and no ~/.kube/config".into(),
        ))
    } else {
        match load(&paths).await {
            Err((e, true)) => return Err(e),
            other => other.map_err(|(e, _)| e),
        }
    };
    let mut config = match from_files {
        Ok(c) => c,
        Err(files) => Config::incluster().map_err(|in_cluster| {
            KubeError::Access(format!(
                "no API config: in-cluster: {in_cluster}; kubeconfig: {files}"
            ))
        })?,
    };
    config.apply_debug_overrides();
    Ok(config)
}

/// Says once a run that the API server's certificate is not verified (`insecure-skip-tls-verify`):
/// kube-rs's own warning is muted with its client's logs.
fn say_skip_verify(server: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::SeqCst) {
        tracing::warn!(
            "kubernetes: the kubeconfig says insecure-skip-tls-verify: the API server {}'s \
             certificate is not verified (anyone on the path can act as it, and read the \
             token); give its CA (certificate-authority-data) instead",
            crate::pod::escaped(server)
        );
    }
}

/// An error and those of its sources its text does not hold already, `: `-joined and escaped: a
/// refused TLS connection says "client error (Connect)" alone, its reason (an unknown issuer, a
/// server that does not speak TLS) being a source.
pub fn error_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    // bounded: a chain is a few links
    for _ in 0..16 {
        let Some(s) = src else { break };
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        src = s.source();
    }
    crate::pod::escaped(&text)
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

/// The kind of a list or watch error: a failing API server is said once per kind, not at each
/// retry (the watcher retries with backoff, for as long as it fails).
pub fn watch_error_kind(e: &watcher::Error) -> String {
    fn client(e: &kube::Error) -> String {
        match e {
            kube::Error::Api(s) => format!("API status {}", s.code),
            kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => "malformed answer".into(),
            kube::Error::Service(b) => match b.downcast_ref::<ListBoundError>() {
                Some(ListBoundError::TooLarge { .. }) => "list too large".into(),
                Some(ListBoundError::TooManyItems { .. }) => "list of too many items".into(),
                Some(ListBoundError::TooManyStrings { .. }) => "list of too many strings".into(),
                Some(ListBoundError::Redirect { status, .. }) => format!("redirect {status}"),
                Some(ListBoundError::Deadline { .. }) => "list deadline".into(),
                Some(ListBoundError::WatchLineTooLarge { .. }) => "watch line too long".into(),
                Some(ListBoundError::WatchEventTooManyStrings { .. }) => {
                    "watch event of too many strings".into()
                }
                Some(ListBoundError::WatchOverdue { .. }) => "watch overdue".into(),
                None => "unreachable".into(),
            },
            kube::Error::HyperError(_) | kube::Error::ReadEvents(_) => "unreachable".into(),
            _ => "client error".into(),
        }
    }
    match e {
        watcher::Error::InitialListFailed(c)
        | watcher::Error::WatchStartFailed(c)
        | watcher::Error::WatchFailed(c) => client(c),
        watcher::Error::WatchError(s) => format!("watch error event {}", s.code),
        watcher::Error::NoResourceVersion => "no resourceVersion".into(),
    }
}

/// A list or watch error as said, escaped. A watch `ERROR` event whose object is no Status
/// (a Pod, `{}`) parses to an empty one, which kube-rs says as "…during watch: :": what came is
/// said instead.
pub fn watch_error_text(e: &watcher::Error) -> String {
    match e {
        watcher::Error::WatchError(s) if s.message.is_empty() && s.reason.is_empty() => {
            format!(
            "the API server sent a watch ERROR event without a Status message or reason (code {}; \
             a broken or hostile API server)",
            if s.code == 0 { "none".to_string() } else { s.code.to_string() }
        )
        }
        other => error_text(other),
    }
}

/// Whether `e` is the API's ordinary "resourceVersion too old" (410 Gone): the watcher lists
/// again, as designed, and nothing is wrong.
fn is_expired(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchError(s) => s.code == 410,
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 410,
        _ => false,
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
    let timeout = opts
        .bounds
        .watch_timeout
        .as_secs()
        .clamp(1, u64::from(u32::MAX)) as u32;
    let config = watcher::Config::default()
        .fields(&selector)
        .timeout(timeout);
    let mut pods = watcher(api, config).default_backoff().boxed();
    let mut discoverer = Discoverer::new(&opts.node);
    // The kind of error last said (said again only when it changes, and once at recovery).
    let mut said: Option<String> = None;
    let mut cap_said = false;
    let mut recheck = tokio::time::interval(opts.recheck.max(Duration::from_millis(10)));
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut watch_errors = 0u64;
    // A (re)list under way since: a server that never finishes one is warned about loudly,
    // every `warn_after`, for as long as it lasts.
    let started = tokio::time::Instant::now();
    let mut listing_since = Some(started);
    let mut warned_at: Option<tokio::time::Instant> = None;
    loop {
        let now = tokio::time::Instant::now();
        if let Some(since) = listing_since {
            let due = warned_at.is_none_or(|w| now - w >= opts.bounds.warn_after);
            if now - since >= opts.bounds.warn_after && due {
                warned_at = Some(now);
                tracing::warn!(
                    waited_s = (now - since).as_secs(),
                    errors = watch_errors,
                    "kubernetes: no complete pod list of {} from the API server for {} s (hanging, \
                     overloaded or unreachable); the LC set stays as last known{}",
                    opts.node,
                    (now - since).as_secs(),
                    if since == started { " and BE is held until the first list" } else { "" }
                );
            }
        }
        tokio::select! {
            event = pods.next() => match event {
                Some(Ok(e)) => {
                    // `Init` only says a list begins (it comes before each try): not a recovery.
                    let answered = !matches!(e, watcher::Event::Init);
                    if let Some(kind) = said.take_if(|_| answered) {
                        tracing::info!(
                            errors = watch_errors,
                            "kubernetes: the API server answers the pods of {} again (after {kind})",
                            opts.node
                        );
                    }
                    match &e {
                        watcher::Event::Init => {
                            listing_since.get_or_insert(now);
                        }
                        watcher::Event::InitDone => {
                            listing_since = None;
                            warned_at = None;
                        }
                        _ => {}
                    }
                    discoverer.apply(reduce(e));
                    if discoverer.over_cap() > 0 && !cap_said {
                        cap_said = true;
                        tracing::warn!(
                            "kubernetes: the API server sent more than {} pods of {} (a node runs a \
                             few hundred at most: a broken or hostile API server); pods past that \
                             are not kept (said once)",
                            crate::state::MAX_PODS,
                            opts.node
                        );
                    }
                }
                Some(Err(e)) => {
                    // The set stays as last known: pods do not go because the API is away.
                    watch_errors += 1;
                    if is_expired(&e) {
                        tracing::debug!("kubernetes: watching pods of {}: {}: listed again", opts.node, crate::pod::escaped(&e.to_string()));
                        continue;
                    }
                    let kind = watch_error_kind(&e);
                    if said.as_deref() != Some(kind.as_str()) {
                        tracing::warn!(
                            errors = watch_errors,
                            "kubernetes: watching pods of {}: {} (retried with backoff; said \
                             again only when the error changes, and when it recovers)",
                            opts.node,
                            watch_error_text(&e)
                        );
                        said = Some(kind);
                    }
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
    /// Every change of the set is handed to `events` (when given) and kept for
    /// [`Discovery::snapshot`].
    pub fn start(
        opts: DiscoveryOptions,
        mut events: Option<EventSink>,
    ) -> Result<Discovery, KubeError> {
        if opts.node.trim().is_empty() {
            return Err(KubeError::NoNode);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| KubeError::Runtime(e.to_string()))?;
        let client = rt.block_on(client_bounded(opts.kubeconfig.as_deref(), opts.bounds))?;
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
                        if let Some(sink) = events.as_mut() {
                            sink(ev);
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
