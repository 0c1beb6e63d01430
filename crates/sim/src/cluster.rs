//! The fleet's cluster scheduler (`headroom sim fleet --cluster`): a stream of batch jobs placed
//! on the fleet's nodes by the capacity each node advertises (`headroom.io/be-cpu`, from the
//! real advertiser in headroom-control) vs placed blind, as BestEffort pods are today.
//!
//! Two stages. First every node runs the day under `hybrid` (the real policy in the SimHost
//! loop, BE always asking), which gives per SLO window the BE CPUs the policy granted and whether
//! the LC violated. Then the jobs are scheduled over those timelines:
//! - **blind**: a job is a BestEffort pod requesting nothing; kube-scheduler scores nodes for
//!   it as it does by default (`LeastAllocated` over its non-zero stand-in requests, 100 m CPU
//!   and 200 MiB a pod), so such pods spread in proportion to node size, up to 110 a node,
//!   whatever CPU the node has free;
//! - **advertised**: a job requests its size in `headroom.io/be-cpu` and its memory in
//!   `headroom.io/be-memory`; it is bound to the node with the most advertised-minus-requested
//!   CPU among those where both fit, else it waits (FIFO with backfill). A node's be-memory is
//!   the real be-memory advertiser (headroom-control, the agent's defaults) fed the node's BE
//!   memory budget (`NodeCosts::be_mem_budget_gib`: the node's memory less the LC's fixed
//!   footprint and reservations, the room the agent would measure) each window;
//! - **advertised-no-floor**: the same, but the advertiser is given no floor (as utilisation-
//!   derived numbers are) for either resource: it shows the rejections the floor prevents.
//!
//! A node's granted CPUs are shared by its running jobs in proportion to their sizes, each at
//! most its size, less what crowding costs (crate::cluster_costs: BE memory pressure evicts pods
//! and their work is lost, timesharing more pods than CPUs loses some throughput; `NodeCosts::none`
//! is the first, cost-free model). A "rejection" is a node-window where what the node advertises is below what
//! its bound pods requested: kubelet would reject or fail those pods on a restart.
//!
//! The job shape is synthetic, documented and seeded (crate::cluster_jobs); Poisson arrivals at the
//! rate that offers `offered_load` × the fleet's mean granted BE CPUs.
//!
//! Caveat: the node timelines come from runs where BE always asks, so the LC violations are the
//! same under every placement (an upper bound for each: fewer BE jobs interfere less).

use headroom_control::advertise::memory::MemoryAdvertiser;
use headroom_control::advertise::{AdvertiseParams, Advertiser, LcHealth, MemoryInput, Tick};
use headroom_control::config::{KubernetesConfig, PolicyKind, SafetyConfig};
use rayon::prelude::*;

pub use crate::cluster_costs::NodeCosts;
pub use crate::cluster_jobs::{
    jobs, mean_job_cpu_s, Job, JOB_MAX_S, JOB_MEDIAN_S, JOB_MIN_S, JOB_SIGMA, JOB_SIZES,
};
use crate::error::SimError;
use crate::host::SimHost;
use crate::run::{run_server, ServerSpec, SimSetup};

/// kubelet's default pod limit per node.
pub const MAX_PODS: usize = 110;
/// How many waiting jobs one scheduling pass looks at (a bound on the backfill).
const SCAN: usize = 2000;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub servers: usize,
    pub hours: f64,
    pub cores: Vec<u32>,
    pub seed: u64,
    /// Offered batch CPU demand, as a fraction of the fleet's mean granted BE CPUs.
    pub offered_load: f64,
    pub advertise: AdvertiseParams,
    /// What crowding a node costs (NodeCosts::none() for the first model).
    pub costs: NodeCosts,
}

/// How jobs are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    Blind,
    Advertised,
    AdvertisedNoFloor,
}

impl Placement {
    pub const ALL: [Placement; 3] = [
        Placement::Blind,
        Placement::Advertised,
        Placement::AdvertisedNoFloor,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Blind => "blind",
            Placement::Advertised => "advertised",
            Placement::AdvertisedNoFloor => "advertised-no-floor",
        }
    }
}

/// One placement's outcome over the day.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlacementOutcome {
    pub placement: Placement,
    pub jobs_submitted: u64,
    pub jobs_done: u64,
    /// CPU-hours of batch work done (finished jobs and the progress of the others).
    pub work_cpu_h: f64,
    /// Over the finished jobs: mean and p90 completion time (submission to end), s.
    pub mean_jct_s: f64,
    pub p90_jct_s: f64,
    /// Over every submitted job: mean completion time, s, an unfinished job (waiting, running
    /// or given up) counted with its time from submission to the day's end — a lower bound on
    /// its completion time, so blind's finished-only mean cannot look better by leaving its
    /// slow jobs unfinished.
    pub mean_jct_all_s: f64,
    /// Mean slowdown of finished jobs (completion time / duration at full size).
    pub mean_slowdown: f64,
    /// Jobs not yet bound at the end, and the most ever waiting.
    pub waiting_end: u64,
    pub waiting_max: u64,
    /// Node-windows where an advertised value (be-cpu or be-memory) was below what bound pods
    /// requested.
    pub rejections: u64,
    /// Pods evicted for BE memory pressure, and the CPU-hours of progress they lost (not in
    /// `work_cpu_h`); the jobs were requeued.
    pub evictions: u64,
    pub lost_cpu_h: f64,
    /// Jobs given up after more evictions than the Job's backoff limit.
    pub jobs_failed: u64,
    /// LC SLO violations (node-windows) of the node runs.
    pub lc_violations: u64,
}

/// The cluster day.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterReport {
    pub servers: usize,
    pub hours: f64,
    pub offered_load: f64,
    /// The fleet's mean granted BE CPUs, and the mean advertised (with the floor).
    pub granted_cpus_mean: f64,
    pub costs: NodeCosts,
    pub outcomes: Vec<PlacementOutcome>,
}

impl ClusterReport {
    pub fn outcome(&self, p: Placement) -> Option<&PlacementOutcome> {
        self.outcomes.iter().find(|o| o.placement == p)
    }
}

/// One node's day: per window, BE CPUs granted and whether the LC violated.
#[derive(Debug, Clone)]
pub struct NodeTimeline {
    pub cores: u32,
    pub granted: Vec<f64>,
    pub violating: Vec<bool>,
}

/// Runs every node under hybrid: their timelines.
pub fn node_timelines(
    setup: &SimSetup,
    spec: &ClusterSpec,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<Vec<NodeTimeline>, SimError> {
    if spec.servers == 0 || spec.cores.is_empty() {
        return Err(SimError::invalid(
            "--servers",
            spec.servers,
            "need at least one server and one size",
        ));
    }
    let done = std::sync::atomic::AtomicU64::new(0);
    let total = spec.servers as u64;
    (0..spec.servers)
        .into_par_iter()
        .map(|i| {
            let cores = spec.cores[i % spec.cores.len()];
            let server = ServerSpec {
                cores,
                seed: spec.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64,
                start_s: 0.0,
                duration_s: spec.hours * 3600.0,
            };
            let peak = SimHost::peak_qps(&setup.model, cores);
            let o = run_server(setup, &server, PolicyKind::Hybrid, peak, true, |_, _| {})?;
            progress(
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
                total,
            );
            Ok(NodeTimeline {
                cores,
                granted: o.records.iter().map(|r| r.be_cpus).collect(),
                violating: o.records.iter().map(|r| r.violating).collect(),
            })
        })
        .collect()
}

struct NodeState {
    running: Vec<Job>,
    /// milli-CPUs and bytes requested by the bound jobs.
    committed: u64,
    committed_mem: u64,
    advertiser: Advertiser,
    advertised: u64,
    memory: MemoryAdvertiser,
    advertised_mem: u64,
}

const GIB: f64 = (1u64 << 30) as f64;

/// What a job requests of `headroom.io/be-memory`: its resident memory, bytes, rounded up.
fn mem_bytes(j: &Job) -> u64 {
    (j.mem_gib * GIB).ceil() as u64
}

/// GiB as bytes (an unbounded budget, `NodeCosts::none`, is `u64::MAX`).
fn gib_bytes(gib: f64) -> u64 {
    (gib * GIB).min(u64::MAX as f64) as u64
}

/// The be-memory advertiser's parameters beside be-cpu's `cpu`: the agent's defaults
/// (`KubernetesConfig::advertise_memory_params`) on be-cpu's horizon, damping and warming.
pub fn memory_params(cpu: AdvertiseParams) -> AdvertiseParams {
    let m = KubernetesConfig::default().advertise_memory_params(&SafetyConfig::default());
    AdvertiseParams {
        percentile: m.percentile,
        margin: m.margin,
        step: m.step,
        cap: m.cap,
        ..cpu
    }
}

/// kube-scheduler's requests for a pod that requests nothing, when it scores nodes
/// (`DefaultMilliCPURequest`, `DefaultMemoryRequest` in its `schedutil`): a BestEffort pod is
/// not free to the scorer.
const NONZERO_MILLICPU: i64 = 100;
const NONZERO_MEMORY_BYTES: i64 = 200 * 1024 * 1024;

/// kube-scheduler's default node score for a BestEffort pod (`NodeResourcesFit`, strategy
/// `LeastAllocated`, cpu and memory weighted 1 each): per resource `(capacity − requested) × 100
/// / capacity` in integers, `requested` being the non-zero requests of `pods` such pods (the new
/// one included), averaged. The LC's and system pods' requests are left out: taken as the same
/// fraction of every node, they lower every node's score alike. So blind pods spread in
/// proportion to a node's size, not by count.
fn least_allocated_score(cores: u32, pods: usize, mem_gib_per_core: f64) -> i64 {
    fn score(capacity: i64, requested: i64) -> i64 {
        if capacity <= 0 || requested > capacity {
            0
        } else {
            (capacity - requested) * 100 / capacity
        }
    }
    let pods = pods as i64;
    let cpu = score(cores as i64 * 1000, pods * NONZERO_MILLICPU);
    let mem_capacity = (cores as f64 * mem_gib_per_core * GIB).min(i64::MAX as f64 / 128.0) as i64;
    let mem = score(mem_capacity, pods * NONZERO_MEMORY_BYTES);
    (cpu + mem) / 2
}

/// Schedules the job stream over the timelines under one placement.
pub fn schedule(
    nodes: &[NodeTimeline],
    window_s: f64,
    stream: &[Job],
    placement: Placement,
    params: AdvertiseParams,
    costs: NodeCosts,
) -> PlacementOutcome {
    let windows = nodes.iter().map(|n| n.granted.len()).min().unwrap_or(0);
    let mut state: Vec<NodeState> = nodes
        .iter()
        .map(|_| NodeState {
            running: Vec::new(),
            committed: 0,
            committed_mem: 0,
            advertiser: Advertiser::new(params),
            advertised: 0,
            memory: MemoryAdvertiser::new(memory_params(params)),
            advertised_mem: 0,
        })
        .collect();
    let mut waiting: std::collections::VecDeque<Job> = Default::default();
    let mut next_job = 0usize;
    let mut jct: Vec<f64> = Vec::new();
    // Jobs given up after their backoff limit: their submission times (JCT over all jobs).
    let mut unfinished_submits: Vec<f64> = Vec::new();
    let mut slowdown_sum = 0.0;
    let (mut work_done, mut rejections, mut waiting_max) = (0.0, 0u64, 0u64);
    let (mut evictions, mut lost, mut failed) = (0u64, 0.0, 0u64);
    let mut rr = 0usize;
    for w in 0..windows {
        let t0 = w as f64 * window_s;
        let t1 = t0 + window_s;
        // The advertisers see the window that just closed (the agent publishes each tick).
        if placement != Placement::Blind {
            for (n, st) in nodes.iter().zip(state.iter_mut()) {
                let health = if n.violating[w] {
                    LcHealth::Violating { lc: "lc".into() }
                } else {
                    LcHealth::Held
                };
                let floored = placement == Placement::Advertised;
                let floor = if floored { st.committed } else { 0 };
                let t_ms = (t0 * 1000.0) as u64;
                let (ad, _) = st.advertiser.update(&Tick {
                    t_ms,
                    granted_millicpu: (n.granted[w] * 1000.0).round() as u64,
                    health,
                    floor_millicpu: floor,
                });
                st.advertised = ad.value_millicpu;
                // The room the agent would measure: the node's BE memory budget (the LC's
                // footprint and the reservations are fixed in this model).
                let (mem, _) = st.memory.update(
                    t_ms,
                    &MemoryInput {
                        room_bytes: gib_bytes(costs.be_mem_budget_gib(n.cores)),
                        total_bytes: gib_bytes(n.cores as f64 * costs.node_mem_gib_per_core),
                        lc_bytes: None,
                        health: LcHealth::Held,
                        floor_bytes: if floored { st.committed_mem } else { 0 },
                    },
                );
                st.advertised_mem = mem.value;
                if st.advertised < st.committed || st.advertised_mem < st.committed_mem {
                    rejections += 1;
                }
            }
        }
        while next_job < stream.len() && stream[next_job].submit_s < t1 {
            waiting.push_back(stream[next_job].clone());
            next_job += 1;
        }
        // Place.
        let mut kept = std::collections::VecDeque::new();
        let mut scanned = 0usize;
        while let Some(job) = waiting.pop_front() {
            scanned += 1;
            if scanned > SCAN || job.ready_s > t0 {
                kept.push_back(job);
                continue;
            }
            let chosen = match placement {
                Placement::Blind => {
                    // The highest score wins; ties go to the first in a rotating order
                    // (kube-scheduler picks at random among them).
                    let n = state.len();
                    (0..n)
                        .map(|k| (k + rr) % n)
                        .filter(|&i| state[i].running.len() < MAX_PODS)
                        .enumerate()
                        .max_by_key(|&(order, i)| {
                            let score = least_allocated_score(
                                nodes[i].cores,
                                state[i].running.len() + 1,
                                costs.node_mem_gib_per_core,
                            );
                            (score, std::cmp::Reverse(order))
                        })
                        .map(|(_, i)| i)
                }
                _ => {
                    let need = (job.size * 1000.0) as u64;
                    let need_mem = mem_bytes(&job);
                    state
                        .iter()
                        .enumerate()
                        .filter(|(_, s)| s.running.len() < MAX_PODS)
                        .filter(|(_, s)| s.advertised.saturating_sub(s.committed) >= need)
                        .filter(|(_, s)| {
                            s.advertised_mem.saturating_sub(s.committed_mem) >= need_mem
                        })
                        .max_by_key(|(i, s)| (s.advertised - s.committed, std::cmp::Reverse(*i)))
                        .map(|(i, _)| i)
                }
            };
            match chosen {
                Some(i) => {
                    rr = i + 1;
                    state[i].committed += (job.size * 1000.0) as u64;
                    state[i].committed_mem += mem_bytes(&job);
                    state[i].running.push(job);
                }
                None => kept.push_back(job),
            }
        }
        waiting = kept;
        // Memory pressure: the node evicts BE pods (largest first); their progress is lost and
        // the jobs requeued.
        for (n, st) in nodes.iter().zip(state.iter_mut()) {
            let mut out = costs.evict(&st.running, costs.be_mem_budget_gib(n.cores));
            out.sort_unstable();
            for k in out.into_iter().rev() {
                let mut j = st.running.swap_remove(k);
                st.committed -= (j.size * 1000.0) as u64;
                st.committed_mem -= mem_bytes(&j);
                let progress = j.size * j.duration_s - j.work;
                work_done -= progress;
                lost += progress;
                j.work = j.size * j.duration_s;
                evictions += 1;
                j.failures += 1;
                match costs.backoff_s(j.failures) {
                    Some(b) => {
                        j.ready_s = t1 + b;
                        waiting.push_back(j);
                    }
                    None => {
                        failed += 1;
                        unfinished_submits.push(j.submit_s);
                    }
                }
            }
        }
        waiting_max = waiting_max.max(waiting.len() as u64);
        // Run the window.
        for (n, st) in nodes.iter().zip(state.iter_mut()) {
            let demand: f64 = st.running.iter().map(|j| j.size).sum();
            if demand <= 0.0 {
                continue;
            }
            let share =
                (n.granted[w] * costs.timeshare_efficiency(demand, n.granted[w]) / demand).min(1.0);
            let mut finished = Vec::new();
            for (k, j) in st.running.iter_mut().enumerate() {
                let did = (j.size * share * window_s).min(j.work);
                j.work -= did;
                work_done += did;
                if j.work <= 1e-9 {
                    finished.push(k);
                }
            }
            for k in finished.into_iter().rev() {
                let j = st.running.swap_remove(k);
                st.committed -= (j.size * 1000.0) as u64;
                st.committed_mem -= mem_bytes(&j);
                let c = t1 - j.submit_s;
                jct.push(c);
                slowdown_sum += c / j.duration_s;
            }
        }
    }
    let done = jct.len();
    let mean = jct.iter().sum::<f64>() / done.max(1) as f64;
    let day_end = windows as f64 * window_s;
    unfinished_submits.extend(waiting.iter().map(|j| j.submit_s));
    unfinished_submits.extend(
        state
            .iter()
            .flat_map(|st| st.running.iter().map(|j| j.submit_s)),
    );
    let all = done + unfinished_submits.len();
    let mean_jct_all_s = (jct.iter().sum::<f64>()
        + unfinished_submits.iter().map(|s| day_end - s).sum::<f64>())
        / all.max(1) as f64;
    let p90 = crate::fleet::pct(&mut jct, 0.9);
    PlacementOutcome {
        placement,
        jobs_submitted: next_job as u64,
        jobs_done: done as u64,
        work_cpu_h: work_done / 3600.0,
        mean_jct_s: mean,
        mean_jct_all_s,
        p90_jct_s: if done == 0 { 0.0 } else { p90 },
        mean_slowdown: slowdown_sum / done.max(1) as f64,
        waiting_end: waiting.len() as u64,
        waiting_max,
        rejections,
        evictions,
        jobs_failed: failed,
        lost_cpu_h: lost / 3600.0,
        lc_violations: nodes
            .iter()
            .map(|n| n.violating.iter().filter(|v| **v).count() as u64)
            .sum(),
    }
}

/// The whole cluster day: the node runs, then every placement over the same job stream.
pub fn run_cluster(
    setup: &SimSetup,
    spec: &ClusterSpec,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<ClusterReport, SimError> {
    if !(spec.offered_load > 0.0 && spec.offered_load <= 4.0) {
        return Err(SimError::invalid(
            "--offered-load",
            spec.offered_load,
            "must be in (0, 4]",
        ));
    }
    let nodes = node_timelines(setup, spec, progress)?;
    Ok(schedule_all(&nodes, setup.window_s, spec))
}

/// Every placement over `nodes` (the node runs given).
pub fn schedule_all(nodes: &[NodeTimeline], window_s: f64, spec: &ClusterSpec) -> ClusterReport {
    let windows: usize = nodes.iter().map(|n| n.granted.len()).sum();
    let granted_cpus_mean = nodes.iter().flat_map(|n| &n.granted).sum::<f64>()
        / windows.max(1) as f64
        * nodes.len() as f64;
    let rate = spec.offered_load * granted_cpus_mean / mean_job_cpu_s(spec.seed);
    let mut stream = jobs(spec.seed, rate, spec.hours * 3600.0);
    spec.costs.draw_memory(spec.seed, &mut stream);
    let outcomes = Placement::ALL
        .par_iter()
        .map(|&p| schedule(nodes, window_s, &stream, p, spec.advertise, spec.costs))
        .collect();
    ClusterReport {
        servers: nodes.len(),
        hours: spec.hours,
        offered_load: spec.offered_load,
        granted_cpus_mean,
        costs: spec.costs,
        outcomes,
    }
}

/// The report as text.
pub fn text_table(r: &ClusterReport) -> String {
    let mut s = format!(
        "cluster scheduler: {} nodes, {:.1} h, fleet mean BE CPUs granted {:.1}, offered {:.0}% of it\n\
         costs: BE memory {:.0}% of {:.0} GiB/core, jobs {:.1} GiB/CPU (σ {:.1}), timeshare loss {:.0}%\n\
         {:<22} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>8} {:>10} {:>9} {:>8} {:>6} {:>8}\n",
        r.servers, r.hours, r.granted_cpus_mean, r.offered_load * 100.0,
        r.costs.be_mem_fraction * 100.0, r.costs.node_mem_gib_per_core, r.costs.job_mem_gib_per_cpu,
        r.costs.job_mem_sigma, r.costs.timeshare_loss * 100.0,
        "placement", "submitted", "done", "work cpu-h", "mean jct s", "jct all s", "p90 jct s", "slowdown", "wait end", "wait max", "rejections", "evictions", "lost h", "failed", "lc viol"
    );
    for o in &r.outcomes {
        s += &format!(
            "{:<22} {:>9} {:>9} {:>10.1} {:>10.0} {:>10.0} {:>10.0} {:>9.2} {:>8} {:>8} {:>10} {:>9} {:>8.1} {:>6} {:>8}\n",
            o.placement.as_str(),
            o.jobs_submitted,
            o.jobs_done,
            o.work_cpu_h,
            o.mean_jct_s,
            o.mean_jct_all_s,
            o.p90_jct_s,
            o.mean_slowdown,
            o.waiting_end,
            o.waiting_max,
            o.rejections,
            o.evictions,
            o.lost_cpu_h,
            o.jobs_failed,
            o.lc_violations
        );
    }
    if let (Some(b), Some(a)) = (
        r.outcome(Placement::Blind),
        r.outcome(Placement::Advertised),
    ) {
        s += &format!(
            "advertised vs blind: mean JCT {:.2}x better (finished jobs), {:.2}x (all submitted, the unfinished counted to the day's end), work done {:.2}x\n",
            b.mean_jct_s / a.mean_jct_s.max(1e-9),
            b.mean_jct_all_s / a.mean_jct_all_s.max(1e-9),
            a.work_cpu_h / b.work_cpu_h.max(1e-9)
        );
    }
    s
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
