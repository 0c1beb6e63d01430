//! The agent a point or run is recorded under: its config, and the warm-up its latency
//! window needs before anything is measured.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use headroom_control::config::{
    BeConfig, Config, ConfigError, LatencyConfig, LcConfig, LoadConfig, OnExit, PolicyConfig,
    PolicyKind, SafetyConfig, SloConfig,
};
use headroom_types::{CpuSet, GroupPath};

use super::{probe_rate_hz, Session, LATENCY_BLIND_POLICIES};
use crate::error::{BenchError, Result};
use crate::experiments::Experiment;
use crate::runner::{self};

impl Session<'_> {
    /// The window (s) over which the agent's latency is taken: a colocation window, else
    /// Heracles' 15 s.
    pub(super) fn agent_window_s(&self) -> f64 {
        if self.exp == Experiment::Colocation {
            self.opts.duration_s
        } else {
            15.0
        }
    }

    /// Runs the load for one latency window (plus a second) before anything is measured, so a
    /// latency-driven policy has seen a full window: the agent publishes no tail before its
    /// window has filled once, and keeps BE off until it has one. The result is not recorded.
    pub(super) fn warm_up_agent(
        &self,
        addr: SocketAddr,
        qps: f64,
        feed: &Path,
        label: &str,
    ) -> Result<()> {
        let json = self
            .dir
            .scratch_path(&format!("{label}-warmup.load.json"))?;
        self.runner
            .run_load_feeding(addr, qps, self.agent_window_s() + 1.0, &json, Some(feed))
            .map(|_| ())
    }

    /// Writes the agent's config for a policy and returns its path.
    ///
    /// Policies whose papers define them without a latency-triggered BE shutdown run with the
    /// safety layer's SLO-violation cooldown off (see [`LATENCY_BLIND_POLICIES`]).
    pub fn agent_config(&self, a: &AgentRun) -> Result<PathBuf> {
        let path = self.dir.scratch_path(&format!("agent-{}.toml", a.name))?;
        let state = self
            .dir
            .scratch_path(&format!("agent-{}.state.json", a.name))?;
        let socket = self.dir.scratch_path(&format!("agent-{}.sock", a.name))?;
        let metrics_port = runner::free_port()?;
        let policy: PolicyKind = a.policy.parse().map_err(|e| config_error(&path, e))?;
        // The latency the agent acts on: the load generator's own windows when it feeds them
        // (the same measurement that judges the SLO), else the agent's prober.
        let window_s = self.agent_window_s();
        let latency = match &a.feed_socket {
            Some(sock) => LatencyConfig::feed(sock),
            None => {
                LatencyConfig::memcache_probe(a.addr, probe_rate_hz(self.opts.percentile, window_s))
            }
        };
        let lc = lc_config(
            &LcService {
                name: "serve",
                cgroup: "headroom-bench/lc",
                pid: a.lc_pid,
                addr: a.addr,
                peak_qps: a.peak_qps,
            },
            SloConfig {
                percentile: self.opts.percentile,
                target_us: a.slo_us,
                window_s,
                min_samples: None,
            },
            latency,
        )
        .map_err(|e| config_error(&path, e))?;
        let be = be_config("headroom-bench/be", &a.be_argv).map_err(|e| config_error(&path, e))?;
        let server: CpuSet = self
            .opts
            .placement
            .server
            .iter()
            .map(|&c| c as u32)
            .collect();
        let mut config = Config::new(
            vec![lc],
            vec![be],
            PolicyConfig {
                kind: policy,
                ..PolicyConfig::default()
            },
        );
        config.policy.blind.be_cpus = server.clone();
        config.policy.static_cores.cpus = server;
        // The agent shares its CPU with the load generator here: a SCHED_FIFO agent would
        // preempt the instrument (its send lag grew to 393 ms in a demo run), so it stays a
        // normal task.
        config.safety = SafetyConfig {
            on_exit: OnExit::Restore,
            state_file: state.display().to_string(),
            agent_fifo_priority: 0,
            ..SafetyConfig::default()
        };
        let latency_blind = LATENCY_BLIND_POLICIES.contains(&policy.as_str());
        if latency_blind {
            // PerfIso's static baselines, Blagodurov's weights and blind isolation do not react
            // to an SLO violation by switching BE off for minutes; the agent's safety layer
            // would (its production default), and then the experiment compares that rule, not
            // the policies.
            config.safety.violation_cooldown_s = 0.0;
        } else if self.exp == Experiment::Colocation {
            // The trace compresses a day into minutes: the production cooldown (300 s) would
            // keep BE off for the rest of it after one bad window; the same for Heracles' own
            // cooldown after a negative slack (Alg. 1, also hybrid's and multi's outer loop:
            // measured 2026-11-27, one violation kept BE off from window 6 of 9 with the safety
            // layer's cooldown already 10 s).
            let cooldown = scaled_cooldown_s(self.opts.minutes * 60.0, window_s);
            config.safety.violation_cooldown_s = cooldown;
            config.policy.heracles.cooldown_s = cooldown;
        }
        config.api.socket = socket.display().to_string();
        config.api.metrics = Some(SocketAddr::from(([127, 0, 0, 1], metrics_port)).to_string());
        (a.tweak)(&mut config);
        write_config(&path, &config)?;
        Ok(path)
    }
}

/// A change to the agent's config a run asks for (a policy's constants, LC thread settings).
pub type AgentTweak = fn(&mut Config);

/// The config as built.
pub fn no_tweak(_: &mut Config) {}

/// One LC service the bench runs, as the agent's config names it.
pub(crate) struct LcService<'a> {
    pub name: &'a str,
    pub cgroup: &'a str,
    pub pid: u32,
    pub addr: SocketAddr,
    pub peak_qps: f64,
}

/// The service's `[lc]` table: judged by `slo`, its latency from `latency`, its load from
/// memcached's own stats.
pub(crate) fn lc_config(
    lc: &LcService<'_>,
    slo: SloConfig,
    latency: LatencyConfig,
) -> std::result::Result<LcConfig, ConfigError> {
    let cgroup = GroupPath::new(lc.cgroup).map_err(|e| ConfigError::Invalid {
        key: "lc.cgroup".into(),
        value: lc.cgroup.into(),
        reason: e.to_string(),
    })?;
    Ok(LcConfig::new(
        lc.name,
        cgroup,
        vec![lc.pid],
        slo,
        Some(latency),
        Some(LoadConfig::memcache_stats(lc.addr, lc.peak_qps)),
    ))
}

/// The BE group `cgroup` running `argv`.
pub(crate) fn be_config(
    cgroup: &str,
    argv: &[String],
) -> std::result::Result<BeConfig, ConfigError> {
    let group = GroupPath::new(cgroup).map_err(|e| ConfigError::Invalid {
        key: "be.cgroup".into(),
        value: cgroup.into(),
        reason: e.to_string(),
    })?;
    Ok(BeConfig::new("be", group, argv.to_vec()))
}

pub(crate) fn config_error(path: &Path, e: ConfigError) -> BenchError {
    BenchError::Config {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Validates `config` (every problem at once) and writes it as TOML to `path`.
pub(crate) fn write_config(path: &Path, config: &Config) -> Result<()> {
    config.validate().map_err(|e| config_error(path, e))?;
    let text = toml::to_string(config).map_err(|e| BenchError::Config {
        path: path.to_path_buf(),
        reason: format!("cannot write the config as TOML: {e}"),
    })?;
    std::fs::write(path, text).map_err(|e| BenchError::io("writing", path, e))
}

/// The day a diurnal trace stands for, seconds.
pub const TRACE_DAY_S: f64 = 86_400.0;
/// The agent's production SLO-violation cooldown (Heracles Alg. 1: BE off for 5 minutes).
pub const PRODUCTION_COOLDOWN_S: f64 = 300.0;

/// The SLO-violation cooldown for a trace of `trace_s` seconds standing for a day: the
/// production cooldown scaled by the trace's time compression, but at least one latency window
/// of `window_s` (the window that says whether the violation is over) and at most the
/// production value. A 90 s demo trace with 10 s windows gets 10 s instead of 300 s.
pub fn scaled_cooldown_s(trace_s: f64, window_s: f64) -> f64 {
    (PRODUCTION_COOLDOWN_S * trace_s / TRACE_DAY_S)
        .max(window_s)
        .min(PRODUCTION_COOLDOWN_S)
}

/// What the agent's config for one run says.
#[derive(Debug, Clone)]
pub struct AgentRun {
    pub name: String,
    pub policy: String,
    /// What the run changes in the config built for it.
    pub tweak: AgentTweak,
    pub lc_pid: u32,
    pub addr: SocketAddr,
    /// The BE command the agent launches in the BE group.
    pub be_argv: Vec<String>,
    pub slo_us: f64,
    pub peak_qps: f64,
    /// The agent takes the LC latency from `headroom load --feed` on this socket.
    pub feed_socket: Option<std::path::PathBuf>,
}
