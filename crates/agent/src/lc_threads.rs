//! LC thread treatment (`[lc.threads]`, the allocation's `lc`): pin the LC threads one per CPU
//! (round robin over `pin_cpus`), and give them SCHED_FIFO or an EEVDF slice request — the
//! mainline stand-ins for BVT warp. Threads appear and go; each new thread is treated once, and
//! all are treated again when the treatment changes. The LC is only ever given more.

use std::collections::BTreeSet;

use headroom_host::sched::{self, SchedPolicy};
use headroom_host::{Cgroups, CpuSet, GroupPath};

use crate::allocation::LcTreatment;

/// Applies an [`LcTreatment`] to the threads of the LC group.
#[derive(Debug, Default)]
pub struct LcThreads {
    treated: BTreeSet<i32>,
    last: Option<LcTreatment>,
    /// Errors so far (a thread may exit between listing and treating it).
    pub errors: u64,
}

impl LcThreads {
    /// Treats the LC group's threads not treated yet; returns how many were treated now.
    pub fn apply(&mut self, cgroups: &Cgroups, lc: &GroupPath, treatment: &LcTreatment) -> usize {
        let wants_something = treatment.pin_cpus.as_ref().is_some_and(|c| !c.is_empty())
            || treatment.fifo_priority.is_some()
            || treatment.slice_us.is_some();
        if self.last.as_ref() != Some(treatment) {
            self.treated.clear();
            self.last = Some(treatment.clone());
        }
        if !wants_something {
            return 0;
        }
        let Ok(tids) = cgroups.threads(lc) else {
            self.errors += 1;
            return 0;
        };
        self.treated.retain(|t| tids.contains(t));
        let mut done = 0;
        for (i, &tid) in tids.iter().enumerate() {
            if self.treated.contains(&tid) {
                continue;
            }
            if let Some(cpus) = treatment.pin_cpus.as_ref().filter(|c| !c.is_empty()) {
                let cpu = cpus[i % cpus.len()] as usize;
                let set: CpuSet = [cpu].into_iter().collect();
                if let Err(e) = sched::set_affinity(tid, &set) {
                    self.error(tid, "pinning", &e);
                    continue;
                }
            }
            let policy = match (treatment.fifo_priority, treatment.slice_us) {
                (Some(p), _) => Some(SchedPolicy::Fifo {
                    priority: u32::from(p),
                }),
                (None, Some(us)) => Some(SchedPolicy::Other {
                    nice: sched::sched(tid).map_or(0, |a| a.nice),
                    slice_ns: Some(us * 1000),
                }),
                (None, None) => None,
            };
            if let Some(policy) = policy {
                if let Err(e) = sched::set_sched(tid, policy) {
                    self.error(tid, "setting the scheduling policy of", &e);
                    continue;
                }
            }
            tracing::info!(tid, ?treatment, "LC thread treated");
            self.treated.insert(tid);
            done += 1;
        }
        done
    }

    fn error(&mut self, tid: i32, what: &str, e: &dyn std::fmt::Display) {
        self.errors += 1;
        if self.errors.is_power_of_two() {
            tracing::warn!(tid, error = %e, "{what} an LC thread failed");
        }
    }
}
