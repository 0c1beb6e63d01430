//! The start's group locks (moved out of `start.rs`, which had grown past its room): every
//! directory of the groups this agent manages locked for it, and an LC pid sitting in a group
//! another live agent manages refused.

use std::path::Path;

use super::{AgentError, AgentOptions};
use crate::state;
use headroom_control::config::Config;

/// Locks every directory of every group this agent manages (LC and BE, in each hierarchy).
pub(super) fn lock_groups(
    options: &AgentOptions,
    config: &Config,
    cgroups: &headroom_host::Cgroups,
) -> Result<state::GroupLock, AgentError> {
    lock_group_set(
        options,
        config,
        cgroups,
        config
            .lcs
            .iter()
            .map(|l| &l.cgroup)
            .chain(config.be.iter().map(|b| &b.cgroup)),
    )
}

/// Locks every directory of `groups` for this agent (see [`lock_groups`]).
pub(super) fn lock_group_set<'a>(
    options: &AgentOptions,
    config: &Config,
    cgroups: &headroom_host::Cgroups,
    groups: impl IntoIterator<Item = &'a headroom_types::GroupPath>,
) -> Result<state::GroupLock, AgentError> {
    let (dirs, above) = crate::group_lock::lock_keys(cgroups, groups);
    let holder = headroom_types::control::LockHolder {
        pid: std::process::id(),
        config: options
            .config_path
            .as_ref()
            .map(|p| {
                std::fs::canonicalize(p)
                    .unwrap_or_else(|_| p.clone())
                    .display()
                    .to_string()
            })
            .unwrap_or_default(),
        socket: config.api.socket.clone(),
        state_file: config.safety.state_file.clone(),
        groups: Vec::new(),
    };
    Ok(state::GroupLock::acquire_nested(
        &state::lock_dir(&options.root),
        &dirs,
        &above,
        holder,
    )?)
}

/// Refuses the start when an LC pid of the config sits in a group another live agent
/// manages (its LC or BE group, or one inside them): moving it would take it from that agent,
/// and a BE process moved into this agent's LC group escapes that agent's freeze (third
/// hostile pass, issue 42).
pub(super) fn refuse_foreign_lc_pids(
    root: &Path,
    config: &Config,
    cgroups: &headroom_host::Cgroups,
    lock: &state::GroupLock,
) -> Result<(), AgentError> {
    for lc in &config.lcs {
        for pid in &lc.pids {
            let text = headroom_host::pids::cgroup_text(root, *pid);
            for dir in cgroups.process_dirs(&lc.cgroup, &text) {
                if let Some((lock_file, holder)) = lock.foreign_holder(&dir) {
                    return Err(AgentError::State(state::StateError::Held {
                        what: format!("LC {} pid {pid}, in group {},", lc.name, dir.display()),
                        lock: lock_file,
                        holder,
                    }));
                }
            }
        }
    }
    Ok(())
}
