//! `[[be]]`: the best-effort groups.

use crate::config::{invalid, LcConfig, Problems};
use headroom_types::{GroupPath, GroupSpec, UserSpec};
use serde::{Deserialize, Serialize};

/// `[[be]]`: one best-effort group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BeConfig {
    pub name: String,
    pub cgroup: GroupPath,
    /// Optional command the agent launches in the group and owns.
    #[serde(default)]
    pub command: Vec<String>,
    /// The user `command` runs as (a login name or a uid; its primary group and
    /// supplementary groups with it). Unset: as the agent's user (root), which can leave its
    /// groups; said once at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserSpec>,
    /// The group `command` runs as (a group name or a gid), in place of `user`'s primary
    /// group (its supplementary groups stay). Unset: the user's primary group. Needs `user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupSpec>,
    /// Restart the command when it dies, with exponential backoff.
    #[serde(default = "default_true")]
    pub restart: bool,
    #[serde(default = "default_backoff_ms")]
    pub restart_backoff_ms: u64,
    #[serde(default = "default_backoff_max_ms")]
    pub restart_backoff_max_ms: u64,
}

impl BeConfig {
    /// Group `cgroup` named `name`, running `command` (none: the agent only confines what is
    /// moved there), restarted with the default backoff.
    pub fn new(name: &str, cgroup: GroupPath, command: Vec<String>) -> BeConfig {
        BeConfig {
            name: name.to_string(),
            cgroup,
            command,
            user: None,
            group: None,
            restart: default_true(),
            restart_backoff_ms: default_backoff_ms(),
            restart_backoff_max_ms: default_backoff_max_ms(),
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_backoff_ms() -> u64 {
    1000
}
fn default_backoff_max_ms() -> u64 {
    60_000
}

/// Refuses bad BE groups: empty or duplicate names, unsafe paths, groups that overlap each other or the LC's.
pub(crate) fn validate_be(groups: &[BeConfig], lcs: &[LcConfig], p: &mut Problems) {
    let mut names = Vec::new();
    for (i, be) in groups.iter().enumerate() {
        if be.name.trim().is_empty() {
            p.push(invalid(
                &format!("be[{i}].name"),
                &be.name,
                "must not be empty",
            ));
        }
        if names.contains(&&be.name) {
            p.push(invalid(
                &format!("be[{i}].name"),
                &be.name,
                "duplicate BE name",
            ));
        }
        names.push(&be.name);
        if let Some((j, other)) = groups[..i]
            .iter()
            .enumerate()
            .find(|(_, o)| o.cgroup.overlaps(&be.cgroup))
        {
            p.push(invalid(
                    &format!("be[{i}].cgroup"),
                    be.cgroup.as_str(),
                    format!(
                        "overlaps be[{j}].cgroup {:?}: each BE needs a group of its own, neither inside the other",
                        other.cgroup.as_str()
                    ),
                ));
        }
        if let Some((j, lc)) = lcs
            .iter()
            .enumerate()
            .find(|(_, lc)| be.cgroup.overlaps(&lc.cgroup))
        {
            let how = if be.cgroup == lc.cgroup {
                "it is the LC's group"
            } else if be.cgroup.is_within(&lc.cgroup) {
                "BE nested inside the LC"
            } else {
                "the LC nested inside BE"
            };
            let whose = if lcs.len() == 1 {
                String::new()
            } else {
                format!(" of lc[{j}] ({:?})", lc.name)
            };
            p.push(invalid(
                &format!("be[{i}].cgroup"),
                be.cgroup.as_str(),
                format!(
                    "overlaps the LC group {:?}{whose}: {how}",
                    lc.cgroup.as_str()
                ),
            ));
        }
        if let (Some(user), true) = (&be.user, be.command.is_empty()) {
            p.push(invalid(
                &format!("be[{i}].user"),
                user.to_string(),
                "names who runs the BE command, and there is none: set command or remove user",
            ));
        }
        if let (Some(group), None) = (&be.group, &be.user) {
            p.push(invalid(
                &format!("be[{i}].group"),
                group.to_string(),
                "names the group of the BE command's user, and there is no user (the command would run as the agent's user and group): set user too, or remove group",
            ));
        }
        // The key that is wrong by its own name (a 0 backoff was reported as the max's).
        if be.restart_backoff_ms == 0 {
            p.push(invalid(
                &format!("be[{i}].restart_backoff_ms"),
                0,
                "must be > 0 (a BE command that exits at once would be restarted in a busy loop)",
            ));
        } else if be.restart_backoff_max_ms < be.restart_backoff_ms {
            p.push(invalid(
                &format!("be[{i}].restart_backoff_max_ms"),
                be.restart_backoff_max_ms,
                "backoffs must be > 0 with max >= restart_backoff_ms",
            ));
        }
    }
}
