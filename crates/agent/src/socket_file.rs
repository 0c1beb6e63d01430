//! Making room for a Unix socket the agent binds (the control socket, a feed socket): only a
//! stale stream socket is replaced. Another program's file, a live socket, a datagram socket
//! are not the agent's to delete (fifth and sixth hostile passes for `api.socket`; the feed
//! socket deleted whatever its path named until the eighth).

use std::io;
use std::path::{Path, PathBuf};

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

/// Why a directory's owner proves nothing: someone besides root and that owner could have
/// made it, or could remove or replace what is in it.
#[derive(Debug, thiserror::Error)]
pub enum DirDoubt {
    #[error("{path}: {source}")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is owned by uid {uid} with mode {mode:04o}")]
    Others { path: PathBuf, uid: u32, mode: u32 },
}

/// The owner of `dir` when only they or root could have made it and put a socket there: every
/// directory above it, as spelled and as it resolves, is root's or theirs and writable by no
/// one else (OpenSSH's rule for its files). A sticky directory others can write (`/tmp`)
/// counts only above a directory of root's or `me`'s, which no one else may rename there.
/// Otherwise the first directory that breaks the rule: a directory in `/tmp` may be anyone's,
/// made before the agent started, so its owner proves nothing. `ctl` (`me`: its user, whom it
/// believes anyway) believes this owner; the start requires it to be root or the agent's user
/// `me` ([`dir_refusal`]).
pub fn dir_owner(dir: &Path, me: u32) -> Result<u32, DirDoubt> {
    use std::os::unix::fs::MetadataExt;
    let meta = |p: &Path| {
        std::fs::metadata(p).map_err(|source| DirDoubt::Unreadable {
            path: p.to_path_buf(),
            source,
        })
    };
    let owner = meta(dir)?.uid();
    let spelled = match dir.is_absolute() {
        true => dir.to_path_buf(),
        false => std::env::current_dir()
            .map_err(|source| DirDoubt::Unreadable {
                path: dir.to_path_buf(),
                source,
            })?
            .join(dir),
    };
    let real = std::fs::canonicalize(dir).map_err(|source| DirDoubt::Unreadable {
        path: dir.to_path_buf(),
        source,
    })?;
    for above in spelled.ancestors().skip(1).chain(real.ancestors().skip(1)) {
        let m = meta(above)?;
        let sticky_over_own = m.mode() & 0o1000 != 0 && (owner == 0 || owner == me);
        if (m.uid() != 0 && m.uid() != owner) || (m.mode() & 0o022 != 0 && !sticky_over_own) {
            return Err(DirDoubt::Others {
                path: above.to_path_buf(),
                uid: m.uid(),
                mode: m.mode() & 0o7777,
            });
        }
    }
    Ok(owner)
}

/// Why another user could remove or replace a socket the agent binds at `socket` (then `ctl`
/// cannot reach the agent, or reaches someone else), or `None`: its directory (where that
/// does not exist yet, the deepest one above that does; the agent makes the rest, 0755)
/// must be root's or `uid`'s, writable by no one else, under [`dir_owner`]'s rule.
pub fn dir_refusal(socket: &Path, uid: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dir = socket.parent()?;
    let there = dir.ancestors().find(|d| std::fs::metadata(d).is_ok())?;
    let m = std::fs::metadata(there).ok()?;
    // The directory itself first (its owner named), then every one above it.
    let doubt = if (m.uid() != 0 && m.uid() != uid) || m.mode() & 0o022 != 0 {
        DirDoubt::Others {
            path: there.to_path_buf(),
            uid: m.uid(),
            mode: m.mode() & 0o7777,
        }
    } else {
        dir_owner(there, uid).err()?
    };
    Some(format!(
        "{doubt}: another user could remove or replace the socket there (ctl would not reach \
         the agent); put it in a directory that only root or uid {uid} can write, every \
         directory above it too (e.g. /run/headroom)"
    ))
}
