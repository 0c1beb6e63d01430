//! The agent on a Linux host: the control loop ([`Controller::step`] over a [`LinuxNode`]) at
//! the policy's cadence, with the control socket, the metrics endpoint, BE supervision, the
//! state file and the exit action around it. Start-up is in [`start`], the exit action in
//! [`exit`], the record/publish phases in [`publish`].

pub mod advertise;
mod decision_log;
mod distinct_files;
mod earlier;
mod exit;
mod follow;
pub mod held_off;
mod host_steps;
mod kube;
mod lc_events;
mod lc_identity;
mod lc_sources;
mod loops;
mod on_host;
mod publish;
mod requests;
mod start;
mod start_be;
mod start_files;
mod start_locks;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_host::doctor::{probe_with, ProbeOptions};
use headroom_host::{HostError, LinuxHost};
use headroom_types::control::{
    ActuatorsStatus, AgentStatus, BeCommandStatus, DisabledActuator, LcStatus, ReasonAt,
};
use headroom_types::GroupPath;

use crate::linux_node::LinuxNode;
use crate::publish::control::{ControlError, Request, Requests, Response};
use crate::publish::reaction_log::ReactionLog;
use crate::sensors::idle_wake::{self, Cause, EventSchedule, IdleEventSource, Woken};
use crate::sensors::lc_signal::{SignalCell, StopFlag};
use crate::sensors::SLOW_PERIOD;
use crate::state::{self, AgentState, OriginalValue, StateError, StateLock, STATE_VERSION};
use crate::supervisor::{LaunchError, Supervised};
use headroom_control::actuation::{ActuationError, ManagedGroups};
use headroom_control::config::IdleSensing;
use headroom_control::config::{Config, ConfigError};
use headroom_control::controller::Controller;
use headroom_control::decision::{tick_time, CtlEvent};
use headroom_control::node::NodeError;
use headroom_control::policy::{MachineInfo, Mechanism};
use headroom_host::idle_bpf::monotonic_ns;
use headroom_load::clock::unix_ms;

pub use lc_events::{LcEventSender, LcEvents, ReaderGone};
pub use publish::DecisionLog;
use publish::Publisher;

/// How often knobs are read back to detect drift (in between, differences are computed against
/// what was last applied; reading every knob each 1 ms tick would cost more than the policy).
pub const VERIFY_PERIOD: Duration = Duration::from_millis(100);
/// The same while event-driven: the periodic tick is the steady host's whole cost, and reading
/// every knob back was about a third of it (9 of its ~20 syscalls on the benchmark's v1 host).
/// A knob someone else changes is repaired within this; the agent's own writes are not
/// affected (they go out on the tick that decides them).
pub const EVENT_VERIFY_PERIOD: Duration = Duration::from_secs(1);
/// How often the state file is rewritten at most (only when something it records changed).
const STATE_PERIOD: Duration = Duration::from_secs(1);

/// Everything that can stop the agent, naming what and where.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("host: {0}")]
    Host(Box<HostError>),
    #[error("actuating: {0}")]
    Actuation(Box<ActuationError>),
    #[error("host: {0}")]
    Node(Box<NodeError>),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("control socket: {0}")]
    Control(#[from] ControlError),
    #[error(transparent)]
    Feed(#[from] crate::sensors::feed::FeedError),
    #[error("launching: {0}")]
    Launch(Box<LaunchError>),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The decision log could not be opened at start (a file that is not a decision log, a
    /// FIFO in a directory others can write, a missing directory): a path the operator gave,
    /// so a usage error (exit 2) as the other config paths naming what the host holds.
    #[error("opening the decision log {path}: {source}")]
    DecisionLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The exit action did not complete; the state file is kept for the next start.
    #[error("exit action failed: {0}; the state file is kept so the next start finishes it")]
    Exit(String),
}

impl From<HostError> for AgentError {
    fn from(e: HostError) -> Self {
        AgentError::Host(Box::new(e))
    }
}

impl From<ActuationError> for AgentError {
    fn from(e: ActuationError) -> Self {
        AgentError::Actuation(Box::new(e))
    }
}

impl From<NodeError> for AgentError {
    fn from(e: NodeError) -> Self {
        AgentError::Node(Box::new(e))
    }
}

impl From<LaunchError> for AgentError {
    fn from(e: LaunchError) -> Self {
        AgentError::Launch(Box::new(e))
    }
}

impl AgentError {
    /// True for errors in what the user gave (exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            AgentError::Config(_)
                | AgentError::DecisionLog { .. }
                | AgentError::Control(ControlError::Refused { .. })
                | AgentError::Feed(crate::sensors::feed::FeedError::Refused { .. })
                | AgentError::State(
                    StateError::Held { .. }
                        | StateError::NotAStateFile { .. }
                        | StateError::NotTrusted { .. }
                        | StateError::DirNotTrusted { .. }
                        | StateError::LockDirNotTrusted { .. }
                        | StateError::NotALockFile { .. },
                )
        )
    }
}

/// How to run the agent.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub config: Config,
    /// Decide and log, write nothing.
    pub dry_run: bool,
    /// Decision log (overrides `api.decision_log`).
    pub decision_log: Option<PathBuf>,
    /// Filesystem root of the host ("/" in production).
    pub root: PathBuf,
    /// Stop after this long (benchmarks); `None` = until a signal.
    pub run_for: Option<Duration>,
    /// Install signal handlers (off when embedded in a test or benchmark).
    pub handle_signals: bool,
    /// `[kubernetes] discover`: the LC sets the discovery publishes (the binary connects
    /// headroom-kube here; without it a discovery config runs with the holder service alone,
    /// BE held).
    pub discovery: Option<LcEvents>,
    /// `[kubernetes] advertise`: where the advertised value goes (the binary connects
    /// headroom-kube's publisher; without it nothing is advertised).
    pub advertise: Option<advertise::AdvertiseLink>,
    /// The config file the agent was started from (named in its group locks).
    pub config_path: Option<PathBuf>,
}

impl AgentOptions {
    pub fn new(config: Config) -> AgentOptions {
        AgentOptions {
            config,
            dry_run: false,
            decision_log: None,
            root: PathBuf::from("/"),
            run_for: None,
            handle_signals: true,
            discovery: None,
            advertise: None,
            config_path: None,
        }
    }
}

/// What the agent did, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSummary {
    pub ticks: u64,
    pub writes: u64,
    pub write_errors: u64,
    pub exit_action: String,
    /// Why the event-driven loop woke (all zero when polling).
    pub wakes: WakeCounts,
}

/// The event-driven loop's wake-ups by cause: a steady host should see only `periodic`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WakeCounts {
    /// An idle-count crossing (or an overrun) in the ring buffer.
    pub event: u64,
    /// A control request (the doorbell in the same epoll set).
    pub request: u64,
    /// The periodic duty (or slow work, or the run's end) was due.
    pub timeout: u64,
}

/// Signals the agent answers: TERM, INT and QUIT stop it (running `on_exit`); HUP, USR1 and
/// USR2 are logged and otherwise ignored — their default action would kill the agent without
/// its exit action.
#[derive(Debug, Clone, Default)]
pub struct Signals {
    stop: Arc<AtomicBool>,
    ignored: Arc<AtomicBool>,
}

impl Signals {
    pub fn install() -> Signals {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
        let s = Signals::default();
        for sig in [SIGTERM, SIGINT, SIGQUIT] {
            if let Err(e) = signal_hook::flag::register(sig, s.stop.clone()) {
                tracing::warn!(signal = sig, error = %e, "installing a signal handler");
            }
        }
        for sig in [SIGHUP, SIGUSR1, SIGUSR2] {
            if let Err(e) = signal_hook::flag::register(sig, s.ignored.clone()) {
                tracing::warn!(signal = sig, error = %e, "installing a signal handler");
            }
        }
        s
    }

    fn stop_requested(&self) -> bool {
        if self.ignored.swap(false, Ordering::Relaxed) {
            tracing::warn!("ignored SIGHUP/SIGUSR1/SIGUSR2 (stop the agent with SIGTERM)");
        }
        self.stop.load(Ordering::Relaxed)
    }
}

/// A running agent.
pub struct Agent {
    config: Config,
    options: AgentOptions,
    machine: MachineInfo,
    node: LinuxNode,
    controller: Controller,
    groups: ManagedGroups,
    supervised: Vec<Supervised>,
    lc_threads: crate::sensors::lc_threads::LcThreads,
    /// The BE groups' egress classifiers (links: detached when the agent dies).
    #[allow(dead_code)]
    egress_classifiers: Vec<headroom_host::bpf::EgressPriority>,
    /// Groups the agent created (ancestors first), removed on exit once empty.
    created_groups: Vec<GroupPath>,
    /// The directories this start made for its groups, in each hierarchy (removed at exit
    /// where they hold nothing: see `host_steps::remove_made_dirs`).
    created_dirs: Vec<(GroupPath, PathBuf)>,
    /// LC processes moved into the LC group: pid → their group directories before.
    lc_origins: BTreeMap<u32, Vec<String>>,
    /// LC commands this agent launched (`[[lc]] command`), left running on exit.
    lc_children: Vec<host_steps::LcChild>,
    /// The earlier agent's BE records (its state file's `owned_pids`, `relay_pipes`,
    /// `be_found`), written on in this one's until the start has adopted or launched each BE
    /// command: a kill -9 or a failed restart meanwhile left a state file without them, and
    /// the next start killed the BE it would have adopted (hostile pass 28).
    inherited_be: Option<state::AgentState>,
    /// The LC commands last recorded as left running (`crate::lc_record`), kept while the
    /// agent runs: written again only when it changed.
    lc_recorded: Vec<crate::lc_record::LeftLc>,
    publisher: Publisher,
    requests: Option<Requests>,
    stop: StopFlag,
    signals: Option<Signals>,
    threads: Vec<JoinHandle<()>>,
    signal_cells: Vec<(String, Arc<SignalCell>)>,
    started: Instant,
    state_written: Option<Instant>,
    /// When the LCs and BE groups were last looked for (see `follow`), and what was done.
    followed_at: Option<Instant>,
    targets_followed: std::collections::VecDeque<(u64, String)>,
    /// The BE commands' processes seen in their groups at the last look: pid → (group, start
    /// time), so one moved out after its parent died is still found (see `follow`).
    be_members: BTreeMap<u32, (GroupPath, u64)>,
    /// When the state file's presence was last checked (a removed one is written again).
    state_checked: Option<Instant>,
    metrics_addr: Option<std::net::SocketAddr>,
    /// `[kubernetes] discover`: the discovered services and the last set.
    kube: Option<kube::KubeLive>,
    /// `[kubernetes] advertise`: the advertiser and its edge.
    advertise: Option<advertise::AdvertiseLive>,
    /// Held for the agent's life: no second agent manages the same groups.
    state_lock: Option<StateLock>,
    /// One agent per group: every managed group's lock, held for the agent's life.
    group_lock: Option<state::GroupLock>,
    /// What the follower remembers of the processes found as LCs (whose may be taken).
    lc_follow: lc_identity::LcFollow,
    /// A state file this start could not read, moved here (said in `ctl status`).
    state_set_aside: Option<PathBuf>,
    /// How often the running loop ticks (`ctl status`); `None` before `run`.
    tick_interval: Option<Duration>,
    /// The last failure to write the state file, until a write goes through (`ctl status`).
    state_write_error: Option<String>,
    /// What the start did with what an earlier agent left (`ctl status`): groups its config
    /// dropped released, its BE found without a state file stopped.
    start_actions: Vec<String>,
}

/// What this host offers the policies, limited to what the node actuates (a mechanism the
/// doctor finds but this agent does not drive is reported as missing, loudly).
pub fn machine_info(host: &LinuxHost, node: &LinuxNode) -> MachineInfo {
    let cpus: Vec<u32> = host
        .topology()
        .map(|t| t.cpus_online.to_vec())
        .unwrap_or_else(|_| {
            (0..std::thread::available_parallelism().map_or(1, |n| n.get() as u32)).collect()
        });
    let doctor = probe_with(
        host,
        ProbeOptions {
            sched_syscalls: false,
            tc_netns: false,
            scratch_cgroup: false,
        },
    );
    // What doctor found, with the optional actuators' parts left for the node to narrow
    // (it knows whether each one runs) and RAPL only where the power sensor opens.
    let mut mechanisms = doctor.mechanisms.available();
    for m in [
        Mechanism::ResctrlL3,
        Mechanism::ResctrlMba,
        Mechanism::Cpufreq,
        Mechanism::TcHtb,
    ] {
        mechanisms.set(m, true);
    }
    mechanisms.set(
        Mechanism::Rapl,
        crate::sensors::PowerSensor::open(host).is_some(),
    );
    node.limit_mechanisms(&mut mechanisms);
    let pid_max = headroom_host::sysctl::pid_max(host.root())
        .map_err(|e| {
            tracing::warn!(
                "kernel.pid_max unread ({e}): the default safety.be_pids_max assumes 32768"
            )
        })
        .ok();
    let threads_max = headroom_host::sysctl::threads_max(host.root())
        .map_err(|e| {
            tracing::warn!("kernel.threads-max unread ({e}): the default safety.be_pids_max takes kernel.pid_max alone")
        })
        .ok();
    MachineInfo {
        cpus,
        sockets: Vec::new(),
        llc_ways: node.llc_ways(),
        mechanisms,
        pid_max,
        threads_max,
    }
}

/// The machine-description file written beside a decision log (replay uses it).
pub fn machine_sidecar(log: &Path) -> PathBuf {
    let mut s = log.as_os_str().to_owned();
    s.push(".machine.json");
    PathBuf::from(s)
}

impl Agent {
    /// The bound metrics address (when enabled).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// The state file's content now.
    fn state(&self) -> Option<AgentState> {
        let act = self.controller.actuation()?;
        let inherited_pids: Vec<u32> = self
            .inherited_be_records(|e| e.owned_pids.clone())
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        Some(AgentState {
            version: STATE_VERSION,
            pid: std::process::id(),
            written_unix_ms: unix_ms(),
            originals: act
                .original()
                .iter()
                .map(|(k, v)| OriginalValue {
                    knob: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            original: BTreeMap::new(),
            last_allocation: self.controller.last_applied().cloned(),
            owned_pids: self
                .supervised
                .iter()
                .filter_map(|s| s.pid().map(|p| (s.name.clone(), p)))
                .chain(self.inherited_be_records(|e| e.owned_pids.clone()))
                .collect(),
            lc_threads: self.lc_threads.state().clone(),
            created_groups: self.created_groups.clone(),
            lc_origins: self.lc_origins.clone(),
            be_found: self
                .supervised
                .iter()
                .filter(|s| !s.spared.is_empty())
                .map(|s| (s.name.clone(), s.spared.iter().map(|&p| p as u32).collect()))
                .chain(self.inherited_be_records(|e| e.be_found.clone()))
                .collect(),
            relay_pipes: self
                .supervised
                .iter()
                .filter_map(|s| Some((s.pid()?, s.relay_pipe?)))
                .chain(
                    self.inherited_be
                        .iter()
                        .flat_map(|e| e.relay_pipes.iter())
                        .filter(|(p, _)| inherited_pids.contains(p))
                        .map(|(p, id)| (*p, *id)),
                )
                .collect(),
            lc_groups: self.config.lcs.iter().map(|l| l.cgroup.clone()).collect(),
            be_groups: self
                .config
                .be
                .iter()
                .map(|b| {
                    // What it runs: this agent's once it launched or adopted it; until then
                    // the earlier agent's record.
                    let argv = match self.supervised.iter().find(|s| s.name == b.name) {
                        Some(s) => Some(s.command.clone()),
                        None => self
                            .inherited_be_records(|p| p.be_groups.clone())
                            .into_iter()
                            .find(|(name, _)| *name == b.name)
                            .and_then(|(_, r)| r.argv),
                    };
                    let rec = state::RecordedBe {
                        group: b.cgroup.clone(),
                        command: !b.command.is_empty(),
                        argv,
                    };
                    (b.name.clone(), rec)
                })
                .collect(),
        })
    }

    /// The earlier agent's records `of` it for each BE name this start has not yet adopted
    /// or launched (`inherited_be`).
    fn inherited_be_records<T>(
        &self,
        of: impl Fn(&state::AgentState) -> BTreeMap<String, T>,
    ) -> Vec<(String, T)> {
        self.inherited_be
            .iter()
            .flat_map(of)
            .filter(|(name, _)| !self.supervised.iter().any(|s| s.name == *name))
            .collect()
    }

    fn write_state(&mut self) -> Result<(), AgentError> {
        if self.options.dry_run {
            return Ok(());
        }
        let Some(st) = self.state() else {
            return Ok(());
        };
        if let Err(e) = state::store(Path::new(&self.config.safety.state_file), &st) {
            // Said in `ctl status` and counted until a write goes through: a kill -9 meanwhile
            // leaves the next start without this record (fifth hostile pass).
            self.publisher.metrics.state_write_errors.inc();
            self.state_write_error = Some(e.to_string());
            return Err(e.into());
        }
        if self.state_write_error.take().is_some() {
            tracing::info!(state = %self.config.safety.state_file, "the state file is written again");
        }
        self.publisher.state_dirty = false;
        self.state_written = Some(Instant::now());
        Ok(())
    }
}
