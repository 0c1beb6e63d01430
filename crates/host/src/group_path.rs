//! Logical cgroup paths, validated on construction so that nothing outside the configured cgroup
//! roots can ever be written (DESIGN.md safety rule 5).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::HostError;

/// A cgroup path relative to every hierarchy's root, e.g. `headroom/be`.
///
/// Refused at construction: absolute paths, `..` and `.` components, empty components (`a//b`),
/// NUL or control characters, names longer than 255 bytes. The empty string is refused too; the
/// hierarchy root itself is [`GroupPath::root`], which can be read but never created or removed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupPath(String);

impl GroupPath {
    /// Validates `path`.
    pub fn new(path: &str) -> Result<Self, HostError> {
        let bad = |reason: &str| HostError::invalid("cgroup path", path, reason);
        if path.is_empty() {
            return Err(bad("empty (use GroupPath::root() for the hierarchy root)"));
        }
        if path.starts_with('/') {
            return Err(bad(
                "absolute paths escape the cgroup root; give it relative to the root",
            ));
        }
        let trimmed = path.strip_suffix('/').unwrap_or(path);
        for part in trimmed.split('/') {
            match part {
                "" => return Err(bad("empty component")),
                "." | ".." => return Err(bad("`.` and `..` components are not allowed")),
                _ => {}
            }
            if part.len() > 255 {
                return Err(bad("component longer than 255 bytes"));
            }
            if part.chars().any(|c| c.is_control()) {
                return Err(bad("control characters are not allowed"));
            }
        }
        Ok(GroupPath(trimmed.to_owned()))
    }

    /// The root of every hierarchy (read-only use: usage and PSI of the whole machine).
    pub fn root() -> Self {
        GroupPath(String::new())
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parent group (`a/b` → `a`, `a` → root); `None` for the root.
    pub fn parent(&self) -> Option<GroupPath> {
        if self.is_root() {
            return None;
        }
        Some(match self.0.rsplit_once('/') {
            Some((parent, _)) => GroupPath(parent.to_owned()),
            None => GroupPath::root(),
        })
    }

    /// A child group; `name` must be a single valid component.
    pub fn join(&self, name: &str) -> Result<GroupPath, HostError> {
        if name.contains('/') {
            return Err(HostError::invalid(
                "cgroup name",
                name,
                "must be one component",
            ));
        }
        if self.is_root() {
            GroupPath::new(name)
        } else {
            GroupPath::new(&format!("{}/{name}", self.0))
        }
    }

    /// Every ancestor from the top (excluding the root) down to and including `self`.
    pub fn lineage(&self) -> Vec<GroupPath> {
        if self.is_root() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut acc = String::new();
        for part in self.0.split('/') {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(part);
            out.push(GroupPath(acc.clone()));
        }
        out
    }

    /// The directory of this group below a hierarchy mount point.
    pub fn dir_in(&self, mount: &Path) -> PathBuf {
        if self.is_root() {
            mount.to_path_buf()
        } else {
            mount.join(&self.0)
        }
    }
}

impl fmt::Display for GroupPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            f.write_str("/")
        } else {
            f.write_str(&self.0)
        }
    }
}

impl FromStr for GroupPath {
    type Err = HostError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GroupPath::new(s)
    }
}

impl TryFrom<&str> for GroupPath {
    type Error = HostError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        GroupPath::new(s)
    }
}

impl serde::Serialize for GroupPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Read back validated: a state file cannot smuggle in a path that climbs out of the root.
impl<'de> serde::Deserialize<'de> for GroupPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        GroupPath::new(&s).map_err(serde::de::Error::custom)
    }
}
