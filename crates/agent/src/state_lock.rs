//! The state file's lock: one agent manages one set of groups. A `flock` on `<state>.lock`,
//! taken before anything is touched and released by the kernel when the agent dies.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::state::StateError;

/// An exclusive hold on a state file: one agent manages one set of groups. Held for the
/// agent's life (a `flock` on `<state>.lock`, released by the kernel when the agent dies, even
/// by SIGKILL); the holder's pid is written into the lock file for the error message.
#[derive(Debug)]
pub struct StateLock {
    _file: std::fs::File,
    path: PathBuf,
    /// This taker made the lock file (it was not there): a refused start removes it.
    made_file: bool,
    /// The directories this taker made for it, outermost first.
    made_dirs: Vec<PathBuf>,
}

impl StateLock {
    /// Takes the lock of `state_file`, or says which agent holds it.
    pub fn acquire(state_file: &Path) -> Result<StateLock, StateError> {
        use headroom_host::process::{try_flock, Flock};
        let mut name = state_file.as_os_str().to_owned();
        name.push(".lock");
        let path = PathBuf::from(name);
        let io = |op: &'static str| {
            let p = path.clone();
            move |source| StateError::Io {
                op,
                path: p,
                source,
            }
        };
        let made_dirs = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(dir) => {
                crate::made_dirs::make_dirs(dir).map_err(io("creating the directory of"))?
            }
            None => Vec::new(),
        };
        // Whatever fails below leaves no directory this taker made.
        let undo_dirs = |e| {
            crate::made_dirs::remove_dirs(&made_dirs);
            e
        };
        // A holder removes the file at a clean exit (while it holds it): a file opened before
        // that removal and locked after it guards nothing, so the path must still name the
        // locked file, or it is opened again (the group locks' rule).
        for _ in 0..LOCK_TRIES {
            // Never through a link (one planted there had its target truncated to the pid).
            // Made anew where it can be (so a refused start knows the file is its own to
            // remove), else the one there opened.
            // Root's alone (0600, and one found readable by others made so): another user
            // who could open it could `flock` it and keep every later start out (pass 18).
            let open = |create_new: bool| {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(create_new)
                    .mode(crate::group_lock::LOCK_FILE_MODE)
                    .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
                    .open(&path)?;
                let meta = file.metadata()?;
                if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
                    file.set_permissions(std::fs::Permissions::from_mode(
                        crate::group_lock::LOCK_FILE_MODE,
                    ))?;
                }
                Ok::<_, std::io::Error>(file)
            };
            // A directory (or FIFO, device) at the lock's name is an operator's matter (exit
            // 2, naming it), not a failed open (exit 1).
            let refused = |e| match crate::group_lock::not_a_lock_file(&path) {
                Some(what) => StateError::NotALockFile {
                    path: path.clone(),
                    what,
                },
                None => io("opening")(e),
            };
            let (mut file, made_file) = match open(true) {
                Ok(f) => (f, true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match open(false) {
                    Ok(f) => (f, false),
                    // Removed between the two opens (a holder's clean exit): again.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(undo_dirs(refused(e))),
                },
                Err(e) => return Err(undo_dirs(refused(e))),
            };
            if !file.metadata().is_ok_and(|m| m.is_file()) {
                return Err(undo_dirs(refused(std::io::Error::other(
                    "not a regular file",
                ))));
            }
            let locked = try_flock(&file, Flock::Exclusive)
                .map_err(io("locking"))
                .map_err(undo_dirs)?;
            if !names(&path, &file) {
                continue;
            }
            if !locked {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(StateError::Held {
                    what: format!("state file {}", state_file.display()),
                    lock: path.clone(),
                    holder: format!("pid {}", holder.trim()),
                });
            }
            let written = file
                .set_len(0)
                .map_err(io("truncating"))
                .and_then(|()| writeln!(file, "{}", std::process::id()).map_err(io("writing")));
            let lock = StateLock {
                _file: file,
                path: path.clone(),
                made_file,
                made_dirs: made_dirs.clone(),
            };
            return match written {
                Ok(()) => Ok(lock),
                Err(e) => {
                    lock.abandon();
                    Err(e)
                }
            };
        }
        Err(undo_dirs(io("locking (the file kept being removed)")(
            std::io::Error::other(format!("removed {LOCK_TRIES} times")),
        )))
    }

    /// Lets go of the lock and removes its file: after a clean `restore` exit removed the
    /// state file nothing is left behind. Removed while held, so a taker that opened it before
    /// finds it gone and opens the path again (see [`StateLock::acquire`]).
    pub fn remove(self) {
        if names(&self.path, &self._file) {
            let _ = std::fs::remove_file(&self.path);
        }
        drop(self);
    }

    /// Lets go after a refused or failed start: removes the lock file if this taker made it
    /// (while still held, as [`StateLock::remove`]), then the directories it made while they
    /// are empty. A lock file that was there before is left as it was found.
    pub fn abandon(self) {
        let dirs = self.made_dirs.clone();
        if self.made_file {
            self.remove();
        } else {
            drop(self);
        }
        crate::made_dirs::remove_dirs(&dirs);
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Times the state lock is opened again when its file was removed under the taker (each a
/// holder's clean exit; more means something outside the protocol).
const LOCK_TRIES: u32 = 100;

/// Whether `path` names the open `file` now (same device and inode).
fn names(path: &Path, file: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::symlink_metadata(path), file.metadata()) {
        (Ok(p), Ok(f)) => p.dev() == f.dev() && p.ino() == f.ino(),
        _ => false,
    }
}
