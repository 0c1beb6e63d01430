//! Servers with several LC services (issue 29): each service has its own trace (the day shifted
//! by its `offset_h`, its own noise), service time and SLO; the services share the server's
//! CPUs as one FCFS queue (unpinned, the default deployment), so every request waits the same
//! M/G/k wait — that of the services' mixed service time — and then takes its own service time,
//! both stretched by BE's interference as for one LC. The real policy (`policy::build`, inside
//! its safety rules, through `Controller::step` and the write path) reads each service's window
//! tail, load and rate in `obs.lc_groups`, the top-level `lc_*` fields repeating the first's,
//! as the agent reports them. EMU = the services' loads (each relative to its peak alone on the
//! server) + BE's normalised throughput; a window violates for a service when its p99 exceeds
//! that service's SLO.

pub mod report;
pub mod spec;

use headroom_control::config::{Config, PolicyKind};
use headroom_types::observation::LcGroupObservation;
use rayon::prelude::*;

use crate::closed_loop::ClosedLoop;
use crate::error::SimError;
use crate::fleet::FleetSpec;
use crate::host::SimHost;
use crate::model::ServerModel;
use crate::queue::{quantile_of_mix, ResponseTail};
use crate::run::{model_window_s, ServerSpec, SimSetup};
use crate::trace::ServerLoad;
pub use spec::{mixed_service, ServiceSpec, ServicesFile};

/// The policies compared on multi-service servers by default.
pub const DEFAULT_POLICIES: [PolicyKind; 3] =
    [PolicyKind::None, PolicyKind::Hybrid, PolicyKind::Multi];

/// The model with service `s` as its LC (for its peak alone on the server).
fn model_of(model: &ServerModel, s: &ServiceSpec) -> ServerModel {
    let mut m = model.clone();
    m.lc.service_us = s.service_us;
    m.lc.service_cv = s.service_cv;
    m.lc.cpu_us = 0.0;
    m.lc.slo_us = s.slo_us;
    m.lc.percentile = s.percentile;
    m
}

/// Each service's peak alone on a server of `cores`, requests/s.
pub fn service_peaks(model: &ServerModel, services: &[ServiceSpec], cores: u32) -> Vec<f64> {
    services
        .iter()
        .map(|s| SimHost::peak_qps(&model_of(model, s), cores))
        .collect()
}

/// The agent config of a multi-service server: one `[[lc]]` per service (the first in the
/// model's LC group), latency and load from a feed, `peak_qps` = the service's peak alone.
pub fn multi_agent_config(
    kind: PolicyKind,
    services: &[ServiceSpec],
    peaks: &[f64],
    cores: u32,
    window_s: f64,
    extra: &str,
) -> Result<Config, SimError> {
    let mut lcs = Vec::new();
    for (i, (s, peak)) in services.iter().zip(peaks).enumerate() {
        let cgroup = if i == 0 {
            crate::node::LC_GROUP.to_string()
        } else {
            format!("headroom/lc-{}", s.name)
        };
        lcs.push(crate::run::fed_lc(&crate::run::FedLc {
            name: &s.name,
            cgroup: &cgroup,
            priority: s.priority,
            slo_us: s.slo_us,
            percentile: s.percentile,
            window_s,
            peak_qps: *peak,
        })?);
    }
    let config = crate::run::simulated_config(kind, lcs, cores);
    crate::run::with_user_overrides(config, extra, kind)
}

/// One service's totals on one server.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ServiceOutcome {
    pub name: String,
    pub windows: u64,
    pub violations: u64,
    pub p99_max_us: f64,
    /// Mean load, fraction of the service's peak alone on the server.
    pub load_mean: f64,
}

/// One SLO window of a multi-service server.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MultiWindow {
    pub t_s: f64,
    /// Per service: (load, p99 µs, violating).
    pub services: Vec<(f64, f64, bool)>,
    pub be_norm: f64,
    pub emu: f64,
    pub be_cpus: f64,
    pub reason: String,
    pub binding: Option<String>,
}

/// A multi-service server's result under one policy.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct MultiOutcome {
    pub server: usize,
    pub cores: u32,
    pub services: Vec<ServiceOutcome>,
    pub windows: u64,
    pub emu_mean: f64,
    pub emu_min: f64,
    pub be_norm_mean: f64,
    /// Mean of the services' summed loads.
    pub lc_load_mean: f64,
    pub decisions: u64,
    pub writes: u64,
    #[serde(skip)]
    pub records: Vec<MultiWindow>,
}

impl MultiOutcome {
    /// Windows in which at least one service violated.
    pub fn violating_windows(&self) -> u64 {
        self.services
            .iter()
            .map(|s| s.violations)
            .max()
            .unwrap_or(0)
    }
}

/// The fleet of multi-service servers under one policy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MultiFleet {
    pub policy: &'static str,
    pub servers: Vec<MultiOutcome>,
}

impl MultiFleet {
    /// Violating windows per service over the fleet, in service order.
    pub fn violations(&self) -> Vec<u64> {
        let n = self.servers.first().map_or(0, |s| s.services.len());
        (0..n)
            .map(|i| self.servers.iter().map(|s| s.services[i].violations).sum())
            .collect()
    }

    pub fn windows(&self) -> u64 {
        self.servers.iter().map(|s| s.windows).sum()
    }

    pub fn emu_mean(&self) -> f64 {
        let n = self.servers.len().max(1) as f64;
        self.servers.iter().map(|s| s.emu_mean).sum::<f64>() / n
    }

    pub fn be_norm_mean(&self) -> f64 {
        let n = self.servers.len().max(1) as f64;
        self.servers.iter().map(|s| s.be_norm_mean).sum::<f64>() / n
    }
}

/// Runs every server of `spec` hosting `services` under each policy.
pub fn run_multi_fleet(
    setup: &SimSetup,
    services: &[ServiceSpec],
    spec: &FleetSpec,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<MultiFleet>, SimError> {
    if spec.servers == 0 || spec.cores.is_empty() || services.is_empty() {
        return Err(SimError::invalid(
            "--servers",
            spec.servers,
            "need at least one server, one size and one service",
        ));
    }
    let total = (spec.servers * spec.policies.len()) as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let mut out = Vec::new();
    for &kind in &spec.policies {
        let mut servers = (0..spec.servers)
            .into_par_iter()
            .map(|i| {
                let cores = spec.cores[i % spec.cores.len()];
                let server = ServerSpec {
                    cores,
                    seed: spec.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64,
                    start_s: 0.0,
                    duration_s: spec.hours * 3600.0,
                };
                let mut o = run_multi_server(setup, services, &server, kind, false)?;
                o.server = i;
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(n, total);
                Ok(o)
            })
            .collect::<Result<Vec<_>, SimError>>()?;
        servers.sort_by_key(|s| s.server);
        out.push(MultiFleet {
            policy: kind.as_str(),
            servers,
        });
    }
    Ok(out)
}

/// Per-service window bookkeeping (as `run_server` keeps it for one LC).
struct Windowing {
    recent: Vec<(f64, ResponseTail)>,
    window: Vec<(f64, ResponseTail)>,
    closed_p99: Option<f64>,
    load_sum: f64,
}

/// Simulates one server hosting `services` under one policy.
pub fn run_multi_server(
    setup: &SimSetup,
    services: &[ServiceSpec],
    spec: &ServerSpec,
    kind: PolicyKind,
    record: bool,
) -> Result<MultiOutcome, SimError> {
    let model = &setup.model;
    let window_s = model_window_s(setup);
    let peaks = service_peaks(model, services, spec.cores);
    let config = multi_agent_config(
        kind,
        services,
        &peaks,
        spec.cores,
        window_s,
        &setup.agent_extra,
    )?;
    let mut lp = ClosedLoop::new(setup, spec, &config, kind, window_s, record)?;
    let mut loads: Vec<ServerLoad> = (0..services.len())
        .map(|i| {
            // the first service draws as a one-LC server would; the others their own noise
            let seed = spec.seed ^ (i as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
            ServerLoad::new(seed, setup.noise_sd, setup.tick_s, setup.vary_servers)
        })
        .collect();
    let (ticks_per_window, total_ticks) = (lp.ticks_per_window, lp.total_ticks);
    let mut out = MultiOutcome {
        cores: spec.cores,
        emu_min: f64::INFINITY,
        services: services
            .iter()
            .map(|s| ServiceOutcome {
                name: s.name.clone(),
                ..ServiceOutcome::default()
            })
            .collect(),
        ..MultiOutcome::default()
    };
    let mut win: Vec<Windowing> = services
        .iter()
        .map(|_| Windowing {
            recent: Vec::with_capacity(ticks_per_window),
            window: Vec::with_capacity(ticks_per_window),
            closed_p99: None,
            load_sum: 0.0,
        })
        .collect();
    let (mut w_emu, mut w_be, mut w_lc) = (0.0, 0.0, 0.0);
    let (mut emu_sum, mut be_sum, mut lc_sum) = (0.0, 0.0, 0.0);
    let mut last = (String::new(), None);
    for i in 0..total_ticks {
        let t0 = lp.start_tick(i, setup.be_job_mean_s);
        let t_s = t0.as_secs_f64();
        // each service's arrivals: its trace (shifted) × its share of its peak alone
        let rates: Vec<f64> = services
            .iter()
            .zip(&mut loads)
            .zip(&peaks)
            .map(|((s, l), peak)| {
                let load = l.next(&setup.trace, spec.start_s + t_s + s.offset_h * 3600.0);
                load * s.share * peak
            })
            .collect();
        let groups: Vec<LcGroupObservation> = services
            .iter()
            .zip(&mut win)
            .zip(rates.iter().zip(&peaks))
            .map(|((s, w), (qps, peak))| {
                let q = s.percentile / 100.0;
                let latency = (!w.recent.is_empty()).then(|| {
                    w.closed_p99
                        .take()
                        .unwrap_or_else(|| quantile_of_mix(&w.recent, q))
                });
                w.closed_p99 = None;
                LcGroupObservation {
                    name: s.name.clone(),
                    latency_us: latency,
                    latency_age_ms: latency.map(|_| 0),
                    latency_source: None,
                    latency_untrusted: None,
                    qps: Some(*qps),
                    load: Some(qps / peak),
                    cpu_usage: None,
                    cpus: None,
                }
            })
            .collect();
        let total: f64 = rates.iter().sum();
        lp.host.set_service(mixed_service(services, &rates));
        lp.host.set_inputs(total, groups[0].latency_us, peaks[0]);
        lp.host.set_groups(groups);
        let state = lp.run_tick(t0, |d| {
            if record {
                last = (d.reason, d.binding_lc);
            }
        })?;
        let lc_load: f64 = rates.iter().zip(&peaks).map(|(r, p)| r / p).sum();
        w_emu += lc_load + state.be_norm;
        w_be += state.be_norm;
        w_lc += lc_load;
        for (((s, w), rate), peak) in services.iter().zip(&mut win).zip(&rates).zip(&peaks) {
            // the shared wait, then the service's own (stretched) service time
            let tail = ResponseTail {
                service: s.dist().stretched(state.stretch),
                ..state.tail
            };
            let weight = rate.max(1e-9);
            if w.recent.len() == ticks_per_window {
                w.recent.remove(0);
            }
            w.recent.push((weight, tail));
            w.window.push((weight, tail));
            w.load_sum += rate / peak;
        }
        let n = win[0].window.len();
        if n == ticks_per_window || i + 1 == total_ticks {
            let nf = n as f64;
            let mut per = Vec::with_capacity(services.len());
            for ((s, w), o) in services.iter().zip(&mut win).zip(&mut out.services) {
                let p99 = quantile_of_mix(&w.window, s.percentile / 100.0);
                if n == ticks_per_window {
                    w.closed_p99 = Some(p99);
                }
                let violating = p99 > s.slo_us;
                o.windows += 1;
                o.violations += u64::from(violating);
                o.p99_max_us = o.p99_max_us.max(p99);
                o.load_mean += w.load_sum / nf;
                per.push((w.load_sum / nf, p99, violating));
                w.window.clear();
                w.load_sum = 0.0;
            }
            let emu = w_emu / nf;
            out.windows += 1;
            emu_sum += emu;
            be_sum += w_be / nf;
            lc_sum += w_lc / nf;
            out.emu_min = out.emu_min.min(emu);
            if record {
                out.records.push(MultiWindow {
                    t_s: t_s - setup.tick_s * (nf - 1.0),
                    services: per,
                    be_norm: w_be / nf,
                    emu,
                    be_cpus: lp.applied.be_cpu_capacity(spec.cores as usize),
                    reason: last.0.clone(),
                    binding: last.1.clone(),
                });
            }
            (w_emu, w_be, w_lc) = (0.0, 0.0, 0.0);
        }
    }
    let windows = out.windows.max(1) as f64;
    out.emu_mean = emu_sum / windows;
    out.be_norm_mean = be_sum / windows;
    out.lc_load_mean = lc_sum / windows;
    for s in &mut out.services {
        s.load_mean /= windows;
    }
    if out.windows == 0 {
        out.emu_min = 0.0;
    }
    out.decisions = lp.decisions;
    out.writes = lp.writes;
    Ok(out)
}

#[cfg(test)]
mod tests;
