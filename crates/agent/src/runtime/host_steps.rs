//! The host steps of a start, and their undo: the groups it creates, the LC processes it moves,
//! the originals it restores and the state file it removes when a later step fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_host::Cgroups;
use headroom_types::GroupPath;

use super::AgentError;
use crate::linux_node::LinuxNode;
use crate::sensors::lc_threads::LcThreads;
use crate::state::{self};
use crate::supervisor::Supervised;
use headroom_control::actuation::ManagedGroups;
use headroom_control::config::Config;
use headroom_control::controller::Controller;

/// What a start did to the host so far (undone, newest first, if a later step fails).
#[derive(Default)]
pub(super) struct HostSteps {
    pub(super) created_groups: Vec<GroupPath>,
    /// Every directory this start made for a group (in each hierarchy), with the group: where
    /// the group existed in some hierarchies only, these are this start's to remove.
    pub(super) created_dirs: Vec<(GroupPath, PathBuf)>,
    /// LC pids moved, with the directories they came from.
    pub(super) lc_moved: BTreeMap<u32, Vec<String>>,
    /// Every LC service's group: only a process found in one goes back (see [`move_lc_back`]).
    pub(super) lc_groups: Vec<GroupPath>,
    /// LC commands this start launched or found running (`[[lc]] command`), one per service
    /// that has one.
    pub(super) lc_children: Vec<LcChild>,
    pub(super) supervised: Vec<Supervised>,
    pub(super) state_written: bool,
    /// The state file existed before this start (a restart keeps it on failure).
    pub(super) had_state: bool,
}

/// Undoes `steps` newest first: stops launched BE, restores originals, moves the LC back,
/// removes the groups this start created, and the state file when there was none before.
///
/// A restart (a state file of these groups) found BE confined by the agent before it, and its
/// originals are that agent's record: they stay for the next start, and BE is left frozen —
/// restoring them here thawed the earlier agent's BE onto every CPU with no agent left
/// (fourth hostile pass). Only the BE commands this start launched are stopped.
pub(super) fn undo(
    steps: &mut HostSteps,
    cgroups: &Cgroups,
    controller: Option<&mut Controller>,
    node: &mut LinuxNode,
    state_path: &Path,
) {
    tracing::warn!("start failed: undoing what it did");
    for s in &mut steps.supervised {
        if !steps.had_state || s.launched() {
            // (a kill that left processes is logged by `stop`; the undo goes on)
            let _ = s.stop(cgroups, Duration::from_secs(2));
        }
    }
    let mut restored = true;
    if let Some(act) = controller.and_then(|c| c.actuation_mut()) {
        if steps.had_state {
            for g in &act.groups().be {
                match cgroups.freeze(g) {
                    Ok(()) => {
                        tracing::warn!(group = %g, "a restart failed: BE left frozen, the state file kept for the next start")
                    }
                    Err(e) => {
                        tracing::error!(group = %g, error = %e, "freezing BE after a failed restart")
                    }
                }
            }
        } else if let Err(e) = act.restore_original(node) {
            tracing::error!(error = %e, "restoring originals after a failed start");
            restored = false;
        }
    }
    move_lc_back(cgroups, &steps.lc_moved, &steps.lc_groups);
    for child in steps.lc_children.drain(..) {
        // An LC command this start launched: nobody else knows of it. One found running
        // (an earlier agent's) is left as it was.
        if let LcChild::Launched(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    remove_created_groups(cgroups, &mut steps.created_groups, &[]);
    remove_made_dirs(cgroups, &mut steps.created_dirs, &[]);
    if restored && steps.created_groups.is_empty() && !steps.had_state && steps.state_written {
        let _ = state::remove(state_path);
    }
}

/// Notes the groups (and ancestors) that do not exist yet: this start will create them.
/// `lcs`: every LC service's group.
pub(super) fn plan_groups(
    cg: &Cgroups,
    lcs: &[GroupPath],
    groups: &ManagedGroups,
    steps: &mut HostSteps,
) {
    for g in lcs.iter().chain(groups.be.iter()) {
        let mut missing = Vec::new();
        let mut at = Some(g.clone());
        while let Some(p) = at.filter(|p| !p.is_root()) {
            // a group that exists in only some hierarchies is not the agent's to remove
            if !cg.group_dirs(&p).iter().any(|(_, d)| d.is_dir())
                && !steps.created_groups.contains(&p)
            {
                missing.push(p.clone());
            }
            at = p.parent();
        }
        steps.created_groups.extend(missing.into_iter().rev());
    }
}

/// Creates every LC service's group and the BE groups, noting each directory made.
pub(super) fn create_groups(
    cg: &Cgroups,
    lcs: &[GroupPath],
    groups: &ManagedGroups,
    steps: &mut HostSteps,
) -> Result<(), AgentError> {
    for g in lcs.iter().chain(groups.be.iter()) {
        let mut made = Vec::new();
        let created = cg.create_noting(g, &mut made);
        steps
            .created_dirs
            .extend(made.into_iter().map(|d| (g.clone(), d)));
        created?;
    }
    Ok(())
}

/// Removes the directories this start made (`made`, newest last), deepest first, each only
/// when it holds no process and no child group, except those of `keep` and their ancestors;
/// keeps the rest listed. A group that existed in some hierarchies only (an operator made it
/// in `cpu`) was made by the agent in the others and left there, empty, at every exit
/// (fourteenth hostile pass, "Found, not fixed": `blkio` groups after `restore`).
pub(super) fn remove_made_dirs(
    cg: &Cgroups,
    made: &mut Vec<(GroupPath, PathBuf)>,
    keep: &[GroupPath],
) {
    let kept_dirs: Vec<PathBuf> = keep
        .iter()
        .flat_map(|k| k.lineage())
        .flat_map(|level| cg.group_dirs(&level).into_iter().map(|(_, d)| d))
        .collect();
    let mut left = Vec::new();
    for (g, dir) in made.iter().rev() {
        if kept_dirs.contains(dir) {
            left.push((g.clone(), dir.clone()));
            continue;
        }
        match cg.remove_made_dir(g, dir) {
            Ok(true) => {
                tracing::debug!(group = %g, dir = %dir.display(), "removed a directory the agent made")
            }
            Ok(false) => left.push((g.clone(), dir.clone())),
            Err(e) => {
                tracing::warn!(group = %g, dir = %dir.display(), error = %e, "removing a directory the agent made failed");
                left.push((g.clone(), dir.clone()));
            }
        }
    }
    left.reverse();
    *made = left;
}

/// Thaws an LC group found frozen before the LC joins it (someone froze it, or it was an
/// earlier agent's BE group): moved in, the LC stopped with it, for the agent's whole run
/// (sixth hostile pass). Returns what was done, for `ctl status`.
pub(super) fn thaw_lc_group(cg: &Cgroups, group: &GroupPath) -> Option<String> {
    let state = cg.freeze_state(group).ok()?;
    if state == headroom_host::FreezeState::Thawed {
        return None;
    }
    let note = match cg.thaw(group) {
        Ok(()) => format!("LC group {group} was frozen ({state:?}): thawed before the LC joins it"),
        Err(e) => format!("LC group {group} is frozen ({state:?}) and thawing it failed: {e}"),
    };
    tracing::warn!("{note}");
    Some(note)
}

/// Notes where each service's `pids` are in every hierarchy (unless a state file already did).
pub(super) fn plan_lc_moves(root: &Path, cg: &Cgroups, config: &Config, steps: &mut HostSteps) {
    for (pid, lc) in config
        .lcs
        .iter()
        .flat_map(|l| l.pids.iter().map(move |&p| (p, &l.cgroup)))
    {
        if steps.lc_moved.contains_key(&pid) {
            continue;
        }
        let text = headroom_host::pids::cgroup_text(root, pid);
        let dirs = cg
            .process_dirs(lc, &text)
            .into_iter()
            .filter(|d| !d.ends_with(lc.as_str()))
            .map(|d| d.display().to_string())
            .collect();
        steps.lc_moved.insert(pid, dirs);
    }
}

/// Moves LC processes back into the groups they were in before the agent moved them: those
/// still in an LC group (`lc_groups`). A recorded pid found elsewhere left, or names another
/// process now (the LC died and its number was reused while no agent ran): moving it put an
/// unrelated process in the LC's old group.
pub(super) fn move_lc_back(
    cg: &Cgroups,
    origins: &BTreeMap<u32, Vec<String>>,
    lc_groups: &[GroupPath],
) {
    for (pid, dirs) in origins {
        if !in_an_lc_group(cg, *pid, lc_groups) {
            tracing::info!(
                pid,
                "not moved back: no longer in an LC group (it left, or the number names another process now)"
            );
            continue;
        }
        for dir in dirs {
            match cg.move_process_to_dir(Path::new(dir), *pid as i32) {
                Ok(()) => tracing::info!(pid, group = %dir, "LC process moved back"),
                Err(e) if e.errno() == Some(nix::errno::Errno::ESRCH) => {}
                Err(e) => {
                    tracing::warn!(pid, group = %dir, error = %e, "moving the LC process back")
                }
            }
        }
    }
}

/// Whether `pid` sits in one of `lc_groups` (or below one) in some hierarchy, by its
/// `/proc/<pid>/cgroup`; true when that cannot be read (the move then decides, as before).
fn in_an_lc_group(cg: &Cgroups, pid: u32, lc_groups: &[GroupPath]) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return true;
    };
    lc_groups.iter().any(|lc| {
        let lc_dirs: Vec<PathBuf> = cg.group_dirs(lc).into_iter().map(|(_, d)| d).collect();
        cg.process_dirs(lc, &text)
            .iter()
            .any(|now| lc_dirs.iter().any(|d| now.starts_with(d)))
    })
}

/// Removes the groups in `created` (ancestors first), deepest first, each only when neither it
/// nor a child holds a process, except `keep` and their ancestors; keeps the rest listed.
pub(super) fn remove_created_groups(
    cg: &Cgroups,
    created: &mut Vec<GroupPath>,
    keep: &[GroupPath],
) {
    let mut left = Vec::new();
    for g in created.iter().rev() {
        let kept = keep
            .iter()
            .any(|k| k == g || k.as_str().starts_with(&format!("{}/", g.as_str())));
        let exists = cg.group_dirs(g).iter().any(|(_, d)| d.is_dir());
        if kept || !exists {
            if kept {
                left.push(g.clone());
            }
            continue;
        }
        let busy = cg.procs(g).map_or(true, |p| !p.is_empty())
            || cg.children(g).map_or(true, |c| !c.is_empty());
        if busy {
            tracing::info!(group = %g, "leaving a group the agent created: it still holds processes or groups");
            left.push(g.clone());
            continue;
        }
        match cg.remove(g) {
            Ok(()) => tracing::info!(group = %g, "removed the group the agent created"),
            Err(e) => {
                tracing::warn!(group = %g, error = %e, "removing a group the agent created failed");
                left.push(g.clone());
            }
        }
    }
    left.reverse();
    *created = left;
}

/// An LC service's `command`: launched by this start, or found running in the service's
/// group, where an earlier agent launched it and left it (an LC is never stopped: a kill -9,
/// `on_exit = "freeze"`). Hostile pass 22: a restart launched a second copy beside it, and
/// one more at every restart.
#[derive(Debug)]
pub(super) enum LcChild {
    Launched(std::process::Child),
    /// The pid, with its start time (a pid reused by another process is not it).
    Found(u32, u64),
}

impl LcChild {
    pub(super) fn id(&self) -> u32 {
        match self {
            LcChild::Launched(c) => c.id(),
            LcChild::Found(pid, _) => *pid,
        }
    }

    /// Whether it has ended (one found: is gone, a zombie, or its pid now another process's).
    pub(super) fn exited(&mut self, root: &Path) -> bool {
        match self {
            LcChild::Launched(c) => !matches!(c.try_wait(), Ok(None)),
            LcChild::Found(pid, start) => {
                headroom_host::pids::start_time(root, *pid) != Some(*start)
                    || headroom_host::pids::is_zombie(root, *pid)
            }
        }
    }
}

/// The LC command an earlier agent left running, to be taken instead of launched again: a copy
/// in the LC's group ([`lc_left_running`]), else the process the agent before recorded at its
/// exit (`restore` moved it out of the group) or while it ran ([`lc_recorded`]); either is
/// moved into the group in every hierarchy it is out of ([`take_into`]), with what the record
/// lists as forked by it.
pub(super) fn lc_to_take(
    root: &Path,
    cgroups: &Cgroups,
    left: &[crate::lc_record::LeftLc],
    lc: &headroom_control::config::LcConfig,
    uid: u32,
    lc_threads: &mut LcThreads,
    lc_moved: &mut BTreeMap<u32, Vec<String>>,
) -> Option<LcChild> {
    let (pid, start) = lc_left_running(root, cgroups, &lc.cgroup, &lc.command, uid)
        .or_else(|| lc_recorded(root, left, &lc.name, &lc.command, uid))?;
    let taken = take_into(root, cgroups, lc_threads, &lc.cgroup, pid, start, lc_moved)?;
    // What it forked, recorded with it at the last exit, goes back in with it: `restore`
    // moved it out too (hostile pass 28: it ran outside the LC group the whole next run).
    for (p, t) in crate::lc_record::forked_still_running(root, left, &lc.name, pid, start) {
        let _ = take_into(root, cgroups, lc_threads, &lc.cgroup, p, t, lc_moved);
    }
    Some(taken)
}

/// A process in `group` — in any hierarchy the group lives in (pass 24's low: the first one
/// alone was looked at, and a copy in the group in the others only was launched again)
/// — running exactly `command` (its whole command line) as `uid` (real and effective): the LC
/// command an earlier agent launched there and left running, with its start time. Only root
/// moves a process into the group, and a process of the LC's own user is the LC's; a command
/// run as root (`uid` 0) may have become any user itself, so any user's is taken then.
pub(super) fn lc_left_running(
    root: &Path,
    cgroups: &Cgroups,
    group: &GroupPath,
    command: &[String],
    uid: u32,
) -> Option<(u32, u64)> {
    headroom_host::pids::running(root, command)
        .into_iter()
        .filter(|&p| {
            let text = headroom_host::pids::cgroup_text(root, p);
            cgroups
                .process_dirs(group, &text)
                .iter()
                .any(|d| d.ends_with(group.as_str()))
        })
        // As `uid`, or as anyone when the command runs as root: a root command may become
        // its user itself (`memcached -u nobody`), and only root, or what the LC forks, puts a
        // process in the LC group (hostile pass 27: such a copy was never found again, and a
        // second one was launched beside it).
        .filter(|&p| uid == 0 || headroom_host::pids::uids(root, p) == Some((uid, uid)))
        .filter(|&p| !headroom_host::pids::is_zombie(root, p))
        .find_map(|p| headroom_host::pids::start_time(root, p).map(|t| (p, t)))
}

/// The LC command the agent before this one recorded as left running at its exit
/// (`crate::lc_record`: `on_exit = "restore"` hands it back, out of the group; hostile pass
/// 23), or while it ran (a kill -9), when that very process still runs exactly `command`
/// (or the command line it ran when recorded) as `uid`.
fn lc_recorded(
    root: &Path,
    left: &[crate::lc_record::LeftLc],
    name: &str,
    command: &[String],
    uid: u32,
) -> Option<(u32, u64)> {
    let found = crate::lc_record::still_running(root, left, name, command, uid)?;
    tracing::info!(
        name,
        pid = found.0,
        "the LC command the agent before recorded (at its exit, or while it ran) still runs"
    );
    Some(found)
}

/// Takes the LC command `pid` (started at `start`) into `group` in every hierarchy it is out
/// of, the groups it was in noted for the exit's (or a failed start's) move back; a process
/// with a real-time thread gets the group's real-time budget first (a v1 `cpu` group at
/// `cpu.rt_runtime_us` 0 refuses it: EINVAL), as the LC's `pids` do. A move that still fails
/// is said, naming the pid and the error, and the LC is taken where it is (pass 24's low: it
/// failed the whole start); one that has ended meanwhile is not taken (`None`: launched).
fn take_into(
    root: &Path,
    cgroups: &Cgroups,
    lc_threads: &mut LcThreads,
    group: &GroupPath,
    pid: u32,
    start: u64,
    lc_moved: &mut BTreeMap<u32, Vec<String>>,
) -> Option<LcChild> {
    let text = headroom_host::pids::cgroup_text(root, pid);
    let out: Vec<String> = cgroups
        .process_dirs(group, &text)
        .into_iter()
        .filter(|d| !d.ends_with(group.as_str()))
        .map(|d| d.display().to_string())
        .collect();
    if out.is_empty() {
        return Some(LcChild::Found(pid, start));
    }
    if super::lc_sources::has_realtime_thread(root, pid as i32) {
        if let Err(e) = lc_threads.ensure_rt_budget(cgroups, group) {
            tracing::warn!(pid, group = %group, error = %e, "the LC command has a real-time thread and its group no real-time budget");
        }
    }
    match cgroups.move_process(group, pid as i32) {
        Ok(()) => {
            tracing::info!(pid, group = %group, out_of = ?out, "the LC command was out of its group: moved in");
        }
        Err(_) if headroom_host::pids::start_time(root, pid) != Some(start) => {
            tracing::warn!(
                pid,
                "the LC command to take ended before it was moved into its group: launched again"
            );
            return None;
        }
        Err(e) => {
            tracing::warn!(pid, group = %group, error = %e, "moving the LC command into its group failed: taken where it is, the start goes on");
        }
    }
    // (also after a failed move: the hierarchies written before it are moved back at exit)
    lc_moved.entry(pid).or_insert(out);
    Some(LcChild::Found(pid, start))
}
