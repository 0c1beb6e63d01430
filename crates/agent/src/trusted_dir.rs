//! Whether only root or the agent's user can have put or replaced a file in a directory: the
//! one rule for the agent's sockets (at start, and `ctl` believing a server), its decision
//! log (links followed only there) and its state file (refused elsewhere).

use std::io;
use std::path::{Path, PathBuf};

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

/// Whether only root or `me` can have put, removed or replaced a file in `dir`: `dir` is
/// root's or `me`'s and writable by no one else, and every directory above it passes
/// [`dir_owner`]'s rule. Otherwise the first directory that breaks it.
pub fn doubt(dir: &Path, me: u32) -> Result<(), DirDoubt> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).map_err(|source| DirDoubt::Unreadable {
        path: dir.to_path_buf(),
        source,
    })?;
    // The directory itself first (its owner named), then every one above it.
    if (m.uid() != 0 && m.uid() != me) || m.mode() & 0o022 != 0 {
        return Err(DirDoubt::Others {
            path: dir.to_path_buf(),
            uid: m.uid(),
            mode: m.mode() & 0o7777,
        });
    }
    dir_owner(dir, me).map(|_| ())
}

/// [`doubt`] for the directory of `file` (a relative bare name: the working directory), or,
/// where that does not exist yet, the deepest one above it that does (the agent makes the
/// rest, 0755, and nobody else can make them under a directory that passes).
pub fn doubt_above(file: &Path, me: u32) -> Result<(), DirDoubt> {
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Some(there) = dir.ancestors().find(|d| std::fs::metadata(d).is_ok()) else {
        return doubt(dir, me);
    };
    doubt(there, me)
}
