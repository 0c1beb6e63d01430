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
