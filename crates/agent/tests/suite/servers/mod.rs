//! The agent's two servers on their own, as the publish tests run them: the control socket
//! (`ctl.sock` in a temp dir) and the metrics endpoint (a loopback port), each with its stop
//! flag and thread.
#![allow(dead_code)] // not every test that shares this module runs both servers

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use headroom_agent::publish::control::{self, Requests};
use headroom_agent::publish::metrics::Metrics;
use headroom_agent::publish::scrape_server::{self, SCRAPE_DEADLINE};

/// The control socket served in a thread: the temp dir holding it (removed when dropped), the
/// socket, the stop flag, where requests arrive, and the thread.
pub fn control() -> (
    tempfile::TempDir,
    PathBuf,
    Arc<AtomicBool>,
    Requests,
    JoinHandle<()>,
) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ctl.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let (requests, handle) = control::serve(&sock, stop.clone()).unwrap();
    (dir, sock, stop, requests, handle)
}

/// A fresh registry served on a loopback port with the agent's whole-request deadline: the
/// address, the stop flag, the thread, and the metrics the registry shows.
pub fn scrape() -> (SocketAddr, Arc<AtomicBool>, JoinHandle<()>, Metrics) {
    scrape_with_deadline(SCRAPE_DEADLINE)
}

/// [`scrape`] with the whole-request deadline `deadline`.
pub fn scrape_with_deadline(
    deadline: Duration,
) -> (SocketAddr, Arc<AtomicBool>, JoinHandle<()>, Metrics) {
    let (metrics, registry) = Metrics::new();
    let stop = Arc::new(AtomicBool::new(false));
    let (addr, handle) = scrape_server::serve_with_deadline(
        "127.0.0.1:0".parse().unwrap(),
        registry,
        stop.clone(),
        deadline,
    )
    .unwrap();
    (addr, stop, handle, metrics)
}
