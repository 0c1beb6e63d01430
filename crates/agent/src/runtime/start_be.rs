//! A start's confinement of BE and its BE commands: the groups and originals recorded, BE
//! confined (a restart's last safe allocation, never wider than BE holds now, else frozen),
//! then each BE command adopted from the earlier agent or launched, its records kept in the
//! state file until it is.

use super::{Agent, AgentError};
use crate::state::AgentState;
use crate::supervisor::Supervised;
use headroom_types::allocation::Allocation;

impl Agent {
    /// Records the groups and originals, confines BE (a restart's last safe allocation, else
    /// frozen), records that, then adopts or launches the BE commands and records their pids.
    pub(super) fn confine_and_launch(
        &mut self,
        previous: Option<&AgentState>,
        earlier: super::earlier::Earlier,
    ) -> Result<(), AgentError> {
        // Until each BE is adopted or launched, its records stay in the state file.
        self.inherited_be = previous.cloned();
        self.write_state()?;
        // What the earlier agent managed and this config dropped, before this agent confines
        // its own groups: a dropped group inside one of them (a new BE group around the old)
        // could neither be thawed nor its processes stopped inside a frozen, narrowed parent.
        self.release_dropped(earlier);
        self.write_state()?;
        let safe = previous
            .and_then(|p| p.last_allocation.clone())
            .unwrap_or_else(|| Allocation::default().disabled());
        let mut first = safe.clone();
        if previous.is_some() {
            // A restart never widens BE: its cpuset now (the earlier agent's, kept frozen)
            // bounds the start-up allocation, whose own set (or, with none recorded, the
            // original) may be wider; the first tick widens last, after it narrows.
            first.be_cpus = self.no_wider_than_now(first.be_cpus.take());
        }
        // BE commands start frozen; the first tick thaws them if the policy lets BE run.
        if self.config.be.iter().any(|b| !b.command.is_empty()) {
            first.be_enabled = false;
        }
        if let Err(e) = self.controller.apply_now(&mut self.node, &first) {
            tracing::error!(error = %e, "could not apply the start-up allocation");
            return Err(e.into());
        }
        self.write_state()?;
        let cg = self.node.cgroups().clone();
        for (i, b) in self.config.be.clone().iter().enumerate() {
            if b.command.is_empty() {
                continue;
            }
            let g = self.groups.be[i].clone();
            let mut s = Supervised::new(
                &b.name,
                &b.command,
                g.clone(),
                b.restart,
                b.restart_backoff_ms,
                b.restart_backoff_max_ms,
            )
            .run_as(crate::run_as::be_user(i, b)?);
            // A restart for this group when the state file records it as a BE group (the
            // config's other groups may have changed: fifth hostile pass).
            let recorded = previous.filter(|p| p.records_be(&g));
            // A BE whose command the config changed is stopped (below) and the new one
            // launched: adopting it kept the old command running.
            let changed = recorded.is_some_and(|p| p.be_command_changed(&b.name, &b.command));
            if changed {
                tracing::warn!(be = %b.name, group = %g, "the [[be]] command changed since the earlier agent launched it: its BE is stopped and the new command launched");
            }
            // Its BE by name, else any pid it recorded that runs in this group (a renamed
            // `[[be]]` entry).
            let adopted = !changed
                && recorded.is_some_and(|p| {
                    p.adoptable_pids(&b.name)
                        .into_iter()
                        .any(|pid| s.adopt(&cg, pid, p.relay_pipes.get(&pid).copied()))
                });
            // Processes found in the group at the first start (no agent launched them),
            // still running: spared as then.
            s.spared = recorded
                .map(|p| {
                    let now = super::earlier::procs_below(&cg, &g);
                    p.spared_pids().intersection(&now).copied().collect()
                })
                .unwrap_or_default();
            if !adopted && recorded.is_some() {
                // Processes in the BE group that the state file (of these groups) does not
                // name were launched by an agent killed before it could record them: stop
                // them, start one.
                let orphans = crate::supervisor::kill_group_except(&cg, &g, &s.spared);
                if orphans > 0 {
                    tracing::warn!(group = %g, processes = orphans, "killed unrecorded processes left in the BE group by an earlier agent");
                }
            } else if !adopted {
                // No state file names this group: what an agent launched there (its mark) is
                // an earlier agent's BE, stopped; whatever else runs there (an existing group
                // the operator named) is confined as BE with the rest, never killed.
                s.spared = self.first_start_in(&g);
                let found = s.spared.len();
                if found > 0 {
                    tracing::warn!(group = %g, processes = found, "the BE group already holds processes no agent launched: they are confined as BE (not killed)");
                }
            }
            if !adopted {
                s.start(&cg)?;
            }
            self.supervised.push(s);
            self.write_state()?;
        }
        self.inherited_be = None;
        self.write_state()
    }

    /// `cpus` (`None`: the original) bounded by what every BE group holds now: what they hold
    /// for `None`, else its intersection with it (`cpus` itself when the two share no CPU:
    /// never wider than what it recorded, and a set the machine lacks fails as before). A group whose set is
    /// empty (v2: the parent's) or cannot be read bounds nothing. Hostile pass 14's low: a
    /// restart with no recorded allocation wrote the original, wide, cpuset on a frozen BE.
    fn no_wider_than_now(
        &mut self,
        cpus: Option<headroom_types::CpuSet>,
    ) -> Option<headroom_types::CpuSet> {
        use headroom_control::actuation::{CgroupKnob, Knob, KnobValue};
        use headroom_control::node::Node;
        let mut now: Option<headroom_types::CpuSet> = None;
        for g in &self.groups.be {
            if let Ok(KnobValue::Cpus(held)) =
                self.node.read(&Knob::cgroup(g, CgroupKnob::CpusetCpus))
            {
                if !held.is_empty() {
                    now = Some(now.map_or_else(|| held.clone(), |n| n.intersection(&held)));
                }
            }
        }
        let Some(now) = now.filter(|n| !n.is_empty()) else {
            return cpus;
        };
        match cpus {
            None => Some(now),
            // A recorded set sharing no CPU with BE's now (a CPU the machine lost) is kept:
            // its write fails and the failed restart leaves BE frozen (hostile pass 4).
            Some(c) if c.intersection(&now).is_empty() => Some(c),
            Some(c) => Some(c.intersection(&now)),
        }
    }
}
