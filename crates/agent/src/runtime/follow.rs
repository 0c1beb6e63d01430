//! Moving targets: an LC restarted under a new pid (found by its `pid_file`, its
//! `listen_port`, or — for an LC the agent launched that has exited — a process running its
//! `command`) is moved into its LC group; a BE group someone else removed is created again,
//! BE's settings written into it and the BE commands moved back. Each is logged and listed in
//! `ctl status` (`targets_followed`). Checked once a second.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use headroom_control::config::LcConfig;
use headroom_host::pids;

use super::Agent;

/// How often the targets are looked for.
pub(super) const FOLLOW_PERIOD: Duration = Duration::from_secs(1);
/// Moves kept for `ctl status`.
const FOLLOWED_KEPT: usize = 10;
/// BE processes remembered from one look to the next, at most.
const MEMBERS_KEPT: usize = 4096;

impl Agent {
    /// Follows the LCs and the BE groups (at most once per [`FOLLOW_PERIOD`]).
    pub(super) fn follow_moving_targets(&mut self, now: Instant) {
        if self.options.dry_run
            || !self.controller.is_actuating()
            || self
                .followed_at
                .is_some_and(|t| now.saturating_duration_since(t) < FOLLOW_PERIOD)
        {
            return;
        }
        self.followed_at = Some(now);
        self.recreate_removed_be_groups();
        self.redelegate_be_groups();
        self.keep_be_processes_in_their_groups();
        self.follow_restarted_lcs();
        // The LC commands as they run now, for a start after a kill -9 (`exit.rs`).
        self.record_left_lcs(false);
    }

    /// A BE command's process (or one it forked) found outside its BE group — moved out by
    /// someone else — is moved back: outside, nothing confines it, and the agent would report
    /// BE frozen while it ran (third hostile pass, issue 42: a worker moved to the root group
    /// ran on through a disable). Looked for among the command's descendants and among the
    /// processes seen in the group at the last look (by pid and start time, so a reused pid
    /// is never taken): a daemon or double fork has left the tree (fourth hostile pass: one
    /// moved out of the group ran unfrozen on every CPU, never moved back).
    fn keep_be_processes_in_their_groups(&mut self) {
        let cg = self.node.cgroups().clone();
        let root = self.options.root.clone();
        let mut moved = Vec::new();
        let mut members = std::collections::BTreeMap::new();
        for s in &self.supervised {
            let mut look: BTreeSet<u32> = s
                .pid()
                .map(|pid| pids::descendants(&root, pid))
                .unwrap_or_default()
                .into_iter()
                .collect();
            look.extend(
                self.be_members
                    .iter()
                    .filter(|(p, (g, start))| {
                        *g == s.group && pids::start_time(&root, **p) == Some(*start)
                    })
                    .map(|(p, _)| *p),
            );
            for p in look {
                // an exited process not yet reaped shows the root group: left alone
                if pids::is_zombie(&root, p) {
                    continue;
                }
                let text = pids::cgroup_text(&root, p);
                // A group below BE's (a job's own sub-group) is still BE's: moving it back up
                // fought the job every second, each move logged as someone else's (fifth
                // hostile pass).
                let dirs = cg.group_dirs(&s.group);
                let outside = cg
                    .process_dirs(&s.group, &text)
                    .iter()
                    .any(|d| !dirs.iter().any(|(_, gd)| d.starts_with(gd)));
                if outside {
                    match cg.move_process(&s.group, p as i32) {
                        Ok(()) => moved.push((p, s.group.clone())),
                        Err(e) => {
                            tracing::warn!(group = %s.group, pid = p, error = %e, "moving a BE process that left its group back")
                        }
                    }
                }
                // still ours if it is still there (a move back that failed is tried again)
                if let Some(start) = pids::start_time(&root, p) {
                    members.insert(p, (s.group.clone(), start));
                }
            }
            // what is in the group now (but the processes found there at a first start)
            let now = cg.procs(&s.group).unwrap_or_default();
            for p in now.into_iter().filter(|p| !s.spared.contains(p)) {
                if members.len() >= MEMBERS_KEPT {
                    break;
                }
                if let Some(start) = pids::start_time(&root, p as u32) {
                    members.insert(p as u32, (s.group.clone(), start));
                }
            }
        }
        self.be_members = members;
        for (p, g) in moved {
            tracing::warn!(group = %g, pid = p, "a BE process was outside its group (moved by someone else): moved back");
            self.note_followed(format!(
                "BE process {p} was outside {g} (moved by someone else): moved back"
            ));
        }
    }

    fn note_followed(&mut self, what: String) {
        self.targets_followed
            .push_back((self.started.elapsed().as_millis() as u64, what));
        if self.targets_followed.len() > FOLLOWED_KEPT {
            self.targets_followed.pop_front();
        }
    }

    /// A BE group that is gone from a hierarchy: created again, confined (the last allocation
    /// written whole, verified), and its commands' processes moved back in.
    fn recreate_removed_be_groups(&mut self) {
        let cg = self.node.cgroups().clone();
        let missing: Vec<_> = self
            .groups
            .be
            .iter()
            .filter(|g| !cg.exists(g))
            .cloned()
            .collect();
        if missing.is_empty() {
            return;
        }
        for g in &missing {
            tracing::warn!(group = %g, "a BE group was removed by someone else: creating it again and confining BE in it");
            if let Err(e) = cg.create(g) {
                tracing::error!(group = %g, error = %e, "creating the removed BE group again");
            }
        }
        // Its knobs are the kernel's defaults now: write the last allocation whole before
        // any BE process goes back in.
        if let Some(last) = self.controller.last_applied().cloned() {
            if let Err(e) = self.controller.apply_now(&mut self.node, &last) {
                tracing::error!(error = %e, "confining the recreated BE group");
            }
        }
        for g in missing {
            let mut moved = 0;
            for s in self.supervised.iter().filter(|s| s.group == g) {
                let Some(pid) = s.pid() else { continue };
                for p in pids::in_process_group(&self.options.root, pid) {
                    match cg.move_process(&g, p as i32) {
                        Ok(()) => moved += 1,
                        Err(e) => {
                            tracing::warn!(group = %g, pid = p, error = %e, "moving a BE process back")
                        }
                    }
                }
            }
            self.note_followed(format!(
                "BE group {g} was removed by someone else: created again, confined, {moved} BE process(es) moved back"
            ));
        }
        self.publisher.state_dirty = true;
    }

    /// A BE group whose controllers someone took away (v2: `-cpuset` written to a
    /// `cgroup.subtree_control` above it) is given them again and the last allocation written
    /// whole: until then its knob files are gone and nothing confines BE by them (tenth
    /// hostile pass: BE ran on every CPU while `ctl status` said the kernel held cpus 1).
    fn redelegate_be_groups(&mut self) {
        let cg = self.node.cgroups().clone();
        let lost: Vec<_> = self
            .groups
            .be
            .iter()
            .filter(|g| cg.exists(g) && cg.delegation_lost(g))
            .cloned()
            .collect();
        if lost.is_empty() {
            return;
        }
        let mut done = Vec::new();
        for g in &lost {
            match cg.create(g) {
                Ok(()) => {
                    tracing::warn!(group = %g, "a controller of a BE group was disabled above it by someone else (cgroup.subtree_control): enabling it again and confining BE");
                    done.push(g.clone());
                }
                Err(e) => {
                    tracing::error!(group = %g, error = %e, "a controller of a BE group was disabled above it by someone else, and enabling it again failed: BE is not confined by its knobs")
                }
            }
        }
        if let Some(last) = self.controller.last_applied().cloned() {
            if let Err(e) = self.controller.apply_now(&mut self.node, &last) {
                tracing::error!(error = %e, "confining the BE group given its controllers again");
            }
        }
        for g in done {
            self.note_followed(format!(
                "BE group {g}: a controller was disabled above it by someone else: enabled again, confined"
            ));
        }
        self.publisher.state_dirty = true;
    }

    /// Each LC with a way to be found again: its new pid moved into its group.
    fn follow_restarted_lcs(&mut self) {
        let cg = self.node.cgroups().clone();
        let root = self.options.root.clone();
        // The origins of LC processes that are gone: their pids may be reused by anything,
        // which `restore` would then move (and the list grew with every LC restart). One whose
        // /proc files cannot be read (EMFILE) is kept.
        let before = self.lc_origins.len();
        self.lc_origins.retain(|&p, _| !pids::is_gone(&root, p));
        if self.lc_origins.len() < before {
            self.publisher.state_dirty = true;
        }
        let lcs = self.config.lcs.clone();
        let members: Vec<BTreeSet<u32>> = lcs
            .iter()
            .map(|lc| {
                cg.procs(&lc.cgroup)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|p| p as u32)
                    .collect()
            })
            .collect();
        for (i, lc) in lcs.iter().enumerate() {
            let in_group = &members[i];
            // Who the LC runs as: learned from what its group holds (its configured pids
            // moved in at start, the command launched there, or a process taken before).
            let seen = self.lc_follow.lc_uids.entry(i).or_default();
            for p in in_group {
                if let Some((real, effective)) = pids::uids(&root, *p) {
                    seen.extend([real, effective]);
                }
            }
            self.say_lc_user_rule(lc);
            let launched_exited =
                !lc.command.is_empty() && self.lc_child_exited(launched_index(&lcs, i));
            let (found, pid_file, on_port) =
                find_lc(&root, lc, in_group.is_empty(), launched_exited);
            let not_regular = match pid_file {
                Some(pids::PidFile::NotRegular(kind)) => Some(kind),
                _ => None,
            };
            self.say_pid_file_not_regular(lc, not_regular);
            let pid_file = match pid_file {
                Some(pids::PidFile::Pid(read)) => Some(read),
                _ => None,
            };
            for pid in found {
                // An LC that died and was not reaped (its pid file still names it) is no
                // process to move: it was "moved in" once a second, a warning each time.
                if in_group.contains(&pid)
                    || pid == std::process::id()
                    || pids::is_zombie(&root, pid)
                {
                    continue;
                }
                // Another service's process (two services running one command line) is that
                // service's: taking it emptied the other's group (pass 24's low).
                if members
                    .iter()
                    .enumerate()
                    .any(|(j, m)| j != i && m.contains(&pid))
                {
                    continue;
                }
                // A pid file older than the process it names was written for an earlier
                // process with that number: the LC died and left it, and the number was
                // reused (hostile pass 35: a root process moved into the LC group).
                if let Some(later) = pid_file
                    .filter(|r| r.pid == pid)
                    .and_then(|r| pids::started_after_written(&root, &r))
                {
                    if self.lc_follow.stranger_lc_pids.insert(pid) {
                        let file = lc.pid_file.as_deref().unwrap_or_default();
                        tracing::warn!(lc = %lc.name, pid, pid_file = %file, started_after_s = later.as_secs_f64(), "the LC's pid file is older than the process it names (a stale file, the number reused): not taken as the LC, left where it is");
                        self.note_followed(format!(
                            "LC {}: pid {pid} named by the pid file {file} started {:.1} s after the file was written (a stale file, the number reused): left where it is",
                            lc.name,
                            later.as_secs_f64()
                        ));
                    }
                    continue;
                }
                // A pid file root cannot vouch for (the LC's user writes it, or its
                // directory) names no process of root's or the agent's user: pass 14's rule
                // counts those as the LC's always, so the LC's user wrote a root process's
                // pid there and root moved it into the LC group (fifteenth hostile pass).
                if let Some(why) = pid_file
                    .filter(|r| r.pid == pid)
                    .and_then(|r| self.pid_file_doubt(lc, &r))
                {
                    if self.lc_follow.stranger_lc_pids.insert(pid) {
                        tracing::warn!(lc = %lc.name, pid, reason = %why, "a process named by the LC's pid file is not taken as the LC: left where it is");
                        self.note_followed(format!(
                            "LC {}: pid {pid} named by the pid file: {why}: left where it is",
                            lc.name
                        ));
                    }
                    continue;
                }
                // Another user's process is never taken as the LC: any local user could
                // listen on the LC's port, or run its command, while the LC restarts, and had
                // root move that process into the LC group (out of its own confinement) and
                // give its threads the LC's SCHED_FIFO priority (fourteenth hostile pass).
                // Nor a process holding another user's listening socket on the LC's port (a
                // descriptor passed to root's process), nor, with `[lc] user`, anyone else's.
                if let Some(why) = self.stranger(i, lc, pid, on_port.get(&pid)) {
                    if self.lc_follow.stranger_lc_pids.insert(pid) {
                        tracing::warn!(lc = %lc.name, pid, reason = %why, "a process found as the LC (pid file, port or command) is not the LC's user's: left where it is");
                        self.note_followed(format!(
                            "LC {}: pid {pid} (pid file, port or command) {why}: left where it is",
                            lc.name
                        ));
                    }
                    continue;
                }
                // where it is now, to move it back on `restore`
                let text = pids::cgroup_text(&root, pid);
                // One of this agent's BE processes is never taken as the LC: a stale pid file
                // whose pid BE reused, or a BE job listening on the LC's port, moved BE into
                // the LC group, out of its freeze and cpuset (fifth hostile pass).
                if self.is_be_process(pid, &text) {
                    if self.lc_follow.be_lc_pids.insert(pid) {
                        tracing::warn!(lc = %lc.name, pid, "a process found as the LC (pid file, port or command) is one of BE's: left in BE");
                        self.note_followed(format!(
                            "LC {}: pid {pid} (pid file, port or command) is a BE process: left in BE",
                            lc.name
                        ));
                    }
                    continue;
                }
                // A process in a group another agent manages is that agent's (its BE, moved
                // here, would escape its freeze): left where it is.
                let foreign = self.group_lock.as_ref().and_then(|l| {
                    cg.process_dirs(&lc.cgroup, &text)
                        .iter()
                        .find_map(|d| l.foreign_holder(d))
                });
                if let Some((_, holder)) = foreign {
                    if self.lc_follow.foreign_lc_pids.insert(pid) {
                        tracing::warn!(lc = %lc.name, pid, "a process found as the LC is in a group another agent manages, {holder}: left where it is");
                    }
                    continue;
                }
                let origins: Vec<String> = cg
                    .process_dirs(&lc.cgroup, &text)
                    .into_iter()
                    .filter(|d| !d.ends_with(lc.cgroup.as_str()))
                    .map(|d| d.display().to_string())
                    .collect();
                match cg.move_process(&lc.cgroup, pid as i32) {
                    Ok(()) => {
                        tracing::warn!(lc = %lc.name, pid, group = %lc.cgroup, "the LC runs under a new pid: moved it into its group");
                        self.lc_origins.insert(pid, origins);
                        self.publisher.state_dirty = true;
                        self.note_followed(format!(
                            "LC {} runs under a new pid {pid}: moved into {}",
                            lc.name, lc.cgroup
                        ));
                    }
                    Err(e) => {
                        tracing::warn!(lc = %lc.name, pid, error = %e, "moving the LC's new pid into its group")
                    }
                }
            }
        }
    }

    /// A pid file that is not a regular file is read as no pid (it is never opened to wait,
    /// nor read without end): said once, naming the path and what it is, until it is a
    /// regular file (or gone) again; not each second.
    fn say_pid_file_not_regular(&mut self, lc: &LcConfig, not_regular: Option<&'static str>) {
        let Some(f) = &lc.pid_file else { return };
        match not_regular {
            Some(kind) => {
                if self.lc_follow.pid_files_not_regular.insert(f.clone()) {
                    tracing::warn!(lc = %lc.name, pid_file = %f, kind, "the LC's pid file is not a regular file: not read, so a restarted LC is not found through it");
                    self.note_followed(format!(
                        "LC {}: pid file {f} is a {kind}, not a regular file: not read (a restart is not followed through it)",
                        lc.name
                    ));
                }
            }
            None => {
                self.lc_follow.pid_files_not_regular.remove(f);
            }
        }
    }

    /// Whether `pid` (its `/proc/<pid>/cgroup` is `text`) is one of BE's: in or below a BE
    /// group in some hierarchy, or seen there at the last look (moved out, to be moved back).
    fn is_be_process(&self, pid: u32, text: &str) -> bool {
        let cg = self.node.cgroups();
        let seen = self
            .be_members
            .get(&pid)
            .is_some_and(|(_, start)| pids::start_time(&self.options.root, pid) == Some(*start));
        seen || self.groups.be.iter().any(|g| {
            let dirs = cg.group_dirs(g);
            cg.process_dirs(g, text)
                .iter()
                .any(|d| dirs.iter().any(|(_, gd)| d.starts_with(gd)))
        })
    }

    /// Whether the LC command launched for service `k` (an index into `lc_children`) exited.
    fn lc_child_exited(&mut self, k: usize) -> bool {
        let root = &self.options.root;
        self.lc_children.get_mut(k).is_some_and(|c| c.exited(root))
    }
}

/// The index into the launched LC children of service `i` (one child per service with a
/// `command`, in the config's order).
fn launched_index(lcs: &[LcConfig], i: usize) -> usize {
    lcs[..i].iter().filter(|l| !l.command.is_empty()).count()
}

/// Where `lc` runs now: the pid in its pid file (always, a read is cheap); with its group
/// empty, the process listening on its port; with its launched command exited, processes
/// running that command. Beside: what its pid file held (with who could have written the
/// pid, or what the file is when it is not a regular file), and the processes found on the
/// port with the uids that made their listening sockets there.
fn find_lc(
    root: &Path,
    lc: &LcConfig,
    group_empty: bool,
    launched_exited: bool,
) -> (Vec<u32>, Option<pids::PidFile>, OnPort) {
    let mut out = BTreeSet::new();
    let read = lc.pid_file.as_ref().map(|f| pids::read_pid_file(root, f));
    if let Some(pids::PidFile::Pid(r)) = read {
        out.insert(r.pid);
    }
    let mut on_port = OnPort::new();
    if group_empty {
        if let Some(port) = lc.listen_port {
            on_port = pids::listeners(root, port);
            out.extend(on_port.keys());
        }
    }
    if launched_exited {
        out.extend(pids::running(root, &lc.command));
    }
    (out.into_iter().collect(), read, on_port)
}

/// Processes found on an LC's port, with the uids that made their listening sockets there.
type OnPort = std::collections::BTreeMap<u32, BTreeSet<u32>>;
