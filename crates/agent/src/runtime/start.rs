//! `Agent::start` as build steps. Everything that can fail for a reason of its own (a taken
//! port, a bound socket, an unwritable log, a second agent) is tried before the host is
//! touched; then the host steps run in order, each recorded, and a failure undoes what this
//! start did, newest first. BE commands are launched last, into frozen groups, after the state
//! file has recorded the groups and originals: at no instant does a BE process run outside a
//! group the state file names.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use headroom_host::LinuxHost;

use super::host_steps::{create_groups, plan_groups, plan_lc_moves, undo, HostSteps};
use super::lc_sources::{has_realtime_thread, lc_signals};
use super::publish::Publisher;
use super::start_files::StartFiles;
use headroom_load::clock::unix_ms;

use super::{machine_info, Agent, AgentError, AgentOptions, Signals};
use crate::linux_node::LinuxNode;
use crate::publish::metrics::Metrics;
use crate::sensors::lc_services::LcServiceSensor;
use crate::sensors::lc_signal::StopFlag;
use crate::sensors::Sensors;
use crate::state::{self, AgentState, StateLock};
use headroom_control::actuation::{Actuation, ManagedGroups};
use headroom_control::config::ConfigError;
use headroom_control::controller::Controller;
use headroom_control::policy;

impl Agent {
    /// Validates, takes the state lock, binds the sockets and opens the log, then creates the
    /// groups, moves the LC, captures the originals, records them, and launches BE frozen.
    pub fn start(options: AgentOptions) -> Result<Agent, AgentError> {
        // Before anything is touched: a SIGTERM while the start moves the LC and freezes BE
        // (a `systemctl stop`, a rollout) is kept for the run, which then runs `on_exit` at
        // once; installed at the end, it killed the agent by the default action, no exit
        // action run, the LC left in its group and BE frozen (hostile pass 33).
        let stop_signals = options.handle_signals.then(Signals::install);
        let config = options.config.clone();
        config.validate()?;
        config.check_runnable()?;
        // Two keys naming one file through a link, refused before anything is made.
        super::distinct_files::check(
            &config,
            options.decision_log.as_deref(),
            options.config_path.as_deref(),
        )?;
        super::on_host::check_run_for(options.run_for)?;
        super::on_host::check_socket_dirs(&config)?;
        if !options.dry_run {
            let written = options
                .config_path
                .as_ref()
                .and_then(|p| std::fs::metadata(p).ok()?.modified().ok());
            super::on_host::check_on_host(&options.root, &config, written)?;
        }
        let dry = options.dry_run;
        let host = LinuxHost::new(&options.root);
        let groups = ManagedGroups {
            lc: config.lc().cgroup.clone(),
            be: config.be.iter().map(|b| b.cgroup.clone()).collect(),
        };
        // Every LC service's group, the first (`groups.lc`) first.
        let lc_groups: Vec<_> = config.lcs.iter().map(|l| l.cgroup.clone()).collect();
        let cgroups = host.cgroups()?;
        super::on_host::check_domain_groups(&config, &cgroups)?;
        // BE already in its groups (an earlier agent's, or processes found there): a limit
        // below its use is refused as `ctl set` refuses it.
        super::on_host::check_memory_limit(
            &cgroups,
            &groups.be,
            config.safety.be_memory_limit_bytes,
        )?;
        // One agent per group, decided before anything is touched (a second agent changes
        // nothing: no orphan kill, no drift repair).
        let group_lock = if options.dry_run {
            None
        } else {
            let lock = super::start_locks::lock_groups(&options, &config, &cgroups)?;
            super::start_locks::refuse_foreign_lc_pids(&options.root, &config, &cgroups, &lock)?;
            Some(lock)
        };
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
        super::on_host::say_be_limits(&config, &machine, &cgroups, &groups.be);

        // ---- steps that touch nothing on the host ----
        let state_path = PathBuf::from(&config.safety.state_file);
        // From here on a failed start removes the lock file and the directories it made
        // (dropping `files`); the agent takes the lock once it has started.
        let mut files = StartFiles::default();
        if !dry {
            state::check_path(&state_path)?;
            files.lock = Some(StateLock::acquire(&state_path)?);
        }
        let (recorded, state_set_aside) = if dry {
            (None, None)
        } else {
            state::load_or_set_aside(&state_path)?
        };
        // A state file that names any of these groups makes this start a restart for those
        // (originals kept, the earlier agent's BE adopted or stopped); groups it names that
        // the config dropped are released once BE is confined (see `earlier`). The groups and
        // LC origins an interrupted start recorded (before its originals) are taken in any
        // case. (A group it does not name gets its originals read now.)
        let previous = recorded
            .clone()
            .filter(|p| p.names_any(&groups, &lc_groups));
        let earlier = if dry {
            super::earlier::Earlier::default()
        } else {
            super::earlier::plan(recorded.as_ref(), &groups, &lc_groups, |dropped| {
                super::start_locks::lock_group_set(&options, &config, &cgroups, dropped.iter())
            })?
        };
        let stop: StopFlag = Arc::new(AtomicBool::new(false));
        let mut threads: Vec<JoinHandle<()>> = Vec::new();
        files.make_socket_dir(Path::new(&config.api.socket))?;
        let started = (|| {
            let log = super::decision_log::open_log(&options, &config, &machine)?;
            let (requests, t) =
                crate::publish::control::serve(Path::new(&config.api.socket), stop.clone())?;
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
                let (bound, t) = crate::publish::scrape_server::serve(addr, registry, stop.clone())
                    .map_err(|source| AgentError::Io {
                        what: "binding the metrics endpoint",
                        path: PathBuf::from(addr.to_string()),
                        source,
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
            let mut signals = signals.into_iter();
            let mut sensors = Sensors::new(
                &host,
                cgroups.clone(),
                groups.lc.clone(),
                groups.be.clone(),
                signals.next().unwrap_or_default(),
                config.sensors.idle,
            )?;
            if config.lcs.len() > 1 {
                let more = config.lcs[1..]
                    .iter()
                    .zip(signals)
                    .map(|(lc, s)| LcServiceSensor::new(&lc.name, lc.cgroup.clone(), s))
                    .collect();
                sensors.set_lc_services(&config.lc().name, more);
            }
            if config.kubernetes.discover {
                sensors.set_list_services(&config.lc().name, true);
            }
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

        // With discovery the policy starts with the holder service (BE held until the first
        // pod list); the runtime's config stays the static one.
        let policy = policy::build(
            &headroom_control::discovered::initial_policy_config(&config),
            &machine,
        );
        let mut node = node;
        let mut lc_threads = crate::sensors::lc_threads::LcThreads::from_state(
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
            lc_groups: config.lcs.iter().map(|l| l.cgroup.clone()).collect(),
            ..HostSteps::default()
        };
        let mut egress_classifiers = Vec::new();
        let mut start_actions = Vec::new();
        let mut actuation = None;
        let touched: Result<(), AgentError> = if dry {
            Ok(())
        } else {
            (|| {
                // What this start is about to create and move is recorded first: a kill -9
                // between here and the full state file must not leak a group or lose the
                // LC's own groups.
                plan_groups(&cgroups, &lc_groups, &groups, &mut steps);
                plan_lc_moves(&options.root, &cgroups, &config, &mut steps);
                let mut intent = recorded.clone().unwrap_or_else(AgentState::empty);
                intent.pid = std::process::id();
                intent.written_unix_ms = unix_ms();
                intent.created_groups.clone_from(&steps.created_groups);
                intent.lc_origins = steps.lc_moved.clone();
                state::store(&state_path, &intent)?;
                steps.state_written = true;
                create_groups(&cgroups, &lc_groups, &groups, &mut steps)?;
                // BE traffic is classified by a cgroup-BPF program on the BE groups' cgroup2
                // directories (on hybrid hosts made for it): skb->priority = the BE HTB class.
                if let Some(classid) = node.egress_be_classid() {
                    for g in &groups.be {
                        let dir = cgroups.ensure_v2_group(g)?;
                        egress_classifiers
                            .push(headroom_host::bpf::EgressPriority::attach(&dir, classid)?);
                    }
                }
                // Each service into its own group, in the config's order; a failure undoes
                // the services before it too.
                let left_lcs = crate::lc_record::load(&state_path);
                for lc in &config.lcs {
                    start_actions.extend(super::host_steps::thaw_lc_group(&cgroups, &lc.cgroup));
                    // An LC already running SCHED_FIFO/RR cannot join a v1 cpu group whose
                    // real-time budget is 0 (EINVAL): give the group chain its budget first.
                    if lc
                        .pids
                        .iter()
                        .any(|&pid| has_realtime_thread(&options.root, pid as i32))
                    {
                        lc_threads.ensure_rt_budget(&cgroups, &lc.cgroup)?;
                    }
                    for &pid in &lc.pids {
                        cgroups.move_process(&lc.cgroup, pid as i32)?;
                    }
                    if !lc.command.is_empty() {
                        let user = crate::run_as::user_for("lc.user", lc.user.as_ref())?;
                        let uid = user.as_ref().map_or_else(
                            headroom_host::process::effective_uid,
                            headroom_host::spawn::RunAs::uid,
                        );
                        // An earlier agent's copy still running is taken, not doubled.
                        let found = super::host_steps::lc_to_take(
                            &options.root,
                            &cgroups,
                            &left_lcs,
                            lc,
                            uid,
                            &mut lc_threads,
                            &mut steps.lc_moved,
                        );
                        if let Some(found) = found {
                            tracing::warn!(name = %lc.name, pid = found.id(), "the LC command an earlier agent launched still runs in its group: taken, not launched again");
                            steps.lc_children.push(found);
                        } else {
                            steps.lc_children.push(super::host_steps::LcChild::Launched(
                                crate::supervisor::launch_in_group(
                                    &cgroups,
                                    &lc.name,
                                    &lc.command,
                                    &lc.cgroup,
                                    user.as_ref(),
                                )?,
                            ));
                        }
                    }
                }
                // Every original the state file holds is kept (those of groups the config
                // dropped, until they are released).
                if previous.is_some() {
                    tracing::info!(state = %state_path.display(), "restarting from the state file: originals kept, reconciling");
                }
                let act = match &recorded {
                    Some(r) => Actuation::resume(&mut node, groups.clone(), r.original_map())?,
                    None => Actuation::attach(&mut node, groups.clone())?,
                };
                actuation = Some(act.with_lc_services(&mut node, &lc_groups[1..])?);
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

        if !dry {
            node.keep_freezer_fast();
        }
        let started_at = Instant::now();
        node.set_sensors(sensors, started_at);
        metrics.actuating.set(if dry { 0.0 } else { 1.0 });
        metrics.cpus.set(machine.cpus.len() as f64);
        let lcs = config
            .lcs
            .iter()
            .map(|l| crate::publish::metrics::ServiceSlo {
                name: l.name.clone(),
                slo_us: l.slo.target_us,
            })
            .collect();
        let mut publisher = Publisher::new(
            log,
            metrics,
            config.policy.kind.as_str(),
            config.lc().slo.target_us,
            lcs,
            unix_ms(),
        );
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
            created_dirs: std::mem::take(&mut steps.created_dirs),
            lc_origins: std::mem::take(&mut steps.lc_moved),
            lc_children: std::mem::take(&mut steps.lc_children),
            inherited_be: None,
            lc_recorded: Vec::new(),
            publisher,
            requests: Some(requests),
            stop,
            signals: None,
            threads,
            signal_cells,
            started: started_at,
            state_written: None,
            state_checked: None,
            followed_at: None,
            targets_followed: Default::default(),
            be_members: Default::default(),
            metrics_addr,
            kube: None,
            advertise: None,
            state_lock: None,
            group_lock,
            lc_follow: Default::default(),
            state_set_aside,
            tick_interval: None,
            state_write_error: None,
            start_actions,
        };
        if let Some(w) = headroom_control::config::policy_without_knob(&agent.config) {
            tracing::warn!("{w}");
        }
        if let Some(w) = crate::run_as::root_be_warning(&agent.config) {
            tracing::warn!("{w}");
        }
        // (an LC process's effective uid: the one its signals and ptrace are judged by)
        let uid_of = |pid| headroom_host::pids::uids(&agent.options.root, pid).map(|(_, e)| e);
        if let Some(w) = crate::run_as::same_user_warning(&agent.config, uid_of) {
            tracing::warn!("{w}");
        }
        if agent.config.kubernetes.discover {
            let node = agent
                .config
                .kubernetes
                .node_name
                .clone()
                .unwrap_or_default();
            let events = agent.options.discovery.clone().unwrap_or_else(|| {
                tracing::warn!(
                    "[kubernetes] discover = true but no discovery is connected: BE stays held"
                );
                super::LcEvents::channel().1
            });
            agent.kube = Some(super::kube::KubeLive::new(events, &node));
        }
        if agent.config.kubernetes.advertise {
            match agent.options.advertise.clone() {
                Some(edge) => {
                    let k = &agent.config.kubernetes;
                    agent.advertise = Some(super::advertise::AdvertiseLive::new(
                        k.advertise_params(),
                        k.advertise_memory_params(&agent.config.safety),
                        edge,
                    ))
                }
                None => tracing::warn!(
                    "[kubernetes] advertise = true but no publisher is connected: nothing is advertised"
                ),
            }
        }
        if !dry {
            if let Err(e) = agent.confine_and_launch(previous.as_ref(), earlier) {
                agent.undo_start(steps.had_state);
                return Err(e);
            }
        }
        agent.state_lock = files.keep();
        agent.signals = stop_signals;
        tracing::info!(policy = agent.config.policy.kind.as_str(), dry_run = agent.options.dry_run,
            socket = %agent.config.api.socket, "agent started");
        Ok(agent)
    }

    /// Undoes what a failed start did to the host, newest first.
    fn undo_start(&mut self, had_state: bool) {
        let cg = self.node.cgroups().clone();
        let mut steps = HostSteps {
            created_groups: std::mem::take(&mut self.created_groups),
            created_dirs: std::mem::take(&mut self.created_dirs),
            lc_moved: std::mem::take(&mut self.lc_origins),
            lc_groups: self.config.lcs.iter().map(|l| l.cgroup.clone()).collect(),
            lc_children: std::mem::take(&mut self.lc_children),
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

fn stop_threads(stop: &StopFlag, threads: Vec<JoinHandle<()>>) {
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    crate::sensors::wake_and_join(threads);
}
