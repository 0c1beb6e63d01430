//! The real-time budgets SCHED_FIFO needs on a cgroup-v1 host with RT group scheduling: given
//! to the LC group chain, recorded so `restore` puts them back.

use headroom_host::Cgroups;
use headroom_types::GroupPath;

use super::LcThreads;

impl LcThreads {
    /// On a cgroup-v1 host with RT group scheduling, a group whose `cpu.rt_runtime_us` is 0
    /// refuses SCHED_FIFO tasks (EINVAL): give the LC group and each ancestor at 0 the budget
    /// its parent can spare (the parent's budget minus what its other children hold), top down.
    pub fn ensure_rt_budget(
        &mut self,
        cgroups: &Cgroups,
        lc: &GroupPath,
    ) -> Result<(), headroom_host::HostError> {
        let mut chain = vec![lc.clone()];
        while let Some(p) = chain.last().and_then(GroupPath::parent) {
            if p.is_root() {
                break;
            }
            chain.push(p);
        }
        chain.reverse();
        for group in chain {
            let Some(current) = cgroups.rt_runtime_us(&group)? else {
                return Ok(()); // no per-group RT budget on this host: nothing to do
            };
            if current != 0 {
                continue;
            }
            let parent = group.parent().unwrap_or_else(GroupPath::root);
            let Some(parent_budget) = cgroups.rt_runtime_us(&parent)? else {
                return Ok(());
            };
            let mut siblings = 0i64;
            for child in cgroups.children(&parent)? {
                if child != group {
                    siblings += cgroups.rt_runtime_us(&child)?.unwrap_or(0).max(0);
                }
            }
            let spare = if parent_budget < 0 {
                // -1: unlimited parent (root with RT throttling off)
                950_000
            } else {
                parent_budget - siblings
            };
            if spare <= 0 {
                return Err(headroom_host::HostError::invalid(
                    "cpu.rt_runtime_us",
                    format!("{parent_budget} in {parent} minus {siblings} held by siblings"),
                    format!("no real-time budget left for {group}"),
                ));
            }
            let spare = set_rt_budget_retrying(cgroups, &group, spare)?;
            tracing::info!(group = %group, runtime_us = spare, "real-time budget given to the LC group chain");
            self.state.rt_budgets.push((group.clone(), current));
        }
        Ok(())
    }
}

/// Writes `spare` to the group's `cpu.rt_runtime_us`, retried: the kernel counts the budget of a
/// group being removed (a previous agent's, just rmdir'd) until it is freed, so a budget that
/// adds up on paper can be refused (EINVAL) for a moment. Tries the same value for ~0.5 s, then
/// halves it (some budget lets the LC's FIFO threads in; none refuses them) down to 1/16.
fn set_rt_budget_retrying(
    cgroups: &Cgroups,
    group: &GroupPath,
    spare: i64,
) -> Result<i64, headroom_host::HostError> {
    let mut value = spare;
    let mut tries = 0;
    loop {
        match cgroups.set_rt_runtime_us(group, value) {
            Ok(()) => return Ok(value),
            Err(e) if value > spare / 16 => {
                tries += 1;
                if tries >= 5 {
                    value /= 2;
                }
                tracing::debug!(group = %group, runtime_us = value, error = %e, "cpu.rt_runtime_us refused; retrying");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}
