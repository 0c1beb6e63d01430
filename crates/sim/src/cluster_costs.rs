//! The costs a real node imposes on the batch pods crowded onto it, which the cluster scheduler's
//! first model lacked (in it a node's granted BE CPUs were shared work-conservingly by however
//! many pods landed there, so blind placement never lost). Each is a named parameter with its
//! source; `NodeCosts::none()` is the old model.
//!
//! 1. **Memory pressure evicts BE pods and their work is lost.** A BE pod's memory stays
//!    resident whether its CPUs are granted, throttled or frozen. When the BE pods on a node
//!    outgrow the memory the LC leaves them, the node kills BE: PerfIso (ATC'18, §3 "Memory":
//!    the primary keeps a fixed working set, "when memory runs very low, secondary processes are
//!    killed"); kubelet's memory-pressure eviction takes BestEffort pods first, the largest user
//!    first (requests are 0, so usage above request is all of it); Borg evicts best-effort tasks
//!    and reschedules them (Verma et al., EuroSys'15; the Google traces' EVICT events). A batch
//!    task restarts from the beginning (no checkpoint), so its progress is lost and it is
//!    requeued (the Job controller makes a new pod).
//!    The new pod comes after the Job controller's backoff (10 s, doubling, at most 6 min), and
//!    after `backoffLimit` failures (default 6) the Job fails (Kubernetes Job docs, "Pod backoff
//!    failure policy"; a kubelet-evicted pod is Failed and counts).
//! 2. **A pod at 0 CPUs makes no progress** (frozen, or the granted CPUs 0 at the LC's peak):
//!    already in the scheduler's share rule, named here for the list.
//! 3. **Timesharing more runnable pods than granted CPUs loses some throughput** to context
//!    switches and cache refills (CFS time slices shrink as runnable tasks grow; Li, Ding & Shen,
//!    "Quantifying the cost of context switch", ExpCS'07, measure indirect costs from a few µs to
//!    over a millisecond per switch for cache-heavy tasks; Leverich & Kozyrakis, EuroSys'14,
//!    Table 2, and Blagodurov et al.'s weight-based collocation report batch slowdowns from
//!    sharing). A flat, deliberately small fraction of the granted CPUs while demand exceeds them.
//!
//! The defaults are assumptions in the shape of common hardware and batch containers, not fits
//! to a trace (none is on this machine): nodes of 4 GiB per core (the general-purpose cloud shape,
//! e.g. GCE n2-standard, AWS m6i); the LC's fixed footprint and the node's reservations leave BE
//! 40 % of it; a job's memory per CPU log-normal, median 2 GiB, σ 0.6 (batch containers commonly
//! ask 1–4 GiB per CPU); timesharing loses 5 %.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cluster_jobs::Job;

/// The costs of crowding a node (module docs for each one's source).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct NodeCosts {
    /// Node memory per core, GiB.
    pub node_mem_gib_per_core: f64,
    /// The fraction of node memory BE pods may use before the node evicts them (the rest is the
    /// LC's fixed working set, system and kubelet reservations).
    pub be_mem_fraction: f64,
    /// A job's memory per CPU of its size: log-normal median, GiB, and σ.
    pub job_mem_gib_per_cpu: f64,
    pub job_mem_sigma: f64,
    /// The fraction of granted CPUs lost while the pods' demand exceeds them.
    pub timeshare_loss: f64,
    /// The Job controller's backoff before a failed pod's successor: base, doubling, at most.
    pub backoff_base_s: f64,
    pub backoff_max_s: f64,
    /// Failures after which the Job is given up.
    pub backoff_limit: u32,
}

impl Default for NodeCosts {
    fn default() -> Self {
        NodeCosts {
            node_mem_gib_per_core: 4.0,
            be_mem_fraction: 0.4,
            job_mem_gib_per_cpu: 2.0,
            job_mem_sigma: 0.6,
            timeshare_loss: 0.05,
            backoff_base_s: 10.0,
            backoff_max_s: 360.0,
            backoff_limit: 6,
        }
    }
}

impl NodeCosts {
    /// The first model: no memory limit, no timesharing loss.
    pub fn none() -> Self {
        NodeCosts {
            be_mem_fraction: f64::INFINITY,
            timeshare_loss: 0.0,
            ..Default::default()
        }
    }

    /// The wait before the pod after the `failures`-th eviction; `None`: the Job has failed.
    pub fn backoff_s(&self, failures: u32) -> Option<f64> {
        (failures <= self.backoff_limit).then(|| {
            (self.backoff_base_s * 2f64.powi(failures.saturating_sub(1).min(30) as i32))
                .min(self.backoff_max_s)
        })
    }

    /// The memory BE pods may use on a node of `cores` CPUs, GiB.
    pub fn be_mem_budget_gib(&self, cores: u32) -> f64 {
        cores as f64 * self.node_mem_gib_per_core * self.be_mem_fraction
    }

    /// The share of `granted` CPUs that does work when the running pods ask `demand` CPUs.
    pub fn timeshare_efficiency(&self, demand: f64, granted: f64) -> f64 {
        if demand > granted {
            1.0 - self.timeshare_loss.clamp(0.0, 1.0)
        } else {
            1.0
        }
    }

    /// Which running pods the node evicts (indices into `running`, largest memory first) to
    /// bring their memory within `budget_gib`.
    pub fn evict(&self, running: &[Job], budget_gib: f64) -> Vec<usize> {
        let mut used: f64 = running.iter().map(|j| j.mem_gib).sum();
        if used <= budget_gib {
            return Vec::new();
        }
        let mut order: Vec<usize> = (0..running.len()).collect();
        order.sort_by(|&a, &b| running[b].mem_gib.total_cmp(&running[a].mem_gib));
        let mut out = Vec::new();
        for i in order {
            if used <= budget_gib {
                break;
            }
            used -= running[i].mem_gib;
            out.push(i);
        }
        out
    }

    /// Every job's memory (seeded apart from the stream's sizes and durations, so the stream is
    /// the same with and without costs).
    pub fn draw_memory(&self, seed: u64, stream: &mut [Job]) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6d65_6d6f);
        for j in stream {
            let (u1, u2): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            let per_cpu = (self.job_mem_gib_per_cpu * (self.job_mem_sigma * z).exp()).clamp(
                self.job_mem_gib_per_cpu / 8.0,
                self.job_mem_gib_per_cpu * 8.0,
            );
            j.mem_gib = per_cpu * j.size;
        }
    }
}
