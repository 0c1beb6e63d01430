//! The LC command's launch ([`launch_in_group`]): it joins its group's v1 hierarchies (all but
//! the freezer) in `pre_exec`, before it runs a single instruction of the command; the freezer
//! (and a v2 group) right after spawn. Moved out of `supervisor.rs` (the BE commands' room).

use std::path::Path;
use std::process::{Child, Command, Stdio};

use headroom_host::spawn::{RunAs, StartIn};
use headroom_host::{Backend, Cgroups, Controller};
use headroom_types::GroupPath;

use super::LaunchError;

/// Spawns `command` so that it runs inside `group` from its first instruction (see module doc),
/// as `user` when given (`[lc] user`), else as the agent's user.
pub fn launch_in_group(
    cgroups: &Cgroups,
    name: &str,
    command: &[String],
    group: &GroupPath,
    user: Option<&RunAs>,
) -> Result<Child, LaunchError> {
    let Some((program, args)) = command.split_first() else {
        return Err(LaunchError::Empty {
            name: name.to_string(),
        });
    };
    let freezer_mount = cgroups
        .backend(Controller::Freezer)
        .ok()
        .map(|b| b.mount().to_path_buf());
    let early = cgroups
        .group_dirs(group)
        .into_iter()
        .filter(|(b, _)| matches!(b, Backend::V1(_)))
        .filter(|(b, _)| Some(b.mount().to_path_buf()) != freezer_mount)
        // Its own session, no controlling terminal (as the gated BE's): run as a user, one
        // left in the agent's could push input into the agent's terminal (eighteenth pass).
        .fold(StartIn::parent().in_own_session(), |start, (_, dir)| {
            start.in_group(&dir)
        });
    let early = match user {
        Some(u) => early.as_user(u.clone()),
        None => early,
    };
    let mut cmd = Command::new(program);
    // As a user, the agent's stdin is left in place for the start step to compare fds 1 and 2
    // with (the agent's input must not reach the command), which then makes it /dev/null.
    cmd.args(args).stdin(if user.is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    });
    cmd.envs(user.map(RunAs::env).unwrap_or_default());
    let spawn_err = |source| LaunchError::Spawn {
        name: name.to_string(),
        command: command.to_vec(),
        group: group.to_string(),
        source,
    };
    // As a user, its fds 1 and 2 outlive the agent (the agent leaves it running: through a
    // pipe only the agent read, it died at its first write after the agent's exit, pass 24)
    // and are never the agent's journal stream (pass 20: its lines were the agent's).
    if user.is_some() {
        lc_output(&mut cmd, name);
    }
    early
        .apply(&mut cmd)
        .map_err(|source| LaunchError::Prepare {
            name: name.to_string(),
            group: group.to_string(),
            source: Box::new(source),
        })?;
    let mut child = cmd.spawn().map_err(spawn_err)?;
    drop(cmd); // the agent's copies of the command's journal stream
    if let Err(source) = cgroups.move_process(group, child.id() as i32) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(LaunchError::Move {
            name: name.to_string(),
            pid: child.id(),
            group: group.to_string(),
            source: Box::new(source),
        });
    }
    Ok(child)
}

/// Where a user-run LC command's output goes: where the agent logs to journald (systemd's
/// `$JOURNAL_STREAM` is its fd 2), a journald stream of its own with the identifier
/// `headroom-lc-<name>` (`systemd-cat`'s); else the agent's own fds 1 and 2 (a file, or a pipe
/// whose reader outlives the agent; the start step makes a terminal or the agent's input
/// `/dev/null`). A journald that refuses the stream: `/dev/null`, said.
///
/// The agent connects the stream, so journald records the agent's `_PID`/`_UID` and unit for
/// the LC's lines (hostile pass 26's low, left): `SO_PEERCRED` is fixed at `connect`, so only
/// a connect in the child after it dropped to its user (`pre_exec`) would carry the LC's uid,
/// and there the connect's bounded wait and its failure could not be said (nothing may
/// allocate or log after `fork` in this multi-threaded process). The identifier marks the
/// LC's lines (docs/safety-hostile-pass-26.md, "Lows of pass 26").
fn lc_output(cmd: &mut Command, name: &str) {
    use headroom_host::spawn::journal;
    if !journal::agent_logs_to_journal() {
        return;
    }
    let opened = journal::open(
        Path::new(journal::STDOUT_SOCKET),
        &format!("headroom-lc-{name}"),
    )
    .and_then(|fd| Ok((fd.try_clone()?, fd)));
    match opened {
        Ok((out, err)) => {
            cmd.stdout(Stdio::from(out)).stderr(Stdio::from(err));
        }
        Err(e) => {
            tracing::warn!(name, socket = journal::STDOUT_SOCKET, error = %e, "journald refused a stream for the LC command: its output is discarded");
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
}
