//! The receiving end of the live feed (docs/architecture.md, contract 4): a running `headroom load --feed
//! SOCKET` connects to the agent's Unix socket and writes one JSON line per second with that
//! second's corrected-latency histogram and rate. The agent keeps the histograms over the SLO
//! window and publishes the window percentile (latency) and the last rate (load).

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_load::feed::{FeedLine, FEED_VERSION};
use headroom_load::stats::LatencyHist;

use crate::sensors::lc_signal::{LatencyWindow, SignalCell, StopFlag};

/// Where a feed publishes.
#[derive(Debug, Clone)]
pub struct FeedCells {
    /// Window percentile of the latency, µs.
    pub latency: Arc<SignalCell>,
    /// Requests per second of the last line.
    pub qps: Arc<SignalCell>,
}

/// Why a feed socket is not served.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// Its path names what is not the agent's to replace (exit 2: nothing was touched there).
    #[error("refusing to replace the feed socket {path:?}: {refusal}; give the feed socket a path of its own")]
    Refused {
        path: PathBuf,
        refusal: crate::socket_file::Refusal,
    },
    #[error("{what} the feed socket {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the feed socket (0600; a stale socket file is replaced) and serves it in a thread,
/// to root and the agent's user only.
pub fn spawn(
    path: &Path,
    percentile: f64,
    window_s: f64,
    min_samples: u64,
    cells: FeedCells,
    stop: StopFlag,
) -> Result<JoinHandle<()>, FeedError> {
    let io = |what| {
        move |source| FeedError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    // Only a stale socket is replaced: the feed's path deleted whatever it named (the
    // control socket, taking `ctl off` away; a config file) until the eighth hostile pass.
    crate::socket_file::clear_stale(path).map_err(|refusal| FeedError::Refused {
        path: path.to_path_buf(),
        refusal,
    })?;
    let listener = UnixListener::bind(path).map_err(io("binding"))?;
    headroom_host::net::chmod_socket(path, 0o600).map_err(io("setting the mode of"))?;
    listener
        .set_nonblocking(true)
        .map_err(io("setting non-blocking"))?;
    // The file bound here: the one to remove at the end (taken before the thread starts).
    let bound = (path.to_path_buf(), crate::socket_file::file_id(path));
    std::thread::Builder::new()
        .name("headroom-feed".into())
        .spawn(move || {
            serve(
                listener,
                bound,
                percentile,
                window_s,
                min_samples,
                cells,
                stop,
            )
        })
        .map_err(io("starting the thread of"))
}

fn serve(
    listener: UnixListener,
    (path, id): (PathBuf, Option<(u64, u64)>),
    percentile: f64,
    window_s: f64,
    min_samples: u64,
    cells: FeedCells,
    stop: StopFlag,
) {
    let window = Arc::new(Mutex::new(LatencyWindow::new(window_s, min_samples)));
    let epoch_unix_ms = headroom_load::clock::unix_ms();
    let epoch = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Some(uid) = stranger(&stream) {
                    tracing::warn!(socket = %path.display(), uid, "feed: refused a connection from another user");
                    continue;
                }
                let window = window.clone();
                let cells = cells.clone();
                let stop = stop.clone();
                let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = std::thread::Builder::new()
                    .name("headroom-feed-conn".into())
                    .spawn(move || {
                        let mut reader = BufReader::new(stream);
                        let mut line = String::new();
                        while !stop.load(Ordering::Relaxed) {
                            line.clear();
                            match reader.read_line(&mut line) {
                                Ok(0) => break,
                                Ok(_) => {
                                    if let Err(e) = ingest(
                                        &line,
                                        &window,
                                        percentile,
                                        &cells,
                                        epoch,
                                        epoch_unix_ms,
                                    ) {
                                        cells.latency.error("feed", e.to_string());
                                    }
                                }
                                Err(e)
                                    if e.kind() == std::io::ErrorKind::WouldBlock
                                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                                Err(e) => {
                                    cells.latency.error("feed", format!("reading: {e}"));
                                    break;
                                }
                            }
                        }
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                cells
                    .latency
                    .error("feed", format!("accepting on {}: {e}", path.display()));
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    // Only its own socket file (one put there since is not the agent's to remove).
    if crate::socket_file::file_id(&path) == id {
        let _ = std::fs::remove_file(&path);
    }
}

/// The peer's uid when it is neither root nor the agent's user (unknown: `u32::MAX`). The
/// socket is 0600 only from the chmod after bind(2): under a umask that lets others write,
/// another user could connect in between, stay connected and feed a low latency that grows BE
/// (thirteenth hostile pass); the control socket checks its peers the same way.
fn stranger(stream: &std::os::unix::net::UnixStream) -> Option<u32> {
    let me = headroom_host::process::effective_uid();
    match headroom_host::net::peer_uid(stream) {
        Some(uid) if uid == 0 || uid == me => None,
        other => Some(other.unwrap_or(u32::MAX)),
    }
}

/// Why a feed line was not taken.
#[derive(Debug, thiserror::Error)]
pub enum FeedLineError {
    #[error("bad feed line {line:.80}: {source}")]
    Json {
        line: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("feed version {found} (expected {FEED_VERSION})")]
    Version { found: u32 },
    #[error("feed histogram: {0}")]
    Histogram(#[from] headroom_load::stats::HistError),
}

/// Takes one feed line into the window and publishes the results.
fn ingest(
    line: &str,
    window: &Mutex<LatencyWindow>,
    percentile: f64,
    cells: &FeedCells,
    epoch: Instant,
    epoch_unix_ms: u64,
) -> Result<(), FeedLineError> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(());
    }
    let feed: FeedLine = serde_json::from_str(line).map_err(|source| FeedLineError::Json {
        line: line.to_string(),
        source,
    })?;
    if feed.version != FEED_VERSION {
        return Err(FeedLineError::Version {
            found: feed.version,
        });
    }
    let hist = LatencyHist::from_base64(&feed.hist)?;
    // The line's end time on the agent's monotonic clock (both clocks are this host's).
    let at = epoch + Duration::from_millis(feed.t_unix_ms.saturating_sub(epoch_unix_ms));
    let at = at.min(Instant::now());
    let sec = at.saturating_duration_since(epoch).as_secs();
    let p = {
        let mut w = window.lock().expect("feed window");
        w.add(sec, &hist);
        w.percentile_us(sec, percentile)
    };
    if let Some(p) = p {
        cells.latency.publish(p, at);
    }
    cells.qps.publish(feed.qps, at);
    Ok(())
}
