//! `headroom serve`: a memcached-compatible server (ASCII and binary protocols) whose threading
//! and per-request work are under our control.
//!
//! ```no_run
//! use headroom_workloads::serve::{Dispatch, ServeConfig, Server};
//! let mut handle = Server::start(ServeConfig {
//!     port: 0, // any free port
//!     threads: 2,
//!     dispatch: Dispatch::Shared,
//!     ..ServeConfig::default()
//! })?;
//! println!("listening on {}", handle.addr());
//! handle.stop();
//! # Ok::<(), headroom_workloads::serve::ServeError>(())
//! ```

mod ascii;
pub mod binary;
mod conn;
mod event;
pub mod stats;
pub mod store;
pub mod work;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rand::RngCore;

pub use stats::StatsSnapshot;
pub use work::{ServiceTime, ServiceTimeError, FOOTPRINT_LINES_PER_REQUEST, MAX_SERVICE_US};

use stats::{Counters, ProcessFacts};
use store::Store;
use work::{Footprint, SyntheticWork};

/// What `version` answers. memcapable treats servers ≥ 1.6 as 1.6 (lenient `version foo`), and
/// we follow memcached 1.6's behaviour.
pub const VERSION: &str = "1.6.0-headroom";

/// How accepted connections reach worker threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dispatch {
    /// memcached's scheme: an acceptor assigns each connection to one thread, round-robin, for
    /// its lifetime. A thread that is descheduled delays every request of its connections.
    #[default]
    Static,
    /// Leverich & Kozyrakis' fix for thread load imbalance: all worker threads wait on one shared
    /// epoll set, every connection armed one-shot, so whichever thread is idle takes the next
    /// ready connection.
    Shared,
}

impl FromStr for Dispatch {
    type Err = ServeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "static" => Ok(Dispatch::Static),
            "shared" => Ok(Dispatch::Shared),
            other => Err(ServeError::Config(format!(
                "unknown dispatch {other:?}: expected \"static\" or \"shared\""
            ))),
        }
    }
}

impl fmt::Display for Dispatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dispatch::Static => "static",
            Dispatch::Shared => "shared",
        })
    }
}

/// Everything `headroom serve` can be told.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on (default 127.0.0.1).
    pub listen: IpAddr,
    /// TCP port; 0 picks a free one (see [`ServerHandle::addr`]).
    pub port: u16,
    /// Worker threads (memcached's `-t`).
    pub threads: usize,
    pub dispatch: Dispatch,
    /// Pin worker thread i to the i-th CPU of the process's allowed set (round-robin).
    pub pin: bool,
    /// Synthetic CPU work per request.
    pub service_time: Option<ServiceTime>,
    /// Size of the working set every request reads from (0 = none).
    pub footprint_mb: usize,
    /// Item memory limit (memcached's `-m`), MiB.
    pub memory_mb: usize,
    /// Largest item (key + value + overhead), bytes (memcached's `-I`, default 1 MiB).
    pub max_item_bytes: usize,
    /// Connections beyond this are closed at once (memcached's `-c`).
    pub max_connections: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 11211,
            threads: 4,
            dispatch: Dispatch::Static,
            pin: false,
            service_time: None,
            footprint_mb: 0,
            memory_mb: 64,
            max_item_bytes: 1 << 20,
            max_connections: 1024,
        }
    }
}

impl ServeConfig {
    /// Checks the values that have limits.
    pub fn validate(&self) -> Result<(), ServeError> {
        if self.threads == 0 || self.threads > 1024 {
            return Err(ServeError::Config(format!(
                "threads must be between 1 and 1024, got {}",
                self.threads
            )));
        }
        if self.memory_mb == 0 {
            return Err(ServeError::Config(
                "memory limit (-m) must be at least 1 MiB, got 0".into(),
            ));
        }
        if self.max_item_bytes < 1024 {
            return Err(ServeError::Config(format!(
                "max item size must be at least 1024 bytes, got {}",
                self.max_item_bytes
            )));
        }
        if self.max_connections == 0 {
            return Err(ServeError::Config(
                "max connections must be at least 1, got 0".into(),
            ));
        }
        if self.footprint_mb > 1 << 20 {
            return Err(ServeError::Config(format!(
                "footprint of {} MiB is too large",
                self.footprint_mb
            )));
        }
        Ok(())
    }
}

/// Errors starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid serve configuration: {0}")]
    Config(String),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Sys { what: String, source: nix::Error },
    #[error(transparent)]
    Topology(#[from] crate::topology::TopologyError),
}

/// One step of a protocol parser over a connection's input.
pub(crate) enum Step {
    /// The request is incomplete.
    NeedMore,
    /// A request was handled: drop `consumed` bytes, then skip `swallow` more (the body of a
    /// refused item), then close if asked.
    Done {
        consumed: usize,
        swallow: usize,
        close: bool,
    },
}

/// State shared by every thread of one server.
pub(crate) struct Shared {
    store: Mutex<Store>,
    pub counters: Counters,
    start: Instant,
    pub max_item_bytes: usize,
    max_value_cap: usize,
    work: SyntheticWork,
    config: ServeConfig,
}

impl Shared {
    /// Store time: milliseconds since start, never 0.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    pub fn lock_store(&self) -> MutexGuard<'_, Store> {
        // A panic in another worker leaves the store consistent enough to keep serving.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn max_value_len(&self, key_len: usize) -> usize {
        self.max_value_cap.saturating_sub(key_len)
    }

    pub fn stats_snapshot(&self) -> StatsSnapshot {
        let store = self.lock_store().counts();
        let (user, system) = process_cpu_times();
        let facts = ProcessFacts {
            pid: std::process::id(),
            uptime_s: self.start.elapsed().as_secs(),
            time_unix_s: unix_now_s() as u64,
            version: VERSION,
            threads: self.config.threads,
            rusage_user_s: user,
            rusage_system_s: system,
            max_connections: self.config.max_connections,
        };
        StatsSnapshot::build(&self.counters, store, &facts)
    }

    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let c = &self.config;
        vec![
            ("maxbytes", (c.memory_mb << 20).to_string()),
            ("maxconns", c.max_connections.to_string()),
            ("tcpport", c.port.to_string()),
            ("interface", c.listen.to_string()),
            ("num_threads", c.threads.to_string()),
            ("item_size_max", c.max_item_bytes.to_string()),
            ("evictions", "on".to_string()),
            ("cas_enabled", "yes".to_string()),
            ("dispatch", c.dispatch.to_string()),
            ("pin", if c.pin { "yes" } else { "no" }.to_string()),
            (
                "service_time",
                c.service_time
                    .as_ref()
                    .map(|s| s.spec().to_string())
                    .unwrap_or_else(|| "none".into()),
            ),
            ("footprint_mb", c.footprint_mb.to_string()),
        ]
    }
}

/// Per-worker context handed to the protocol code.
pub(crate) struct Ctx<'a> {
    pub shared: &'a Shared,
    pub rng: &'a mut dyn RngCore,
}

impl Ctx<'_> {
    /// Called once per executed request: counts it and does its synthetic work.
    pub fn request_done(&mut self) {
        Counters::bump(&self.shared.counters.requests);
        if !self.shared.work.is_empty() {
            self.shared.work.run(self.rng);
        }
    }
}

pub(crate) fn unix_now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn process_cpu_times() -> (f64, f64) {
    let cpu = headroom_host::process::cpu_split(headroom_host::process::Usage::Process);
    (cpu.user_s, cpu.sys_s)
}

/// Starts servers.
pub struct Server;

impl Server {
    /// Binds, spawns the worker threads and returns at once; the server runs until
    /// [`ServerHandle::stop`] (or the handle is dropped).
    pub fn start(config: ServeConfig) -> Result<ServerHandle, ServeError> {
        config.validate()?;
        let addr = SocketAddr::new(config.listen, config.port);
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|source| ServeError::Bind { addr, source })?;
        let local = listener.local_addr().map_err(|source| ServeError::Io {
            what: format!("reading the local address of the listener on {addr}"),
            source,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| ServeError::Io {
                what: format!("making the listener on {local} nonblocking"),
                source,
            })?;
        let limit = config.memory_mb << 20;
        let store = Store::new(limit, config.max_item_bytes);
        let max_value_cap = store.max_value_len(0);
        let work = SyntheticWork {
            service_time: config.service_time.clone(),
            footprint: (config.footprint_mb > 0).then(|| Footprint::new(config.footprint_mb)),
        };
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            counters: Counters::default(),
            start: Instant::now(),
            max_item_bytes: config.max_item_bytes,
            max_value_cap,
            work,
            config: config.clone(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let threads = event::spawn(listener, &config, Arc::clone(&shared), Arc::clone(&stop))?;
        Ok(ServerHandle {
            addr: local,
            stop,
            threads,
            shared,
        })
    }
}

/// A running server.
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl ServerHandle {
    /// The address it listens on (with the real port when started with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters `stats` would print now.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared.stats_snapshot()
    }

    /// Whether every thread is still running (false once one has exited or panicked).
    pub fn is_running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed) && self.threads.iter().all(|t| !t.is_finished())
    }

    /// Stops accepting, closes every connection and joins the threads (within ~100 ms).
    /// Idempotent; also run on drop.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
