//! The LC commands (`[[lc]] command`) an agent left running at its exit, recorded beside the
//! state file (`<state_file>.lc`), so that the next start takes them instead of launching a
//! second copy. Hostile pass 23: `on_exit = "restore"` removes the state file and hands the
//! LC back, and a routine restart (`systemctl restart`) then launched the command again.
//!
//! A record names a process by its pid and start time: a start takes only that very process,
//! still running exactly the command as the command's user, never another that merely runs
//! the same command line.

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
/// zombie) running exactly `command` for service `name`, as the user it was recorded as (real
/// and effective): `uid`, or any when `uid` is root's (a root command may become its user).
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
                && headroom_host::pids::running_command(root, l.pid, command)
        })
        .map(|l| (l.pid, l.start_time))
}
