//! One agent per group: an exclusive `flock` on a lock file per group directory, shared ones
//! on the directories above. A lock file is removed by its last holder on release (under an
//! exclusive lock, so nobody holds the removed file), and one left by an agent that died is
//! removed by the next agent that takes a lock: the directory holds the live agents' files,
//! not one per run for ever (2317 files were found on a test machine).
//!
//! Removing a file someone may be about to lock is the classic race; it is closed on the
//! taking side: after `flock` succeeds the taker checks that the path still names the file it
//! locked (same device and inode) and starts over when not, and a lock found busy while its
//! releaser or a cleaner holds it for the instant of removal is tried again briefly.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_host::process::{flock_key, try_flock, Flock};

use crate::state::StateError;

/// Where the group locks live under a host root (`/run/headroom/locks` in production).
pub fn lock_dir(root: &Path) -> PathBuf {
    root.join("run/headroom/locks")
}

/// The lock file of one group directory: its path with `%` and `/` escaped (a hash keeps a
/// long one within a file name's 255 bytes).
pub fn lock_file_name(group_dir: &Path) -> String {
    let text = group_dir.to_string_lossy();
    let escaped = text
        .trim_start_matches('/')
        .replace('%', "%25")
        .replace('/', "%2F");
    if escaped.len() <= 200 {
        return format!("{escaped}.lock");
    }
    // FNV-1a: stable across builds (the std hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut cut = escaped.len() - 180;
    while !escaped.is_char_boundary(cut) {
        cut += 1;
    }
    format!("{h:016x}-{}.lock", &escaped[cut..])
}

/// One agent per group: an exclusive `flock` on a lock file per group directory (every
/// controller's path of every group the agent manages), taken before the agent touches
/// anything and held for its life. The kernel drops the locks when the holder dies, even by
/// SIGKILL, so a dead agent's locks are taken over by the next start. Dropping it releases
/// the locks and removes the files nobody else holds.
#[derive(Debug)]
pub struct GroupLock {
    dir: PathBuf,
    held: Vec<(PathBuf, File)>,
    /// Shared locks on the ancestors' lock files (no holder is written into them).
    above: Vec<(PathBuf, File)>,
    holder: headroom_types::control::LockHolder,
}

impl Drop for GroupLock {
    fn drop(&mut self) {
        for (path, file) in self.held.drain(..).chain(self.above.drain(..)) {
            release(&path, file);
        }
    }
}

impl GroupLock {
    /// Locks every directory of `group_dirs` (in one global order, so two agents racing for
    /// overlapping sets never both fail), or says which agent holds one. On refusal nothing is
    /// kept locked.
    pub fn acquire(
        dir: &Path,
        group_dirs: &[PathBuf],
        holder: headroom_types::control::LockHolder,
    ) -> Result<GroupLock, StateError> {
        GroupLock::acquire_nested(dir, group_dirs, &[], holder)
    }

    /// [`GroupLock::acquire`], and a shared lock on each of `ancestor_dirs` (the directories
    /// of the groups above the managed ones): an agent whose group contains another agent's
    /// (its exclusive lock meets the other's shared one), or lies inside it (the reverse), is
    /// refused too. Without it, an agent whose BE group was an ancestor of another agent's
    /// LC group froze that LC and killed it as an "unrecorded" BE process at start.
    pub fn acquire_nested(
        dir: &Path,
        group_dirs: &[PathBuf],
        ancestor_dirs: &[PathBuf],
        mut holder: headroom_types::control::LockHolder,
    ) -> Result<GroupLock, StateError> {
        let mut keys: Vec<PathBuf> = group_dirs.to_vec();
        keys.sort();
        keys.dedup();
        let mut above: Vec<PathBuf> = ancestor_dirs
            .iter()
            .filter(|a| !keys.contains(a))
            .cloned()
            .collect();
        above.sort();
        above.dedup();
        holder.groups = keys.iter().map(|k| k.display().to_string()).collect();
        make_lock_dir(dir)?;
        remove_stale(dir);
        let mut lock = GroupLock {
            dir: dir.to_path_buf(),
            held: Vec::new(),
            above: Vec::new(),
            holder,
        };
        for key in &keys {
            let path = dir.join(lock_file_name(key));
            let Some(file) = take(&path, Flock::Exclusive)? else {
                // Held exclusively (an agent manages this group), or shared (one manages a
                // group inside it).
                let below = !held_exclusively(&path);
                let holder = if below {
                    let mine: Vec<&Path> = lock.held.iter().map(|(p, _)| p.as_path()).collect();
                    holder_below(dir, key, &mine)
                } else {
                    read_holder(&path).map(|h| h.to_string())
                };
                let holder = holder.unwrap_or_else(|| "whose lock file names no holder yet".into());
                let what = if below {
                    format!("group {} contains a group that", key.display())
                } else {
                    format!("group {}", key.display())
                };
                // Dropping `lock` releases what was taken so far.
                return Err(StateError::Held {
                    what,
                    lock: path,
                    holder,
                });
            };
            lock.held.push((path, file));
        }
        for key in &above {
            let path = dir.join(lock_file_name(key));
            let Some(file) = take(&path, Flock::Shared)? else {
                let holder = read_holder(&path)
                    .map(|h| h.to_string())
                    .unwrap_or_else(|| "whose lock file names no holder yet".into());
                return Err(StateError::Held {
                    what: format!(
                        "group {}, which contains this agent's groups,",
                        key.display()
                    ),
                    lock: path,
                    holder,
                });
            };
            lock.above.push((path, file));
        }
        let text = serde_json::to_string(&lock.holder).expect("holder serializes") + "\n";
        for (path, file) in &lock.held {
            write_holder(file, text.as_bytes()).map_err(|source| StateError::Io {
                op: "writing the holder into",
                path: path.clone(),
                source,
            })?;
        }
        Ok(lock)
    }

    /// The lock another live agent holds exclusively on `dir` or a directory above it (its
    /// group, or a group inside which `dir` lies), and that agent, if any: a process in that
    /// directory is that agent's to manage (an LC pid named here but sitting in another
    /// agent's BE group was moved out of it, unfrozen, by this one).
    pub fn foreign_holder(&self, dir: &Path) -> Option<(PathBuf, String)> {
        use std::os::unix::fs::MetadataExt;
        let held = headroom_host::process::flocks_held(true);
        let mine: Vec<(u64, u64)> = self
            .held
            .iter()
            .filter_map(|(_, f)| f.metadata().ok().map(|m| (m.dev(), m.ino())))
            .collect();
        dir.ancestors()
            .filter(|d| d.parent().is_some())
            .find_map(|d| {
                let path = self.dir.join(lock_file_name(d));
                let meta = std::fs::metadata(&path).ok()?;
                let key = flock_key(&meta);
                if !held.contains(&key) || mine.contains(&(meta.dev(), meta.ino())) {
                    return None;
                }
                let holder = read_holder(&path)
                    .map(|h| h.to_string())
                    .unwrap_or_else(|| "whose lock file names no holder yet".into());
                Some((path, holder))
            })
    }

    /// Who holds these locks (this agent).
    pub fn holder(&self) -> &headroom_types::control::LockHolder {
        &self.holder
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Makes the lock directory (0755 whatever the umask: under `umask 0` it and
/// `/run/headroom` were made 0777, fourteenth hostile pass) and refuses one another user
/// could write, or rename one above it (the agent's one directory rule,
/// [`crate::trusted_dir::doubt`]): a link planted there had root truncate its target and
/// write the holder into it, and a FIFO hung the start.
fn make_lock_dir(dir: &Path) -> Result<(), StateError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|source| StateError::Io {
            op: "creating the lock directory",
            path: dir.to_path_buf(),
            source,
        })?;
    let uid = headroom_host::process::effective_uid();
    crate::trusted_dir::doubt(dir, uid).map_err(|doubt| StateError::LockDirNotTrusted {
        dir: dir.to_path_buf(),
        uid,
        doubt,
    })
}

/// How often a busy lock is tried again before it counts as held: a releaser or a cleaner
/// holds a file exclusively only for the instant of its removal (an upgrade, a stat, an
/// unlink), a live agent for its life.
const BUSY_TRIES: u32 = 25;
const BUSY_PAUSE: Duration = Duration::from_millis(2);
/// Files replaced under the taker before it gives up (each a removal by another process
/// between this one's open and its check; more means something outside the protocol).
const REPLACED_TRIES: u32 = 200;

/// Takes `how` on the file `path` names, creating it; `None` when
/// another holder keeps it.
fn take(path: &Path, how: Flock) -> Result<Option<File>, StateError> {
    let io = |op: &'static str| {
        move |source| StateError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut busy = 0;
    for _ in 0..REPLACED_TRIES {
        let file = open_lock_file(path)?;
        if try_flock(&file, how).map_err(io("locking"))? {
            // Locked; but a file removed after this open and before this lock guards
            // nothing: the path must still name it.
            if names(path, &file) {
                return Ok(Some(file));
            }
            continue;
        }
        if !names(path, &file) {
            // Removed or replaced while busy: its holder was letting go.
            continue;
        }
        busy += 1;
        if busy >= BUSY_TRIES {
            return Ok(None);
        }
        std::thread::sleep(BUSY_PAUSE);
    }
    Err(io("locking (the file kept being replaced)")(
        std::io::Error::other(format!("replaced {REPLACED_TRIES} times")),
    ))
}

/// Whether `path` names the open `file` now (same device and inode).
fn names(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), file.metadata()) {
        (Ok(p), Ok(f)) => p.dev() == f.dev() && p.ino() == f.ino(),
        _ => false,
    }
}

/// Lets go of one lock file: removed when nobody else holds it (an exclusive lock taken
/// without waiting says so), before the lock itself goes with the descriptor.
fn release(path: &Path, file: File) {
    // A shared holder's upgrade drops its shared lock when it fails; it is letting go anyway.
    if try_flock(&file, Flock::Exclusive).unwrap_or(false) && names(path, &file) {
        let _ = std::fs::remove_file(path);
    }
    drop(file);
}

/// Lock files looked at per lock taken (the work stays bounded however many a host holds).
const STALE_LOOK: usize = 4096;

/// Removes lock files nobody holds (left by agents that died, or by versions that never
/// removed theirs), looking at up to [`STALE_LOOK`] files. One held now (by /proc/locks,
/// then by a lock taken without waiting) is left alone.
fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let held = headroom_host::process::flocks_held(false);
    for e in entries.flatten().take(STALE_LOOK) {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "lock") {
            continue;
        }
        // Regular files only, never through a link (a FIFO's open would wait for a writer).
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_file() || held.contains(&flock_key(&meta)) {
            continue;
        }
        // Not created here: a file removed meanwhile is not brought back.
        let Ok(file) = open_no_wait(&path, false) else {
            continue;
        };
        if try_flock(&file, Flock::Exclusive).unwrap_or(false) && names(&path, &file) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn open_lock_file(path: &Path) -> Result<File, StateError> {
    open_no_wait(path, true).map_err(|source| match not_a_lock_file(path) {
        Some(what) => StateError::NotALockFile {
            path: path.to_path_buf(),
            what,
        },
        None => StateError::Io {
            op: "opening the group lock",
            path: path.to_path_buf(),
            source,
        },
    })
}

/// What is at a lock file's name when it is something the agent never makes there (a
/// directory, a FIFO, a link, a device), in words; `None` for a regular file or nothing.
pub(crate) fn not_a_lock_file(path: &Path) -> Option<&'static str> {
    let ft = std::fs::symlink_metadata(path).ok()?.file_type();
    if ft.is_symlink() {
        Some("symbolic link")
    } else if ft.is_file() {
        None
    } else {
        Some(headroom_types::other_writers::special_file_kind(ft))
    }
}

/// Opens a lock file (made 0600 whatever the umask when `create`, and one found readable by
/// others made 0600) without following a link and without waiting (O_NONBLOCK: a FIFO's open
/// would wait for a writer); anything but a regular file is refused. No one but root may open
/// it: `flock` needs only a file open for reading, and another user's lock on a file left by
/// an agent that died (a kill -9: its group locks and its state lock stay) kept every later
/// start out, named as "another agent" (eighteenth hostile pass).
fn open_no_wait(path: &Path, create: bool) -> std::io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(create)
        .create(create)
        .truncate(false)
        .mode(LOCK_FILE_MODE)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other(
            "not a regular file (a lock file is one the agent made)",
        ));
    }
    if create && meta.permissions().mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(LOCK_FILE_MODE))?;
    }
    Ok(file)
}

/// The mode of the lock files (the group locks' and the state file's): root's alone.
pub(crate) const LOCK_FILE_MODE: u32 = 0o600;

/// Whether `path` is held by an exclusive flock now (an agent's own group), per /proc/locks.
fn held_exclusively(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let key = flock_key(&meta);
    headroom_host::process::flocks_held(true).contains(&key)
}

/// The agent holding an exclusive lock on a group inside `key` (a directory), by the holders'
/// group lists (`mine`: this agent's lock files, whose text is not written yet).
fn holder_below(dir: &Path, key: &Path, mine: &[&Path]) -> Option<String> {
    held_locks(dir).into_iter().find_map(|(path, h)| {
        if mine.contains(&path.as_path()) {
            return None;
        }
        let h = h?;
        h.groups
            .iter()
            .any(|g| Path::new(g).starts_with(key) && Path::new(g) != key)
            .then(|| h.to_string())
    })
}

/// Writes the holder at offset 0 and cuts the file there (a reader racing the write retries).
fn write_holder(file: &File, text: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(text, 0)?;
    file.set_len(text.len() as u64)?;
    file.sync_all()
}

/// The holder named in a lock file; a holder that has just taken it may not have written it
/// yet: retried for up to 200 ms.
pub fn read_holder(path: &Path) -> Option<headroom_types::control::LockHolder> {
    use std::io::Read;
    for _ in 0..20 {
        // (64 KiB at most: a holder is a line of JSON)
        let mut text = String::new();
        let read =
            open_no_wait(path, false).and_then(|f| f.take(64 * 1024).read_to_string(&mut text));
        if read.is_ok() {
            if let Ok(h) = serde_json::from_str(text.trim()) {
                return Some(h);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// The group locks under `dir` held now, with their holders (`doctor`); a lock nobody holds
/// (left by a dead agent) is not listed. Read from `/proc/locks` (taking a lock to test it
/// could refuse an agent starting at that instant).
pub fn held_locks(dir: &Path) -> Vec<(PathBuf, Option<headroom_types::control::LockHolder>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    // Exclusive ones only: a shared lock is an agent's mark on a group above its own.
    let held = headroom_host::process::flocks_held(true);
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "lock") {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let key = flock_key(&meta);
        if held.contains(&key) {
            out.push((path.clone(), read_holder(&path)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// What one agent locks for `groups`: each group's directory in every hierarchy (exclusive),
/// and the directories of the groups above them, each hierarchy's root excluded (shared: an
/// agent on one of them would contain this one's groups, and the reverse). The same rule for
/// configured groups and discovered pods' groups.
pub fn lock_keys<'a>(
    cgroups: &headroom_host::Cgroups,
    groups: impl IntoIterator<Item = &'a headroom_types::GroupPath>,
) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut dirs = Vec::new();
    let mut above = Vec::new();
    for g in groups {
        let in_hierarchies = cgroups.group_dirs(g);
        if in_hierarchies.is_empty() {
            // No hierarchy mounted: the group's name is the key.
            dirs.push(PathBuf::from("/").join(g.to_string()));
        }
        dirs.extend(in_hierarchies.into_iter().map(|(_, d)| d));
        let mut up = g.parent();
        while let Some(p) = up.filter(|p| !p.is_root()) {
            let in_hierarchies = cgroups.group_dirs(&p);
            if in_hierarchies.is_empty() {
                above.push(PathBuf::from("/").join(p.to_string()));
            }
            above.extend(in_hierarchies.into_iter().map(|(_, d)| d));
            up = p.parent();
        }
    }
    (dirs, above)
}
