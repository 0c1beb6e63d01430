//! The exit action (`safety.on_exit`), run on a stop signal or at the end of `run_for` —
//! also after `ctl off`: the kill switch restored the originals, but a BE left running with no
//! agent watching it is what the exit action exists to prevent.
//!
//! - `freeze`: BE frozen; its groups, the originals and the state file stay for the next start.
//! - `restore`: every original back, the BE commands (launched or adopted, with everything they
//!   forked) stopped, the LC moved back into its own groups, the groups the agent made removed,
//!   the state file removed.
//! - `leave`: the allocation as it is; the state file stays.
//!
//! When the exit action does not complete, the state file is kept (the next start finishes the
//! job) and the agent exits non-zero.

use std::path::Path;
use std::time::Duration;

use super::host_steps::{lc_left_running, move_lc_back, remove_created_groups, remove_made_dirs};
use super::{Agent, AgentError, RunSummary};
use crate::state;
use headroom_control::config::OnExit;
use headroom_types::GroupPath;

impl Agent {
    pub(super) fn shutdown(mut self) -> Result<RunSummary, AgentError> {
        let action = self.config.safety.on_exit;
        let mut failures: Vec<String> = Vec::new();
        // The state lock's file goes with the state file (seventh pass's low: it was left).
        let mut remove_lock = false;
        // The LC commands left running are recorded first, while each is still in its group:
        // `restore` moves one the agent moved in back out, where only the record finds it.
        if !self.options.dry_run {
            self.record_left_lcs(true);
        }
        let exit_action = if self.options.dry_run {
            "none (dry run)".to_string()
        } else {
            let done = match action {
                OnExit::Freeze => self.freeze_be(&mut failures),
                OnExit::Restore => self.restore_all(&mut failures),
                OnExit::Leave => "leave: allocation left as is".into(),
            };
            // The LC's pinning, policy and real-time budgets go back unless told to leave all.
            if action != OnExit::Leave {
                let n = self.lc_threads.restore(Some(self.node.cgroups()));
                if n > 0 {
                    tracing::info!(threads = n, "LC threads' affinity and policy restored");
                }
            }
            if action == OnExit::Restore && failures.is_empty() {
                match state::remove(Path::new(&self.config.safety.state_file)) {
                    Ok(()) => remove_lock = true,
                    Err(e) => failures.push(e.to_string()),
                }
            } else if let Err(e) = self.write_state() {
                failures.push(format!("writing the state file: {e}"));
            }
            done
        };
        let exit_action = if failures.is_empty() {
            exit_action
        } else {
            format!("{exit_action} FAILED: {}", failures.join("; "))
        };
        tracing::info!(action = %exit_action, "exit action");
        for child in self.lc_children.drain(..) {
            // The LC command stays running: the agent never stops an LC service.
            tracing::info!(pid = child.id(), "leaving the LC command running");
            if let super::host_steps::LcChild::Launched(mut child) = child {
                let _ = child.try_wait();
            }
        }
        self.publisher.end_run();
        if let Some(log) = &mut self.publisher.log {
            log.flush();
        }
        if let Some(k) = &mut self.kube {
            let t = k.stop_all();
            self.threads.extend(t);
        }
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.requests = None;
        // The accept loops sleep up to a second between looks at `stop`: a connection wakes
        // them now.
        let _ = std::os::unix::net::UnixStream::connect(&self.config.api.socket);
        if let Some(addr) = self.metrics_addr {
            let _ = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100));
        }
        crate::sensors::wake_and_join(self.threads.drain(..));
        self.publisher.summary.exit_action = exit_action.clone();
        // Last, once nothing more is done (the group locks, held until the agent is dropped,
        // still turn a new agent away meanwhile).
        if remove_lock {
            if let Some(lock) = self.state_lock.take() {
                lock.remove();
            }
        }
        if failures.is_empty() {
            Ok(self.publisher.summary.clone())
        } else {
            Err(AgentError::Exit(exit_action))
        }
    }

    /// Records the LC commands left running (`<state_file>.lc`, `crate::lc_record`), for the
    /// next start to take them rather than launch them again (hostile pass 23: after a
    /// `restore`, a restart doubled the LC): each service's launched or taken command while
    /// it runs; once that has ended, the process running the command that was followed into
    /// the group in its place (`follow.rs`: its service manager started it again), found as
    /// a start finds one left in the group (hostile pass 24: it was not recorded, `restore`
    /// moved it out, and the next start launched a second copy beside it). Also while the
    /// agent runs (`at_exit` false: written only when it changed, without what the command
    /// forked, which a kill -9 leaves in the group): a kill -9 leaves no exit to record a
    /// command that exec'd another program, which no start found again by its command line
    /// (hostile pass 28: a second copy was launched beside it).
    pub(super) fn record_left_lcs(&mut self, at_exit: bool) {
        let root = self.options.root.clone();
        let cg = self.node.cgroups().clone();
        let services: Vec<_> = self
            .config
            .lcs
            .iter()
            .filter(|l| !l.command.is_empty())
            .collect();
        let running: Vec<Option<u32>> = self
            .lc_children
            .iter_mut()
            .map(|c| (!c.exited(&root)).then(|| c.id()))
            .collect();
        let mut left = Vec::new();
        for (lc, &pid) in services.iter().zip(&running) {
            // (another service's own command, which this one's follow may have taken in, is
            // that service's)
            let Some(pid) = pid
                .or_else(|| followed_lc(&root, &cg, lc).filter(|p| !running.contains(&Some(*p))))
            else {
                continue;
            };
            let (Some(start_time), Some((uid, _))) = (
                headroom_host::pids::start_time(&root, pid),
                headroom_host::pids::uids(&root, pid),
            ) else {
                continue;
            };
            let ran = headroom_host::pids::command_line(&root, pid)
                .filter(|r| *r != lc.command)
                .unwrap_or_default();
            let forked = if at_exit {
                forked_in_group(&root, &cg, &lc.cgroup, pid)
            } else {
                Vec::new()
            };
            left.push(crate::lc_record::LeftLc {
                name: lc.name.clone(),
                command: lc.command.clone(),
                uid,
                pid,
                start_time,
                ran,
                forked,
            });
        }
        if !at_exit && left == self.lc_recorded {
            return;
        }
        let state = Path::new(&self.config.safety.state_file);
        match crate::lc_record::store(state, &left) {
            Ok(()) => self.lc_recorded = left,
            Err(e) => {
                tracing::warn!(error = %e, "recording the LC commands left running failed: the next start launches them again")
            }
        }
    }

    /// `on_exit = "freeze"`: BE frozen (its groups kept); other groups the agent made may go.
    fn freeze_be(&mut self, failures: &mut Vec<String>) -> String {
        let mut a = self.controller.last_applied().cloned().unwrap_or_default();
        a.be_enabled = false;
        a.be_kill = false;
        if self.controller.actuation().is_some() {
            if let Err(e) = self.controller.apply_now(&mut self.node, &a) {
                failures.push(format!("freezing BE: {e}"));
            }
        }
        let keep = self.groups.be.clone();
        let cg = self.node.cgroups().clone();
        remove_created_groups(&cg, &mut self.created_groups, &keep);
        remove_made_dirs(&cg, &mut self.created_dirs, &keep);
        "freeze: BE frozen".into()
    }

    /// `on_exit = "restore"`: originals back, BE commands stopped, LC moved back, groups gone.
    fn restore_all(&mut self, failures: &mut Vec<String>) -> String {
        // BE commands stop while still confined (stopping thaws a frozen group to deliver
        // the signal); only then do the groups get their originals back.
        let cg = self.node.cgroups().clone();
        // A kill that left processes is not done (pass 25's low: it was counted done, the
        // state file removed and the survivors left in a group put back to its originals).
        for s in &mut self.supervised {
            if let Err(e) = s.stop(&cg, Duration::from_secs(2)) {
                failures.push(e.to_string());
            }
        }
        self.supervised.clear();
        if let Err(e) = self.restore_originals() {
            failures.push(e.to_string());
        }
        let lc_groups: Vec<GroupPath> = self.config.lcs.iter().map(|l| l.cgroup.clone()).collect();
        move_lc_back(&cg, &self.lc_origins, &lc_groups);
        self.lc_origins.clear();
        self.move_lc_commands_out_of_made_groups();
        remove_created_groups(&cg, &mut self.created_groups, &[]);
        remove_made_dirs(&cg, &mut self.created_dirs, &[]);
        "restore: original settings restored".into()
    }
}

impl Agent {
    /// `restore` removes the groups the agent made (`docs/agent.md`, "Start and exit"): the
    /// processes still in an LC service's group where the agent made that group — the LC
    /// command it launched (or took) and whatever that forked (pass 27's low: a forked child
    /// kept the group) — are moved, in those hierarchies, to where the agent itself is (the
    /// hierarchy's root where the agent's own group does not read), as the command started
    /// there before its launch moved it in. Left in it, the group stayed, and every later
    /// start adopted it as an existing group and never removed it (passes 23 and 24's low).
    /// The command stays running and recorded (`record_left_lcs`): the next start takes it.
    /// Processes the agent moved in from elsewhere went back before this (`move_lc_back`).
    fn move_lc_commands_out_of_made_groups(&mut self) {
        let root = self.options.root.clone();
        let cg = self.node.cgroups().clone();
        let own = headroom_host::pids::cgroup_text(&root, std::process::id());
        let services: Vec<GroupPath> = self
            .config
            .lcs
            .iter()
            .filter(|l| !l.command.is_empty())
            .map(|l| l.cgroup.clone())
            .take(self.lc_children.len())
            .collect();
        for group in &services {
            let made_all = self.created_groups.contains(group);
            let agent_dirs = cg.process_dirs(group, &own);
            for (backend, dir) in cg.group_dirs(group) {
                let made = made_all || self.created_dirs.contains(&(group.clone(), dir.clone()));
                let held = match cg.procs_in_dir(&dir) {
                    Ok(held) if made && !held.is_empty() => held,
                    _ => continue,
                };
                let mount = backend.mount();
                let to = agent_dirs
                    .iter()
                    .find(|d| d.starts_with(mount))
                    .map_or_else(|| mount.to_path_buf(), Clone::clone);
                if to == dir {
                    continue; // the agent is in the LC's group itself: the group stays
                }
                for pid in held {
                    match cg.move_process_to_dir(&to, pid) {
                        Ok(()) => {
                            tracing::info!(pid, group = %group, to = %to.display(), "an LC command's process moved out of the group the agent made, to where the agent is, before the group is removed")
                        }
                        Err(e) => {
                            tracing::warn!(pid, group = %group, to = %to.display(), error = %e, "moving an LC command's process out of the group the agent made failed: the group stays")
                        }
                    }
                }
            }
        }
    }
}

/// The processes in `group` (in any hierarchy) but `pid`, with their start times: what the LC
/// command `pid` forked, recorded with it at the exit.
fn forked_in_group(
    root: &Path,
    cg: &headroom_host::Cgroups,
    group: &GroupPath,
    pid: u32,
) -> Vec<(u32, u64)> {
    let mut held: Vec<u32> = cg
        .group_dirs(group)
        .into_iter()
        .filter_map(|(_, d)| cg.procs_in_dir(&d).ok())
        .flatten()
        .map(|p| p as u32)
        .filter(|&p| p != pid && !headroom_host::pids::is_zombie(root, p))
        .collect();
    held.sort_unstable();
    held.dedup();
    held.into_iter()
        .filter_map(|p| headroom_host::pids::start_time(root, p).map(|t| (p, t)))
        .collect()
}

/// The process in `lc`'s group running exactly its command as the command's user (its `user`,
/// else the agent's), as a start looks for one left there
/// ([`super::host_steps::lc_left_running`]).
fn followed_lc(
    root: &Path,
    cg: &headroom_host::Cgroups,
    lc: &headroom_control::config::LcConfig,
) -> Option<u32> {
    let user = crate::run_as::user_for("lc.user", lc.user.as_ref()).ok()?;
    let uid = user.as_ref().map_or_else(
        headroom_host::process::effective_uid,
        headroom_host::spawn::RunAs::uid,
    );
    lc_left_running(root, cg, &lc.cgroup, &lc.command, uid).map(|(pid, _)| pid)
}
