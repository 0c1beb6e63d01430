//! Making room for a Unix socket the agent binds (the control socket, a feed socket): only a
//! stale stream socket is replaced. Another program's file, a live socket, a datagram socket
//! are not the agent's to delete (fifth and sixth hostile passes for `api.socket`; the feed
//! socket deleted whatever its path named until the eighth).

use std::io;
use std::path::Path;

/// Why the path cannot be bound.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A stream connect succeeded: someone serves there (another agent).
    #[error("a live socket is there (another agent or program serves it)")]
    InUse,
    /// A socket that refuses a stream connect for its type (journald's `/dev/log`): in use
    /// or not, it is another program's.
    #[error("another program's socket is there, not a stream socket: {0}")]
    NotStream(io::Error),
    /// A file that is not a socket (a config file, a state file named by mistake).
    #[error("a file that is not a socket is there")]
    NotASocket,
    /// A socket this user may not connect to (EACCES, EPERM): another user's, live or not,
    /// and not this user's to delete (tenth hostile pass, by reading: an agent run as a
    /// non-root user removed another user's live 0600 socket at its path).
    #[error("a socket this user may not connect to is there (owned by uid {uid}, mode {mode:04o}: {source}); it may be another user's live socket")]
    Forbidden {
        uid: u32,
        mode: u32,
        #[source]
        source: io::Error,
    },
}

/// Removes a stale stream socket at `path`; refuses anything else there. Nothing at the path
/// is fine.
pub fn clear_stale(path: &Path) -> Result<(), Refusal> {
    // Not waiting: a full backlog means a listener (a stopped agent), and a blocking connect
    // there hung the start for ever (ninth hostile pass).
    match headroom_host::net::connect_unix_now(path) {
        Ok(_) => return Err(Refusal::InUse),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(Refusal::InUse),
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EPROTOTYPE as i32) => {
            return Err(Refusal::NotStream(e))
        }
        Err(e)
            if matches!(
                nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0)),
                nix::errno::Errno::EACCES | nix::errno::Errno::EPERM
            ) =>
        {
            use std::os::unix::fs::MetadataExt;
            let (uid, mode) = std::fs::symlink_metadata(path)
                .map(|m| (m.uid(), m.mode() & 0o7777))
                .unwrap_or((u32::MAX, 0));
            return Err(Refusal::Forbidden {
                uid,
                mode,
                source: e,
            });
        }
        Err(_) => {}
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            let _ = std::fs::remove_file(path);
            Ok(())
        }
        Ok(_) => Err(Refusal::NotASocket),
        Err(_) => Ok(()),
    }
}

/// The device and inode `path` names now (not through a link).
pub fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

pub use crate::trusted_dir::{dir_owner, DirDoubt};

/// Why another user could remove or replace a socket the agent binds at `socket` (then `ctl`
/// cannot reach the agent, or reaches someone else), or `None`: its directory (where that
/// does not exist yet, the deepest one above that does; the agent makes the rest, 0755)
/// must be root's or `uid`'s, writable by no one else, under [`dir_owner`]'s rule.
pub fn dir_refusal(socket: &Path, uid: u32) -> Option<String> {
    let doubt = crate::trusted_dir::doubt_above(socket, uid).err()?;
    Some(format!(
        "{doubt}: another user could remove or replace the socket there (ctl would not reach \
         the agent); put it in a directory that only root or uid {uid} can write, every \
         directory above it too (e.g. /run/headroom)"
    ))
}
