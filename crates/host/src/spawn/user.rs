//! Who a started child runs as (`[[be]] user`, `[lc] user`): looked up in the parent (the
//! passwd entry and the supplementary groups, from the files: [`crate::accounts`]), applied in
//! the child just before it execs with `setgroups`, `setgid` and `setuid` (async-signal-safe,
//! on data prepared before the fork).

use std::io;
use std::path::PathBuf;

use headroom_types::{GroupSpec, UserSpec};
use nix::unistd::{Gid, Uid};

/// The gid a child gets when its user is a bare uid with no passwd entry: 65534, the
/// kernel's overflow gid ("nogroup"), never a group that may hold something (gid = uid could
/// be `shadow`'s 42).
pub const NO_ENTRY_GID: u32 = 65534;

/// A user to run a child as: uid, primary gid, supplementary groups (none for a uid with no
/// passwd entry), and the name and home directory when the host knows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
    name: Option<String>,
    home: Option<PathBuf>,
}

impl RunAs {
    /// Looks `spec` up on this host: `Ok(None)` for a name the host does not know. A uid with
    /// no passwd entry runs with gid [`NO_ENTRY_GID`] and no supplementary groups.
    pub fn resolve(spec: &UserSpec) -> io::Result<Option<RunAs>> {
        let accounts = crate::accounts::Accounts::system();
        let entry = match spec {
            UserSpec::Name(n) => match accounts.user_by_name(n)? {
                Some(e) => e,
                None => return Ok(None),
            },
            UserSpec::Uid(u) => match accounts.user_by_uid(*u)? {
                Some(e) => e,
                None => {
                    return Ok(Some(RunAs {
                        uid: Uid::from_raw(*u),
                        gid: Gid::from_raw(NO_ENTRY_GID),
                        groups: Vec::new(),
                        name: None,
                        home: None,
                    }))
                }
            },
        };
        let groups = accounts
            .groups_of(&entry.name, entry.gid)?
            .into_iter()
            .map(Gid::from_raw)
            .collect();
        Ok(Some(RunAs {
            uid: Uid::from_raw(entry.uid),
            gid: Gid::from_raw(entry.gid),
            groups,
            name: Some(entry.name),
            home: Some(entry.home),
        }))
    }

    /// This user with `spec` as its group (`[[be]] group`) in place of its primary group;
    /// its supplementary groups stay. `Ok(None)` for a name `/etc/group` does not have.
    pub fn with_group(mut self, spec: &GroupSpec) -> io::Result<Option<RunAs>> {
        let gid = match spec {
            GroupSpec::Gid(g) => *g,
            GroupSpec::Name(n) => match crate::accounts::Accounts::system().group_by_name(n)? {
                Some(g) => g,
                None => return Ok(None),
            },
        };
        self.gid = Gid::from_raw(gid);
        Ok(Some(self))
    }

    /// The uid.
    pub fn uid(&self) -> u32 {
        self.uid.as_raw()
    }

    /// The primary gid.
    pub fn gid(&self) -> u32 {
        self.gid.as_raw()
    }

    /// The supplementary groups.
    pub fn groups(&self) -> Vec<u32> {
        self.groups.iter().map(|g| g.as_raw()).collect()
    }

    /// `HOME`, `USER` and `LOGNAME` for the child, where the host knows the user (the
    /// agent's own would otherwise be inherited: root's home).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Some(home) = self.home.as_ref().and_then(|h| h.to_str()) {
            env.push(("HOME".to_string(), home.to_string()));
        }
        if let Some(name) = &self.name {
            env.push(("USER".to_string(), name.clone()));
            env.push(("LOGNAME".to_string(), name.clone()));
        }
        env
    }

    /// Becomes this user: supplementary groups, then gid, then uid (after which neither can
    /// change back). Only async-signal-safe calls, no allocation: callable between fork and
    /// exec.
    pub(crate) fn become_it(&self) -> io::Result<()> {
        nix::unistd::setgroups(&self.groups).map_err(io::Error::from)?;
        nix::unistd::setgid(self.gid).map_err(io::Error::from)?;
        nix::unistd::setuid(self.uid).map_err(io::Error::from)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_resolve_by_name_and_by_uid_without_an_entry() {
        let none = RunAs::resolve(&UserSpec::name("bu-no-such-user").unwrap()).unwrap();
        assert_eq!(none, None, "a name the host lacks");
        let bare = RunAs::resolve(&UserSpec::uid(3_999_999).unwrap())
            .unwrap()
            .expect("a bare uid runs");
        assert_eq!(
            (bare.uid(), bare.gid(), bare.groups()),
            (3_999_999, NO_ENTRY_GID, vec![])
        );
        assert!(bare.env().is_empty(), "no passwd entry: no HOME or USER");
        let root = RunAs::resolve(&UserSpec::name("root").unwrap())
            .unwrap()
            .expect("root is known");
        assert_eq!((root.uid(), root.gid()), (0, 0));
        assert!(root
            .env()
            .contains(&("USER".to_string(), "root".to_string())));
    }
}
