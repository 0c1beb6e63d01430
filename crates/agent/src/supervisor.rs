//! Commands the agent launches in their groups (`[[be]] command`, `[lc] command`), restarted
//! with exponential backoff when they die.
//!
//! A BE command is forked behind a gate ([`launch_gated`]): the agent moves the child into
//! every hierarchy of its group — a frozen freezer included — while it waits, and only then lets
//! it exec, so no BE instruction runs outside its groups, and a child whose agent dies before
//! opening the gate exits without running. The LC command ([`launch_in_group`]) instead
//! joins its group's v1 hierarchies (all but the freezer) in `pre_exec`, before it runs
//! a single instruction of the command; the freezer (and a v2 group, where freezing is part of
//! the one hierarchy) is joined right after spawn — joining a frozen group inside `pre_exec`
//! would block the spawn until BE is thawed.

use std::time::{Duration, Instant};

use headroom_host::spawn::relay::PipeId;
use headroom_host::spawn::{Gated, ProcessScope, RunAs};
use headroom_host::Cgroups;
use headroom_types::GroupPath;

mod lc_launch;
pub use lc_launch::launch_in_group;

/// Errors launching a command.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{name}: empty command")]
    Empty { name: String },
    #[error("{name}: starting {command:?} in {group}: {source}")]
    Spawn {
        name: String,
        command: Vec<String>,
        group: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name}: preparing its start in {group}: {source}")]
    Prepare {
        name: String,
        group: String,
        #[source]
        source: Box<headroom_host::HostError>,
    },
    #[error("{name}: moving pid {pid} into {group}: {source}")]
    Move {
        name: String,
        pid: u32,
        group: String,
        #[source]
        source: Box<headroom_host::HostError>,
    },
}

/// A BE command's group still held processes after the kill ([`Supervised::stop`]).
#[derive(Debug, thiserror::Error)]
#[error("BE {name}: its group {group} still holds processes after the kill: {source}")]
pub struct StopError {
    pub name: String,
    pub group: String,
    #[source]
    pub source: Box<headroom_host::HostError>,
}

/// One supervised command.
#[derive(Debug)]
pub struct Supervised {
    pub name: String,
    pub command: Vec<String>,
    pub group: GroupPath,
    pub restart: bool,
    backoff_initial: Duration,
    backoff_max: Duration,
    backoff: Duration,
    /// A BE command this agent launched (reaped with waitpid).
    child: Option<i32>,
    /// A process started by an earlier agent (from the state file): watched, not reaped.
    adopted: Option<u32>,
    started: Option<Instant>,
    restart_at: Option<Instant>,
    pub restarts: u64,
    /// How the command last ended and after how long (`ctl status`).
    pub last_exit: Option<String>,
    /// The group's memory OOM-kill count when the command started (v1 `memory.oom_control`,
    /// v2 `memory.events` `oom_kill`): a death by SIGKILL while it rose is said as the memory
    /// limit's OOM kill, not as a bare "signal: SIGKILL" (hostile pass 13).
    oom_kills: Option<u64>,
    /// Processes found in the group at a first start, launched by no agent: confined as BE,
    /// never killed (stopping the command spares them).
    pub spared: std::collections::BTreeSet<i32>,
    /// Who the command runs as (`[[be]] user`); `None`: the agent's user (root).
    user: Option<RunAs>,
    /// The relay pipe of the running command's output (run as a user), recorded in the state
    /// file: the next agent relays only that pipe (hostile pass 26's low).
    pub relay_pipe: Option<PipeId>,
}

impl Supervised {
    pub fn new(
        name: &str,
        command: &[String],
        group: GroupPath,
        restart: bool,
        backoff_ms: u64,
        backoff_max_ms: u64,
    ) -> Supervised {
        Supervised {
            name: name.to_string(),
            command: command.to_vec(),
            group,
            restart,
            backoff_initial: Duration::from_millis(backoff_ms),
            backoff_max: Duration::from_millis(backoff_max_ms),
            backoff: Duration::from_millis(backoff_ms),
            child: None,
            adopted: None,
            relay_pipe: None,
            started: None,
            restart_at: None,
            restarts: 0,
            last_exit: None,
            oom_kills: None,
            spared: Default::default(),
            user: None,
        }
    }

    /// The command runs as `user` (`[[be]] user`), at every start and restart; a process
    /// an earlier agent left is adopted only when it runs as that user.
    pub fn run_as(mut self, user: Option<RunAs>) -> Supervised {
        self.user = user;
        self
    }

    /// The uid the command runs as: its user's, else the agent's.
    pub fn uid(&self) -> u32 {
        self.user
            .as_ref()
            .map_or_else(headroom_host::process::effective_uid, RunAs::uid)
    }

    /// The running process's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.map(|p| p as u32).or(self.adopted)
    }

    /// Whether the running command was launched by this agent (not adopted).
    pub fn launched(&self) -> bool {
        self.child.is_some()
    }

    /// Watches a process an earlier agent started (if it is still alive and in the group).
    /// `pipe`: its relay pipe, as the state file recorded it.
    pub fn adopt(&mut self, cgroups: &Cgroups, pid: u32, pipe: Option<PipeId>) -> bool {
        let alive = headroom_host::process::exists(pid as i32);
        let in_group = cgroups
            .procs(&self.group)
            .is_ok_and(|p| p.contains(&(pid as i32)));
        // With a `user`, one that runs as another (the config's `user` changed, or the
        // earlier agent ran it as root) is not adopted: it is stopped and the command started
        // again as its user. Without one, any is adopted, as before.
        // The gids too (pass 18): a `[[be]] group` changed since, or the user's group.
        let root = std::path::Path::new("/");
        // (first: the pipe of its output is opened only from the process checked here)
        let born = headroom_host::pids::start_time(root, pid);
        let uids = headroom_host::pids::uids(root, pid);
        let gids = headroom_host::pids::gids(root, pid);
        let want = self.uid();
        let want_gid = self.user.as_ref().map(RunAs::gid);
        if alive && in_group && not_as(want, want_gid, uids, gids) {
            tracing::warn!(name = %self.name, pid, uids = ?uids, gids = ?gids, want, want_gid,
                "the previous agent's BE command runs as another user or group than the config's: not adopted (stopped, started again)");
        } else if alive && in_group {
            self.adopted = Some(pid);
            self.oom_kills = oom_kills(cgroups, &self.group);
            self.started = Some(Instant::now());
            tracing::info!(name = %self.name, pid, "adopted a BE command from the previous agent");
            if self.user.is_some() {
                self.relay_pipe = pipe;
                self.relay_adopted(pid, born);
            }
        }
        self.adopted.is_some()
    }

    /// Reads again the output of an adopted BE run as a user (hostile pass 23's low): its fds
    /// 1 and 2 are the earlier agent's relay pipe, whose reader ended with it; thawed, the BE
    /// died on its first write. Called at adoption, while BE is still frozen (the start-up
    /// allocation), before the first tick thaws it. A BE whose output is no such pipe (one
    /// an agent before pass 20 launched, `/dev/null`, a file) is left as it is.
    fn relay_adopted(&self, pid: u32, born: Option<u64>) {
        let name = self.command.first().map_or_else(
            || self.name.clone(),
            |p| {
                std::path::Path::new(p)
                    .file_name()
                    .map_or_else(|| p.clone(), |n| n.to_string_lossy().into_owned())
            },
        );
        let Some(born) = born else {
            tracing::warn!(name = %self.name, pid, "the adopted BE command's start time is unreadable: its output is not relayed (a write may end it)");
            return;
        };
        match headroom_host::spawn::relay::start_adopted(pid as i32, born, &name, self.relay_pipe) {
            Ok(0) => {
                tracing::info!(name = %self.name, pid, recorded = ?self.relay_pipe, "the adopted BE command's output is not the relay pipe the earlier agent recorded: left as it is")
            }
            Ok(pipes) => {
                tracing::info!(name = %self.name, pid, pipes, "the adopted BE command's output is relayed again")
            }
            Err(e) => {
                tracing::warn!(name = %self.name, pid, error = %e, "the adopted BE command's output could not be relayed: a write may end it (restarted then)")
            }
        }
    }

    /// Starts the command in its group.
    pub fn start(&mut self, cgroups: &Cgroups) -> Result<u32, LaunchError> {
        self.oom_kills = oom_kills(cgroups, &self.group);
        let (pid, pipe) = launch_gated_piped(
            cgroups,
            &self.name,
            &self.command,
            &self.group,
            self.user.as_ref(),
        )?;
        self.relay_pipe = pipe;
        let child = pid as i32;
        tracing::info!(name = %self.name, pid, group = %self.group, command = ?self.command, uid = self.uid(), "started");
        self.child = Some(child);
        self.adopted = None;
        self.started = Some(Instant::now());
        self.restart_at = None;
        Ok(pid)
    }

    /// Reaps a dead command and restarts it when its backoff has passed.
    pub fn check(&mut self, cgroups: &Cgroups, now: Instant) {
        use headroom_host::process::{ChildEnd, Signal};
        // How it ended, and whether it may have been the OOM killer (SIGKILL, or an adopted
        // process whose end is not known).
        let died = match (&mut self.child, self.adopted) {
            (Some(pid), _) => headroom_host::process::reap(*pid, false).map(|end| {
                (
                    end.to_string(),
                    matches!(end, ChildEnd::Signaled(Signal::SIGKILL)),
                )
            }),
            (None, Some(pid)) => (!headroom_host::process::exists(pid as i32))
                .then(|| ("adopted process is gone".to_string(), true)),
            (None, None) => None,
        };
        if let Some((how, killed)) = died {
            let how = match killed.then(|| self.oom_killed(cgroups)).flatten() {
                Some(oom) => format!("{oom} ({how})"),
                None => how,
            };
            let ran = self.started.map_or(Duration::ZERO, |s| now - s);
            // A command that ran for a while before dying starts over at the initial backoff.
            if ran >= self.backoff_max {
                self.backoff = self.backoff_initial;
            }
            self.child = None;
            self.adopted = None;
            self.last_exit = Some(format!("{how} after {:.1} s", ran.as_secs_f64()));
            // A command that daemonizes ends at once and leaves its work behind: confined in
            // the group and stopped with it, but worth saying (a restart adds another).
            let left = cgroups
                .procs(&self.group)
                .map_or(0, |p| p.iter().filter(|p| !self.spared.contains(p)).count());
            if left > 0 {
                tracing::warn!(name = %self.name, processes = left, restart = self.restart,
                    "the BE command ended but left processes in its group (it daemonizes?): they stay confined there and are stopped with it; run the command in the foreground");
            }
            if self.restart {
                self.restart_at = Some(now + self.backoff);
                tracing::warn!(name = %self.name, status = %how, ran_ms = ran.as_millis() as u64,
                    restart_in_ms = self.backoff.as_millis() as u64, "BE command died");
                self.backoff = (self.backoff * 2).min(self.backoff_max);
            } else {
                tracing::warn!(name = %self.name, status = %how, "command died (restart = false)");
            }
        }
        if let Some(at) = self.restart_at {
            if now >= at && self.pids_full(cgroups) {
                // Counted before the relaunch: a move into the group is not refused by
                // `pids.max` (only a fork is), so relaunching into a full group took it one
                // task past `be_pids_max` (issue 42's low). Tried again after the backoff.
                self.restart_at = Some(now + self.backoff);
                self.backoff = (self.backoff * 2).min(self.backoff_max);
            } else if now >= at {
                self.restarts += 1;
                if let Err(e) = self.start(cgroups) {
                    tracing::error!(error = %e, "restart failed");
                    self.restart_at = Some(now + self.backoff);
                    self.backoff = (self.backoff * 2).min(self.backoff_max);
                }
            }
        }
    }

    /// Whether the group holds as many tasks as its `pids.max` allows (said when it does): a
    /// relaunch would take it past the limit. A group without the limit, or whose counts do not
    /// read, is not full.
    fn pids_full(&self, cgroups: &Cgroups) -> bool {
        let (Ok(Some(max)), Ok(current)) = (
            cgroups.pids_max(&self.group),
            cgroups.pids_current(&self.group),
        ) else {
            return false;
        };
        let full = current >= max;
        if full {
            tracing::warn!(name = %self.name, group = %self.group, current, max,
                "the BE group holds as many tasks as its pids.max (safety.be_pids_max): the command is not relaunched until one ends");
        }
        full
    }

    /// "OOM-killed (memory limit N bytes)" when the group's OOM-kill count rose since the
    /// command started (the count is re-based, so the next death is judged on its own).
    fn oom_killed(&mut self, cgroups: &Cgroups) -> Option<String> {
        let before = self.oom_kills?;
        let now = oom_kills(cgroups, &self.group)?;
        self.oom_kills = Some(now);
        if now <= before {
            return None;
        }
        Some(match cgroups.memory_max(&self.group) {
            Ok(Some(limit)) => format!("OOM-killed (memory limit {limit} bytes)"),
            Ok(None) => "OOM-killed (no memory limit on its group: one above it)".to_string(),
            Err(_) => "OOM-killed (memory limit unreadable)".to_string(),
        })
    }

    /// Stops the command and everything it started — launched by this agent or adopted from
    /// an earlier one: SIGTERM to its process group (the command leads its own), then, after
    /// `grace`, SIGKILL to every process left in its group and the groups below (`cgroup.kill`
    /// on v2). A BE group with a `command` is the agent's own, so a process someone else put
    /// there goes too. With the command itself gone (exited, or waiting for its restart), what
    /// it forked may still run in the group — a daemon, a double fork — and goes the same way
    /// (fourth hostile pass: such a child outlived `restore`, unconfined, with no agent).
    /// Processes in `spared` are left. Returns how many processes had to be killed; a kill
    /// that did not empty the group within [`headroom_host::cgroup::KILL_SETTLE`] is an error
    /// naming the group and the processes left (pass 25's low: `restore` counted it done).
    pub fn stop(&mut self, cgroups: &Cgroups, grace: Duration) -> Result<usize, StopError> {
        use headroom_host::process::{exists, send_signal, Signal};
        self.restart_at = None;
        let pid = self.pid();
        let ours = |cgroups: &Cgroups| -> Vec<i32> {
            cgroups
                .procs(&self.group)
                .unwrap_or_default()
                .into_iter()
                .filter(|p| !self.spared.contains(p))
                .collect()
        };
        if pid.is_none() && ours(cgroups).is_empty() && !self.has_subgroups(cgroups) {
            return Ok(0);
        }
        // A frozen process takes no signal until it is thawed.
        if cgroups
            .freeze_state(&self.group)
            .is_ok_and(|st| st != headroom_host::FreezeState::Thawed)
        {
            let _ = cgroups.thaw(&self.group);
        }
        let leader = pid.map(|p| p as i32);
        match leader {
            Some(leader) => {
                // Its process group first (what it forked), else the leader alone.
                if send_signal(-leader, Signal::SIGTERM).is_err() {
                    let _ = send_signal(leader, Signal::SIGTERM);
                }
            }
            None => {
                for p in ours(cgroups) {
                    let _ = send_signal(p, Signal::SIGTERM);
                }
            }
        }
        let end = Instant::now() + grace;
        while Instant::now() < end {
            let gone = match (self.child, leader) {
                (Some(pid), _) => reap(pid).is_some(),
                (None, Some(leader)) => !exists(leader),
                (None, None) => true,
            };
            if gone && ours(cgroups).is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let killed = cgroups.kill_all_except(&self.group, &self.spared);
        if let Some(pid) = self.child.take() {
            let _ = send_signal(pid, Signal::SIGKILL);
            // (not waited for when the kill failed: a frozen child would never be reaped)
            let _ = headroom_host::process::reap(pid, killed.is_ok());
        }
        self.adopted = None;
        match killed {
            Ok(killed) => {
                tracing::info!(name = %self.name, pid = ?pid, killed, "stopped");
                Ok(killed)
            }
            Err(e) => {
                let e = StopError {
                    name: self.name.clone(),
                    group: self.group.to_string(),
                    source: Box::new(e),
                };
                tracing::error!(error = %e, "stopping the BE command");
                Err(e)
            }
        }
    }

    /// Whether the group has groups below it (their processes are stopped with it).
    fn has_subgroups(&self, cgroups: &Cgroups) -> bool {
        cgroups.children(&self.group).is_ok_and(|c| !c.is_empty())
    }
}

/// The environment variable every BE command the agent launches carries (and what it forks
/// inherits): the BE group it was launched for. A first start finds an earlier agent's BE by
/// it when no state file recorded its pid (the state file could not be written, then a
/// crash: fifth hostile pass); a process without it is an operator's, spared.
pub const BE_OWNER_ENV: &str = "HEADROOM_BE_OWNER";

/// Whether `pid` was launched by an agent (or forked by what one launched) for `group`.
pub fn launched_for(pid: i32, group: &GroupPath) -> bool {
    u32::try_from(pid).is_ok_and(|pid| {
        headroom_host::pids::environ_var(std::path::Path::new("/"), pid, BE_OWNER_ENV)
            .is_some_and(|v| v == group.as_str())
    })
}

/// Kills every process of `group` and below (see [`Cgroups::kill_all`]); returns how many.
pub fn kill_group(cgroups: &Cgroups, group: &GroupPath) -> usize {
    kill_group_except(cgroups, group, &std::collections::BTreeSet::new())
}

/// [`kill_group`] sparing `keep`.
pub fn kill_group_except(
    cgroups: &Cgroups,
    group: &GroupPath,
    keep: &std::collections::BTreeSet<i32>,
) -> usize {
    match cgroups.kill_all_except(group, keep) {
        Ok(n) => n,
        Err(e) => {
            tracing::error!(group = %group, error = %e, "killing the processes of a BE group");
            0
        }
    }
}

/// How a launched child ended, if it has (reaped); `None` while it runs.
/// The group's memory OOM-kill count, where its memory controller is mounted and readable.
fn oom_kills(cgroups: &Cgroups, group: &GroupPath) -> Option<u64> {
    cgroups.memory_events(group).ok().map(|e| e.oom_kill)
}

fn reap(pid: i32) -> Option<String> {
    headroom_host::process::reap(pid, false).map(|end| end.to_string())
}

/// Forks `command` behind a gate ([`Gated`]), marked [`BE_OWNER_ENV`]`=<group>`, to run as
/// `user` when given (it becomes that user once placed, just before it execs): the child
/// drops every fd it inherited and waits;
/// the agent moves it into every hierarchy of `group` (a frozen group freezes it where it
/// waits) and then opens the gate, and the child execs. Moving it only once it has dropped its
/// fds matters: a child frozen before it had would hold the agent's state lock for as long as
/// it stays frozen (a kill -9 of the agent mid-launch then kept the next agent out). If the
/// agent dies first, the gate closes empty and the child exits without running the command.
/// Returns the child's pid.
pub fn launch_gated(
    cgroups: &Cgroups,
    name: &str,
    command: &[String],
    group: &GroupPath,
    user: Option<&RunAs>,
) -> Result<u32, LaunchError> {
    launch_gated_piped(cgroups, name, command, group, user).map(|(pid, _)| pid)
}

/// [`launch_gated`], with the relay pipe of a command run as a user (its fds 1 and 2).
pub fn launch_gated_piped(
    cgroups: &Cgroups,
    name: &str,
    command: &[String],
    group: &GroupPath,
    user: Option<&RunAs>,
) -> Result<(u32, Option<PipeId>), LaunchError> {
    let spawn_err = |source: std::io::Error| LaunchError::Spawn {
        name: name.to_string(),
        command: command.to_vec(),
        group: group.to_string(),
        source,
    };
    if command.is_empty() {
        return Err(LaunchError::Empty {
            name: name.to_string(),
        });
    }
    let mut env = user.map(RunAs::env).unwrap_or_default();
    env.push((BE_OWNER_ENV.to_string(), group.to_string()));
    // Scoped to its own processes (hostile pass 25: a BE as a user could take over another
    // process of that user outside the BE groups through ptrace or /proc/<pid>/mem).
    let child = Gated::fork_as(command, &env, user, ProcessScope::Own).map_err(spawn_err)?;
    // Bounded: a child that does not say it dropped the agent's fds is not placed.
    if !child.wait_ready(Duration::from_secs(5)) {
        child.kill();
        return Err(spawn_err(std::io::Error::other(
            "the gated child did not get ready within 5 s",
        )));
    }
    let pid = child.pid();
    if let Err(source) = cgroups.move_process(group, pid) {
        child.refuse();
        return Err(LaunchError::Move {
            name: name.to_string(),
            pid: pid as u32,
            group: group.to_string(),
            source: Box::new(source),
        });
    }
    let pipe = child.output_pipe();
    child.open();
    Ok((pid as u32, pipe))
}

/// Whether a process with real and effective `uids` and `gids` runs as another than the
/// command's user (`want`, and `want_gid` when the command has a `user`): without a `user`
/// (`want_gid` `None`) any is taken, as before.
fn not_as(
    want: u32,
    want_gid: Option<u32>,
    uids: Option<(u32, u32)>,
    gids: Option<(u32, u32)>,
) -> bool {
    let Some(gid) = want_gid else {
        return false;
    };
    uids.is_some_and(|u| u != (want, want)) || gids.is_some_and(|g| g != (gid, gid))
}

#[cfg(test)]
mod not_as_tests {
    /// Pass 18's low: adoption checked the uids only; a process of the user in another
    /// group (a `[[be]] group` changed, the earlier agent's gid) was adopted.
    #[test]
    fn a_process_in_another_group_is_not_adopted() {
        let u = Some((65534, 65534));
        assert!(
            !super::not_as(65534, None, Some((0, 0)), Some((0, 0))),
            "no user: any"
        );
        assert!(!super::not_as(65534, Some(65534), u, Some((65534, 65534))));
        assert!(super::not_as(
            65534,
            Some(65534),
            Some((0, 0)),
            Some((65534, 65534))
        ));
        assert!(super::not_as(65534, Some(65534), u, Some((0, 0))));
        assert!(super::not_as(65534, Some(4), u, Some((65534, 65534))));
    }
}
