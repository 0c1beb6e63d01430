//! The agent's main loop: sensors → policy → decision log → reconciler, at the policy's cadence,
//! with the control socket, the metrics endpoint, BE supervision, the state file and the exit
//! action around it.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use headroom_host::doctor::{probe_with, ProbeOptions};
use headroom_host::{Cgroups, GroupPath, HostError, LinuxHost};
use serde_json::json;

use crate::allocation::Allocation;
use crate::config::{Config, ConfigError, LatencySource, LoadSource, OnExit};
use crate::control::{self, ControlError, Pending, Request, Response};
use crate::decision::{tick_time, CtlEvent, DecisionRecord};
use crate::lc_signal::{SignalCell, StopFlag};
use crate::metrics::Metrics;
use crate::policy::{self, MachineInfo, Mechanisms, Policy};
use crate::reconcile::{ManagedGroups, ReconcileError, Reconciler};
use crate::scrape::PullKind;
use crate::sensors::{LcSignals, Sensors, SLOW_PERIOD};
use crate::state::{self, AgentState, StateError, STATE_VERSION};
use crate::supervisor::{LaunchError, Supervised};

/// How often knobs are read back to detect drift (in between, differences are computed against
/// what was last applied; reading every knob each 1 ms tick would cost more than the policy).
pub const VERIFY_PERIOD: Duration = Duration::from_millis(100);
/// How often the state file is rewritten at most (only when the applied allocation changed).
const STATE_PERIOD: Duration = Duration::from_secs(1);
/// Reasons kept for `ctl status`.
const REASONS_KEPT: usize = 10;

/// Set by SIGTERM / SIGINT.
static STOP_SIGNAL: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP_SIGNAL.store(true, Ordering::SeqCst);
}

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
    #[error("reconciling: {0}")]
    Reconcile(Box<ReconcileError>),
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
}

impl From<HostError> for AgentError {
    fn from(e: HostError) -> Self {
        AgentError::Host(Box::new(e))
    }
}

impl From<ReconcileError> for AgentError {
    fn from(e: ReconcileError) -> Self {
        AgentError::Reconcile(Box::new(e))
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
    /// Install SIGTERM/SIGINT handlers (off when embedded in a test or benchmark).
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

/// A running agent.
pub struct Agent {
    config: Config,
    options: AgentOptions,
    machine: MachineInfo,
    cgroups: Option<Cgroups>,
    groups: ManagedGroups,
    reconciler: Option<Reconciler>,
    sensors: Sensors,
    policy: Box<dyn Policy>,
    supervised: Vec<Supervised>,
    lc_threads: crate::lc_threads::LcThreads,
    /// resctrl ways/MBA, frequency caps and egress (where the host has them).
    actuators: crate::actuators::Actuators,
    /// The BE groups' egress classifiers (detached on drop).
    #[allow(dead_code)]
    egress_classifiers: Vec<headroom_host::bpf::EgressPriority>,
    last_actuator_error: Option<String>,
    /// Groups the agent created (ancestors first), removed on exit once empty.
    created_groups: Vec<GroupPath>,
    lc_child: Option<std::process::Child>,
    log: Option<BufWriter<std::fs::File>>,
    metrics: Metrics,
    requests: Option<Receiver<Pending>>,
    stop: StopFlag,
    threads: Vec<JoinHandle<()>>,
    signal_cells: Vec<(String, Arc<SignalCell>)>,
    started: Instant,
    started_unix_ms: u64,
    actuating: bool,
    last_allocation: Option<Allocation>,
    last_applied: Option<Allocation>,
    last_reason: String,
    reasons: VecDeque<(u64, String)>,
    last_write_error: Option<String>,
    state_dirty: bool,
    state_written: Option<Instant>,
    summary: RunSummary,
    metrics_addr: Option<std::net::SocketAddr>,
}

fn group(key: &str, path: &str) -> Result<GroupPath, AgentError> {
    GroupPath::new(path).map_err(|e| {
        AgentError::Config(ConfigError::Invalid {
            key: key.to_string(),
            value: format!("{path:?}"),
            reason: e.to_string(),
        })
    })
}

/// What this host offers the policies, limited to what the reconciler actuates (a mechanism
/// the doctor finds but this agent does not drive is reported as missing, loudly).
pub fn machine_info(host: &LinuxHost) -> MachineInfo {
    let cpus: Vec<u32> = host
        .topology()
        .map(|t| t.cpus_online.iter().map(|c| c as u32).collect())
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
    let m = &doctor.mechanisms;
    let extra = crate::actuators::Actuators::probe(host, &cpus);
    let (l3, mba, cpufreq) = extra.available();
    let rapl = crate::sensors::PowerSensor::open(host).is_some();
    MachineInfo {
        cpus,
        sockets: Vec::new(),
        llc_ways: extra.llc_ways().filter(|_| l3),
        mechanisms: Mechanisms {
            cpuset: m.cpuset.available,
            cpu_weight: m.cpu_weight.available,
            cpu_idle: m.cpu_idle.available,
            cpu_quota: m.cpu_quota.available,
            freeze: m.freeze.available,
            memory: m.memory.available,
            io: m.io.available,
            sched_attr: m.sched_attr.available,
            resctrl_l3: l3,
            resctrl_mba: mba,
            rapl,
            cpufreq,
            tc_htb: false,
        },
    }
}

/// The machine-description file written beside a decision log (replay uses it).
pub fn machine_sidecar(log: &Path) -> PathBuf {
    let mut s = log.as_os_str().to_owned();
    s.push(".machine.json");
    PathBuf::from(s)
}

impl Agent {
    /// Validates, creates/attaches the groups, launches commands, starts the sources, the
    /// control socket and the metrics endpoint.
    pub fn start(options: AgentOptions) -> Result<Agent, AgentError> {
        let config = options.config.clone();
        config.validate()?;
        let dry = options.dry_run;
        let host = LinuxHost::new(&options.root);
        let lc = group("lc.cgroup", &config.lc.cgroup)?;
        let be = config
            .be
            .iter()
            .enumerate()
            .map(|(i, b)| group(&format!("be[{i}].cgroup"), &b.cgroup))
            .collect::<Result<Vec<_>, _>>()?;
        let groups = ManagedGroups {
            lc: lc.clone(),
            be: be.clone(),
        };
        let cgroups: Option<Cgroups> = Some(host.cgroups()?);
        let stop: StopFlag = Arc::new(AtomicBool::new(false));
        if options.handle_signals {
            install_signal_handlers();
        }

        // Groups and processes.
        let state_path = PathBuf::from(&config.safety.state_file);
        let previous = if dry { None } else { state::load(&state_path)? };
        let mut lc_threads = crate::lc_threads::LcThreads::from_state(
            previous
                .as_ref()
                .map(|p| p.lc_threads.clone())
                .unwrap_or_default(),
        );
        let mut reconciler = None;
        let mut supervised = Vec::new();
        let mut lc_child = None;
        // resctrl / cpufreq / egress actuators; egress only where `[egress] device` names one.
        let probe_cpus: Vec<u32> = host
            .topology()
            .map(|t| t.cpus_online.iter().map(|c| c as u32).collect())
            .unwrap_or_default();
        let actuators = crate::actuators::Actuators::from_config(
            &host,
            &config,
            cgroups.as_ref(),
            &be,
            &probe_cpus,
        )
        .map_err(|e| {
            AgentError::Config(ConfigError::Invalid {
                key: "egress".into(),
                value: format!("{:?}", config.egress.device),
                reason: e.to_string(),
            })
        })?;
        let mut egress_classifiers = Vec::new();
        // A restarted agent keeps the list of groups the first one created.
        let mut created_groups: Vec<GroupPath> = previous
            .as_ref()
            .filter(|p| groups_match(p, &groups))
            .map(|p| {
                p.created_groups
                    .iter()
                    .filter_map(|g| GroupPath::new(g).ok())
                    .collect()
            })
            .unwrap_or_default();
        if let Some(cg) = &cgroups {
            if !dry {
                for g in std::iter::once(&lc).chain(be.iter()) {
                    let mut missing = Vec::new();
                    let mut at = Some(g.clone());
                    while let Some(p) = at.filter(|p| !p.is_root()) {
                        if !cg.exists(&p) && !created_groups.contains(&p) {
                            missing.push(p.clone());
                        }
                        at = p.parent();
                    }
                    cg.create(g)?;
                    created_groups.extend(missing.into_iter().rev());
                }
                // BE traffic is classified by a cgroup-BPF program on the BE groups' cgroup2
                // directories (on hybrid hosts made for it): skb->priority = the BE HTB class.
                if let Some(classid) = actuators.egress_be_classid() {
                    for g in &be {
                        let dir = cg.ensure_v2_group(g)?;
                        egress_classifiers
                            .push(headroom_host::bpf::EgressPriority::attach(&dir, classid)?);
                    }
                }
                // An LC already running SCHED_FIFO/RR (started under `chrt`) cannot join a v1
                // cpu group whose real-time budget is 0: the kernel answers EINVAL. Give the
                // group chain its budget first (restored on exit like the rest).
                if config
                    .lc
                    .pids
                    .iter()
                    .any(|&pid| has_realtime_thread(&options.root, pid as i32))
                {
                    lc_threads.ensure_rt_budget(cg, &lc)?;
                }
                for &pid in &config.lc.pids {
                    cg.move_process(&lc, pid as i32)?;
                }
                if !config.lc.command.is_empty() {
                    lc_child = Some(crate::supervisor::launch_in_group(
                        cg,
                        &config.lc.name,
                        &config.lc.command,
                        &lc,
                    )?);
                }
                let r = match &previous {
                    Some(prev) if groups_match(prev, &groups) => {
                        tracing::info!(state = %state_path.display(), "restarting from the state file: originals kept, reconciling");
                        let original = prev
                            .original
                            .iter()
                            .filter_map(|(k, v)| GroupPath::new(k).ok().map(|g| (g, v.clone())))
                            .collect();
                        Reconciler::with_original(cg.clone(), groups.clone(), original)
                    }
                    _ => Reconciler::attach(cg.clone(), groups.clone())?,
                };
                reconciler = Some(r);
                for (i, b) in config.be.iter().enumerate() {
                    if b.command.is_empty() {
                        continue;
                    }
                    let mut s = Supervised::new(
                        &b.name,
                        &b.command,
                        be[i].clone(),
                        b.restart,
                        b.restart_backoff_ms,
                        b.restart_backoff_max_ms,
                    );
                    let adopted = previous
                        .as_ref()
                        .and_then(|p| p.owned_pids.get(&b.name))
                        .is_some_and(|&pid| s.adopt(cg, pid));
                    if !adopted {
                        s.start(cg)?;
                    }
                    supervised.push(s);
                }
            }
        }

        // LC signal sources.
        let mut signals = LcSignals::default();
        let mut signal_cells = Vec::new();
        let mut threads = Vec::new();
        let slo = &config.lc.slo;
        let mut feeds: BTreeMap<String, crate::feed::FeedCells> = BTreeMap::new();
        let mut feed_cells = |socket: &str,
                              threads: &mut Vec<JoinHandle<()>>|
         -> Result<crate::feed::FeedCells, AgentError> {
            if let Some(c) = feeds.get(socket) {
                return Ok(c.clone());
            }
            let cells = crate::feed::FeedCells {
                latency: SignalCell::new(),
                qps: SignalCell::new(),
            };
            let t = crate::feed::spawn(
                Path::new(socket),
                slo.percentile,
                slo.window_s,
                slo.min_samples(),
                cells.clone(),
                stop.clone(),
            )
            .map_err(|source| AgentError::Io {
                what: "binding the feed socket",
                path: PathBuf::from(socket),
                source,
            })?;
            threads.push(t);
            feeds.insert(socket.to_string(), cells.clone());
            Ok(cells)
        };
        let spawn_err = |what: &'static str| {
            move |source| AgentError::Io {
                what,
                path: PathBuf::new(),
                source,
            }
        };
        if let Some(lat) = &config.lc.latency {
            let cell = match lat.source {
                LatencySource::Probe => {
                    let cell = SignalCell::new();
                    let mut spec = crate::probe::ProbeSpec::new(
                        lat.protocol,
                        lat.address.as_deref().unwrap_or_default(),
                        lat.rate_hz,
                        slo.percentile,
                        slo.window_s,
                    );
                    spec.min_samples = slo.min_samples();
                    let t = crate::probe::spawn(spec, cell.clone(), stop.clone())
                        .map_err(spawn_err("starting the prober"))?;
                    threads.push(t);
                    cell
                }
                LatencySource::Prometheus => {
                    let cell = SignalCell::new();
                    let kind = PullKind::PromHistogram {
                        url: lat.url.clone().unwrap_or_default(),
                        metric: lat.metric.clone().unwrap_or_default(),
                        percentile: slo.percentile,
                        window_s: slo.window_s,
                        min_samples: slo.min_samples(),
                    };
                    let t = crate::scrape::spawn(
                        kind,
                        Duration::from_secs(1),
                        cell.clone(),
                        stop.clone(),
                    )
                    .map_err(spawn_err("starting the scraper"))?;
                    threads.push(t);
                    cell
                }
                LatencySource::Feed => {
                    let socket = lat
                        .socket
                        .clone()
                        .unwrap_or_else(|| "/run/headroom-feed.sock".to_string());
                    feed_cells(&socket, &mut threads)?.latency
                }
            };
            signal_cells.push(("latency".to_string(), cell.clone()));
            signals.latency = Some(cell);
        }
        if let Some(load) = &config.lc.load {
            signals.peak_qps = Some(load.peak_qps);
            let address = load.address.clone().unwrap_or_default();
            let pull = |kind: PullKind, threads: &mut Vec<JoinHandle<()>>| {
                let cell = SignalCell::new();
                crate::scrape::spawn(kind, Duration::from_secs(1), cell.clone(), stop.clone())
                    .map(|t| {
                        threads.push(t);
                        cell
                    })
                    .map_err(spawn_err("starting the load source"))
            };
            let cell = match load.source {
                LoadSource::MemcacheStats => {
                    pull(PullKind::MemcacheStats { address }, &mut threads)?
                }
                LoadSource::RedisInfo => pull(PullKind::RedisInfo { address }, &mut threads)?,
                LoadSource::Prometheus => pull(
                    PullKind::PromCounter {
                        url: load.url.clone().unwrap_or_default(),
                        metric: load.metric.clone().unwrap_or_default(),
                    },
                    &mut threads,
                )?,
                LoadSource::Feed => {
                    let socket = load
                        .socket
                        .clone()
                        .or_else(|| config.lc.latency.as_ref().and_then(|l| l.socket.clone()))
                        .unwrap_or_else(|| "/run/headroom-feed.sock".to_string());
                    feed_cells(&socket, &mut threads)?.qps
                }
            };
            signal_cells.push(("load".to_string(), cell.clone()));
            signals.qps = Some(cell);
        }

        let mut machine = machine_info(&host);
        // Heracles Alg. 4 runs where the agent shapes a device's egress.
        machine.mechanisms.tc_htb = actuators.egress_be_classid().is_some();
        actuators.limit_mechanisms(&mut machine.mechanisms);
        let mut policy = policy::build(&config, &machine);
        let sensors = match &cgroups {
            Some(cg) => Sensors::new(
                &host,
                cg.clone(),
                lc.clone(),
                be.clone(),
                signals,
                config.sensors.idle,
            )?,
            None => unreachable!("host.cgroups() succeeded above"),
        };
        let mut sensors = sensors;
        if actuators.egress_be_classid().is_some() {
            let link = config.egress.link_mbit;
            let link_bits = if link > 0 {
                link * 1_000_000
            } else {
                std::fs::read_to_string(
                    host.root()
                        .join(format!("sys/class/net/{}/speed", config.egress.device)),
                )
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .unwrap_or(0)
                    * 1_000_000
            };
            sensors.set_egress(crate::sensors::EgressSensor::new(
                &config.egress.device,
                link_bits,
            )?);
        }

        // Decision log (+ the machine description replay needs).
        let log_path = options
            .decision_log
            .clone()
            .or_else(|| config.api.decision_log.as_ref().map(PathBuf::from));
        let log = match &log_path {
            Some(p) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|source| AgentError::Io {
                        what: "opening the decision log",
                        path: p.clone(),
                        source,
                    })?;
                let side = machine_sidecar(p);
                std::fs::write(
                    &side,
                    serde_json::to_vec_pretty(&machine).expect("machine serializes"),
                )
                .map_err(|source| AgentError::Io {
                    what: "writing",
                    path: side,
                    source,
                })?;
                Some(BufWriter::with_capacity(1 << 16, f))
            }
            None => None,
        };
        // The decision state is only ever read from the log.
        policy.set_explain(log.is_some());

        let (requests, t) = control::serve(Path::new(&config.api.socket), stop.clone())?;
        threads.push(t);
        let (metrics, registry) = Metrics::new();
        let mut metrics_addr = None;
        if let Some(addr) = &config.api.metrics {
            let addr: std::net::SocketAddr = addr.parse().map_err(|_| {
                AgentError::Config(ConfigError::Invalid {
                    key: "api.metrics".into(),
                    value: addr.clone(),
                    reason: "expected IP:PORT".into(),
                })
            })?;
            let (bound, t) =
                crate::metrics::serve(addr, registry, stop.clone()).map_err(|source| {
                    AgentError::Io {
                        what: "binding the metrics endpoint",
                        path: PathBuf::from(addr.to_string()),
                        source,
                    }
                })?;
            threads.push(t);
            metrics_addr = Some(bound);
        }
        metrics.actuating.set(if dry { 0.0 } else { 1.0 });

        let mut agent = Agent {
            last_applied: previous.as_ref().and_then(|p| p.last_allocation.clone()),
            config,
            options,
            machine,
            cgroups,
            groups,
            reconciler,
            sensors,
            policy,
            supervised,
            lc_threads,
            created_groups,
            actuators,
            egress_classifiers,
            last_actuator_error: None,
            lc_child,
            log,
            metrics,
            requests: Some(requests),
            stop,
            threads,
            signal_cells,
            started: Instant::now(),
            started_unix_ms: unix_ms(),
            actuating: !dry,
            last_allocation: None,
            last_reason: String::new(),
            reasons: VecDeque::new(),
            last_write_error: None,
            state_dirty: true,
            state_written: None,
            summary: RunSummary::default(),
            metrics_addr,
        };
        // A restart goes back to the last safe allocation at once, before the first decision.
        if let (Some(prev), Some(r)) = (agent.last_applied.clone(), agent.reconciler.as_mut()) {
            if let Err(e) = r.apply(&prev, true) {
                tracing::error!(error = %e, "could not re-apply the last safe allocation");
            }
        }
        agent.write_state()?;
        tracing::info!(policy = agent.config.policy.kind.as_str(), dry_run = dry,
            socket = %agent.config.api.socket, "agent started");
        Ok(agent)
    }

    /// The bound metrics address (when enabled).
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_addr
    }

    /// Runs until SIGTERM/SIGINT (or `run_for`), then performs the exit action.
    pub fn run(mut self) -> Result<RunSummary, AgentError> {
        let interval = self.policy.poll_interval().max(Duration::from_micros(100));
        let deadline = self.options.run_for.map(|d| Instant::now() + d);
        let mut next = Instant::now();
        let mut slow_due = Instant::now();
        set_timer_slack_ns(1000);
        raise_control_loop_priority(self.config.safety.agent_fifo_priority);
        loop {
            if STOP_SIGNAL.load(Ordering::SeqCst) && self.options.handle_signals {
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
            self.tick(now);
            if now >= slow_due {
                slow_due = now + SLOW_PERIOD;
                self.slow_work(now);
            }
            self.handle_requests();
        }
        self.shutdown()
    }

    fn tick(&mut self, now: Instant) {
        let obs = self.sensors.sample(now);
        let t = tick_time(now.saturating_duration_since(self.started));
        let decision = self.policy.decide(obs, t);
        if let Some(log) = &mut self.log {
            let rec = DecisionRecord::new(
                t,
                self.started_unix_ms + t.as_millis() as u64,
                self.config.policy.kind.as_str(),
                obs,
                &decision,
            );
            let mut line = rec.to_json_line();
            line.push('\n');
            if let Err(e) = log.write_all(line.as_bytes()) {
                tracing::error!(error = %e, "writing the decision log");
            }
        }
        if self.actuating && decision.allocation.be_kill {
            self.kill_be();
        }
        if self.actuating && !self.options.dry_run {
            let be_cpus = decision
                .allocation
                .be_cpus
                .as_deref()
                .unwrap_or(&self.machine.cpus);
            match self.actuators.apply(&decision.allocation, be_cpus) {
                Ok(0) => self.last_actuator_error = None,
                Ok(n) => {
                    self.last_actuator_error = None;
                    self.metrics.writes.inc_by(n as u64);
                    self.summary.writes += n as u64;
                }
                Err(e) => {
                    // retried next tick: the applied values only move on success
                    self.metrics.write_errors.inc();
                    self.summary.write_errors += 1;
                    let msg = e.to_string();
                    if self.last_actuator_error.as_deref() != Some(msg.as_str()) {
                        tracing::error!(error = %msg, "actuator write failed");
                    }
                    self.last_actuator_error = Some(msg);
                }
            }
        }
        if self.actuating {
            if let Some(r) = self.reconciler.as_mut() {
                let verify = self
                    .summary
                    .ticks
                    .is_multiple_of(verify_every(self.policy.poll_interval()));
                let same_as_applied = self.last_applied.as_ref() == Some(&decision.allocation);
                // Between read-backs, an unchanged decision needs no diff at all.
                let unchanged = !verify && self.last_write_error.is_none() && same_as_applied;
                let result = if unchanged {
                    Ok(Default::default())
                } else {
                    r.apply(&decision.allocation, verify)
                };
                match result {
                    Ok(report) => {
                        if !report.writes.is_empty() {
                            self.metrics.writes.inc_by(report.writes.len() as u64);
                            self.summary.writes += report.writes.len() as u64;
                            self.state_dirty = true;
                        }
                        if !report.drift.is_empty() {
                            self.metrics.drift_repairs.inc_by(report.drift.len() as u64);
                        }
                        if !same_as_applied {
                            self.last_applied = Some(decision.allocation.clone());
                        }
                        self.last_write_error = None;
                    }
                    Err(e) => {
                        self.metrics.write_errors.inc();
                        self.summary.write_errors += 1;
                        let msg = e.to_string();
                        if self.last_write_error.as_deref() != Some(msg.as_str()) {
                            tracing::error!(error = %msg, "reconciliation failed");
                        }
                        self.last_write_error = Some(msg);
                    }
                }
            }
        }
        // The allocation's gauges hold the same values while it is unchanged.
        let allocation_changed = self.last_allocation.as_ref() != Some(&decision.allocation);
        self.metrics.observe_tick(
            self.sensors.last(),
            &decision.allocation,
            allocation_changed,
            self.config.lc.slo.target_us,
            &decision.reason,
        );
        if decision.reason != self.last_reason {
            self.reasons
                .push_back((t.as_millis() as u64, decision.reason.clone()));
            if self.reasons.len() > REASONS_KEPT {
                self.reasons.pop_front();
            }
            self.last_reason = decision.reason.clone();
        }
        if allocation_changed {
            self.last_allocation = Some(decision.allocation);
        }
        self.summary.ticks += 1;
        self.metrics
            .loop_seconds
            .observe(now.elapsed().as_secs_f64());
    }

    /// `be_kill` (low memory: freezing would not free the memory): SIGKILL every process of the
    /// BE groups, thawing frozen ones so the signal is delivered; the next pass re-applies the
    /// allocation.
    fn kill_be(&mut self) {
        let Some(cg) = &self.cgroups else { return };
        for g in &self.groups.be {
            let procs = cg.procs(g).unwrap_or_default();
            if procs.is_empty() {
                continue;
            }
            tracing::warn!(group = %g, processes = procs.len(), "be_kill: killing BE processes");
            for pid in procs {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if cg
                .freeze_state(g)
                .is_ok_and(|st| st != headroom_host::FreezeState::Thawed)
            {
                let _ = cg.thaw(g);
            }
        }
        if let Some(r) = self.reconciler.as_mut() {
            r.invalidate();
        }
        self.last_applied = None;
    }

    fn slow_work(&mut self, now: Instant) {
        let killing = self.last_allocation.as_ref().is_some_and(|a| a.be_kill);
        if let (Some(cg), false) = (&self.cgroups, killing) {
            for s in &mut self.supervised {
                let before = s.restarts;
                s.check(cg, now);
                if s.restarts > before {
                    self.metrics.be_restarts.inc();
                    self.state_dirty = true;
                }
            }
        }
        if let (Some(cg), Some(a), true) = (&self.cgroups, &self.last_allocation, self.actuating) {
            if self.lc_threads.apply(cg, &self.groups.lc, &a.lc) > 0 {
                self.state_dirty = true;
            }
            self.sensors
                .set_be_cpus(a.be_cpus.as_deref().unwrap_or(&self.machine.cpus));
            let (l3, mba, _) = self.actuators.available();
            if l3 || mba {
                let tids: Vec<i32> = self
                    .groups
                    .be
                    .iter()
                    .flat_map(|g| cg.threads(g).unwrap_or_default())
                    .collect();
                if let Err(e) = self.actuators.assign_be_tasks(&tids) {
                    tracing::warn!(error = %e, "moving BE threads into their resctrl group");
                }
            }
        }
        if let Some(log) = &mut self.log {
            let _ = log.flush();
        }
        for (name, n) in self.sensors.errors() {
            self.metrics.sensor_errors_total(name, *n);
        }
        for (name, cell) in &self.signal_cells {
            self.metrics.sensor_errors_total(name, cell.errors());
        }
        let state_due = self
            .state_written
            .is_none_or(|t| now.saturating_duration_since(t) >= STATE_PERIOD);
        if self.state_dirty && state_due {
            if let Err(e) = self.write_state() {
                tracing::error!(error = %e, "writing the state file");
            }
        }
    }

    /// Removes the groups the agent created, deepest first, each only when neither it nor a
    /// child holds a process (the LC service, or anyone else's, keeps its group), except `keep`
    /// and their ancestors.
    fn remove_created_groups(&mut self, keep: &[GroupPath]) {
        let Some(cg) = &self.cgroups else { return };
        let mut left = Vec::new();
        for g in self.created_groups.iter().rev() {
            let kept = keep
                .iter()
                .any(|k| k == g || k.as_str().starts_with(&format!("{}/", g.as_str())));
            if kept || !cg.exists(g) {
                if kept {
                    left.push(g.clone());
                }
                continue;
            }
            let busy = cg.procs(g).map_or(true, |p| !p.is_empty())
                || cg.children(g).map_or(true, |c| !c.is_empty());
            if busy {
                tracing::info!(group = %g, "leaving a group the agent created: it still holds processes or groups");
                left.push(g.clone());
                continue;
            }
            match cg.remove(g) {
                Ok(()) => tracing::info!(group = %g, "removed the group the agent created"),
                Err(e) => {
                    tracing::warn!(group = %g, error = %e, "removing a group the agent created failed");
                    left.push(g.clone());
                }
            }
        }
        left.reverse();
        self.created_groups = left;
    }

    fn write_state(&mut self) -> Result<(), AgentError> {
        if self.options.dry_run {
            return Ok(());
        }
        let Some(r) = &self.reconciler else {
            return Ok(());
        };
        let st = AgentState {
            version: STATE_VERSION,
            pid: std::process::id(),
            written_unix_ms: unix_ms(),
            original: r
                .original()
                .iter()
                .map(|(g, s)| (g.to_string(), s.clone()))
                .collect(),
            last_allocation: self.last_applied.clone(),
            owned_pids: self
                .supervised
                .iter()
                .filter_map(|s| s.pid().map(|p| (s.name.clone(), p)))
                .collect(),
            lc_threads: self.lc_threads.state().clone(),
            created_groups: self.created_groups.iter().map(|g| g.to_string()).collect(),
        };
        state::store(Path::new(&self.config.safety.state_file), &st)?;
        self.state_dirty = false;
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

    fn answer(&mut self, req: Request) -> Response {
        match req {
            Request::Status => Response {
                ok: true,
                message: "ok".into(),
                status: Some(self.status()),
            },
            Request::Pause => {
                self.log_event(|t_ms| CtlEvent::Pause { t_ms });
                self.policy.pause();
                self.metrics.paused.set(1.0);
                Response::ok("paused: holding the current allocation (safety rules still apply)")
            }
            Request::Resume => {
                self.log_event(|t_ms| CtlEvent::Resume { t_ms });
                self.policy.resume();
                self.metrics.paused.set(0.0);
                if !self.actuating && !self.options.dry_run {
                    self.actuating = true;
                    self.metrics.actuating.set(1.0);
                    if let Some(r) = self.reconciler.as_mut() {
                        r.invalidate();
                    }
                    return Response::ok("resumed: actuating again");
                }
                Response::ok("resumed")
            }
            Request::Off => {
                self.log_event(|t_ms| CtlEvent::Off { t_ms });
                self.actuating = false;
                self.metrics.actuating.set(0.0);
                self.lc_threads.restore(self.cgroups.as_ref());
                if let Err(e) = self.actuators.restore() {
                    tracing::error!(error = %e, "restoring resctrl/cpufreq originals");
                }
                match self.reconciler.as_mut().map(|r| r.restore_original()) {
                    Some(Ok(report)) => {
                        self.last_applied = None;
                        self.state_dirty = true;
                        Response::ok(format!(
                            "off: original settings restored ({} writes); not actuating until `ctl resume`",
                            report.writes.len()
                        ))
                    }
                    Some(Err(e)) => Response::error(format!(
                        "off: actuation stopped, but restoring failed: {e}"
                    )),
                    None => Response::ok("off: nothing to restore (dry run); not actuating"),
                }
            }
            Request::Set { key, value } => {
                let mut updated = self.config.clone();
                if let Err(e) = updated.set(&key, &value) {
                    return Response::error(e.to_string());
                }
                match self.policy.set_param(&key, &value) {
                    Ok(()) => {
                        self.log_event(|t_ms| CtlEvent::Set {
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

    /// Logs a ctl command that changes the policy's decisions, on the decisions' clock, so
    /// `--replay` applies it between the same two decisions.
    fn log_event(&mut self, event: impl FnOnce(u64) -> CtlEvent) {
        let t_ms = tick_time(self.started.elapsed()).as_millis() as u64;
        if let Some(log) = &mut self.log {
            let mut line = event(t_ms).to_json_line();
            line.push('\n');
            if let Err(e) = log.write_all(line.as_bytes()).and_then(|()| log.flush()) {
                tracing::error!(error = %e, "writing a ctl event to the decision log");
            }
        }
    }

    fn status(&self) -> serde_json::Value {
        let slo = &self.config.lc.slo;
        let obs = self.sensors.last();
        json!({
            "policy": self.config.policy.kind.as_str(),
            "pid": std::process::id(),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "dry_run": self.options.dry_run,
            "actuating": self.actuating,
            "paused": self.policy.is_paused(),
            "ticks": self.summary.ticks,
            "writes": self.summary.writes,
            "write_errors": self.summary.write_errors,
            "last_write_error": self.last_write_error,
            "lc": {
                "group": self.groups.lc.to_string(),
                "latency_us": obs.lc_latency_us,
                "latency_age_ms": obs.lc_latency_age_ms,
                "slo_us": slo.target_us,
                "percentile": slo.percentile,
                "slack": obs.slack(slo.target_us),
                "qps": obs.lc_qps,
                "load": obs.lc_load,
                "cpus": obs.lc_cpus,
            },
            "idle_cpus": obs.idle_cpu_count(0.5),
            "be_groups": self.groups.be.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
            "be_commands": self.supervised.iter().map(|s| json!({
                "name": s.name, "pid": s.pid(), "restarts": s.restarts})).collect::<Vec<_>>(),
            "allocation": self.last_allocation,
            "last_reasons": self.reasons.iter().rev().map(|(t, r)| json!({"t_ms": t, "reason": r})).collect::<Vec<_>>(),
            "sensor_errors": self.sensors.errors(),
            "machine_cpus": self.machine.cpus,
            "actuators": self.actuators.status_json(),
        })
    }

    fn shutdown(mut self) -> Result<RunSummary, AgentError> {
        let action = self.config.safety.on_exit;
        let mut exit_action = "none (dry run)".to_string();
        if !self.options.dry_run {
            if !self.actuating {
                exit_action = "none (kill switch was on: originals already restored)".into();
            } else if let Some(r) = self.reconciler.as_mut() {
                exit_action = match action {
                    OnExit::Freeze => {
                        let mut a = self.last_applied.clone().unwrap_or_default();
                        a.be_enabled = false;
                        match r.apply(&a, true) {
                            Ok(_) => "freeze: BE frozen".into(),
                            Err(e) => format!("freeze FAILED: {e}"),
                        }
                    }
                    OnExit::Restore => match r.restore_original() {
                        Ok(_) => "restore: original settings restored".into(),
                        Err(e) => format!("restore FAILED: {e}"),
                    },
                    OnExit::Leave => "leave: allocation left as is".into(),
                };
            }
            tracing::info!(action = %exit_action, "exit action");
            // The LC's pinning, policy and real-time budgets go back unless told to leave all.
            if action != OnExit::Leave {
                let n = self.lc_threads.restore(self.cgroups.as_ref());
                if n > 0 {
                    tracing::info!(threads = n, "LC threads' affinity and policy restored");
                }
            }
            if action == OnExit::Restore && self.actuating {
                if let Err(e) = self.actuators.restore() {
                    tracing::error!(error = %e, "restoring resctrl/cpufreq originals");
                }
                for s in &mut self.supervised {
                    s.stop(Duration::from_secs(2));
                }
                self.supervised.clear();
                self.remove_created_groups(&[]);
                let _ = state::remove(Path::new(&self.config.safety.state_file));
            } else if action == OnExit::Freeze && self.actuating {
                // frozen BE needs its groups; other groups the agent made may go once empty
                let keep = self.groups.be.clone();
                self.remove_created_groups(&keep);
                self.last_applied = self.last_applied.take().map(|mut a| {
                    a.be_enabled = false;
                    a
                });
                self.write_state()?;
            } else {
                self.write_state()?;
            }
        }
        if let Some(mut child) = self.lc_child.take() {
            // The LC command stays running: the agent never stops the LC service.
            tracing::info!(pid = child.id(), "leaving the LC command running");
            let _ = child.try_wait();
        }
        if let Some(log) = &mut self.log {
            let _ = log.flush();
        }
        self.stop.store(true, Ordering::SeqCst);
        self.requests = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.summary.exit_action = exit_action;
        Ok(self.summary.clone())
    }
}

fn groups_match(prev: &AgentState, groups: &ManagedGroups) -> bool {
    prev.original.contains_key(groups.lc.as_str())
        && groups
            .be
            .iter()
            .all(|g| prev.original.contains_key(g.as_str()))
}

/// Ticks between read-backs: every tick when ticks are ≥ [`VERIFY_PERIOD`] apart.
fn verify_every(interval: Duration) -> u64 {
    (VERIFY_PERIOD.as_nanos() / interval.as_nanos().max(1)).max(1) as u64
}

fn install_signal_handlers() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic.
        if let Err(e) = unsafe { sigaction(sig, &action) } {
            tracing::warn!(signal = ?sig, error = %e, "installing the signal handler");
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

/// Whether any thread of `pid` runs SCHED_FIFO or SCHED_RR (procfs under `root`; a process
/// that cannot be read counts as not real-time, and moving it reports the real error).
fn has_realtime_thread(root: &Path, pid: i32) -> bool {
    headroom_host::sched::threads(root, pid)
        .unwrap_or_default()
        .into_iter()
        .any(|tid| {
            matches!(
                headroom_host::sched::sched(tid)
                    .ok()
                    .and_then(|a| a.policy()),
                Some(
                    headroom_host::sched::SchedPolicy::Fifo { .. }
                        | headroom_host::sched::SchedPolicy::RoundRobin { .. }
                )
            )
        })
}

fn set_timer_slack_ns(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches nothing else.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0);
    }
}
