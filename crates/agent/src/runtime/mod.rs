//! The agent on a Linux host: the control loop ([`Controller::step`] over a [`LinuxNode`]) at
//! the policy's cadence, with the control socket, the metrics endpoint, BE supervision, the
//! state file and the exit action around it. Start-up is in [`start`], the exit action in
//! [`exit`], the record/publish phases in [`publish`].

mod exit;
mod publish;
mod start;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headroom_host::doctor::{probe_with, ProbeOptions};
use headroom_host::{GroupPath, HostError, LinuxHost};
use headroom_types::control::{
    ActuatorsStatus, AgentStatus, BeCommandStatus, DisabledActuator, LcStatus, ReasonAt,
};

use crate::actuation::linux::LinuxNode;
use crate::actuation::{ActuationError, ManagedGroups};
use crate::config::IdleSensing;
use crate::config::{Config, ConfigError};
use crate::control::{ControlError, Pending, Request, Response};
use crate::controller::Controller;
use crate::decision::{tick_time, CtlEvent};
use crate::idle_wake::{self, Cause, EventSchedule, IdleEventSource};
use crate::lc_signal::{SignalCell, StopFlag};
use crate::node::NodeError;
use crate::policy::{MachineInfo, Mechanism};
use crate::reaction_log::ReactionLog;
use crate::sensors::SLOW_PERIOD;
use crate::state::{self, AgentState, OriginalValue, StateError, StateLock, STATE_VERSION};
use crate::supervisor::{LaunchError, Supervised};
use headroom_host::idle_bpf::monotonic_ns;

pub use publish::DecisionLog;
use publish::Publisher;

/// How often knobs are read back to detect drift (in between, differences are computed against
/// what was last applied; reading every knob each 1 ms tick would cost more than the policy).
pub const VERIFY_PERIOD: Duration = Duration::from_millis(100);
/// How often the state file is rewritten at most (only when something it records changed).
const STATE_PERIOD: Duration = Duration::from_secs(1);

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

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
    #[error("launching: {0}")]
    Launch(Box<LaunchError>),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
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
        matches!(self, AgentError::Config(_))
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
    lc_threads: crate::lc_threads::LcThreads,
    /// The BE groups' egress classifiers (links: detached when the agent dies).
    #[allow(dead_code)]
    egress_classifiers: Vec<headroom_host::bpf::EgressPriority>,
    /// Groups the agent created (ancestors first), removed on exit once empty.
    created_groups: Vec<GroupPath>,
    /// LC processes moved into the LC group: pid → their group directories before.
    lc_origins: BTreeMap<u32, Vec<String>>,
    lc_child: Option<std::process::Child>,
    publisher: Publisher,
    requests: Option<Receiver<Pending>>,
    stop: StopFlag,
    signals: Option<Signals>,
    threads: Vec<JoinHandle<()>>,
    signal_cells: Vec<(String, Arc<SignalCell>)>,
    started: Instant,
    state_written: Option<Instant>,
    metrics_addr: Option<std::net::SocketAddr>,
    /// Held for the agent's life: no second agent manages the same groups.
    _lock: Option<StateLock>,
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
    MachineInfo {
        cpus,
        sockets: Vec::new(),
        llc_ways: node.llc_ways(),
        mechanisms,
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

    /// Runs until a stop signal (or `run_for`), then performs the exit action. Woken by the
    /// BPF idle program's threshold crossings where it works (see [`crate::idle_wake`]),
    /// polling at the policy's interval otherwise.
    pub fn run(mut self) -> Result<RunSummary, AgentError> {
        let interval = self
            .controller
            .policy()
            .poll_interval()
            .max(Duration::from_micros(100));
        let deadline = self.options.run_for.map(|d| Instant::now() + d);
        set_timer_slack_ns(1000);
        raise_control_loop_priority(self.config.safety.agent_fifo_priority);
        let mut reactions = ReactionLog::from_env();
        if self.start_idle_sensing(&reactions) {
            self.run_on_events(interval, deadline, &mut reactions);
        } else {
            self.run_polling(interval, deadline, &mut reactions);
        }
        if let Some(c) = self.node.sensors().and_then(|s| s.idle_event_counters()) {
            reactions.record_counters(c.events, c.suppressed, c.overruns);
        }
        reactions.flush();
        self.shutdown()
    }

    /// Event-driven where configured and possible; says which and why (log, `ctl status`).
    fn start_idle_sensing(&mut self, reactions: &ReactionLog) -> bool {
        let want = self.config.sensors.idle_sensing;
        let thresholds =
            idle_wake::thresholds(&self.config, self.controller.policy().idle_buffer());
        let policy = self.config.policy.kind.as_str();
        let Some(sensors) = self.node.sensors_mut() else {
            return false;
        };
        let reason = match (want, thresholds) {
            (IdleSensing::Poll, Some((low, high))) => {
                if reactions.enabled() {
                    // still timestamp the crossings, for the benchmark's side-by-side figures
                    let _ = sensors.arm_idle_thresholds(low, high);
                }
                "sensors.idle_sensing = \"poll\"".to_owned()
            }
            (IdleSensing::Poll, None) => "sensors.idle_sensing = \"poll\"".to_owned(),
            (IdleSensing::Events, None) => {
                format!("policy {policy} does not decide on the idle-CPU count")
            }
            (IdleSensing::Events, Some((low, high))) => {
                match sensors.enable_idle_events(low, high) {
                    Ok(()) => {
                        tracing::info!(low, high, "idle sensing: events (BPF ring buffer)");
                        return true;
                    }
                    Err(why) => why,
                }
            }
        };
        if want == IdleSensing::Events && thresholds.is_some() {
            tracing::warn!(reason = %reason, "idle sensing falls back to polling");
        } else {
            tracing::info!(reason = %reason, "idle sensing: polling");
        }
        sensors.set_idle_polling(&reason);
        false
    }

    /// The polling loop: a tick every `interval`.
    fn run_polling(
        &mut self,
        interval: Duration,
        deadline: Option<Instant>,
        reactions: &mut ReactionLog,
    ) {
        let mut next = Instant::now();
        let mut slow_due = Instant::now();
        loop {
            if self.signals.as_ref().is_some_and(Signals::stop_requested) {
                break;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            if now < next {
                std::thread::sleep((next - now).min(Duration::from_millis(100)));
                continue;
            }
            next += interval;
            if next < now {
                next = now + interval;
            }
            let crossed = match self.node.sensors_mut() {
                Some(s) if reactions.enabled() => s.drain().first_low_ktime_ns,
                _ => None,
            };
            let awake = monotonic_ns();
            if self.tick(now) {
                if let Some(k) = crossed {
                    reactions.record("poll", k, awake, monotonic_ns());
                }
            }
            if now >= slow_due {
                slow_due = now + SLOW_PERIOD;
                self.slow_work(now);
            }
            self.handle_requests();
        }
    }

    /// The event-driven loop: asleep in `epoll_wait` until a crossing or the next periodic
    /// duty (the policy's interval, at least [`idle_wake::EVENT_PERIOD`]; slow work).
    fn run_on_events(
        &mut self,
        interval: Duration,
        deadline: Option<Instant>,
        reactions: &mut ReactionLog,
    ) {
        let mut schedule = EventSchedule::new(interval, Instant::now());
        let mut slow_due = Instant::now();
        tracing::info!(
            period_ms = schedule.period().as_millis() as u64,
            "event-driven loop"
        );
        loop {
            if self.signals.as_ref().is_some_and(Signals::stop_requested) {
                break;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            let other_due = deadline.map_or(slow_due, |d| d.min(slow_due));
            let Some(source) = self.node.sensors_mut().and_then(|s| s.idle_event_source()) else {
                // never a silent stop of sensing
                tracing::error!("idle events unavailable; polling from now on");
                return self.run_polling(interval, deadline, reactions);
            };
            let (cause, drained) = schedule.wait_on(source, now, other_due, Instant::now);
            let awake = monotonic_ns();
            let now = Instant::now();
            if let Some(cause) = cause {
                if drained.overrun {
                    tracing::warn!("idle events lost (ring buffer full): re-read the idle count");
                }
                if self.tick(now) && cause == Cause::Event {
                    if let Some(k) = drained.first_low_ktime_ns {
                        reactions.record("events", k, awake, monotonic_ns());
                    }
                }
            }
            if now >= slow_due {
                slow_due = now + SLOW_PERIOD;
                self.slow_work(now);
            }
            self.handle_requests();
        }
    }

    /// One tick; true when it wrote a knob.
    fn tick(&mut self, now: Instant) -> bool {
        let t = tick_time(now.saturating_duration_since(self.started));
        let outcome = self.controller.step(&mut self.node, t, &mut self.publisher);
        // The policy's buffer moves (hybrid's outer loop, a `ctl set`): the kernel's
        // thresholds follow it (a map write only when they change).
        if let (Some((low, high)), Some(s)) = (
            idle_wake::thresholds(&self.config, self.controller.policy().idle_buffer()),
            self.node.sensors_mut(),
        ) {
            s.set_idle_thresholds(low, high);
        }
        self.publisher
            .metrics
            .loop_seconds
            .observe(now.elapsed().as_secs_f64());
        matches!(&outcome.actuation, Some(Ok(r)) if !r.writes.is_empty())
    }

    fn slow_work(&mut self, now: Instant) {
        let killing = self
            .publisher
            .last_allocation
            .as_ref()
            .is_some_and(|a| a.be_kill);
        let cg = self.node.cgroups().clone();
        if !killing {
            for s in &mut self.supervised {
                let before = s.restarts;
                s.check(&cg, now);
                if s.restarts > before {
                    self.publisher.metrics.be_restarts.inc();
                    self.publisher.state_dirty = true;
                }
            }
        }
        if let (Some(a), true) = (
            self.publisher.last_allocation.clone(),
            self.controller.is_actuating(),
        ) {
            if self.lc_threads.apply(&cg, &self.groups.lc, &a.lc) > 0 {
                self.publisher.state_dirty = true;
            }
            let be_cpus = a
                .be_cpus
                .as_ref()
                .map_or_else(|| self.machine.cpus.clone(), |c| c.to_vec());
            if let Some(s) = self.node.sensors_mut() {
                s.set_be_cpus(&be_cpus);
            }
            let tids: Vec<i32> = self
                .groups
                .be
                .iter()
                .flat_map(|g| cg.threads(g).unwrap_or_default())
                .collect();
            if let Err(e) = self.node.assign_be_tasks(&tids) {
                tracing::warn!(error = %e, "moving BE threads into their resctrl group");
            }
        }
        if let Some(log) = &mut self.publisher.log {
            log.flush();
        }
        if let Some(s) = self.node.sensors() {
            for (name, n) in s.errors() {
                self.publisher.metrics.sensor_errors_total(name, *n);
            }
        }
        for (name, cell) in &self.signal_cells {
            self.publisher
                .metrics
                .sensor_errors_total(name, cell.errors());
        }
        let state_due = self
            .state_written
            .is_none_or(|t| now.saturating_duration_since(t) >= STATE_PERIOD);
        if self.publisher.state_dirty && state_due {
            if let Err(e) = self.write_state() {
                tracing::error!(error = %e, "writing the state file");
            }
        }
    }

    /// The state file's content now.
    fn state(&self) -> Option<AgentState> {
        let act = self.controller.actuation()?;
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
                .collect(),
            lc_threads: self.lc_threads.state().clone(),
            created_groups: self.created_groups.clone(),
            lc_origins: self.lc_origins.clone(),
        })
    }

    fn write_state(&mut self) -> Result<(), AgentError> {
        if self.options.dry_run {
            return Ok(());
        }
        let Some(st) = self.state() else {
            return Ok(());
        };
        state::store(Path::new(&self.config.safety.state_file), &st)?;
        self.publisher.state_dirty = false;
        self.state_written = Some(Instant::now());
        Ok(())
    }

    fn handle_requests(&mut self) {
        let Some(rx) = &self.requests else {
            return;
        };
        let mut pending = Vec::new();
        while let Ok(p) = rx.try_recv() {
            pending.push(p);
        }
        for (req, reply) in pending {
            let response = self.answer(req);
            let _ = reply.send(response);
        }
    }

    fn t_ms(&self) -> u64 {
        tick_time(self.started.elapsed()).as_millis() as u64
    }

    fn answer(&mut self, req: Request) -> Response {
        match req {
            Request::Status => Response {
                ok: true,
                message: "ok".into(),
                status: Some(Box::new(self.status())),
            },
            Request::Pause => {
                let t_ms = self.t_ms();
                self.publisher.log_event(&CtlEvent::Pause { t_ms });
                self.controller.policy_mut().pause();
                self.publisher.metrics.paused.set(1.0);
                Response::ok("paused: holding the current allocation (safety rules still apply)")
            }
            Request::Resume => {
                let t_ms = self.t_ms();
                self.publisher.log_event(&CtlEvent::Resume { t_ms });
                self.controller.policy_mut().resume();
                self.publisher.metrics.paused.set(0.0);
                if !self.controller.is_actuating() && !self.options.dry_run {
                    self.controller.set_actuating(true);
                    self.publisher.metrics.actuating.set(1.0);
                    return Response::ok("resumed: actuating again");
                }
                Response::ok("resumed")
            }
            Request::Off => {
                let t_ms = self.t_ms();
                self.publisher.log_event(&CtlEvent::Off { t_ms });
                self.controller.set_actuating(false);
                self.publisher.metrics.actuating.set(0.0);
                self.lc_threads.restore(Some(self.node.cgroups()));
                match self.restore_originals() {
                    Ok(n) => Response::ok(format!(
                        "off: original settings restored ({n} writes); not actuating until `ctl resume`"
                    )),
                    Err(e) => {
                        Response::error(format!("off: actuation stopped, but restoring failed: {e}"))
                    }
                }
            }
            Request::Set { key, value } => {
                let mut updated = self.config.clone();
                if let Err(e) = updated.set(&key, &value) {
                    return Response::error(e.to_string());
                }
                match self.controller.policy_mut().set_param(&key, &value) {
                    Ok(()) => {
                        let t_ms = self.t_ms();
                        self.publisher.log_event(&CtlEvent::Set {
                            t_ms,
                            key: key.clone(),
                            value: value.clone(),
                        });
                        self.config = updated;
                        Response::ok(format!("{key} = {value}"))
                    }
                    Err(e) => Response::error(e.to_string()),
                }
            }
        }
    }

    /// Puts every original back (the kill switch, `on_exit = "restore"`); returns the writes.
    fn restore_originals(&mut self) -> Result<usize, ActuationError> {
        let Some(act) = self.controller.actuation_mut() else {
            return Ok(0);
        };
        let report = act.restore_original(&mut self.node);
        self.controller.forget_applied();
        self.publisher.state_dirty = true;
        report.map(|r| r.writes.len())
    }

    fn status(&self) -> AgentStatus {
        let slo = &self.config.lc.slo;
        let blank = crate::observation::Observation::default();
        let obs = self.node.sensors().map_or(&blank, |s| s.last());
        let p = &self.publisher;
        AgentStatus {
            policy: self.config.policy.kind.as_str().to_string(),
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            dry_run: self.options.dry_run,
            actuating: self.controller.is_actuating(),
            paused: self.controller.policy().is_paused(),
            ticks: p.summary.ticks,
            writes: p.summary.writes,
            write_errors: p.summary.write_errors,
            last_write_error: p.last_write_error.clone(),
            lc: LcStatus {
                group: self.groups.lc.to_string(),
                latency_us: obs.lc_latency_us,
                latency_age_ms: obs.lc_latency_age_ms,
                slo_us: slo.target_us,
                percentile: slo.percentile,
                slack: obs.slack(slo.target_us),
                qps: obs.lc_qps,
                load: obs.lc_load,
                cpus: obs.lc_cpus.clone(),
            },
            idle_cpus: obs.idle_cpu_count(0.5),
            be_groups: self.groups.be.iter().map(|g| g.to_string()).collect(),
            be_commands: self
                .supervised
                .iter()
                .map(|s| BeCommandStatus {
                    name: s.name.clone(),
                    pid: s.pid(),
                    restarts: s.restarts,
                })
                .collect(),
            allocation: p.last_allocation.clone(),
            last_reasons: p
                .reasons
                .iter()
                .rev()
                .map(|(t, r)| ReasonAt {
                    t_ms: *t,
                    reason: r.clone(),
                })
                .collect(),
            sensor_errors: self
                .node
                .sensors()
                .map(|s| {
                    s.errors()
                        .iter()
                        .map(|(k, v)| (k.to_string(), *v))
                        .collect()
                })
                .unwrap_or_default(),
            machine_cpus: self.machine.cpus.clone(),
            actuators: ActuatorsStatus {
                active: self.node.active().iter().map(|s| s.to_string()).collect(),
                disabled: self
                    .node
                    .disabled()
                    .iter()
                    .map(|(n, r)| DisabledActuator {
                        actuator: n.to_string(),
                        reason: r.clone(),
                    })
                    .collect(),
                applied: self
                    .controller
                    .actuation()
                    .map(|a| {
                        a.current()
                            .iter()
                            .filter(|(k, _)| !matches!(k, crate::actuation::Knob::Cgroup { .. }))
                            .map(|(k, v)| {
                                (crate::node::Node::describe(&self.node, k), v.to_string())
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            idle_sensor: self
                .node
                .sensors()
                .and_then(|s| s.idle_source())
                .unwrap_or("none")
                .to_string(),
            idle_sensing: self
                .node
                .sensors()
                .map_or("poll: no sensors", |s| s.idle_sensing())
                .to_string(),
            decision_log_lost_lines: p.log.as_ref().map(|l| l.lost),
        }
    }
}

/// Lowers this thread's timer slack so 1 ms sleeps end close to their deadline.
/// Puts the calling (control loop) thread above every CFS thread, so a BE or LC thread filling
/// every CPU cannot delay the tick that shrinks BE; nice -20 where FIFO is refused.
fn raise_control_loop_priority(fifo_priority: u8) {
    use headroom_host::sched::{set_sched_reset_on_fork, SchedPolicy};
    if fifo_priority == 0 {
        return;
    }
    // Reset on fork: BE and LC commands the supervisor launches must not inherit SCHED_FIFO.
    match set_sched_reset_on_fork(
        0,
        SchedPolicy::Fifo {
            priority: u32::from(fifo_priority),
        },
    ) {
        Ok(()) => tracing::info!(priority = fifo_priority, "control loop runs SCHED_FIFO"),
        Err(fifo) => match set_sched_reset_on_fork(
            0,
            SchedPolicy::Other {
                nice: -20,
                slice_ns: None,
            },
        ) {
            Ok(()) => {
                tracing::warn!(error = %fifo, "SCHED_FIFO refused; control loop runs at nice -20")
            }
            Err(nice) => {
                tracing::warn!(fifo = %fifo, nice = %nice, "control loop keeps its scheduling")
            }
        },
    }
}

fn set_timer_slack_ns(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches nothing else.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0);
    }
}
