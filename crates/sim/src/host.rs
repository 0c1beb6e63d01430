//! `SimHost`: one modelled server. The agent's allocation goes in through [`SimHost::apply`] (the
//! one write path, which becomes `Node::write` once the agent's seam lands); each tick
//! [`SimHost::evaluate`] turns the LC's arrival rate and the applied allocation into the LC's
//! response-time distribution, CPU use, BE progress, power and DRAM traffic, and
//! [`SimHost::observation`] turns that into the `Observation` the real policy reads.

use headroom_control::node::NodeFacts;
use headroom_types::allocation::Allocation;
use headroom_types::observation::Observation;
use headroom_types::CpuSet;

use crate::model::{BeKind, Dispatch, ServerModel, MAX_CORES};
use crate::queue::{erlang_b, ResponseTail, ServiceDist};

/// The node's facts: v1 weights (cpu.shares), per-CPU frequency caps from 0.4 × to the
/// nominal frequency.
pub fn sim_facts(cores: u32, freq_max_mhz: f64) -> NodeFacts {
    let max = (freq_max_mhz * 1000.0) as u64;
    NodeFacts {
        v2_weights: false,
        freq_range: Some((0..cores).map(|c| (c, (max * 2 / 5, max))).collect()),
        ..NodeFacts::default()
    }
}

/// What the agent has written: the BE groups' and the LC's knobs as the model reads them.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub be_enabled: bool,
    /// CPUs BE may run on (bit i = CPU i).
    pub be_cpus: u128,
    pub be_shares: f64,
    pub be_idle: bool,
    /// Quota in CPUs; `None` = unlimited.
    pub be_quota_cpus: Option<f64>,
    pub be_llc_ways: Option<u32>,
    pub be_mba_pct: Option<u32>,
    /// BE CPUs' maximum frequency as a fraction of the nominal one.
    pub be_freq_frac: f64,
    pub lc_shares: f64,
    /// CPUs the LC threads may run on.
    pub lc_cpus: u128,
}

/// One tick's state of the server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TickState {
    pub tail: ResponseTail,
    /// LC arrival rate, requests/s.
    pub lc_qps: f64,
    /// CPUs the LC keeps busy.
    pub lc_busy: f64,
    /// CPUs BE keeps busy.
    pub be_busy: f64,
    pub idle: f64,
    /// BE throughput normalised to the BE kind alone on every CPU of this server (Heracles'
    /// EMU: BE throughput over BE-alone throughput).
    pub be_norm: f64,
    pub be_ops_per_s: f64,
    pub power_w: f64,
    pub lc_freq_mhz: f64,
    pub be_freq_mhz: f64,
    pub dram_bytes_per_s: f64,
    pub be_dram_bytes_per_s: f64,
    pub runq_delay_us: f64,
    /// The LC's service time stretch from interference (1 = alone).
    pub stretch: f64,
}

/// A modelled server.
#[derive(Debug, Clone)]
pub struct SimHost {
    model: ServerModel,
    cores: u32,
    all: u128,
    be: BeKind,
    /// The BE kind's throughput alone on every CPU of this server, in CPUs at full speed (its
    /// own DRAM saturation and power cap included): the denominator of `be_norm`.
    be_alone_cpus: f64,
    service: ServiceDist,
    applied: Applied,
    /// Tick length the saturated-queue approximation uses, µs.
    tick_us: f64,
    // ---- the Node side (crate::node) ----
    pub(crate) facts: NodeFacts,
    /// Maximum frequency of each CPU, kHz.
    pub(crate) cpu_khz: Vec<u64>,
    pub(crate) be_memory_max: Option<u64>,
    /// (LC arrivals per s, latency source's tail, peak) for the next `sense`.
    pub(crate) inputs: (f64, Option<f64>, f64),
    pub(crate) obs: Observation,
    /// The state the last `sense` computed.
    pub(crate) last: Option<TickState>,
    /// A knob or an input changed since the last `sense` (else `sense` returns what it had).
    pub(crate) dirty: bool,
    /// Several LC services (crate::multi): their signals, reported as `obs.lc_groups`;
    /// empty for the one-LC server.
    pub(crate) groups: Vec<headroom_types::observation::LcGroupObservation>,
}

fn mask_of(cpus: &CpuSet, all: u128) -> u128 {
    cpus.iter()
        .filter(|c| *c < MAX_CORES)
        .fold(0u128, |m, c| m | (1u128 << c))
        & all
}

impl SimHost {
    /// A server of `cores` CPUs running BE kind `be`; nothing applied yet (BE unrestricted).
    pub fn new(model: &ServerModel, cores: u32, be: &BeKind, tick_s: f64) -> SimHost {
        let cores = cores.clamp(1, MAX_CORES);
        let all = if cores == 128 {
            u128::MAX
        } else {
            (1u128 << cores) - 1
        };
        let mut host = SimHost {
            model: model.clone(),
            cores,
            all,
            be: be.clone(),
            be_alone_cpus: cores as f64,
            service: ServiceDist::with_mean_cv(model.lc.service_us, model.lc.service_cv),
            applied: Applied {
                be_enabled: true,
                be_cpus: all,
                be_shares: 1024.0,
                be_idle: false,
                be_quota_cpus: None,
                be_llc_ways: None,
                be_mba_pct: None,
                be_freq_frac: 1.0,
                lc_shares: model.sched.lc_shares,
                lc_cpus: all,
            },
            tick_us: tick_s * 1e6,
            facts: sim_facts(cores, model.server.freq_max_mhz),
            cpu_khz: vec![(model.server.freq_max_mhz * 1000.0) as u64; cores as usize],
            be_memory_max: None,
            inputs: (0.0, None, 1.0),
            obs: Observation::default(),
            last: None,
            dirty: true,
            groups: Vec::new(),
        };
        host.refresh_be_alone();
        host
    }

    /// Recomputes [`SimHost::be_alone_cpus`] for the current BE kind: the kind on every CPU,
    /// no LC, nothing throttled.
    fn refresh_be_alone(&mut self) {
        let mut alone = self.clone();
        alone.apply(&Allocation::default());
        alone.be_alone_cpus = self.cores as f64;
        let t = alone.evaluate(0.0);
        self.be_alone_cpus = (t.be_norm * self.cores as f64).max(1e-9);
    }

    pub(crate) fn applied_mut(&mut self) -> &mut Applied {
        self.dirty = true;
        &mut self.applied
    }

    /// The state the last `sense` computed (after the writes that followed it, call `sense`
    /// again or [`SimHost::evaluate`]).
    pub fn last_state(&self) -> Option<&TickState> {
        self.last.as_ref()
    }

    pub(crate) fn cpu_set(&self, mask: u128) -> CpuSet {
        (0..self.cores)
            .filter(|c| mask & (1u128 << c) != 0)
            .collect()
    }

    pub(crate) fn set_be_cpus(&mut self, cpus: &CpuSet) {
        self.dirty = true;
        self.applied.be_cpus = mask_of(cpus, self.all);
        self.refresh_be_freq();
    }

    /// BE's frequency: the mean cap of its CPUs over the nominal frequency.
    pub(crate) fn refresh_be_freq(&mut self) {
        self.dirty = true;
        let fmax = self.model.server.freq_max_mhz * 1000.0;
        let set = self.applied.be_cpus;
        let (sum, n) = (0..self.cores)
            .filter(|c| set & (1u128 << c) != 0)
            .fold((0.0, 0u32), |(s, n), c| {
                (s + self.cpu_khz[c as usize] as f64, n + 1)
            });
        self.applied.be_freq_frac = if n == 0 {
            1.0
        } else {
            (sum / n as f64 / fmax).clamp(0.1, 1.0)
        };
    }

    pub fn cores(&self) -> u32 {
        self.cores
    }

    pub fn applied(&self) -> &Applied {
        &self.applied
    }

    /// The LC's service-time distribution (several services sharing one queue: their mix).
    pub fn set_service(&mut self, service: ServiceDist) {
        if self.service != service {
            self.service = service;
            self.dirty = true;
        }
    }

    /// Switches the BE job (a new one from the pool started).
    pub fn set_be_kind(&mut self, be: &BeKind) {
        self.dirty = true;
        self.be = be.clone();
        self.refresh_be_alone();
    }

    /// Sets every knob from an allocation at once, bypassing the agent's write path: for the
    /// model's own tests and the LC-alone peak search. The simulation writes through
    /// `Controller::step` (`impl Node for SimHost`).
    pub fn apply(&mut self, a: &Allocation) {
        let s = &mut self.applied;
        s.be_enabled = a.be_enabled && !a.be_kill;
        s.be_cpus = a
            .be_cpus
            .as_ref()
            .map_or(self.all, |c| mask_of(c, self.all));
        s.be_shares = a.be_cpu_weight.map_or(1024.0, |w| w.shares as f64);
        s.be_idle = a.be_cpu_idle == Some(true);
        s.be_quota_cpus = a.be_quota_pct.map(|q| (q / 100.0).max(0.0));
        s.be_llc_ways = a.be_llc_ways;
        s.be_mba_pct = a.be_mba_pct;
        let fmax_khz = self.model.server.freq_max_mhz * 1000.0;
        s.be_freq_frac = a
            .be_freq_khz
            .map_or(1.0, |f| (f as f64 / fmax_khz).clamp(0.1, 1.0));
        s.lc_shares =
            a.lc.cpu_weight
                .map_or(self.model.sched.lc_shares, |w| w.shares as f64);
        s.lc_cpus =
            a.lc.pin_cpus
                .as_ref()
                .map(|c| mask_of(c, self.all))
                .filter(|m| *m != 0)
                .unwrap_or(self.all);
    }

    /// The server over one tick with LC arrivals at `lc_qps`.
    pub fn evaluate(&self, lc_qps: f64) -> TickState {
        let m = &self.model;
        let s = &self.applied;
        let c = self.cores as f64;
        let lambda = lc_qps.max(0.0) / 1e6; // per µs
        let be_set = if s.be_enabled { s.be_cpus } else { 0 };
        let n_be = be_set.count_ones() as f64;
        let n_shared = (s.lc_cpus & be_set).count_ones() as f64;
        let n_dedicated = (s.lc_cpus & !be_set).count_ones() as f64;
        let be_cap = s.be_quota_cpus.map_or(n_be, |q| q.min(n_be));
        // busy fraction of each BE CPU when LC leaves it alone
        let b = if n_be > 0.0 { be_cap / n_be } else { 0.0 };

        // LC's share of a CPU BE also runs on, and the wake-up delay it meets there
        let sc = &m.sched;
        let (share, delay_us) = if s.be_idle {
            (sc.idle_lc_share, sc.delay_idle_us)
        } else {
            let ratio = (s.be_shares / s.lc_shares.max(1.0)).min(1.0);
            (
                s.lc_shares / (s.lc_shares + s.be_shares),
                sc.delay_low_weight_us + (sc.delay_fair_us - sc.delay_low_weight_us) * ratio,
            )
        };
        let share_eff = 1.0 - b * (1.0 - share);

        // interference on the LC's service time
        let ways = m.server.llc_ways as f64;
        let way_overlap = s.be_llc_ways.map_or(1.0, |w| (w as f64 / ways).min(1.0));
        let mba = s
            .be_mba_pct
            .map_or(1.0, |p| (p as f64 / 100.0).clamp(0.1, 1.0));
        let lc_bw = lc_qps * m.lc.dram_bytes_per_request;
        let peak_bw = m.server.dram_peak_bytes_per_s;
        // SMT: an LC CPU whose sibling BE keeps busy runs the LC slower
        let stretch_smt = if m.server.smt && self.cores >= 2 {
            let half = self.cores / 2;
            let lc_only = s.lc_cpus & !be_set;
            let sibling_busy = (0..self.cores)
                .filter(|c| lc_only & (1u128 << c) != 0)
                .filter(|c| be_set & (1u128 << ((c + half) % self.cores)) != 0)
                .count() as f64;
            1.0 + m.server.smt_penalty * b * sibling_busy / n_dedicated.max(1.0)
        } else {
            1.0
        };
        // the LC's CPU time per request (its own, or the service time's when not measured apart)
        let cpu_us = if m.lc.cpu_us > 0.0 {
            m.lc.cpu_us
        } else {
            self.service.mean_us()
        };
        // LLC, DRAM and power pressure come from the CPUs BE actually keeps busy, which depend
        // on how much of BE's cpuset the (stretched) LC takes: start from BE's cap, then one
        // more pass from the BE use the first pass found.
        let pressure = |be_busy: f64| {
            let llc_pressure = self.be.llc_pressure * (be_busy / c) * way_overlap;
            let stretch_llc = 1.0 + m.lc.llc_sensitivity * llc_pressure;
            let be_bw_demand = self.be.dram_bytes_per_cpu_s * be_busy * s.be_freq_frac * mba;
            let be_bw = be_bw_demand.min((peak_bw - lc_bw).max(0.0));
            let dram_util = ((lc_bw + be_bw) / peak_bw).min(1.0);
            let stretch_dram = 1.0 + m.lc.dram_sensitivity * ((dram_util - 0.7).max(0.0) / 0.3);
            let base_stretch = stretch_llc * stretch_dram * stretch_smt;
            // power: above TDP every CPU slows (what Heracles' power controller prevents)
            let lc_busy_guess = lambda * cpu_us * base_stretch;
            let be_power = be_busy * self.be.power_factor * s.be_freq_frac.powi(2);
            let power = m.server.static_w + m.server.core_w * (lc_busy_guess.min(c) + be_power);
            let f_scale = if power > m.server.tdp_w {
                ((m.server.tdp_w - m.server.static_w) / (power - m.server.static_w)).max(0.3)
            } else {
                1.0
            };
            (base_stretch / f_scale, f_scale, be_bw)
        };
        let k_eff = n_dedicated + n_shared * share_eff;
        // The CPU the LC is charged with: its CPU time per request, plus a wake-up from idle for
        // a request that finds its CPU idle and a switch for one that finds BE there (each
        // arrival sees a CPU the LC is not on with probability 1 − ρ, ρ its own busy share:
        // cpu = λ(c + y)/(1 + λy/n) solves cpu = λ(c + y(1 − cpu/n))).
        let lc_cpu = |rate: f64, n: f64, stretch: f64, extra_us: f64| {
            if rate <= 0.0 || n <= 0.0 {
                return 0.0;
            }
            rate * (cpu_us * stretch + extra_us) / (1.0 + rate * extra_us / n)
        };
        let wake = m.lc.wake_cpu_us;
        let on_shared = sc.switch_cpu_us * b + wake * (1.0 - b);
        // The LC spills onto BE's CPUs when its own are all busy: a wake-up that finds no idle
        // CPU of its own is placed on a shared one rather than queued (the scheduler's
        // wake-up balancing), so the spill is the overflow of a loss system over the
        // dedicated CPUs — Erlang B, not C — and the dedicated CPUs carry u·(1 − B).
        let spill = |stretch: f64| {
            let u = lambda * self.service.mean_us() * stretch;
            let p_spill = if n_shared == 0.0 {
                0.0
            } else {
                erlang_b(n_dedicated as u32, u)
            };
            let cpu_dedicated = lc_cpu(lambda * (1.0 - p_spill), n_dedicated, stretch, wake);
            let lc_on_shared =
                lc_cpu(lambda * p_spill, n_shared, stretch, on_shared).min(n_shared * share_eff);
            let cpu = cpu_dedicated + lc_on_shared;
            (u, p_spill, (be_cap - lc_on_shared * b).max(0.0), cpu)
        };
        let mut be_busy_guess = be_cap;
        let (mut stretch, mut f_scale, mut be_bw) = pressure(be_busy_guess);
        let (mut u, mut p_spill, mut be_busy, mut cpu) = spill(stretch);
        if be_busy < be_busy_guess - 1e-3 {
            be_busy_guess = be_busy;
            (stretch, f_scale, be_bw) = pressure(be_busy_guess);
            (u, p_spill, be_busy, cpu) = spill(stretch);
        }
        let service = self.service.stretched(stretch);
        let p_delay = p_spill * b * sc.delayed_fraction;
        let tail = match m.lc.dispatch {
            Dispatch::SharedQueue => ResponseTail::mgk(k_eff, lambda, service)
                .unwrap_or_else(|| ResponseTail::saturated(k_eff, lambda, service, self.tick_us)),
            Dispatch::PerThread => {
                let n = if m.lc.threads == 0 {
                    c
                } else {
                    m.lc.threads as f64
                };
                let speed = (k_eff / n).clamp(1e-3, 1.0);
                let per = service.stretched(1.0 / speed);
                ResponseTail::mgk(1.0, lambda / n, per)
                    .unwrap_or_else(|| ResponseTail::saturated(1.0, lambda / n, per, self.tick_us))
            }
        }
        .with_delay(p_delay, delay_us)
        .with_stall(
            m.server.stall_form,
            m.server.stall_fraction,
            m.server.stall_mean_us,
        );

        // the queue saturates on the service time, the CPUs on the CPU time
        let lc_busy = if u >= k_eff { k_eff } else { cpu.min(k_eff) };
        let idle = (c - lc_busy - be_busy).max(0.0);
        let cache_factor = match s.be_llc_ways {
            Some(w) => 1.0 - self.be.llc_sensitivity * (1.0 - (w as f64 / ways).min(1.0)),
            None => 1.0,
        };
        // how much of BE's speed is bandwidth-bound
        let dram_bound = (self.be.dram_bytes_per_cpu_s / 6e9).min(1.0);
        let unthrottled = self.be.dram_bytes_per_cpu_s * be_busy * s.be_freq_frac;
        let bw_ratio = if unthrottled > 0.0 {
            (be_bw * (be_busy / be_busy_guess.max(1e-9)) / unthrottled).min(1.0)
        } else {
            1.0
        };
        let dram_factor = 1.0 - dram_bound + dram_bound * bw_ratio;
        let be_speed = s.be_freq_frac * f_scale * cache_factor * dram_factor;
        let be_norm = be_busy * be_speed / self.be_alone_cpus;
        TickState {
            tail,
            lc_qps,
            lc_busy,
            be_busy,
            idle,
            be_norm,
            be_ops_per_s: be_busy * be_speed * self.be.ops_per_cpu_s,
            power_w: m.server.static_w
                + m.server.core_w
                    * f_scale
                    * (lc_busy + be_busy * self.be.power_factor * s.be_freq_frac.powi(2)),
            lc_freq_mhz: m.server.freq_max_mhz * f_scale,
            be_freq_mhz: m.server.freq_max_mhz * f_scale * s.be_freq_frac,
            dram_bytes_per_s: lc_bw + be_bw,
            be_dram_bytes_per_s: be_bw,
            runq_delay_us: p_delay * delay_us,
            stretch,
        }
    }

    /// What the sensors report for a tick, with the LC tail latency the latency source measured
    /// over its window (`None` before the first window filled).
    pub fn observation(
        &self,
        tick: &TickState,
        latency_us: Option<f64>,
        peak_qps: f64,
    ) -> Observation {
        let m = &self.model.server;
        Observation {
            lc_latency_us: latency_us,
            lc_latency_age_ms: latency_us.map(|_| 0),
            lc_qps: Some(tick.lc_qps),
            lc_load: Some(tick.lc_qps / peak_qps),
            lc_load_age_ms: Some(0),
            idle_cpus: Some(tick.idle),
            lc_cpu_usage: Some(tick.lc_busy),
            be_cpu_usage: Some(tick.be_busy),
            lc_runq_delay_us: Some(tick.runq_delay_us),
            be_progress: Some(tick.be_ops_per_s),
            dram_bw_bytes_per_s: Some(tick.dram_bytes_per_s),
            be_dram_bw_bytes_per_s: Some(tick.be_dram_bytes_per_s),
            dram_bw_peak_bytes_per_s: Some(m.dram_peak_bytes_per_s),
            power_w: Some(tick.power_w),
            tdp_w: Some(m.tdp_w),
            lc_freq_mhz: Some(tick.lc_freq_mhz),
            be_freq_mhz: Some(tick.be_freq_mhz),
            mem_total_bytes: Some(256 << 30),
            mem_available_bytes: Some(128 << 30),
            ..Observation::default()
        }
    }

    /// The LC's peak load on this server: the highest arrival rate (requests/s) whose tail
    /// latency alone meets the SLO (how Heracles defines 100% load).
    pub fn peak_qps(model: &ServerModel, cores: u32) -> f64 {
        let be = BeKind::default();
        let mut alone = SimHost::new(model, cores, &be, 1.0);
        alone.apply(&Allocation::default().disabled());
        let q = model.lc.percentile / 100.0;
        let capacity = cores as f64 / model.lc.service_us * 1e6;
        let (mut lo, mut hi) = (0.0, capacity);
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if alone.evaluate(mid).tail.quantile(q) <= model.lc.slo_us {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}
