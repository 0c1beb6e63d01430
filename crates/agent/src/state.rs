//! The agent's state file: the groups' original settings and the last safe allocation, so a
//! restarted agent restores the right originals and reconciles instead of starting blind.
//! Written atomically (temp file, fsync, rename, fsync of the directory): a crash leaves either
//! the old or the new file, never a torn one.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use headroom_control::actuation::{CgroupKnob, EarlierRole, Knob, KnobValue, ManagedGroups};
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
    /// Processes found in a BE group at a first start, launched by no agent: BE name → pids.
    /// Confined as BE, spared when the agent stops its BE or restarts after a crash.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub be_found: BTreeMap<String, Vec<u32>>,
    /// Every LC service's group, as the config that wrote this named them (a later config
    /// whose groups changed releases the ones it dropped; absent from older agents' files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lc_groups: Vec<GroupPath>,
    /// Every BE: name → its group and whether the agent ran a command there (its processes
    /// are the agent's to stop). Absent from older agents' files.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub be_groups: BTreeMap<String, RecordedBe>,
    /// A BE command run as a user: pid → the relay pipe of its output the agent made at
    /// launch. The next agent relays an adopted BE's fds 1 and 2 only where they are that
    /// pipe (hostile pass 26's low: any FIFO of the agent's user was read). Absent from
    /// older agents' files: nothing relayed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub relay_pipes: BTreeMap<u32, headroom_host::spawn::relay::PipeId>,
}

/// One BE as the state file records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedBe {
    pub group: GroupPath,
    /// The agent ran a command in it (`[[be]] command`).
    pub command: bool,
    /// The command line its BE runs (launched or adopted), once it runs: a restart whose
    /// `[[be]] command` differs stops that BE and launches the new one (it adopted the old
    /// one, and the new command never ran). Absent from older agents' files, and while the
    /// start has not yet launched or adopted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
}

impl AgentState {
    /// Whether the BE `name` runs a command line other than `command`, as this state recorded
    /// it (`false` when it recorded none).
    pub fn be_command_changed(&self, name: &str, command: &[String]) -> bool {
        self.be_groups
            .get(name)
            .and_then(|r| r.argv.as_deref())
            .is_some_and(|argv| argv != command)
    }
}

/// A group the state file records that a later config does not manage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedGroup {
    pub group: GroupPath,
    pub role: EarlierRole,
    /// Whether the earlier agent ran a BE command there (`None`: an older state file does not
    /// say).
    pub command: Option<bool>,
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
            be_found: BTreeMap::new(),
            lc_groups: Vec::new(),
            be_groups: BTreeMap::new(),
            relay_pipes: BTreeMap::new(),
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

    /// The cgroup groups whose originals the state records.
    pub fn named_groups(&self) -> std::collections::BTreeSet<GroupPath> {
        self.originals
            .iter()
            .filter_map(|o| match &o.knob {
                Knob::Cgroup { group, .. } => Some(group.clone()),
                _ => None,
            })
            .chain(self.original.keys().cloned())
            .collect()
    }

    /// Whether the state names any of this config's groups (LC or BE): the start is then a
    /// restart for those (originals kept, the earlier agent's BE adopted or stopped), even
    /// when the config's groups changed (fifth hostile pass: a BE group added made the whole
    /// start a first start, sparing the earlier agent's BE beside a new one).
    pub fn names_any(&self, groups: &ManagedGroups, lcs: &[GroupPath]) -> bool {
        let named = self.named_groups();
        lcs.iter()
            .chain(std::iter::once(&groups.lc))
            .chain(groups.be.iter())
            .any(|g| named.contains(g))
    }

    /// The pids a restarted BE `name` may adopt: its own first, then any other recorded (a
    /// renamed `[[be]]` entry), each once (pass 20: its own was tried twice, and a refused
    /// one warned twice).
    pub fn adoptable_pids(&self, name: &str) -> Vec<u32> {
        let mut out: Vec<u32> = self.owned_pids.get(name).copied().into_iter().collect();
        for &pid in self.owned_pids.values() {
            if !out.contains(&pid) {
                out.push(pid);
            }
        }
        out
    }

    /// Whether the state records `group` as a BE group of the agent that wrote it (an older
    /// file that does not say: any group it names).
    pub fn records_be(&self, group: &GroupPath) -> bool {
        if self.be_groups.is_empty() && self.lc_groups.is_empty() {
            return self.named_groups().contains(group);
        }
        self.be_groups.values().any(|b| b.group == *group)
    }

    /// The groups the state records that this config (`groups`, every LC service's group
    /// `lcs`) no longer manages, with what the earlier agent did there.
    /// A group the earlier agent ran BE in that is one of this config's LC groups (the two
    /// swapped) counts as dropped too: its BE must go, and its settings back, before it holds
    /// an LC.
    pub fn dropped_groups(&self, groups: &ManagedGroups, lcs: &[GroupPath]) -> Vec<DroppedGroup> {
        let is_lc = |g: &GroupPath| *g == groups.lc || lcs.contains(g);
        let managed = |d: &DroppedGroup| {
            groups.be.contains(&d.group) || (is_lc(&d.group) && d.role == EarlierRole::Lc)
        };
        let mut out: Vec<DroppedGroup> = Vec::new();
        let mut add = |d: DroppedGroup| {
            if !managed(&d) && !out.iter().any(|o| o.group == d.group) {
                out.push(d);
            }
        };
        for b in self.be_groups.values() {
            add(DroppedGroup {
                group: b.group.clone(),
                role: EarlierRole::Be,
                command: Some(b.command),
            });
        }
        for g in &self.lc_groups {
            add(DroppedGroup {
                group: g.clone(),
                role: EarlierRole::Lc,
                command: Some(false),
            });
        }
        // Groups with originals but no role: an older agent's file, or groups an agent had
        // not released yet when it died (a release that failed, a kill -9 mid-start). Every
        // knob is put back (an LC group's others hold their originals unless someone else
        // changed them); its processes are stopped only when an agent launched them.
        for g in self.named_groups() {
            // (one of this config's LC groups without a role: its own, as it always was)
            if is_lc(&g) || self.lc_groups.contains(&g) {
                continue;
            }
            add(DroppedGroup {
                group: g,
                role: EarlierRole::Be,
                command: None,
            });
        }
        out
    }

    /// Every BE pid the state records as found at a first start (spared), any BE's.
    pub fn spared_pids(&self) -> std::collections::BTreeSet<i32> {
        self.be_found
            .values()
            .flatten()
            .map(|&p| p as i32)
            .collect()
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
    /// `safety.state_file` names something the agent must not replace (exit 2: nothing was
    /// touched).
    #[error("safety.state_file = {path:?} {what}: the agent replaces its state file at every write (and sets an unreadable one aside); give it a path of its own, e.g. /var/lib/headroom/state.json")]
    NotAStateFile { path: PathBuf, what: String },
    /// A state file another user could have written (exit 2: nothing was touched): its
    /// originals, LC origins and groups would be put back as root at exit.
    #[error("state file {path} {why}: another user could have written it, and the agent would put back as root the originals, LC groups and groups it names (tenth hostile pass: a planted file moved the LC into a stranger's group at exit); check it, remove it, and give safety.state_file a directory only root or this user can write")]
    NotTrusted { path: PathBuf, why: String },
    /// A state file in a directory another user can write, or rename one above (exit 2:
    /// nothing was touched): the file's owner check and the open are two looks at a path that
    /// user could swap between them.
    #[error("safety.state_file = {path:?}: {doubt}: another user could replace the state file (or a directory above it) between the agent's owner check and its open, and the agent would put back as root what it names; give the state file a directory that only root or uid {uid} can write, every directory above it too (e.g. /var/lib/headroom)")]
    DirNotTrusted {
        path: PathBuf,
        uid: u32,
        doubt: crate::trusted_dir::DirDoubt,
    },
    /// The group lock directory is one another user could write (exit 2: nothing was
    /// touched): a link planted there had root write the holder into its target.
    #[error("group lock directory {dir}: {doubt}: another user could put a link or a FIFO at a lock file's name, and the agent would write through it as root; make it (and every directory above it) writable by root or uid {uid} only, e.g. chmod 0755 /run/headroom /run/headroom/locks")]
    LockDirNotTrusted {
        dir: PathBuf,
        uid: u32,
        doubt: crate::trusted_dir::DirDoubt,
    },
    /// A directory, FIFO, link or device at a lock file's name (exit 2: nothing was
    /// touched). It was an exit 1 that called the group lock a state file (fourteenth hostile
    /// pass, "Found, not fixed").
    #[error("lock file {path}: a {what} is there, where the agent keeps a lock file (a regular file it makes and removes): nothing was touched; remove it, or give the agent other groups or another safety.state_file")]
    NotALockFile { path: PathBuf, what: &'static str },
    /// Another live agent manages one of these groups (exit 2: nothing was touched).
    #[error("{what} is managed by another agent, {holder}: its lock {lock} is held; stop that agent (or give this one other groups)")]
    Held {
        what: String,
        lock: PathBuf,
        holder: String,
    },
}

/// Refuses a state-file path naming what is not a regular file (a link is replaced, never
/// followed): `state_file = "/dev/null"` had the host's `/dev/null` set aside as "corrupt"
/// and a regular file written in its place (sixth hostile pass). Checked before anything is
/// made, its lock file included. Its directory must be one only root or this user can write
/// (the agent's one directory rule, [`crate::trusted_dir::doubt`]).
pub fn check_path(path: &Path) -> Result<(), StateError> {
    check_file(path)?;
    let uid = headroom_host::process::effective_uid();
    crate::trusted_dir::doubt_above(path, uid).map_err(|doubt| StateError::DirNotTrusted {
        path: path.to_path_buf(),
        uid,
        doubt,
    })
}

/// What is at the state file's path: nothing, a link (replaced), or a regular file that may be
/// a state file.
fn check_file(path: &Path) -> Result<(), StateError> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    let t = meta.file_type();
    if t.is_file() {
        // (its first bytes: a config file named by mistake is refused before its lock is made)
        use std::io::Read;
        let mut head = [0u8; 256];
        let n = std::fs::File::open(path)
            .and_then(|mut f| f.read(&mut head))
            .unwrap_or(0);
        let text = String::from_utf8_lossy(&head[..n]);
        if !may_be_state(&text) {
            let begins: String = text.chars().take(40).collect();
            return Err(StateError::NotAStateFile {
                path: path.to_path_buf(),
                what: format!("holds something else (it begins {begins:?})"),
            });
        }
        return Ok(());
    }
    if t.is_symlink() {
        return Ok(());
    }
    use std::os::unix::fs::FileTypeExt;
    let what = if t.is_dir() {
        "is a directory"
    } else if t.is_char_device() || t.is_block_device() {
        "is a device"
    } else if t.is_fifo() {
        "is a pipe"
    } else if t.is_socket() {
        "is a socket"
    } else {
        "is not a regular file"
    };
    Err(StateError::NotAStateFile {
        path: path.to_path_buf(),
        what: what.into(),
    })
}

/// Whether `text`, which does not parse as a state file, may be one torn or damaged (empty, or
/// a JSON object): set aside. Anything else is another file the config names by mistake (the
/// config itself, a system file), refused rather than moved away.
fn may_be_state(text: &str) -> bool {
    let t = text.trim_start();
    t.is_empty() || t.starts_with('{')
}

/// Reads the state file; `Ok(None)` when there is none.
pub fn load(path: &Path) -> Result<Option<AgentState>, StateError> {
    let Some((text, file)) = read_trusted(path)? else {
        return Ok(None);
    };
    let state: AgentState = serde_json::from_str(&text).map_err(|e| {
        if may_be_state(&text) {
            StateError::Invalid {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }
        } else {
            let head: String = text.chars().take(40).collect();
            StateError::NotAStateFile {
                path: path.to_path_buf(),
                what: format!("holds something else (it begins {head:?})"),
            }
        }
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
    make_private(&file, path);
    Ok(Some(state))
}

/// The state file's text and the file (`None`: there is none), when only root or this user
/// can have written it (owned by one of them, writable by no one else); otherwise
/// [`StateError::NotTrusted`]. A link at its path is refused, not followed (pass 20: one
/// made its target 0600 before the start was refused).
pub(crate) fn read_trusted(path: &Path) -> Result<Option<(String, std::fs::File)>, StateError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let io = |source| StateError::Io {
        op: "reading",
        path: path.to_path_buf(),
        source,
    };
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path);
    let mut file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(StateError::NotAStateFile {
                path: path.to_path_buf(),
                what: "is a symbolic link, which the agent does not follow (remove it, or name the file it points to)".into(),
            })
        }
        Err(e) => return Err(io(e)),
    };
    let meta = file.metadata().map_err(io)?;
    let me = headroom_host::process::effective_uid();
    let why = if meta.uid() != 0 && meta.uid() != me {
        Some(format!(
            "is owned by uid {}, neither root nor this user",
            meta.uid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "is writable by others (mode {:o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    if let Some(why) = why {
        return Err(StateError::NotTrusted {
            path: path.to_path_buf(),
            why,
        });
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(io)?;
    Ok(Some((text, file)))
}

/// Makes a state file others can read (written 0644 before pass 18) its owner's only, through
/// the descriptor taken; called once it has parsed as a state file.
fn make_private(file: &std::fs::File, path: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Ok(meta) = file.metadata() else {
        return;
    };
    if meta.mode() & 0o044 != 0 {
        let mode = meta.mode() & 0o7700;
        if let Err(e) = file.set_permissions(std::fs::Permissions::from_mode(mode)) {
            tracing::warn!(state = %path.display(), error = %e, "the state file is readable by others and could not be made 0600");
        }
    }
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
    store_bytes(
        path,
        &serde_json::to_vec_pretty(state).expect("state serializes"),
    )
}

/// Writes `text` at `path` as [`store`] does (also the record of LC commands left running,
/// `crate::lc_record`).
pub(crate) fn store_bytes(path: &Path, text: &[u8]) -> Result<(), StateError> {
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
    {
        // Made anew, never opened through a link: in a directory others can write (/tmp), a
        // link planted at `<state>.tmp` had root truncate and write its target (sixth pass).
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("removing the old", &tmp)(e))
            }
            _ => {}
        }
        // Never writable by others, whatever the umask: `load` refuses such a file; nor
        // readable by them: nothing needs others to read the originals and pids (pass 18).
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io("creating", &tmp))?;
        f.write_all(text).map_err(io("writing", &tmp))?;
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

pub use crate::group_lock::{held_locks, lock_dir, lock_file_name, read_holder, GroupLock};
pub use crate::state_lock::StateLock;

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
