//! Logical cgroup paths, validated on construction so that nothing outside the configured cgroup
//! roots can ever be written (docs/architecture.md, safety rule 5).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::ValueError;

/// A cgroup path relative to every hierarchy's root, e.g. `headroom/be`.
///
/// Refused at construction: the empty string, absolute paths, `..` and `.` components, empty
/// components (`a//b`), control characters, names longer than 255 bytes. One trailing `/` is
/// dropped. The hierarchy root itself is [`GroupPath::root`], which can be read but is never
/// created, configured or removed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupPath(String);

impl GroupPath {
    /// Validates `path`.
    pub fn new(path: &str) -> Result<Self, ValueError> {
        let bad = |reason: &str| ValueError::new("cgroup path", path, reason);
        if path.trim().is_empty() {
            return Err(bad("must not be empty"));
        }
        if path.starts_with('/') {
            return Err(bad("absolute path; give it relative to the cgroup root"));
        }
        let trimmed = path.strip_suffix('/').unwrap_or(path);
        let parts: Vec<&str> = trimmed.split('/').collect();
        // `..` first: "escapes the root" is the reason that matters most to a reader.
        if parts.contains(&"..") {
            return Err(bad("path escapes the cgroup root"));
        }
        if parts.iter().all(|p| *p == ".") {
            return Err(bad("names the cgroup root itself"));
        }
        for part in parts {
            if part.is_empty() {
                return Err(bad("empty component (`a//b`)"));
            }
            if part == "." {
                return Err(bad(
                    "`.` components are not allowed; write the path without them",
                ));
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
    pub fn join(&self, name: &str) -> Result<GroupPath, ValueError> {
        if name.contains('/') {
            return Err(ValueError::new(
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

    /// `self` is `other` or lies below it (the root contains every group).
    pub fn is_within(&self, other: &GroupPath) -> bool {
        other.is_root()
            || self == other
            || self
                .0
                .strip_prefix(&other.0)
                .is_some_and(|rest| rest.starts_with('/'))
    }

    /// One of the two contains the other: two groups that may not both be managed.
    pub fn overlaps(&self, other: &GroupPath) -> bool {
        self.is_within(other) || other.is_within(self)
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

impl PartialEq<str> for GroupPath {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for GroupPath {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl FromStr for GroupPath {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GroupPath::new(s)
    }
}

impl TryFrom<&str> for GroupPath {
    type Error = ValueError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        GroupPath::new(s)
    }
}

impl serde::Serialize for GroupPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// Read back validated: a config or state file cannot smuggle in a path that climbs out of the
/// root. The error is the reason alone: the reader (the config loader, the state file) names
/// the key or the line and the value.
impl<'de> serde::Deserialize<'de> for GroupPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = GroupPath;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a cgroup path relative to the cgroup root, e.g. \"headroom/be\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<GroupPath, E> {
                GroupPath::new(v).map_err(|e| E::custom(e.reason))
            }
        }
        d.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_paths_that_leave_the_root_naming_why() {
        let reason = |p: &str| GroupPath::new(p).unwrap_err().reason;
        assert_eq!(reason("../../x"), "path escapes the cgroup root");
        assert_eq!(reason("a/../../b"), "path escapes the cgroup root");
        assert!(reason("/sys/fs/cgroup/x").contains("absolute path"));
        assert_eq!(reason(""), "must not be empty");
        assert_eq!(reason("."), "names the cgroup root itself");
        assert!(reason("./x").contains("`.` components"));
        assert!(reason("a//b").contains("empty component"));
        assert!(reason("a\0b").contains("control"));
        assert!(reason(&"x".repeat(256)).contains("255"));
        let err = GroupPath::new("../x").unwrap_err().to_string();
        assert!(
            err.contains("\"../x\"") && err.contains("cgroup path"),
            "{err}"
        );
    }

    #[test]
    fn accepts_and_normalises_good_paths() {
        let g = GroupPath::new("headroom/be/").unwrap();
        assert_eq!(g.as_str(), "headroom/be");
        assert_eq!(g.parent().unwrap().as_str(), "headroom");
        assert_eq!(
            g.lineage().iter().map(|p| p.as_str()).collect::<Vec<_>>(),
            ["headroom", "headroom/be"]
        );
        assert_eq!(g.join("x").unwrap().as_str(), "headroom/be/x");
        assert!(g.join("x/y").is_err());
        assert_eq!(GroupPath::root().to_string(), "/");
        assert_eq!(
            g.dir_in(Path::new("/sys/fs/cgroup")),
            PathBuf::from("/sys/fs/cgroup/headroom/be")
        );
    }

    #[test]
    fn nesting_is_by_component_not_by_prefix() {
        let p = |s: &str| GroupPath::new(s).unwrap();
        assert!(p("a/b").is_within(&p("a")));
        assert!(!p("ab").is_within(&p("a")));
        assert!(p("a").overlaps(&p("a/b/c")));
        assert!(!p("a/b").overlaps(&p("a/c")));
        assert!(p("x").is_within(&GroupPath::root()));
    }

    #[test]
    fn deserializes_validated() {
        let ok: GroupPath = serde_json::from_str("\"a/b\"").unwrap();
        assert_eq!(ok.as_str(), "a/b");
        let err = serde_json::from_str::<GroupPath>("\"../a\"").unwrap_err();
        assert!(err.to_string().contains("escapes"), "{err}");
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"a/b\"");
    }
}
