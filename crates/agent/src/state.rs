//! The agent's state file: the groups' original settings and the last safe allocation, so a
//! restarted agent restores the right originals and reconciles instead of starting blind.
//! Written atomically (temp file, fsync, rename, fsync of the directory): a crash leaves either
//! the old or the new file, never a torn one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use headroom_control::actuation::{CgroupKnob, Knob, KnobValue};
use headroom_types::allocation::Allocation;
use headroom_types::GroupPath;

/// Version of the state-file format (1: cgroup originals only, by group; still read).
pub const STATE_VERSION: u32 = 2;

/// One knob's value before the agent's first write to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OriginalValue {
    pub knob: Knob,
    pub value: KnobValue,
}

/// Version 1's originals: group path → cgroup knob → value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LegacyGroupSettings {
    pub values: BTreeMap<CgroupKnob, KnobValue>,
}

/// What survives an agent restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    pub version: u32,
    /// Pid of the agent that wrote it.
    pub pid: u32,
    pub written_unix_ms: u64,
    /// Every knob's value before the agent's first write to it (cgroup knobs, resctrl,
    /// frequency caps, egress, io throttles).
    #[serde(default)]
    pub originals: Vec<OriginalValue>,
    /// Version 1's cgroup originals (read, converted into `originals`, never written).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub original: BTreeMap<GroupPath, LegacyGroupSettings>,
    /// The last allocation applied completely (a safe state to return to).
    pub last_allocation: Option<Allocation>,
    /// BE commands the agent launched: BE name → pid (adopted, not relaunched, on restart).
    #[serde(default)]
    pub owned_pids: BTreeMap<String, u32>,
    /// LC threads' original affinity/policy and raised real-time budgets (undone on exit).
    #[serde(default)]
    pub lc_threads: crate::sensors::lc_threads::LcThreadsState,
    /// Groups (and ancestors) that did not exist before the agent created them, deepest last;
    /// removed on exit once empty.
    #[serde(default)]
    pub created_groups: Vec<GroupPath>,
    /// LC processes the agent moved into its LC group: pid → the group directory it was in, per
    /// hierarchy, before the move (moved back on restore).
    #[serde(default)]
    pub lc_origins: BTreeMap<u32, Vec<String>>,
}

impl AgentState {
    /// A state that records nothing yet (before a first start has read any original).
    pub fn empty() -> AgentState {
        AgentState {
            version: STATE_VERSION,
            pid: std::process::id(),
            written_unix_ms: 0,
            originals: Vec::new(),
            original: BTreeMap::new(),
            last_allocation: None,
            owned_pids: BTreeMap::new(),
            lc_threads: Default::default(),
            created_groups: Vec::new(),
            lc_origins: BTreeMap::new(),
        }
    }

    /// The originals as the write path keeps them.
    pub fn original_map(&self) -> BTreeMap<Knob, KnobValue> {
        let mut out: BTreeMap<Knob, KnobValue> = self
            .originals
            .iter()
            .map(|o| (o.knob.clone(), o.value.clone()))
            .collect();
        for (group, settings) in &self.original {
            for (k, v) in &settings.values {
                out.entry(Knob::cgroup(group, *k))
                    .or_insert_with(|| v.clone());
            }
        }
        out
    }

    /// Whether the state names every group of `groups` (the same agent configuration).
    pub fn manages(&self, groups: &headroom_control::actuation::ManagedGroups) -> bool {
        let named: std::collections::BTreeSet<&headroom_types::GroupPath> = self
            .originals
            .iter()
            .filter_map(|o| match &o.knob {
                Knob::Cgroup { group, .. } => Some(group),
                _ => None,
            })
            .collect();
        let has =
            |g: &headroom_types::GroupPath| named.contains(g) || self.original.contains_key(g);
        has(&groups.lc) && groups.be.iter().all(has)
    }
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
    /// Another live agent manages one of these groups (exit 2: nothing was touched).
    #[error("{what} is managed by another agent, {holder}: its lock {lock} is held; stop that agent (or give this one other groups)")]
    Held {
        what: String,
        lock: PathBuf,
        holder: String,
    },
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
    if state.version != STATE_VERSION && state.version != 1 {
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

/// Moves a state file that cannot be read aside, to `<path>.corrupt-<unix ms>`, and returns
/// where it went: the next start must not trip on it again, and an operator can still read
/// the originals it held.
pub fn set_aside(path: &Path) -> Result<PathBuf, StateError> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".corrupt-{ms}"));
    let aside = PathBuf::from(name);
    std::fs::rename(path, &aside).map_err(|source| StateError::Io {
        op: "setting aside (mv it away by hand, then start again)",
        path: path.to_path_buf(),
        source,
    })?;
    Ok(aside)
}

/// Reads the state file; one that is not valid is set aside (see [`set_aside`]) and the start
/// goes on as a first start: the groups' current settings are taken as originals and BE is
/// confined before anything else, so a corrupt file never leaves BE running with no agent.
/// Returns the state and, when one was set aside, where it went.
pub fn load_or_set_aside(path: &Path) -> Result<(Option<AgentState>, Option<PathBuf>), StateError> {
    match load(path) {
        Ok(state) => Ok((state, None)),
        Err(StateError::Invalid { reason, .. }) => {
            let aside = set_aside(path)?;
            tracing::warn!(
                state = %path.display(), set_aside = %aside.display(), reason = %reason,
                "the state file is not valid: set it aside and starting as a first start \
                 (BE confined first; the groups' settings now are taken as originals: compare \
                 them with the originals in the set-aside file and fix any by hand)"
            );
            Ok((None, Some(aside)))
        }
        Err(e) => Err(e),
    }
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

/// An exclusive hold on a state file: one agent manages one set of groups. Held for the
/// agent's life (a `flock` on `<state>.lock`, released by the kernel when the agent dies, even
/// by SIGKILL); the holder's pid is written into the lock file for the error message.
#[derive(Debug)]
pub struct StateLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl StateLock {
    /// Takes the lock of `state_file`, or says which agent holds it.
    pub fn acquire(state_file: &Path) -> Result<StateLock, StateError> {
        use std::os::fd::AsRawFd;
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
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io("creating the directory of"))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io("opening"))?;
        // SAFETY: flock on an fd this function owns.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(StateError::Held {
                    what: format!("state file {}", state_file.display()),
                    lock: path.clone(),
                    holder: format!("pid {}", holder.trim()),
                });
            }
            return Err(io("locking")(err));
        }
        file.set_len(0).map_err(io("truncating"))?;
        writeln!(file, "{}", std::process::id()).map_err(io("writing"))?;
        Ok(StateLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

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
/// SIGKILL, so a dead agent's locks are taken over by the next start. Lock files are never
/// removed (removing a file another agent may be locking races).
#[derive(Debug)]
pub struct GroupLock {
    dir: PathBuf,
    held: Vec<(PathBuf, std::fs::File)>,
    /// Shared locks on the ancestors' lock files (no holder is written into them).
    _above: Vec<std::fs::File>,
    holder: headroom_types::control::LockHolder,
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
        std::fs::create_dir_all(dir).map_err(|source| StateError::Io {
            op: "creating the lock directory",
            path: dir.to_path_buf(),
            source,
        })?;
        let mut lock = GroupLock {
            dir: dir.to_path_buf(),
            held: Vec::new(),
            _above: Vec::new(),
            holder,
        };
        for key in &keys {
            let path = dir.join(lock_file_name(key));
            let file = open_lock_file(&path)?;
            if !try_flock(&file, libc::LOCK_EX).map_err(|source| StateError::Io {
                op: "locking",
                path: path.clone(),
                source,
            })? {
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
            }
            lock.held.push((path, file));
        }
        for key in &above {
            let path = dir.join(lock_file_name(key));
            let file = open_lock_file(&path)?;
            if !try_flock(&file, libc::LOCK_SH).map_err(|source| StateError::Io {
                op: "locking",
                path: path.clone(),
                source,
            })? {
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
            }
            lock._above.push(file);
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

    /// Who holds these locks (this agent).
    pub fn holder(&self) -> &headroom_types::control::LockHolder {
        &self.holder
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn open_lock_file(path: &Path) -> Result<std::fs::File, StateError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| StateError::Io {
            op: "opening the group lock",
            path: path.to_path_buf(),
            source,
        })
}

/// Whether `path` is held by an exclusive flock now (an agent's own group), per /proc/locks.
fn held_exclusively(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let dev = meta.dev();
    let key = (
        u64::from(libc::major(dev)),
        u64::from(libc::minor(dev)),
        meta.ino(),
    );
    flocks_held(true).contains(&key)
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

/// The (device major, minor, inode) of every flock held now; `exclusive`: only those.
fn flocks_held(exclusive: bool) -> std::collections::BTreeSet<(u64, u64, u64)> {
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF": the device (hex major:minor) and inode.
    locks
        .lines()
        .filter(|l| l.contains("FLOCK") && (!exclusive || l.contains(" WRITE ")))
        .filter_map(|l| {
            let id = l.split_whitespace().find(|w| w.matches(':').count() == 2)?;
            let mut it = id.split(':');
            let major = u64::from_str_radix(it.next()?, 16).ok()?;
            let minor = u64::from_str_radix(it.next()?, 16).ok()?;
            let ino = it.next()?.parse().ok()?;
            Some((major, minor, ino))
        })
        .collect()
}

/// `flock(how | LOCK_NB)`: `Ok(false)` when another open file holds it.
fn try_flock(file: &std::fs::File, how: libc::c_int) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on an fd the caller owns for the call's duration.
    let rc = unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(err)
}

/// Writes the holder at offset 0 and cuts the file there (a reader racing the write retries).
fn write_holder(file: &std::fs::File, text: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(text, 0)?;
    file.set_len(text.len() as u64)?;
    file.sync_all()
}

/// The holder named in a lock file; a holder that has just taken it may not have written it
/// yet: retried for up to 200 ms.
pub fn read_holder(path: &Path) -> Option<headroom_types::control::LockHolder> {
    for _ in 0..20 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(h) = serde_json::from_str(text.trim()) {
                return Some(h);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    None
}

/// The group locks under `dir` held now, with their holders (`doctor`); a lock nobody holds
/// (left by a dead agent) is not listed. Read from `/proc/locks` (taking a lock to test it
/// could refuse an agent starting at that instant).
pub fn held_locks(dir: &Path) -> Vec<(PathBuf, Option<headroom_types::control::LockHolder>)> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    // Exclusive ones only: a shared lock is an agent's mark on a group above its own.
    let held = flocks_held(true);
    let mut out = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "lock") {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let dev = meta.dev();
        let key = (
            u64::from(libc::major(dev)),
            u64::from(libc::minor(dev)),
            meta.ino(),
        );
        if held.contains(&key) {
            out.push((path.clone(), read_holder(&path)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
