//! What an earlier agent left outside this start's record of it (fifth hostile pass):
//!
//! - groups its state file names that this config dropped (its groups changed between two
//!   runs, after an `on_exit = "freeze"` or a crash): released as `on_exit = "restore"` would
//!   have — the BE it ran there stopped (processes found there at its first start spared),
//!   every original the state file holds put back, the groups it made removed when empty — and
//!   said in the log and `ctl status`. Left as they were, they stayed frozen or confined for
//!   good with no agent, and the state file that recorded them was overwritten;
//! - on a group no state file names, the processes an agent launched there (marked
//!   [`BE_OWNER_ENV`]): an earlier agent's BE whose pid could not be recorded (the state file
//!   unwritable, then a crash). Stopped as a restart stops unrecorded ones; a process without
//!   the mark is an operator's and is spared, as before.

use std::collections::BTreeSet;

use headroom_control::actuation::{EarlierRole, ManagedGroups};
use headroom_host::Cgroups;
use headroom_types::GroupPath;

use super::host_steps::remove_created_groups;
use super::{Agent, AgentError};
use crate::state::{AgentState, DroppedGroup, GroupLock};
use crate::supervisor::{kill_group_except, launched_for, BE_OWNER_ENV};

/// The groups a start releases, locked (no live agent manages them), and what the state file
/// says of the earlier agent's processes.
#[derive(Debug, Default)]
pub(super) struct Earlier {
    dropped: Vec<DroppedGroup>,
    /// Held until the release is done; `None` when nothing is dropped.
    lock: Option<GroupLock>,
    /// Processes the earlier agent found at its first start (spared).
    spared: BTreeSet<i32>,
    /// The BE pids the earlier agent recorded.
    owned: Vec<u32>,
}

/// The groups of `recorded` this config (`groups`, every LC service's `lcs`) dropped, each
/// locked through `lock` (which refuses the start, before anything is touched, when a live
/// agent manages one now). One that contains or lies inside one of this config's groups needs
/// no lock of its own: this agent's locks already keep any other agent off it.
pub(super) fn plan(
    recorded: Option<&AgentState>,
    groups: &ManagedGroups,
    lcs: &[GroupPath],
    lock: impl FnOnce(&[GroupPath]) -> Result<GroupLock, AgentError>,
) -> Result<Earlier, AgentError> {
    let Some(r) = recorded else {
        return Ok(Earlier::default());
    };
    let ours: Vec<&GroupPath> = lcs.iter().chain(groups.be.iter()).collect();
    let dropped = r.dropped_groups(groups, lcs);
    if dropped.is_empty() {
        return Ok(Earlier::default());
    }
    let alone: Vec<GroupPath> = dropped
        .iter()
        .map(|d| d.group.clone())
        .filter(|d| !ours.iter().any(|g| g.overlaps(d)))
        .collect();
    Ok(Earlier {
        lock: if alone.is_empty() {
            None
        } else {
            Some(lock(&alone)?)
        },
        dropped,
        spared: r.spared_pids(),
        owned: r.owned_pids.values().copied().collect(),
    })
}

/// Every process in `group` and the groups below it, in every hierarchy (the processes a
/// kill of the group takes: a process to spare must be found where the kill looks).
pub(super) fn procs_below(cg: &Cgroups, group: &GroupPath) -> BTreeSet<i32> {
    cg.procs_below(group)
}

impl Agent {
    /// Releases the groups the earlier agent managed and this config dropped (see the module
    /// doc); runs before this agent confines its own groups and launches BE. A failure is
    /// said, not fatal: what could not be put back stays in the state file.
    pub(super) fn release_dropped(&mut self, earlier: Earlier) {
        if earlier.dropped.is_empty() {
            return;
        }
        let cg = self.node.cgroups().clone();
        let ours: Vec<GroupPath> = self
            .config
            .lcs
            .iter()
            .map(|l| l.cgroup.clone())
            .chain(self.groups.be.iter().cloned())
            .collect();
        // The LC processes this start moved or launched (one may now sit in a group that was
        // the earlier agent's BE group).
        let lc_pids: BTreeSet<i32> = self
            .config
            .lcs
            .iter()
            .flat_map(|l| l.pids.iter().map(|&p| p as i32))
            .chain(self.lc_children.iter().map(|c| c.id() as i32))
            .collect();
        for d in &earlier.dropped {
            // Spared: what the earlier agent found at its first start, the LC, and whatever
            // runs in this config's groups but not within this dropped group (a group of
            // this config inside it keeps its processes).
            let inside = procs_below(&cg, &d.group);
            let mut keep = earlier.spared.clone();
            keep.extend(&lc_pids);
            for g in ours.iter().filter(|g| **g != d.group) {
                let procs = procs_below(&cg, g);
                if g.is_within(&d.group) {
                    keep.extend(procs);
                } else {
                    keep.extend(procs.difference(&inside));
                }
            }
            let present = cg.exists(&d.group);
            // The earlier agent's BE is still there when something in the group carries its
            // mark for this group or is a pid it recorded (a command that resets its
            // environment keeps its pid, or has a marked parent such as `sudo`). Without
            // either, the group holds someone else's processes (emptied, removed and made
            // again by an operator between the runs: seventh hostile pass), all spared; before,
            // "the earlier agent ran a command there" killed them.
            let ours_still = inside
                .iter()
                .any(|&p| launched_for(p, &d.group) || earlier.owned.contains(&(p as u32)));
            let mut stopped = 0;
            if d.role == EarlierRole::Be && ours_still && present {
                stopped = kill_group_except(&cg, &d.group, &keep);
            }
            let role = match d.role {
                EarlierRole::Lc => "LC",
                EarlierRole::Be => "BE",
            };
            let note = format!(
                "{} was the earlier agent's {role} group (its state file names it) and is not one of this config's: released as on_exit = \"restore\" would ({stopped} of its BE processes stopped, its originals put back)",
                d.group
            );
            tracing::warn!("{note}");
            self.start_actions.push(note);
        }
        let release: Vec<(GroupPath, EarlierRole)> = earlier
            .dropped
            .iter()
            .map(|d| (d.group.clone(), d.role))
            .collect();
        if let Some(act) = self.controller.actuation_mut() {
            if let Err(e) = act.release(&mut self.node, &release) {
                let note = format!(
                    "putting back the originals of the groups this config dropped failed: {e} (kept in the state file: `ctl off` or on_exit = \"restore\" tries again)"
                );
                tracing::error!("{note}");
                self.start_actions.push(note);
            }
        }
        remove_created_groups(&cg, &mut self.created_groups, &ours);
        drop(earlier.lock);
    }

    /// A BE group no state file names (a first start there): the processes an agent launched
    /// in it (marked [`BE_OWNER_ENV`]) are an earlier agent's BE, stopped; the others are
    /// spared (returned).
    pub(super) fn first_start_in(&mut self, group: &GroupPath) -> BTreeSet<i32> {
        let cg = self.node.cgroups().clone();
        let found = procs_below(&cg, group);
        let (marked, spared): (BTreeSet<i32>, BTreeSet<i32>) =
            found.into_iter().partition(|&p| launched_for(p, group));
        if !marked.is_empty() {
            let killed = kill_group_except(&cg, group, &spared);
            let note = format!(
                "BE group {group}: {killed} process(es) an earlier agent launched ({BE_OWNER_ENV}), which no state file recorded, stopped (as a restart stops unrecorded ones); {} process(es) no agent launched spared",
                spared.len()
            );
            tracing::warn!("{note}");
            self.start_actions.push(note);
        }
        spared
    }
}
