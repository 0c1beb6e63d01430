//! The agent a point or run is recorded under: its config, and the warm-up its latency
//! window needs before anything is measured.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

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
        let AgentRun {
            name,
            policy,
            extra,
            lc_pid,
            addr,
            be_argv,
            slo_us,
            peak_qps,
            feed_socket,
        } = a;
        let path = self.dir.scratch_path(&format!("agent-{name}.toml"))?;
        let state = self.dir.scratch_path(&format!("agent-{name}.state.json"))?;
        let socket = self.dir.scratch_path(&format!("agent-{name}.sock"))?;
        let metrics_port = runner::free_port()?;
        let server: Vec<String> = self
            .opts
            .placement
            .server
            .iter()
            .map(|c| c.to_string())
            .collect();
        // The latency the agent acts on: the load generator's own windows when it feeds them
        // (the same measurement that judges the SLO), else the agent's prober.
        let window_s = self.agent_window_s();
        let latency = match feed_socket {
            Some(sock) => feed_latency(sock),
            None => probe_latency(*addr, probe_rate_hz(self.opts.percentile, window_s)),
        };
        let lc = LcTables {
            name: "serve",
            cgroup: "headroom-bench/lc",
            pid: *lc_pid,
            percentile: self.opts.percentile,
            slo_us: *slo_us,
            window_s,
            latency: &latency,
            addr: *addr,
            peak_qps: *peak_qps,
        };
        // PerfIso's static baselines, Blagodurov's weights and blind isolation do not react to an
        // SLO violation by switching BE off for minutes; the agent's safety layer would (its
        // production default), and then the experiment compares that rule, not the policies.
        let safety_cooldown = if LATENCY_BLIND_POLICIES.contains(&policy.as_str()) {
            "# as its paper defines it, this policy does not switch BE off after an SLO violation\nviolation_cooldown_s = 0.0\n".to_string()
        } else if self.exp == Experiment::Colocation {
            // The trace compresses a day into minutes: the production cooldown (300 s) would
            // keep BE off for the rest of it after one bad window.
            let trace_s = self.opts.minutes * 60.0;
            format!(
                "# the {trace_s:.0} s trace stands for a day: the {PRODUCTION_COOLDOWN_S:.0} s cooldown scaled by {:.5}, at least one latency window\nviolation_cooldown_s = {:?}\n",
                trace_s / TRACE_DAY_S,
                scaled_cooldown_s(trace_s, window_s)
            )
        } else {
            String::new()
        };
        // Heracles' top level keeps its own cooldown after a negative slack (Alg. 1,
        // `policy.heracles.cooldown_s`, also hybrid's and multi's outer loop): scaled the same,
        // or one violation kept BE off for the rest of a demo (measured 2026-11-27: BE off from
        // window 6 of 9 with the safety layer's cooldown already 10 s).
        let heracles_cooldown = if self.exp == Experiment::Colocation
            && !LATENCY_BLIND_POLICIES.contains(&policy.as_str())
            && !extra.contains("[policy.heracles]")
        {
            let trace_s = self.opts.minutes * 60.0;
            format!(
                "[policy.heracles]\n# Alg. 1's cooldown, scaled as the safety layer's below\ncooldown_s = {:?}\n",
                scaled_cooldown_s(trace_s, window_s)
            )
        } else {
            String::new()
        };
        let text = format!(
            r#"# Written by headroom bench {exp}: {name}
{lc}
{be}
[policy.blind]
be_cpus = [{server}]

[policy.static-cores]
cpus = [{server}]
{extra}
{heracles_cooldown}
[safety]
on_exit = "restore"
state_file = "{state}"
# the agent shares its CPU with the load generator here: a SCHED_FIFO agent would preempt the
# instrument (its send lag grew to 393 ms in a demo run), so it stays a normal task
agent_fifo_priority = 0
{safety_cooldown}
[api]
socket = "{socket}"
metrics = "127.0.0.1:{metrics_port}"
"#,
            exp = self.exp.name(),
            lc = lc.toml("[lc]"),
            be = be_and_policy("headroom-bench/be", be_argv, policy),
            server = server.join(", "),
            state = state.display(),
            socket = socket.display(),
        );
        std::fs::write(&path, text).map_err(|e| BenchError::io("writing", &path, e))?;
        Ok(path)
    }
}

/// One LC service's tables in an agent config the bench writes: the service, its SLO, where
/// the agent takes its latency from and its load (memcache stats).
pub(crate) struct LcTables<'a> {
    pub name: &'a str,
    pub cgroup: &'a str,
    pub pid: u32,
    pub percentile: f64,
    pub slo_us: f64,
    pub window_s: f64,
    /// The `[lc.latency]` table's body ([`feed_latency`], [`probe_latency`]).
    pub latency: &'a str,
    pub addr: SocketAddr,
    pub peak_qps: f64,
}

impl LcTables<'_> {
    /// The tables under `header` (`[lc]`, or `[[lc]]` for one of several services).
    pub(crate) fn toml(&self, header: &str) -> String {
        format!(
            r#"{header}
name = "{name}"
cgroup = "{cgroup}"
pids = [{pid}]

[lc.slo]
percentile = {pct:?}
target_us = {slo:?}
window_s = {window:?}

[lc.latency]
{latency}

[lc.load]
source = "memcache-stats"
address = "{addr}"
peak_qps = {peak:?}
"#,
            name = self.name,
            cgroup = self.cgroup,
            pid = self.pid,
            pct = self.percentile,
            slo = self.slo_us,
            window = self.window_s,
            latency = self.latency,
            addr = self.addr,
            peak = self.peak_qps,
        )
    }
}

/// `[lc.latency]` from the service's load generator, which pushes its windows to `socket`.
pub(crate) fn feed_latency(socket: &Path) -> String {
    format!("source = \"feed\"\nsocket = \"{}\"", socket.display())
}

/// `[lc.latency]` from the agent's memcache prober on `addr`, `rate_hz` probes a second.
pub(crate) fn probe_latency(addr: SocketAddr, rate_hz: f64) -> String {
    format!(
        "source = \"probe\"\nprotocol = \"memcache\"\naddress = \"{addr}\"\nrate_hz = {rate_hz:?}"
    )
}

/// The BE group `cgroup` running `argv`, and the `[policy]` table naming `policy`.
pub(crate) fn be_and_policy(cgroup: &str, argv: &[String], policy: &str) -> String {
    let cmd: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "[[be]]\nname = \"be\"\ncgroup = \"{cgroup}\"\ncommand = [{}]\n\n[policy]\nkind = \"{policy}\"\n",
        cmd.join(", ")
    )
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
    /// Extra TOML appended to the generated config (policy or LC thread settings).
    pub extra: String,
    pub lc_pid: u32,
    pub addr: SocketAddr,
    /// The BE command the agent launches in the BE group.
    pub be_argv: Vec<String>,
    pub slo_us: f64,
    pub peak_qps: f64,
    /// The agent takes the LC latency from `headroom load --feed` on this socket.
    pub feed_socket: Option<std::path::PathBuf>,
}
