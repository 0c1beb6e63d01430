//! The agent's state file: the groups' original settings and the last safe allocation, so a
//! restarted agent restores the right originals and reconciles instead of starting blind.
//! Written atomically (temp file, fsync, rename, fsync of the directory): a crash leaves either
//! the old or the new file, never a torn one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::allocation::Allocation;
use crate::reconcile::GroupSettings;

/// Version of the state-file format.
pub const STATE_VERSION: u32 = 1;

/// What survives an agent restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    pub version: u32,
    /// Pid of the agent that wrote it.
    pub pid: u32,
    pub written_unix_ms: u64,
    /// Group path → settings before the agent's first write.
    pub original: BTreeMap<String, GroupSettings>,
    /// The last allocation applied completely (a safe state to return to).
    pub last_allocation: Option<Allocation>,
    /// BE commands the agent launched: BE name → pid (adopted, not relaunched, on restart).
    #[serde(default)]
    pub owned_pids: BTreeMap<String, u32>,
    /// LC threads' original affinity/policy and raised real-time budgets (undone on exit).
    #[serde(default)]
    pub lc_threads: crate::lc_threads::LcThreadsState,
    /// Groups (and ancestors) that did not exist before the agent created them, deepest last;
    /// removed on exit once empty.
    #[serde(default)]
    pub created_groups: Vec<String>,
}

/// Errors reading or writing the state file, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{op} state file {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state file {path} is not valid: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// Reads the state file; `Ok(None)` when there is none.
pub fn load(path: &Path) -> Result<Option<AgentState>, StateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Io {
                op: "reading",
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let state: AgentState = serde_json::from_str(&text).map_err(|e| StateError::Invalid {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if state.version != STATE_VERSION {
        return Err(StateError::Invalid {
            path: path.to_path_buf(),
            reason: format!(
                "version {} (this agent reads {STATE_VERSION})",
                state.version
            ),
        });
    }
    Ok(Some(state))
}

/// Writes `state` atomically: `<path>.tmp` + fsync + rename + fsync of the directory.
pub fn store(path: &Path, state: &AgentState) -> Result<(), StateError> {
    let io = |op: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| StateError::Io {
            op,
            path: p,
            source,
        }
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io("creating the directory of", path))?;
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);
    let text = serde_json::to_vec_pretty(state).expect("state serializes");
    {
        let mut f = std::fs::File::create(&tmp).map_err(io("creating", &tmp))?;
        f.write_all(&text).map_err(io("writing", &tmp))?;
        f.sync_all().map_err(io("syncing", &tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io("renaming into place", path))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Removes the state file (after a clean `restore` exit nothing is left to remember).
pub fn remove(path: &Path) -> Result<(), StateError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StateError::Io {
            op: "removing",
            path: path.to_path_buf(),
            source,
        }),
    }
}
