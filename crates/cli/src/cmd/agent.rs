//! `headroom agent`: the colocation controller (docs/architecture.md "The pipeline").

use std::path::PathBuf;

use anyhow::Context;
use headroom_agent::runtime::{machine_info, machine_sidecar, Agent, AgentOptions};
use headroom_control::config::Config;
use headroom_control::decision::{replay_log, LogLine};
use headroom_control::policy::MachineInfo;

/// Flags of `headroom agent`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Agent configuration (TOML; docs/architecture.md "Config")
    #[arg(long)]
    pub config: PathBuf,
    /// Decide and log, but write nothing to the groups
    #[arg(long)]
    pub dry_run: bool,
    /// Re-run the policy over a decision log; exit 0 if every decision is reproduced, 1 otherwise
    #[arg(long, value_name = "LOG")]
    pub replay: Option<PathBuf>,
    /// Decision log: one JSON line per decision (overrides api.decision_log)
    #[arg(long, value_name = "DECISIONS.jsonl")]
    pub log: Option<PathBuf>,
    /// Stop after this many seconds (then run safety.on_exit as on SIGTERM)
    #[arg(long, value_name = "S")]
    pub duration: Option<f64>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let config = headroom_agent::config_file::read_config(&args.config)
        .map_err(|e| super::usage(e.to_string()))?;
    if let Some(log) = &args.replay {
        return run_replay(&config, log);
    }
    let mut options = AgentOptions::new(config);
    options.dry_run = args.dry_run;
    options.config_path = Some(args.config.clone());
    options.decision_log = args.log;
    if let Some(s) = args.duration {
        if !(s.is_finite() && s > 0.0) {
            return Err(super::usage(format!(
                "--duration {s}: must be a positive number of seconds"
            )));
        }
        // 1e300 panicked here (from_secs_f64): too large for any duration
        let d = std::time::Duration::try_from_secs_f64(s).map_err(|_| {
            super::usage(format!(
                "--duration {s}: too large; leave it out to run until stopped"
            ))
        })?;
        options.run_for = Some(d);
    }
    // `[kubernetes] discover`: the watch runs on its own thread; the agent takes its sets
    // between ticks. Kept alive until the agent stops.
    let _discovery = start_discovery(&mut options)?;
    start_advertise(&mut options)?;
    let agent = Agent::start(options).map_err(|e| {
        if e.is_usage() {
            super::usage(e.to_string())
        } else {
            // The message already carries the path, value and OS error: no chain to repeat.
            anyhow::anyhow!("{e}")
        }
    })?;
    let summary = agent
        .run()
        .map_err(|e| anyhow::anyhow!("agent loop: {e}"))?;
    // Through the log's queue: a stderr nobody reads does not hold the exit (hostile pass 38).
    crate::log_queue::say(&format!(
        "headroom agent: stopped after {} ticks, {} writes, {} failed reconciliations; exit action: {}",
        summary.ticks, summary.writes, summary.write_errors, summary.exit_action
    ));
    Ok(())
}

#[cfg(feature = "kube")]
fn start_discovery(options: &mut AgentOptions) -> anyhow::Result<Option<headroom_kube::Discovery>> {
    let k = &options.config.kubernetes;
    if !k.discover {
        return Ok(None);
    }
    let node = k
        .node(std::env::var(headroom_control::config::NODE_NAME_ENV).ok())
        .map_err(|e| super::usage(e.to_string()))?;
    let mut opts = headroom_kube::DiscoveryOptions::new(&node);
    opts.kubeconfig = k.kubeconfig.as_ref().map(PathBuf::from);
    opts.layout = k.cgroup_layout;
    // The newest set only: the agent takes the newest between ticks.
    let (tx, events) = headroom_agent::runtime::LcEvents::channel();
    let sink: headroom_kube::EventSink = Box::new(move |ev| {
        let _ = tx.send(ev);
    });
    let discovery = headroom_kube::Discovery::start(opts, Some(sink))
        .map_err(|e| kube_start_error("[kubernetes] discover = true", e))?;
    options.config.kubernetes.node_name = Some(node);
    options.discovery = Some(events);
    Ok(Some(discovery))
}

/// A start error of headroom-kube: one of the config (a kubeconfig this host lacks or cannot
/// read, no node name) exits 2 as the other config paths naming what the host lacks do (it
/// exited 1); the API's exits 1. Nothing was made yet: the discovery and the publisher start
/// before the agent touches the host, and a started one stops when dropped.
#[cfg(feature = "kube")]
pub(super) fn kube_start_error(what: &str, e: headroom_kube::KubeError) -> anyhow::Error {
    if e.is_config() {
        super::usage(format!("{what}: {e}"))
    } else {
        anyhow::anyhow!("{what}: {e}")
    }
}

/// headroom-kube's publisher as the agent's advertise edge (it patches on its own thread).
#[cfg(feature = "kube")]
struct KubeAdvertise(headroom_kube::Publisher);

#[cfg(feature = "kube")]
impl headroom_agent::runtime::advertise::AdvertiseEdge for KubeAdvertise {
    fn set(&self, millicpu: u64, memory_bytes: u64) {
        self.0.set_both(headroom_kube::Wanted {
            millicpu,
            memory_bytes: Some(memory_bytes),
        });
    }
    fn floor_millicpu(&self) -> Option<u64> {
        let s = self.0.state();
        s.floor_synced.then_some(s.floor_millicpu)
    }
    fn floor_memory_bytes(&self) -> Option<u64> {
        let s = self.0.state();
        s.floor_synced.then_some(s.floor_memory_bytes)
    }
    fn state(&self) -> headroom_types::advertise::AdvertiseEdgeStatus {
        let s = self.0.state();
        headroom_types::advertise::AdvertiseEdgeStatus {
            floor_synced: s.floor_synced,
            floor_millicpu: s.floor_millicpu,
            published_millicpu: s.published_millicpu,
            floor_memory_bytes: s.floor_memory_bytes,
            published_memory_bytes: s.published_memory_bytes,
            patches: s.patches,
            errors: s.errors,
            last_error: s.last_error,
        }
    }
}

/// `[kubernetes] advertise`: starts the publisher the agent hands its value to.
#[cfg(feature = "kube")]
fn start_advertise(options: &mut AgentOptions) -> anyhow::Result<()> {
    let k = &options.config.kubernetes;
    if !k.advertise {
        return Ok(());
    }
    let node = k
        .node(std::env::var(headroom_control::config::NODE_NAME_ENV).ok())
        .map_err(|e| super::usage(e.to_string()))?;
    let mut opts = headroom_kube::PublishOptions::new(&node);
    opts.kubeconfig = k.kubeconfig.as_ref().map(PathBuf::from);
    let publisher = headroom_kube::Publisher::start(opts)
        .map_err(|e| kube_start_error("[kubernetes] advertise = true", e))?;
    options.advertise = Some(headroom_agent::runtime::advertise::AdvertiseLink(
        std::sync::Arc::new(KubeAdvertise(publisher)),
    ));
    Ok(())
}

#[cfg(not(feature = "kube"))]
fn start_advertise(options: &mut AgentOptions) -> anyhow::Result<()> {
    if options.config.kubernetes.advertise {
        return Err(super::usage(
            "[kubernetes] advertise = true: this headroom was built without the `kube` feature"
                .to_string(),
        ));
    }
    Ok(())
}

#[cfg(not(feature = "kube"))]
fn start_discovery(options: &mut AgentOptions) -> anyhow::Result<Option<()>> {
    if options.config.kubernetes.discover {
        return Err(super::usage(
            "[kubernetes] discover = true: this headroom was built without the `kube` feature"
                .to_string(),
        ));
    }
    Ok(None)
}

fn run_replay(config: &Config, log: &std::path::Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(log)
        .with_context(|| format!("reading decision log {}", log.display()))?;
    let parsed = headroom_types::decision::parse_log(&text)
        .map_err(|e| super::usage(format!("{}: {e}", log.display())))?;
    if let Some((line, why)) = &parsed.torn_tail {
        eprintln!(
            "headroom agent: {} line {line} is torn (the agent stopped or the disk filled \
             mid-write: {why}); replaying the {} whole lines before it",
            log.display(),
            parsed.lines.len()
        );
    }
    let records = parsed.lines;
    let side = machine_sidecar(log);
    let machine: MachineInfo = match std::fs::read_to_string(&side) {
        Ok(t) => serde_json::from_str(&t)
            .with_context(|| format!("parsing machine description {}", side.display()))?,
        Err(_) => {
            eprintln!(
                "headroom agent: no {}; replaying with this host's description",
                side.display()
            );
            let host = headroom_host::LinuxHost::system();
            let cpus: Vec<u32> = host
                .topology()
                .map(|t| t.cpus_online.to_vec())
                .unwrap_or_default();
            let cgroups = host.cgroups()?;
            let node =
                headroom_agent::linux_node::LinuxNode::from_config(&host, cgroups, config, &cpus)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            machine_info(&host, &node)
        }
    };
    let mismatches = replay_log(config, &machine, &records);
    let decisions = records
        .iter()
        .filter(|l| matches!(l, LogLine::Decision(_)))
        .count();
    let events = records.len() - decisions;
    match mismatches.first() {
        None => {
            println!(
                "replay: {decisions} decisions reproduced exactly ({events} ctl events applied)"
            );
            Ok(())
        }
        Some(first) => {
            println!(
                "replay: {} of {decisions} decisions differ; first: {first}",
                mismatches.len(),
            );
            crate::log_queue::flush(crate::LOG_FLUSH);
            std::process::exit(1);
        }
    }
}
