//! Groups an earlier agent managed and this one does not (the config's groups changed between
//! two runs): their originals come from the earlier agent's state file, and are put back once
//! at start, as `on_exit = "restore"` would have. Left as the earlier agent left them, a BE
//! group stayed frozen (or confined) for good with nobody managing it (fifth hostile pass).

use std::collections::BTreeMap;

use headroom_types::GroupPath;

use super::{Actuation, ActuationError, ApplyReport, CgroupKnob, Knob};
use crate::node::Node;

/// What an earlier agent did with a group: an LC group only ever had its weight raised; a BE
/// group had every knob driven (also the role to assume when the state file does not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlierRole {
    Lc,
    Be,
}

impl Actuation {
    /// Puts back the originals of `groups` and forgets them: the state file no longer carries
    /// them. A knob that could not be put back is kept (the state file keeps its original;
    /// `ctl off` and `restore` try it again) and named in the error. This agent's BE groups are
    /// left alone; an LC group of this agent that was the earlier agent's BE group (the two
    /// swapped) gets every original back and keeps them (they are its originals now).
    pub fn release(
        &mut self,
        node: &mut dyn Node,
        groups: &[(GroupPath, EarlierRole)],
    ) -> Result<ApplyReport, ActuationError> {
        let mut target = BTreeMap::new();
        let mut forget = Vec::new();
        for (k, v) in &self.original {
            let (group, knob) = match k {
                Knob::Cgroup { group, knob } => (group, Some(*knob)),
                Knob::Io { group, .. } => (group, None),
                _ => continue,
            };
            let Some((_, role)) = groups.iter().find(|(g, _)| g == group) else {
                continue;
            };
            if self.groups.be.contains(group) {
                continue;
            }
            let ours = self.lc_groups.contains(group);
            if ours && *role == EarlierRole::Lc {
                continue;
            }
            if !ours {
                forget.push(k.clone());
            }
            let driven = *role == EarlierRole::Be || knob == Some(CgroupKnob::CpuWeight);
            if driven {
                target.insert(k.clone(), v.clone());
            }
        }
        // A group removed since (by someone else) has nothing to put back: forgotten.
        target.retain(|k, _| !matches!(node.read(k), Err(e) if e.not_found));
        let result = self.restore_knobs(node, &target);
        for k in forget {
            let put_back = target
                .get(&k)
                .is_none_or(|v| self.current.get(&k) == Some(v) && !self.unknown.contains(&k));
            // (not in `target`: not the agent's to write, or its group is gone)
            if put_back {
                self.original.remove(&k);
                self.current.remove(&k);
                self.unknown.remove(&k);
            }
        }
        result
    }

    /// The groups other than this agent's whose originals it holds (an earlier agent's, not
    /// released yet).
    pub fn foreign_groups(&self) -> Vec<GroupPath> {
        let out: std::collections::BTreeSet<GroupPath> = self
            .original
            .keys()
            .filter_map(|k| match k {
                Knob::Cgroup { group, .. } | Knob::Io { group, .. } => Some(group),
                _ => None,
            })
            .filter(|g| !self.groups.be.contains(g) && !self.lc_groups.contains(g))
            .cloned()
            .collect();
        out.into_iter().collect()
    }
}
