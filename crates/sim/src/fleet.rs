//! A fleet: M servers (sizes may differ), each with its own view of the day's load and its own BE
//! job sequence, under every policy in turn; servers run in parallel (rayon). Per server it keeps
//! only totals; per SLO window it keeps fleet sums, including each window's mean response-time
//! survival curve on a fixed latency grid, from which the fan-out tail follows: a request touching
//! k leaves chosen at random waits for the slowest, P(max ≤ t) = F̄(t)^k.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use headroom_control::config::PolicyKind;
use rayon::prelude::*;

use crate::error::SimError;
use crate::host::SimHost;
use crate::queue::ResponseTail;
use crate::run::{model_window_s, run_server, ServerSpec, SimSetup};

/// Latency grid points for the fan-out view, log-spaced from 0.05 to 50 × the SLO.
pub const GRID: usize = 40;
const GRID_LO: f64 = 0.05;
const GRID_HI: f64 = 50.0;

/// The fan-out widths reported.
pub const FANOUT_K: [u32; 2] = [10, 100];

fn grid_point(j: usize, slo: f64) -> f64 {
    slo * GRID_LO * (GRID_HI / GRID_LO).powf(j as f64 / (GRID - 1) as f64)
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    pub servers: usize,
    pub hours: f64,
    /// Server sizes, assigned round-robin.
    pub cores: Vec<u32>,
    pub seed: u64,
    pub policies: Vec<PolicyKind>,
}

/// One server's totals under one policy.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ServerSummary {
    pub server: usize,
    pub cores: u32,
    pub windows: u64,
    pub violations: u64,
    pub emu_mean: f64,
    pub emu_min: f64,
    pub be_norm_mean: f64,
    pub lc_load_mean: f64,
    pub p99_max_us: f64,
    /// BE work done, CPU-hours of BE-alone throughput.
    pub be_cpu_hours: f64,
}

/// The fleet under one policy.
#[derive(Debug, Clone)]
pub struct PolicyFleet {
    pub policy: PolicyKind,
    pub servers: Vec<ServerSummary>,
    /// Per window: mean EMU over the servers.
    pub window_emu: Vec<f64>,
    /// Per window: servers whose window violated the SLO.
    pub window_violating: Vec<u32>,
    /// Per window: the fan-out p99 for each k in [`FANOUT_K`], µs.
    pub window_fanout_p99: Vec<[f64; 2]>,
    /// Policy calls and allocation writes over the fleet.
    pub decisions: u64,
    pub writes: u64,
}

impl PolicyFleet {
    pub fn total_windows(&self) -> u64 {
        self.servers.iter().map(|s| s.windows).sum()
    }

    pub fn total_violations(&self) -> u64 {
        self.servers.iter().map(|s| s.violations).sum()
    }

    /// Mean EMU over servers.
    pub fn emu_mean(&self) -> f64 {
        mean(self.servers.iter().map(|s| s.emu_mean))
    }

    /// 5th percentile across servers of their mean EMU.
    pub fn emu_p5(&self) -> f64 {
        let mut v: Vec<f64> = self.servers.iter().map(|s| s.emu_mean).collect();
        pct(&mut v, 0.05)
    }

    pub fn emu_min(&self) -> f64 {
        self.servers
            .iter()
            .map(|s| s.emu_min)
            .fold(f64::INFINITY, f64::min)
    }

    pub fn be_norm_mean(&self) -> f64 {
        mean(self.servers.iter().map(|s| s.be_norm_mean))
    }

    pub fn be_cpu_hours(&self) -> f64 {
        self.servers.iter().map(|s| s.be_cpu_hours).sum()
    }

    pub fn p99_max(&self) -> f64 {
        self.servers
            .iter()
            .map(|s| s.p99_max_us)
            .fold(0.0, f64::max)
    }

    /// Servers with at least one violating window.
    pub fn violating_servers(&self) -> usize {
        self.servers.iter().filter(|s| s.violations > 0).count()
    }

    /// Quantile `q` over windows of the fan-out p99 at `FANOUT_K[i]`.
    pub fn fanout_quantile(&self, i: usize, q: f64) -> f64 {
        let mut v: Vec<f64> = self.window_fanout_p99.iter().map(|w| w[i]).collect();
        pct(&mut v, q)
    }
}

fn mean(it: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = it.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

/// Quantile of `v` (sorts it); NaN when empty.
pub fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable_by(f64::total_cmp);
    let idx = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[idx]
}

/// Per-window fleet sums gathered from the servers.
#[derive(Clone)]
struct Acc {
    emu: Vec<f64>,
    violating: Vec<u32>,
    /// windows × GRID sums of per-server survival.
    survival: Vec<f64>,
    servers_in: Vec<u32>,
}

impl Acc {
    fn new(windows: usize) -> Acc {
        Acc {
            emu: vec![0.0; windows],
            violating: vec![0; windows],
            survival: vec![0.0; windows * GRID],
            servers_in: vec![0; windows],
        }
    }

    fn merge(mut self, o: Acc) -> Acc {
        for (a, b) in self.emu.iter_mut().zip(o.emu) {
            *a += b;
        }
        for (a, b) in self.violating.iter_mut().zip(o.violating) {
            *a += b;
        }
        for (a, b) in self.survival.iter_mut().zip(o.survival) {
            *a += b;
        }
        for (a, b) in self.servers_in.iter_mut().zip(o.servers_in) {
            *a += b;
        }
        self
    }
}

/// Runs the fleet under each policy. `progress(done, total)` is called as servers finish
/// (server × policy units), from the worker threads.
pub fn run_fleet(
    setup: &SimSetup,
    spec: &FleetSpec,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<PolicyFleet>, SimError> {
    if spec.servers == 0 || spec.cores.is_empty() {
        return Err(SimError::invalid(
            "--servers",
            spec.servers,
            "need at least one server and one size",
        ));
    }
    let max_load = setup.trace.max_load() * 1.05 + 3.0 * setup.noise_sd;
    for &c in &spec.cores {
        setup.model.check_coverage(c, max_load.min(1.0))?;
    }
    let peaks: BTreeMap<u32, f64> = spec
        .cores
        .iter()
        .map(|&c| (c, SimHost::peak_qps(&setup.model, c)))
        .collect();
    let duration_s = spec.hours * 3600.0;
    let window_s = model_window_s(setup);
    let windows = (duration_s / window_s).ceil() as usize;
    let slo = setup.model.lc.slo_us;
    let grid: Vec<f64> = (0..GRID).map(|j| grid_point(j, slo)).collect();
    let total = (spec.servers * spec.policies.len()) as u64;
    let done = AtomicU64::new(0);
    let mut out = Vec::new();
    for &kind in &spec.policies {
        let decisions = AtomicU64::new(0);
        let writes = AtomicU64::new(0);
        // a fold per rayon job: one accumulator of windows × GRID per job, not per server
        let (mut servers, acc) = (0..spec.servers)
            .into_par_iter()
            .with_min_len(4)
            .try_fold(
                || (Vec::new(), Acc::new(windows)),
                |(mut list, mut acc), i| {
                    let cores = spec.cores[i % spec.cores.len()];
                    let server = ServerSpec {
                        cores,
                        seed: spec.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64,
                        start_s: 0.0,
                        duration_s,
                    };
                    let o = run_server(setup, &server, kind, peaks[&cores], false, |w, ticks| {
                        add_window(&mut acc, w, ticks, &grid);
                    })?;
                    for (w, e) in o.window_emu.iter().enumerate().take(windows) {
                        acc.emu[w] += e.0;
                        acc.violating[w] += u32::from(e.1);
                    }
                    decisions.fetch_add(o.decisions, Ordering::Relaxed);
                    writes.fetch_add(o.writes, Ordering::Relaxed);
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, total);
                    list.push(ServerSummary {
                        server: i,
                        cores,
                        windows: o.windows,
                        violations: o.violations,
                        emu_mean: o.emu_mean(),
                        emu_min: o.emu_min,
                        be_norm_mean: o.be_norm_sum / o.windows.max(1) as f64,
                        lc_load_mean: o.lc_load_sum / o.windows.max(1) as f64,
                        p99_max_us: o.p99_max,
                        be_cpu_hours: o.be_norm_sum * window_s / 3600.0 * cores as f64,
                    });
                    Ok::<_, SimError>((list, acc))
                },
            )
            .try_reduce(
                || (Vec::new(), Acc::new(windows)),
                |(mut a, x), (b, y)| {
                    a.extend(b);
                    Ok((a, x.merge(y)))
                },
            )?;
        servers.sort_by_key(|s| s.server);
        let window_fanout_p99 = (0..windows)
            .map(|w| {
                let n = acc.servers_in[w].max(1) as f64;
                let s = &acc.survival[w * GRID..(w + 1) * GRID];
                let mut r = [0.0; 2];
                for (i, k) in FANOUT_K.iter().enumerate() {
                    // P(max of k > t) = 1 − (1 − S̄(t))^k = 0.01
                    let target = 1.0 - 0.99f64.powf(1.0 / *k as f64);
                    r[i] = crossing(&grid, s, n, target);
                }
                r
            })
            .collect();
        out.push(PolicyFleet {
            policy: kind,
            window_emu: acc
                .emu
                .iter()
                .zip(&acc.servers_in)
                .map(|(e, n)| e / (*n).max(1) as f64)
                .collect(),
            window_violating: acc.violating,
            window_fanout_p99,
            servers,
            decisions: decisions.into_inner(),
            writes: writes.into_inner(),
        });
    }
    Ok(out)
}

fn add_window(acc: &mut Acc, w: usize, ticks: &[(f64, ResponseTail)], grid: &[f64]) {
    if w >= acc.emu.len() {
        return;
    }
    let total: f64 = ticks.iter().map(|(x, _)| x).sum();
    if total <= 0.0 {
        return;
    }
    let row = &mut acc.survival[w * GRID..(w + 1) * GRID];
    for (j, t) in grid.iter().enumerate() {
        row[j] += ticks.iter().map(|(x, r)| x * r.survival(*t)).sum::<f64>() / total;
    }
    acc.servers_in[w] += 1;
}

/// Where the mean survival `sum/n` falls to `target`, log-interpolated on the grid; the grid's
/// top when it never does (reported as "≥").
fn crossing(grid: &[f64], sums: &[f64], n: f64, target: f64) -> f64 {
    let s = |j: usize| sums[j] / n;
    if s(0) <= target {
        return grid[0];
    }
    for j in 1..grid.len() {
        if s(j) <= target {
            let (a, b) = (s(j - 1).max(1e-300).ln(), s(j).max(1e-300).ln());
            let f = if (a - b).abs() < 1e-12 {
                1.0
            } else {
                (a - target.ln()) / (a - b)
            };
            return (grid[j - 1].ln() + f * (grid[j].ln() - grid[j - 1].ln())).exp();
        }
    }
    grid[grid.len() - 1]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ServerModel;
    use crate::trace::LoadTrace;

    #[test]
    fn fanout_grows_with_k_and_fleet_is_deterministic() {
        let setup = SimSetup::new(ServerModel::default(), LoadTrace::default());
        let spec = FleetSpec {
            servers: 6,
            hours: 1.0,
            cores: vec![8, 16],
            seed: 5,
            policies: vec![PolicyKind::Hybrid],
        };
        let a = run_fleet(&setup, &spec, &|_, _| {}).unwrap();
        let b = run_fleet(&setup, &spec, &|_, _| {}).unwrap();
        assert_eq!(a[0].servers, b[0].servers);
        let f = &a[0];
        assert_eq!(f.servers.len(), 6);
        assert_eq!(f.window_fanout_p99.len(), 240);
        for w in &f.window_fanout_p99 {
            assert!(w[1] >= w[0], "k=100 {} below k=10 {}", w[1], w[0]);
        }
    }

    #[test]
    fn crossing_interpolates() {
        let grid = [100.0, 200.0, 400.0];
        // survival 0.1 → 0.01 → 0.001
        let sums = [0.1, 0.01, 0.001];
        assert!((crossing(&grid, &sums, 1.0, 0.01) - 200.0).abs() < 1e-9);
        let mid = crossing(&grid, &sums, 1.0, (0.1f64 * 0.01).sqrt());
        assert!((mid - (100.0f64 * 200.0).sqrt()).abs() < 1e-6, "{mid}");
    }
}
