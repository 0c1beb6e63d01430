//! `[api]`: the control socket, the metrics endpoint and the decision log.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

use crate::config::{invalid, relative_path, Problems};

/// `[api]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Control socket (0600).
    pub socket: String,
    /// Prometheus exposition address (default 127.0.0.1:9464); `""` = no metrics endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// Decision log file (one JSON line per decision); absent = none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_log: Option<String>,
    /// The decision log's size cap in MiB: past it the log is renamed `<log>.1` and started
    /// anew (at a 1 ms poll it grows ~1.5 MB/s; unbounded it would fill a disk in a day).
    #[serde(default = "default_decision_log_max_mb")]
    pub decision_log_max_mb: u64,
}

/// The control socket when the config names none (`headroom ctl`'s default too, and
/// deploy/headroom.toml's): one place.
pub const DEFAULT_SOCKET: &str = "/run/headroom/headroom.sock";

/// The longest control socket path (`sun_path` is 108 bytes with its NUL).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// The largest decision-log cap accepted, MiB (1 TiB).
const MAX_DECISION_LOG_MB: u64 = 1 << 20;

fn default_decision_log_max_mb() -> u64 {
    256
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            socket: DEFAULT_SOCKET.to_string(),
            metrics: Some("127.0.0.1:9464".to_string()),
            decision_log: None,
            decision_log_max_mb: default_decision_log_max_mb(),
        }
    }
}

impl ApiConfig {
    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, p: &mut Problems) {
        if self.socket.trim().is_empty() {
            p.push(invalid("api.socket", &self.socket, "must not be empty"));
        } else if self.socket.len() > MAX_SOCKET_PATH {
            // bind(2) refused it at start, after the config had passed (fifth hostile pass)
            p.push(invalid(
                "api.socket",
                &self.socket,
                format!("{} bytes: a Unix socket path holds at most {MAX_SOCKET_PATH}; give a shorter one", self.socket.len()),
            ));
        }
        if !self.socket.trim().is_empty() && !self.socket.starts_with('/') {
            p.push(relative_path("api.socket", &self.socket, "ctl"));
        }
        if let Some(log) = self.decision_log.as_deref().filter(|l| !l.starts_with('/')) {
            p.push(relative_path("api.decision_log", log, "a reader"));
        }
        if !(1..=MAX_DECISION_LOG_MB).contains(&self.decision_log_max_mb) {
            p.push(invalid(
                "api.decision_log_max_mb",
                self.decision_log_max_mb,
                "must be in 1..=1048576 MiB (0 would rotate the log at every line); leave api.decision_log out for no log",
            ));
        }
        if let Some(m) = &self.metrics {
            if m.parse::<SocketAddr>().is_err() {
                p.push(invalid(
                    "api.metrics",
                    m,
                    "expected IP:PORT, e.g. 127.0.0.1:9464",
                ));
            }
        }
    }
}
