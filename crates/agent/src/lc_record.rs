//! The LC commands (`[[lc]] command`) an agent left running at its exit, recorded beside the
//! state file (`<state_file>.lc`), so that the next start takes them instead of launching a
//! second copy. Hostile pass 23: `on_exit = "restore"` removes the state file and hands the
//! LC back, and a routine restart (`systemctl restart`) then launched the command again.
//!
//! A record names a process by its pid and start time: a start takes only that very process,
//! still running exactly the command (or the command line it ran when recorded: it may have
//! exec'd another program) as the user recorded, never another that merely runs the same
//! command line. It is written at the exit and, while the agent runs, whenever it changes
//! (a kill -9 leaves no exit to write it: hostile pass 28).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::state::{self, StateError};

/// One LC command left running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftLc {
    /// The service's name.
    pub name: String,
    pub command: Vec<String>,
    /// The user it runs as (real and effective).
    pub uid: u32,
    pub pid: u32,
    /// `/proc/<pid>/stat`'s start time: with the pid, it names one process.
    pub start_time: u64,
    /// Its command line when recorded, where that is not `command`: a command that execs
    /// another program (`sh -c "exec memcached …"`, a wrapper script) runs another command
    /// line than the config's (hostile pass 28: never found again, launched a second time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ran: Vec<String>,
    /// The other processes in the service's group at the exit (what the command forked),
    /// by pid and start time: `restore` moves them out with it, the next start takes them
    /// back in with it (hostile pass 28: only the command was taken back).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forked: Vec<(u32, u64)>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    lcs: Vec<LeftLc>,
}

/// `<state_file>.lc`.
pub fn path_for(state_file: &Path) -> PathBuf {
    let mut name = state_file.as_os_str().to_owned();
    name.push(".lc");
    PathBuf::from(name)
}

/// The LC commands the agent before left running (none when there is no record, or one that
/// cannot be trusted or read: said, and a start launches the command as before).
pub fn load(state_file: &Path) -> Vec<LeftLc> {
    let path = path_for(state_file);
    match state::read_trusted(&path) {
        Ok(None) => Vec::new(),
        Ok(Some((text, _))) => match serde_json::from_str::<Record>(&text) {
            Ok(r) => r.lcs,
            Err(e) => {
                tracing::warn!(record = %path.display(), error = %e, "the record of LC commands left running is not valid: ignored");
                Vec::new()
            }
        },
        Err(e) => {
            tracing::warn!(record = %path.display(), error = %e, "the record of LC commands left running is ignored");
            Vec::new()
        }
    }
}

/// Records `left` (removes the record when there is none).
pub fn store(state_file: &Path, left: &[LeftLc]) -> Result<(), StateError> {
    let path = path_for(state_file);
    if left.is_empty() {
        return state::remove(&path);
    }
    let r = Record { lcs: left.to_vec() };
    state::store_bytes(
        &path,
        &serde_json::to_vec_pretty(&r).expect("the record serializes"),
    )
}

/// The process `left` names, if it still is that process (same pid and start time, not a
/// zombie) running exactly `command` (or what it ran when recorded: it may have exec'd) for
/// service `name`, as the user it was recorded as (real and effective): `uid`, or any when
/// `uid` is root's (a root command may become its user).
pub fn still_running(
    root: &Path,
    left: &[LeftLc],
    name: &str,
    command: &[String],
    uid: u32,
) -> Option<(u32, u64)> {
    // Recorded as `uid`, or as anyone when the command runs as root: a root command may
    // become its user itself (`memcached -u nobody`: recorded as that user, it was never
    // taken again, and the next start launched a second copy: hostile pass 27). The pid and
    // start time name that very process; it must still run as the user it was recorded as.
    left.iter()
        .filter(|l| l.name == name && l.command == command && (l.uid == uid || uid == 0))
        .find(|l| {
            headroom_host::pids::start_time(root, l.pid) == Some(l.start_time)
                && !headroom_host::pids::is_zombie(root, l.pid)
                && headroom_host::pids::uids(root, l.pid) == Some((l.uid, l.uid))
                && (headroom_host::pids::running_command(root, l.pid, command)
                    || (!l.ran.is_empty()
                        && headroom_host::pids::running_command(root, l.pid, &l.ran)))
        })
        .map(|l| (l.pid, l.start_time))
}

/// What the record of service `name`'s command `pid` (started at `start`) lists as forked by
/// it that still runs (same pid and start time, not a zombie).
pub fn forked_still_running(
    root: &Path,
    left: &[LeftLc],
    name: &str,
    pid: u32,
    start: u64,
) -> Vec<(u32, u64)> {
    left.iter()
        .filter(|l| l.name == name && l.pid == pid && l.start_time == start)
        .flat_map(|l| l.forked.iter().copied())
        .filter(|&(p, t)| {
            headroom_host::pids::start_time(root, p) == Some(t)
                && !headroom_host::pids::is_zombie(root, p)
        })
        .collect()
}
