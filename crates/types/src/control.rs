//! `headroom ctl` requests and responses (one JSON line each way on the agent's socket).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::allocation::Allocation;

/// A `ctl` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Pause,
    Resume,
    /// The kill switch: restore the original settings now and stop actuating.
    Off,
    Set {
        key: String,
        value: String,
    },
}

/// The answer: `ok`, a message, and for `status` the agent's status object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Box<AgentStatus>>,
}

impl Response {
    pub fn ok(message: impl Into<String>) -> Response {
        Response {
            ok: true,
            message: message.into(),
            status: None,
        }
    }

    pub fn error(message: impl Into<String>) -> Response {
        Response {
            ok: false,
            message: message.into(),
            status: None,
        }
    }
}

/// `ctl status`: what the agent is doing now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentStatus {
    pub policy: String,
    pub pid: u32,
    pub uptime_s: f64,
    pub dry_run: bool,
    pub actuating: bool,
    pub paused: bool,
    pub ticks: u64,
    pub writes: u64,
    pub write_errors: u64,
    pub last_write_error: Option<String>,
    pub lc: LcStatus,
    pub idle_cpus: Option<f64>,
    pub be_groups: Vec<String>,
    pub be_commands: Vec<BeCommandStatus>,
    /// The last allocation decided.
    pub allocation: Option<Allocation>,
    /// Newest first.
    pub last_reasons: Vec<ReasonAt>,
    /// What the agent did after someone else moved its targets (newest first): an
    /// LC restarted under a new pid moved into its group, a removed BE group created again
    /// (ms since the agent started).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets_followed: Vec<ReasonAt>,
    pub sensor_errors: BTreeMap<String, u64>,
    pub machine_cpus: Vec<u32>,
    pub actuators: ActuatorsStatus,
    /// How per-CPU idle is sensed (`bpf` or `proc_stat`) and why, when not by BPF.
    pub idle_sensor: String,
    /// How idle changes wake the agent: `events (…)` (BPF ring buffer) or `poll: <why>`.
    pub idle_sensing: String,
    /// Decision-log lines that could not be written (a full disk).
    pub decision_log_lost_lines: Option<u64>,
    /// Why BE is held off for lack of a trustworthy latency signal (`None`: it is not).
    pub be_held_off: Option<String>,
    /// How the latency source measures (the prober: its stamps and scheduling).
    pub latency_source: Option<String>,
    /// Every LC service (`[[lc]]`), in the config's order; the first is also `lc`. Extension:
    /// an older agent leaves it empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lcs: Vec<LcStatus>,
    /// The service whose slack bound the last decision (several `[[lc]]`; extension).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding_lc: Option<String>,
    /// `[kubernetes] discover`: the node's LC set as the agent last took it (the discovered
    /// LCs, refused and waiting pods, whether the first pod list has arrived).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<crate::discovery::LcSet>,
    /// `[kubernetes] advertise`: the advertised value, its floor, the horizon's figures, the
    /// last change and its reason, and what the API took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<crate::advertise::AdvertiseStatus>,
    /// The agent holding the group locks (this one; extension: `None` from an older agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<LockHolder>,
    /// Where this start set aside a state file it could not read (the originals it held are
    /// there to compare with what the agent took as originals).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_set_aside: Option<String>,
    /// How often the control loop ticks now, ms: the policy's interval (event-driven: the
    /// periodic duty), following a live change of the policy or its interval. Extension:
    /// `None` from an older agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick_interval_ms: Option<f64>,
    /// Why the state file could not be written last (`None` once a write goes through): a
    /// crash now leaves the next start without the originals and BE pids. Extension.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_write_error: Option<String>,
    /// What the start did with what an earlier agent left: groups its config dropped put back
    /// to their originals, its BE processes found without a state file stopped. Extension.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub start_actions: Vec<String>,
    /// Threads the agent holds to join at its exit beside its running sources' (its servers',
    /// and a stopped source's until it ends): a stopped discovered service's are joined once
    /// they end, so this does not grow with every pod that came and went. Extension: `None`
    /// from an older agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads_held: Option<u64>,
}

/// Who holds a group lock (one agent per group): written into each lock file by its holder,
/// named by a second agent's refusal, `ctl status` and `doctor`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LockHolder {
    pub pid: u32,
    /// The holder's config file (empty when it was not started from a file).
    pub config: String,
    pub socket: String,
    pub state_file: String,
    /// Every group directory it locked (each controller's path).
    pub groups: Vec<String>,
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let config = if self.config.is_empty() {
            "(not from a file)"
        } else {
            &self.config
        };
        write!(
            f,
            "pid {} (config {config}, socket {}, state file {})",
            self.pid, self.socket, self.state_file
        )
    }
}

/// The LC as the agent sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LcStatus {
    /// `[[lc]] name` (extension: empty from an older agent).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `[[lc]] priority` (higher = more important).
    #[serde(skip_serializing_if = "is_zero")]
    pub priority: i32,
    pub group: String,
    pub latency_us: Option<f64>,
    pub latency_age_ms: Option<u64>,
    pub slo_us: f64,
    pub percentile: f64,
    pub slack: Option<f64>,
    pub qps: Option<f64>,
    pub load: Option<f64>,
    pub cpus: Option<Vec<u32>>,
    /// Where `latency_us` came from when the LC has two latency sources (`source = "kernel"`
    /// with `fallback = "probe"`): both figures and the reason for a fallback; extension.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_sources: Option<LatencySources>,
    /// Which source gave `latency_us` (`kernel`, `probe`, `prometheus`, `feed`); extension.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_source: Option<String>,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

/// The kernel sensor and the prober side by side.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencySources {
    /// `kernel`, `probe` or `none`: which figure `latency_us` is now.
    pub chosen: String,
    /// Why it is not the kernel sensor's (empty when it is).
    pub reason: String,
    /// The kernel sensor's window percentile, µs (`None`: too few requests, or not running).
    pub kernel_us: Option<f64>,
    /// Requests the kernel sensor timed in its last window.
    pub kernel_requests: u64,
    /// Data segments on the LC's ports in that window: where well above the requests, requests
    /// arrive pipelined behind a pending one and only the first of each burst is timed (the
    /// figure then reads low), or requests span several segments.
    pub kernel_segments: u64,
    /// The prober's window percentile, µs (`None`: not running, or no window yet).
    pub probe_us: Option<f64>,
    /// Whether the prober runs now (it runs only while the kernel sensor's windows are short).
    pub probe_running: bool,
    /// Why the chosen figure may not judge an SLO violation (the prober's, where the kernel
    /// sensor's figure over the same seconds disagrees or holds too few requests to check it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untrusted: Option<String>,
}

/// A BE command the agent supervises.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BeCommandStatus {
    pub name: String,
    pub pid: Option<u32>,
    pub restarts: u64,
    /// How it last ended (`exit status: 1 after 0.9 s`), when it has: a command that dies at
    /// once (a `taskset` outside BE's cpuset) leaves BE "enabled" with nothing running.
    pub last_exit: Option<String>,
}

/// A decision reason and when it first appeared (ms since the agent started).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReasonAt {
    pub t_ms: u64,
    pub reason: String,
}

/// The optional actuators: which run, which do not (and why), and what they hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ActuatorsStatus {
    pub active: Vec<String>,
    pub disabled: Vec<DisabledActuator>,
    /// File (or command) → value last written, for the optional actuators.
    pub applied: BTreeMap<String, String>,
    /// Every BE knob as the kernel holds it (written or read back), file → value: after a
    /// failed plan this, not `allocation`, is what BE runs under. Extension: an older agent
    /// leaves it empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub be_held: BTreeMap<String, String>,
}

/// An actuator that does not run here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DisabledActuator {
    pub actuator: String,
    pub reason: String,
}
