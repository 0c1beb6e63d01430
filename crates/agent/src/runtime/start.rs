//! `Agent::start` as build steps. Everything that can fail for a reason of its own (a taken
//! port, a bound socket, an unwritable log, a second agent) is tried before the host is
//! touched; then the host steps run in order, each recorded, and a failure undoes what this
//! start did, newest first. BE commands are launched last, into frozen groups, after the state
//! file has recorded the groups and originals: at no instant does a BE process run outside a
//! group the state file names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_host::{Cgroups, GroupPath, LinuxHost};

use super::publish::{DecisionLog, Publisher};
use super::{machine_info, machine_sidecar, unix_ms, Agent, AgentError, AgentOptions, Signals};
use crate::actuation::linux::LinuxNode;
use crate::actuation::{Actuation, ManagedGroups};
use crate::allocation::Allocation;
use crate::config::{Config, ConfigError, LatencySource, LoadSource};
use crate::controller::Controller;
use crate::lc_signal::{SignalCell, StopFlag};
use crate::metrics::Metrics;
use crate::policy;
use crate::scrape::PullKind;
use crate::sensors::{LcSignals, Sensors};
use crate::state::{self, AgentState, StateLock};
use crate::supervisor::Supervised;

/// What a start did to the host so far (undone, newest first, if a later step fails).
#[derive(Default)]
struct HostSteps {
    created_groups: Vec<GroupPath>,
    /// LC pids moved, with the directories they came from.
    lc_moved: BTreeMap<u32, Vec<String>>,
    lc_child: Option<std::process::Child>,
    supervised: Vec<Supervised>,
    state_written: bool,
    /// The state file existed before this start (a restart keeps it on failure).
    had_state: bool,
}

impl Agent {
    /// Validates, takes the state lock, binds the sockets and opens the log, then creates the
    /// groups, moves the LC, captures the originals, records them, and launches BE frozen.
    pub fn start(options: AgentOptions) -> Result<Agent, AgentError> {
        let config = options.config.clone();
        config.validate()?;
        let dry = options.dry_run;
        let host = LinuxHost::new(&options.root);
        let groups = ManagedGroups {
            lc: config.lc.cgroup.clone(),
            be: config.be.iter().map(|b| b.cgroup.clone()).collect(),
        };
        let cgroups = host.cgroups()?;
        let cpus: Vec<u32> = host
            .topology()
            .map(|t| t.cpus_online.to_vec())
            .unwrap_or_default();
        let node = LinuxNode::from_config(&host, cgroups.clone(), &config, &cpus).map_err(|e| {
            AgentError::Config(ConfigError::Invalid {
                key: "egress".into(),
                value: format!("{:?}", config.egress.device),
                reason: e.to_string(),
            })
        })?;
        let machine = machine_info(&host, &node);
        config.validate_on(&machine.cpus)?;

        // ---- steps that touch nothing on the host ----
        let state_path = PathBuf::from(&config.safety.state_file);
        let lock = if dry {
            None
        } else {
            Some(StateLock::acquire(&state_path)?)
        };
        let recorded = if dry { None } else { state::load(&state_path)? };
        // Originals and BE pids come from a state file of these groups; the groups and LC
        // origins an interrupted start recorded (before its originals) are taken in any case.
        let previous = recorded.clone().filter(|p| p.manages(&groups));
        let stop: StopFlag = Arc::new(AtomicBool::new(false));
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        let started = (|| {
            let log = open_log(&options, &config, &machine)?;
            let (requests, t) = crate::control::serve(Path::new(&config.api.socket), stop.clone())?;
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
            let (signals, signal_cells) = lc_signals(&config, &stop, &mut threads)?;
            Ok((log, requests, metrics, metrics_addr, signals, signal_cells))
        })();
        let (log, requests, metrics, metrics_addr, signals, signal_cells) = match started {
            Ok(v) => v,
            Err(e) => {
                stop_threads(&stop, threads);
                return Err(e);
            }
        };

        // The sensors (a BPF idle tracker, the egress counters) touch nothing either.
        let sensors = (|| -> Result<Sensors, AgentError> {
            let mut sensors = Sensors::new(
                &host,
                cgroups.clone(),
                groups.lc.clone(),
                groups.be.clone(),
                signals,
                config.sensors.idle,
            )?;
            if node.egress_be_classid().is_some() {
                let link = node.facts_link_bits();
                sensors.set_egress(crate::sensors::EgressSensor::new(
                    &config.egress.device,
                    link,
                )?);
            }
            Ok(sensors)
        })();
        let sensors = match sensors {
            Ok(s) => s,
            Err(e) => {
                stop_threads(&stop, threads);
                return Err(e);
            }
        };

        let policy = policy::build(&config, &machine);
        let mut node = node;
        let mut lc_threads = crate::lc_threads::LcThreads::from_state(
            previous
                .as_ref()
                .map(|p| p.lc_threads.clone())
                .unwrap_or_default(),
        );

        // ---- steps that touch the host, each undone on failure ----
        let mut steps = HostSteps {
            had_state: previous.is_some(),
            created_groups: recorded
                .as_ref()
                .map(|p| p.created_groups.clone())
                .unwrap_or_default(),
            lc_moved: recorded
                .as_ref()
                .map(|p| p.lc_origins.clone())
                .unwrap_or_default(),
            ..HostSteps::default()
        };
        let mut egress_classifiers = Vec::new();
        let mut actuation = None;
        let touched: Result<(), AgentError> = if dry {
            Ok(())
        } else {
            (|| {
                // What this start is about to create and move is recorded first: a kill -9
                // between here and the full state file must not leak a group or lose the
                // LC's own groups.
                plan_groups(&cgroups, &groups, &mut steps);
                plan_lc_moves(&options.root, &cgroups, &config, &groups.lc, &mut steps);
                let mut intent = recorded.clone().unwrap_or_else(AgentState::empty);
                intent.pid = std::process::id();
                intent.written_unix_ms = unix_ms();
                intent.created_groups.clone_from(&steps.created_groups);
                intent.lc_origins = steps.lc_moved.clone();
                state::store(&state_path, &intent)?;
                steps.state_written = true;
                create_groups(&cgroups, &groups, &steps)?;
                // BE traffic is classified by a cgroup-BPF program on the BE groups' cgroup2
                // directories (on hybrid hosts made for it): skb->priority = the BE HTB class.
                if let Some(classid) = node.egress_be_classid() {
                    for g in &groups.be {
                        let dir = cgroups.ensure_v2_group(g)?;
                        egress_classifiers
                            .push(headroom_host::bpf::EgressPriority::attach(&dir, classid)?);
                    }
                }
                // An LC already running SCHED_FIFO/RR cannot join a v1 cpu group whose
                // real-time budget is 0 (EINVAL): give the group chain its budget first.
                if config
                    .lc
                    .pids
                    .iter()
                    .any(|&pid| has_realtime_thread(&options.root, pid as i32))
                {
                    lc_threads.ensure_rt_budget(&cgroups, &groups.lc)?;
                }
                for &pid in &config.lc.pids {
                    cgroups.move_process(&groups.lc, pid as i32)?;
                }
                if !config.lc.command.is_empty() {
                    steps.lc_child = Some(crate::supervisor::launch_in_group(
                        &cgroups,
                        &config.lc.name,
                        &config.lc.command,
                        &groups.lc,
                    )?);
                }
                let act = match &previous {
                    Some(prev) => {
                        tracing::info!(state = %state_path.display(), "restarting from the state file: originals kept, reconciling");
                        Actuation::resume(&mut node, groups.clone(), prev.original_map())?
                    }
                    None => Actuation::attach(&mut node, groups.clone())?,
                };
                actuation = Some(act);
                Ok(())
            })()
        };
        if let Err(e) = touched {
            undo(&mut steps, &cgroups, None, &mut node, &state_path);
            stop_threads(&stop, threads);
            return Err(e);
        }
        let mut controller = Controller::new(policy, actuation, machine.cpus.clone(), 1)
            .with_verify_period(super::VERIFY_PERIOD);

        let started_at = Instant::now();
        node.set_sensors(sensors, started_at);
        metrics.actuating.set(if dry { 0.0 } else { 1.0 });
        metrics.cpus.set(machine.cpus.len() as f64);
        let mut publisher = Publisher {
            log,
            metrics,
            policy: config.policy.kind.as_str(),
            started_unix_ms: unix_ms(),
            slo_us: config.lc.slo.target_us,
            reasons: Default::default(),
            last_reason: String::new(),
            last_allocation: None,
            last_write_error: None,
            summary: Default::default(),
            state_dirty: true,
        };
        // The decision state is only ever read from the log.
        controller.policy_mut().set_explain(publisher.log.is_some());
        publisher.state_dirty = true;

        let mut agent = Agent {
            config,
            options,
            machine,
            node,
            controller,
            groups,
            supervised: Vec::new(),
            lc_threads,
            egress_classifiers,
            created_groups: std::mem::take(&mut steps.created_groups),
            lc_origins: std::mem::take(&mut steps.lc_moved),
            lc_child: steps.lc_child.take(),
            publisher,
            requests: Some(requests),
            stop,
            signals: None,
            threads,
            signal_cells,
            started: started_at,
            state_written: None,
            metrics_addr,
            _lock: lock,
        };
        if !dry {
            if let Err(e) = agent.confine_and_launch(previous.as_ref()) {
                agent.undo_start(steps.had_state);
                return Err(e);
            }
        }
        if agent.options.handle_signals {
            agent.signals = Some(Signals::install());
        }
        tracing::info!(policy = agent.config.policy.kind.as_str(), dry_run = agent.options.dry_run,
            socket = %agent.config.api.socket, "agent started");
        Ok(agent)
    }

    /// Records the groups and originals, confines BE (a restart's last safe allocation, else
    /// frozen), records that, then adopts or launches the BE commands and records their pids.
    fn confine_and_launch(&mut self, previous: Option<&AgentState>) -> Result<(), AgentError> {
        self.write_state()?;
        let safe = previous
            .and_then(|p| p.last_allocation.clone())
            .unwrap_or_else(|| Allocation::default().disabled());
        let mut first = safe.clone();
        // BE commands start frozen; the first tick thaws them if the policy lets BE run.
        if self.config.be.iter().any(|b| !b.command.is_empty()) {
            first.be_enabled = false;
        }
        if let Err(e) = self.controller.apply_now(&mut self.node, &first) {
            tracing::error!(error = %e, "could not apply the start-up allocation");
            return Err(e.into());
        }
        self.write_state()?;
        let cg = self.node.cgroups().clone();
        for (i, b) in self.config.be.clone().iter().enumerate() {
            if b.command.is_empty() {
                continue;
            }
            let g = self.groups.be[i].clone();
            let mut s = Supervised::new(
                &b.name,
                &b.command,
                g.clone(),
                b.restart,
                b.restart_backoff_ms,
                b.restart_backoff_max_ms,
            );
            let adopted = previous
                .and_then(|p| p.owned_pids.get(&b.name))
                .is_some_and(|&pid| s.adopt(&cg, pid));
            if !adopted {
                // Processes in the agent's own BE group that no state file names were launched
                // by an agent killed before it could record them: stop them, start one.
                let orphans = crate::supervisor::kill_group(&cg, &g);
                if orphans > 0 {
                    tracing::warn!(group = %g, processes = orphans, "killed unrecorded processes left in the BE group by an earlier agent");
                }
                s.start(&cg)?;
            }
            self.supervised.push(s);
            self.write_state()?;
        }
        Ok(())
    }

    /// Undoes what a failed start did to the host, newest first.
    fn undo_start(&mut self, had_state: bool) {
        let cg = self.node.cgroups().clone();
        let mut steps = HostSteps {
            created_groups: std::mem::take(&mut self.created_groups),
            lc_moved: std::mem::take(&mut self.lc_origins),
            lc_child: self.lc_child.take(),
            supervised: std::mem::take(&mut self.supervised),
            state_written: true,
            had_state,
        };
        let state_path = PathBuf::from(&self.config.safety.state_file);
        undo(
            &mut steps,
            &cg,
            Some(&mut self.controller),
            &mut self.node,
            &state_path,
        );
        stop_threads(&self.stop, std::mem::take(&mut self.threads));
    }
}

/// Undoes `steps` newest first: stops launched BE, restores originals, moves the LC back,
/// removes the groups this start created, and the state file when there was none before.
fn undo(
    steps: &mut HostSteps,
    cgroups: &Cgroups,
    controller: Option<&mut Controller>,
    node: &mut LinuxNode,
    state_path: &Path,
) {
    tracing::warn!("start failed: undoing what it did");
    for s in &mut steps.supervised {
        s.stop(cgroups, Duration::from_secs(2));
    }
    let mut restored = true;
    if let Some(c) = controller {
        if let Some(act) = c.actuation_mut() {
            if let Err(e) = act.restore_original(node) {
                tracing::error!(error = %e, "restoring originals after a failed start");
                restored = false;
            }
        }
    }
    move_lc_back(cgroups, &steps.lc_moved);
    if let Some(mut child) = steps.lc_child.take() {
        // The LC command this start launched: nobody else knows of it.
        let _ = child.kill();
        let _ = child.wait();
    }
    remove_created_groups(cgroups, &mut steps.created_groups, &[]);
    if restored && steps.created_groups.is_empty() && !steps.had_state && steps.state_written {
        let _ = state::remove(state_path);
    }
}

fn stop_threads(stop: &StopFlag, threads: Vec<JoinHandle<()>>) {
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
}

/// Notes the groups (and ancestors) that do not exist yet: this start will create them.
fn plan_groups(cg: &Cgroups, groups: &ManagedGroups, steps: &mut HostSteps) {
    for g in std::iter::once(&groups.lc).chain(groups.be.iter()) {
        let mut missing = Vec::new();
        let mut at = Some(g.clone());
        while let Some(p) = at.filter(|p| !p.is_root()) {
            // a group that exists in only some hierarchies is not the agent's to remove
            if !cg.group_dirs(&p).iter().any(|(_, d)| d.is_dir())
                && !steps.created_groups.contains(&p)
            {
                missing.push(p.clone());
            }
            at = p.parent();
        }
        steps.created_groups.extend(missing.into_iter().rev());
    }
}

/// Creates the LC and BE groups.
fn create_groups(cg: &Cgroups, groups: &ManagedGroups, _: &HostSteps) -> Result<(), AgentError> {
    for g in std::iter::once(&groups.lc).chain(groups.be.iter()) {
        cg.create(g)?;
    }
    Ok(())
}

/// Notes where each of `lc.pids` is in every hierarchy (unless a state file already did).
fn plan_lc_moves(
    root: &Path,
    cg: &Cgroups,
    config: &Config,
    lc: &GroupPath,
    steps: &mut HostSteps,
) {
    for &pid in &config.lc.pids {
        if steps.lc_moved.contains_key(&pid) {
            continue;
        }
        let text =
            std::fs::read_to_string(root.join(format!("proc/{pid}/cgroup"))).unwrap_or_default();
        let dirs = cg
            .process_dirs(lc, &text)
            .into_iter()
            .filter(|d| !d.ends_with(lc.as_str()))
            .map(|d| d.display().to_string())
            .collect();
        steps.lc_moved.insert(pid, dirs);
    }
}

/// Moves LC processes back into the groups they were in before the agent moved them.
pub(super) fn move_lc_back(cg: &Cgroups, origins: &BTreeMap<u32, Vec<String>>) {
    for (pid, dirs) in origins {
        for dir in dirs {
            match cg.move_process_to_dir(Path::new(dir), *pid as i32) {
                Ok(()) => tracing::info!(pid, group = %dir, "LC process moved back"),
                Err(e) if e.errno() == Some(nix::errno::Errno::ESRCH) => {}
                Err(e) => {
                    tracing::warn!(pid, group = %dir, error = %e, "moving the LC process back")
                }
            }
        }
    }
}

/// Removes the groups in `created` (ancestors first), deepest first, each only when neither it
/// nor a child holds a process, except `keep` and their ancestors; keeps the rest listed.
pub(super) fn remove_created_groups(
    cg: &Cgroups,
    created: &mut Vec<GroupPath>,
    keep: &[GroupPath],
) {
    let mut left = Vec::new();
    for g in created.iter().rev() {
        let kept = keep
            .iter()
            .any(|k| k == g || k.as_str().starts_with(&format!("{}/", g.as_str())));
        let exists = cg.group_dirs(g).iter().any(|(_, d)| d.is_dir());
        if kept || !exists {
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
    *created = left;
}

/// Opens the decision log (and writes the machine description replay needs beside it).
fn open_log(
    options: &AgentOptions,
    config: &Config,
    machine: &crate::policy::MachineInfo,
) -> Result<Option<DecisionLog>, AgentError> {
    let path = options
        .decision_log
        .clone()
        .or_else(|| config.api.decision_log.as_ref().map(PathBuf::from));
    let Some(p) = path else {
        return Ok(None);
    };
    let log = DecisionLog::open(&p, config.api.decision_log_max_mb.saturating_mul(1 << 20))
        .map_err(|source| AgentError::Io {
            what: "opening the decision log",
            path: p.clone(),
            source,
        })?;
    let side = machine_sidecar(&p);
    std::fs::write(
        &side,
        serde_json::to_vec_pretty(machine).expect("machine serializes"),
    )
    .map_err(|source| AgentError::Io {
        what: "writing",
        path: side,
        source,
    })?;
    Ok(Some(log))
}

type Cells = Vec<(String, Arc<SignalCell>)>;

/// Starts the LC latency and load sources.
fn lc_signals(
    config: &Config,
    stop: &StopFlag,
    threads: &mut Vec<JoinHandle<()>>,
) -> Result<(LcSignals, Cells), AgentError> {
    let mut signals = LcSignals::default();
    let mut cells = Vec::new();
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
                spec.max_send_lag_us = lat.send_lag_bound_us(slo.target_us);
                spec.fifo_priority = config.safety.agent_fifo_priority;
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
                let t =
                    crate::scrape::spawn(kind, Duration::from_secs(1), cell.clone(), stop.clone())
                        .map_err(spawn_err("starting the scraper"))?;
                threads.push(t);
                cell
            }
            LatencySource::Feed => {
                let socket = lat
                    .socket
                    .clone()
                    .unwrap_or_else(|| "/run/headroom-feed.sock".to_string());
                feed_cells(&socket, threads)?.latency
            }
        };
        cells.push(("latency".to_string(), cell.clone()));
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
            LoadSource::MemcacheStats => pull(PullKind::MemcacheStats { address }, threads)?,
            LoadSource::RedisInfo => pull(PullKind::RedisInfo { address }, threads)?,
            LoadSource::Prometheus => pull(
                PullKind::PromCounter {
                    url: load.url.clone().unwrap_or_default(),
                    metric: load.metric.clone().unwrap_or_default(),
                },
                threads,
            )?,
            LoadSource::Feed => {
                let socket = load
                    .socket
                    .clone()
                    .or_else(|| config.lc.latency.as_ref().and_then(|l| l.socket.clone()))
                    .unwrap_or_else(|| "/run/headroom-feed.sock".to_string());
                feed_cells(&socket, threads)?.qps
            }
        };
        cells.push(("load".to_string(), cell.clone()));
        signals.qps = Some(cell);
    }
    Ok((signals, cells))
}

/// Whether any thread of `pid` runs SCHED_FIFO or SCHED_RR (procfs under `root`; a process
/// that cannot be read counts as not real-time, and moving it reports the real error).
fn has_realtime_thread(root: &Path, pid: i32) -> bool {
    use headroom_host::sched::SchedPolicy;
    headroom_host::sched::threads(root, pid)
        .unwrap_or_default()
        .into_iter()
        .any(|tid| {
            matches!(
                headroom_host::sched::sched(tid)
                    .ok()
                    .and_then(|a| a.policy()),
                Some(SchedPolicy::Fifo { .. } | SchedPolicy::RoundRobin { .. })
            )
        })
}
