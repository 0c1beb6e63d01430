//! One server, one policy, one stretch of simulated time: the closed loop
//! trace → SimHost → Observation → the real policy (inside its real safety wrapper) → Allocation →
//! SimHost. Simulated time only; the same seed gives the same numbers.
//!
//! Time advances in model ticks (`tick_s`, 5 s by default): within a tick the load is constant and
//! the model is in steady state; how often the policy is called within one is `closed_loop`'s.

use headroom_control::config::{
    Config, LatencyConfig, LcConfig, LoadConfig, PolicyConfig, PolicyKind, SloConfig,
};
use headroom_types::GroupPath;

use crate::closed_loop::ClosedLoop;
use crate::error::SimError;
use crate::host::TickState;
use crate::model::ServerModel;
use crate::queue::{quantile_of_mix, ResponseTail};
pub use crate::setup::{ServerSpec, SimSetup};
use crate::trace::ServerLoad;

/// Every policy, in report order.
pub const ALL_POLICIES: [PolicyKind; 7] = [
    PolicyKind::None,
    PolicyKind::StaticCores,
    PolicyKind::StaticCycles,
    PolicyKind::Weights,
    PolicyKind::Blind,
    PolicyKind::Heracles,
    PolicyKind::Hybrid,
];

/// Parses a policy name as `policy.kind` spells it (`multi` too: it runs on one-LC servers as
/// `hybrid` does, and is the arbitration of multi-service servers, `sim fleet --services`).
pub fn parse_policy(name: &str) -> Result<PolicyKind, SimError> {
    name.parse::<PolicyKind>().map_err(|_| {
        SimError::invalid(
            "--policies",
            name,
            &format!(
                "unknown policy; one of {}",
                headroom_control::config::ALL_POLICY_KINDS
                    .map(PolicyKind::as_str)
                    .join(", ")
            ),
        )
    })
}

/// The agent config a simulated server runs: the LC's SLO and peak from the model, the latency
/// and load from a feed (the simulator), the static baselines at a quarter of the machine.
/// `extra` is the user's TOML (`sim --agent-config`, e.g. `[policy.blind]` keys), laid over the
/// config built here; the whole is validated once.
pub fn agent_config(
    kind: PolicyKind,
    model: &ServerModel,
    cores: u32,
    peak_qps: f64,
    window_s: f64,
    extra: &str,
) -> Result<Config, SimError> {
    let lc = fed_lc(&FedLc {
        name: "lc",
        cgroup: crate::node::LC_GROUP,
        priority: 0,
        slo_us: model.lc.slo_us,
        percentile: model.lc.percentile,
        window_s,
        peak_qps,
    })?;
    let config = simulated_config(kind, vec![lc], cores);
    with_user_overrides(config, extra, kind)
}

/// One fed LC service of a simulated server's agent config.
pub(crate) struct FedLc<'a> {
    pub name: &'a str,
    pub cgroup: &'a str,
    pub priority: i32,
    pub slo_us: f64,
    pub percentile: f64,
    pub window_s: f64,
    pub peak_qps: f64,
}

/// The `[lc]` of a fed service.
pub(crate) fn fed_lc(lc: &FedLc<'_>) -> Result<LcConfig, SimError> {
    let cgroup = GroupPath::new(lc.cgroup)
        .map_err(|e| SimError::invalid("lc.cgroup", lc.cgroup, &e.to_string()))?;
    let slo = SloConfig {
        percentile: lc.percentile,
        target_us: lc.slo_us,
        window_s: lc.window_s,
        min_samples: None,
    };
    let mut c = LcConfig::new(
        lc.name,
        cgroup,
        Vec::new(),
        slo,
        Some(LatencyConfig::fed_in_process()),
        Some(LoadConfig::fed_in_process(lc.peak_qps.max(1.0).round())),
    );
    c.priority = lc.priority;
    Ok(c)
}

/// `lcs` under `kind`, the static baselines at a quarter of the machine.
pub(crate) fn simulated_config(kind: PolicyKind, lcs: Vec<LcConfig>, cores: u32) -> Config {
    let mut c = Config::new(
        lcs,
        Vec::new(),
        PolicyConfig {
            kind,
            ..PolicyConfig::default()
        },
    );
    c.policy.static_cores.cores = (cores / 4).max(1);
    c.policy.static_cycles.percent = 25.0;
    c
}

/// `config` with the user's TOML laid over it (tables merged key by key), validated once.
pub(crate) fn with_user_overrides(
    config: Config,
    extra: &str,
    kind: PolicyKind,
) -> Result<Config, SimError> {
    let refused = |reason: String| SimError::Invalid {
        file: None,
        key: "agent config".to_string(),
        value: kind.as_str().to_string(),
        reason,
    };
    if extra.trim().is_empty() {
        config.validate().map_err(|e| refused(e.to_string()))?;
        return Ok(config);
    }
    let overrides: toml::Table = toml::from_str(extra).map_err(|e| refused(e.to_string()))?;
    let mut doc = toml::Table::try_from(&config).map_err(|e| refused(e.to_string()))?;
    merge_tables(&mut doc, overrides);
    // the agent's own reading of a config file: every refusal at once, named by its key
    let text = toml::to_string(&doc).map_err(|e| refused(e.to_string()))?;
    Config::from_toml_str(&text).map_err(|e| refused(e.to_string()))
}

/// `over`'s keys into `base`: tables merged, anything else replaced.
fn merge_tables(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_tables(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// One SLO window of one server.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WindowRecord {
    /// Window start, seconds since the run started.
    pub t_s: f64,
    /// Mean LC load, fraction of peak.
    pub load: f64,
    pub p99_us: f64,
    pub be_norm: f64,
    pub emu: f64,
    pub violating: bool,
    /// BE CPU capacity the policy allowed at the window's end.
    pub be_cpus: f64,
    /// The BE kind running.
    pub be: String,
    /// The last decision reason of the window.
    pub reason: String,
}

/// A server's result under one policy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerOutcome {
    pub windows: u64,
    pub violations: u64,
    pub emu_sum: f64,
    pub emu_min: f64,
    pub be_norm_sum: f64,
    pub lc_load_sum: f64,
    pub p99_max: f64,
    /// Allocation changes written.
    pub writes: u64,
    /// Policy calls.
    pub decisions: u64,
    pub records: Vec<WindowRecord>,
    /// Per window: (EMU, violating).
    pub window_emu: Vec<(f64, bool)>,
}

impl ServerOutcome {
    pub fn emu_mean(&self) -> f64 {
        self.emu_sum / self.windows.max(1) as f64
    }
}

/// Simulates one server under one policy. `on_window(index, ticks)` gets each closed window's
/// tick distributions with their request weights (for the fleet's fan-out view).
pub fn run_server(
    setup: &SimSetup,
    spec: &ServerSpec,
    kind: PolicyKind,
    peak_qps: f64,
    record: bool,
    mut on_window: impl FnMut(usize, &[(f64, ResponseTail)]),
) -> Result<ServerOutcome, SimError> {
    let model = &setup.model;
    let window_s = model_window_s(setup);
    let config = agent_config(
        kind,
        model,
        spec.cores,
        peak_qps,
        window_s,
        &setup.agent_extra,
    )?;
    let mut lp = ClosedLoop::new(setup, spec, &config, kind, window_s, record)?;
    let mut load_gen = ServerLoad::new(spec.seed, setup.noise_sd, setup.tick_s, setup.vary_servers);
    let (ticks_per_window, total_ticks) = (lp.ticks_per_window, lp.total_ticks);
    let q = model.lc.percentile / 100.0;
    let slo = model.lc.slo_us;
    let mut out = ServerOutcome {
        emu_min: f64::INFINITY,
        ..ServerOutcome::default()
    };
    // the last `ticks_per_window` ticks: (request weight, distribution)
    let mut recent: Vec<(f64, ResponseTail)> = Vec::with_capacity(ticks_per_window);
    let mut window: Vec<(f64, ResponseTail)> = Vec::with_capacity(ticks_per_window);
    let (mut w_emu, mut w_be, mut w_load) = (0.0, 0.0, 0.0);
    let mut last_reason = String::new();
    // the p99 of the window that closed at the previous tick, when it was a full one
    let mut closed_window_p99: Option<f64> = None;
    for i in 0..total_ticks {
        let t0 = lp.start_tick(i, setup.be_job_mean_s);
        let t_s = t0.as_secs_f64();
        let load = load_gen.next(&setup.trace, spec.start_s + t_s);
        let qps = load * peak_qps;
        // the latency source's window: the last window_s of requests, current at the tick
        let latency = if recent.is_empty() {
            None
        } else {
            // right after a full window closed, `recent` holds exactly its ticks
            Some(
                closed_window_p99
                    .take()
                    .unwrap_or_else(|| quantile_of_mix(&recent, q)),
            )
        };
        closed_window_p99 = None;
        lp.host.set_inputs(qps, latency, peak_qps);
        let state = lp.run_tick(t0, |d| {
            if record {
                last_reason = d.reason;
            }
        })?;
        account_tick(&state, load, &mut w_emu, &mut w_be, &mut w_load);
        let weight = qps.max(1e-9);
        if recent.len() == ticks_per_window {
            recent.remove(0);
        }
        recent.push((weight, state.tail));
        window.push((weight, state.tail));
        if window.len() == ticks_per_window || i + 1 == total_ticks {
            let n = window.len() as f64;
            let p99 = quantile_of_mix(&window, q);
            if window.len() == ticks_per_window {
                closed_window_p99 = Some(p99);
            }
            let emu = w_emu / n;
            let violating = p99 > slo;
            out.windows += 1;
            out.violations += u64::from(violating);
            out.emu_sum += emu;
            out.window_emu.push((emu, violating));
            out.emu_min = out.emu_min.min(emu);
            out.be_norm_sum += w_be / n;
            out.lc_load_sum += w_load / n;
            out.p99_max = out.p99_max.max(p99);
            on_window(out.windows as usize - 1, &window);
            if record {
                out.records.push(WindowRecord {
                    t_s: t_s - setup.tick_s * (n - 1.0),
                    load: w_load / n,
                    p99_us: p99,
                    be_norm: w_be / n,
                    emu,
                    violating,
                    be_cpus: lp.applied.be_cpu_capacity(spec.cores as usize),
                    be: setup.be_pool[lp.current_kind()].clone(),
                    reason: last_reason.clone(),
                });
            }
            window.clear();
            (w_emu, w_be, w_load) = (0.0, 0.0, 0.0);
        }
    }
    if out.windows == 0 {
        out.emu_min = 0.0;
    }
    out.decisions = lp.decisions;
    out.writes = lp.writes;
    Ok(out)
}

fn account_tick(s: &TickState, load: f64, emu: &mut f64, be: &mut f64, lc: &mut f64) {
    *emu += load + s.be_norm;
    *be += s.be_norm;
    *lc += load;
}

/// The SLO window the agent config uses (default the agent's 15 s).
pub fn model_window_s(setup: &SimSetup) -> f64 {
    setup.window_s
}
