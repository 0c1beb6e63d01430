//! What a start made on the file system before it touched the host (the state lock's file,
//! the directories of the lock and the control socket), undone when the start fails: a
//! refused start left `<state>.lock` and the directories its lock made (ninth hostile pass).

use std::path::{Path, PathBuf};

use super::AgentError;
use crate::made_dirs::{make_dirs, remove_dirs};
use crate::state::StateLock;

/// The state lock and the directories this start made, undone on drop unless [`kept`].
///
/// [`kept`]: StartFiles::keep
#[derive(Debug, Default)]
pub(super) struct StartFiles {
    pub(super) lock: Option<StateLock>,
    pub(super) dirs: Vec<PathBuf>,
}

impl StartFiles {
    /// Makes the control socket's directory, noting what it made.
    pub(super) fn make_socket_dir(&mut self, socket: &Path) -> Result<(), AgentError> {
        if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
            self.dirs = make_dirs(dir).map_err(|source| AgentError::Io {
                what: "creating the directory of the control socket",
                path: dir.to_path_buf(),
                source,
            })?;
        }
        Ok(())
    }

    /// The start went through: the lock is the agent's now, and what was made stays.
    pub(super) fn keep(mut self) -> Option<StateLock> {
        self.dirs.clear();
        self.lock.take()
    }
}

impl Drop for StartFiles {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            lock.abandon();
        }
        remove_dirs(&self.dirs);
    }
}
