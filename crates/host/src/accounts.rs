//! Users and groups as `/etc/passwd` and `/etc/group` list them, read directly rather than
//! through glibc's `getpwnam` family: the shipped binary is static, and a lookup that glibc
//! hands to an NSS module (`systemd`, `ldap`, `sss` in `/etc/nsswitch.conf`) loads a shared
//! library into it — a name missing from `/etc/passwd` crashed the static agent with SIGSEGV.
//! A user only such a source knows is named by uid in the config.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The files are read whole; a bigger one is refused rather than read (they are a few KiB).
const MAX_FILE_BYTES: u64 = 16 << 20;

/// One `/etc/passwd` line: the fields a started child needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// The account files below `root` (`/` on a real host; a fake tree in tests).
#[derive(Debug, Clone)]
pub struct Accounts {
    root: PathBuf,
}

impl Accounts {
    /// This host's `/etc/passwd` and `/etc/group`.
    pub fn system() -> Accounts {
        Accounts::at("/")
    }

    /// The account files of the tree at `root`.
    pub fn at(root: impl Into<PathBuf>) -> Accounts {
        Accounts { root: root.into() }
    }

    /// The entry named `name`, `None` when `/etc/passwd` has none.
    pub fn user_by_name(&self, name: &str) -> io::Result<Option<PasswdEntry>> {
        Ok(self.users()?.into_iter().find(|e| e.name == name))
    }

    /// The first entry with `uid`, `None` when `/etc/passwd` has none.
    pub fn user_by_uid(&self, uid: u32) -> io::Result<Option<PasswdEntry>> {
        Ok(self.users()?.into_iter().find(|e| e.uid == uid))
    }

    /// The groups `user` is in: its primary `gid` first, then every `/etc/group` entry that
    /// lists it as a member (what `initgroups` would give it from these files).
    pub fn groups_of(&self, user: &str, gid: u32) -> io::Result<Vec<u32>> {
        let path = self.path("etc/group");
        let text = match read_bounded(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let mut groups = vec![gid];
        for line in entries(&text) {
            let f: Vec<&str> = line.split(':').collect();
            let (Some(id), Some(members)) = (f.get(2), f.get(3)) else {
                continue;
            };
            let Ok(id) = id.parse::<u32>() else { continue };
            if members.split(',').any(|m| m == user) && !groups.contains(&id) {
                groups.push(id);
            }
        }
        Ok(groups)
    }

    /// The gid of the `/etc/group` entry named `name`, `None` when it has none (`[[be]] group`).
    pub fn group_by_name(&self, name: &str) -> io::Result<Option<u32>> {
        let text = read_bounded(&self.path("etc/group"))?;
        let gid = entries(&text).find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.first() == Some(&name)).then(|| f.get(2)?.parse().ok())?
        });
        Ok(gid)
    }

    fn users(&self) -> io::Result<Vec<PasswdEntry>> {
        let text = read_bounded(&self.path("etc/passwd"))?;
        Ok(entries(&text)
            .filter_map(|line| {
                let f: Vec<&str> = line.split(':').collect();
                if f.len() < 6 || f[0].is_empty() {
                    return None;
                }
                Some(PasswdEntry {
                    name: f[0].to_string(),
                    uid: f[2].parse().ok()?,
                    gid: f[3].parse().ok()?,
                    home: PathBuf::from(f[5]),
                })
            })
            .collect())
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

/// The lines that are entries: not blank, not comments, not NIS compat markers (`+`/`-`).
fn entries(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', '+', '-']))
}

fn read_bounded(path: &Path) -> io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: over {MAX_FILE_BYTES} bytes", path.display()),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(passwd: &str, group: &str) -> (tempfile::TempDir, Accounts) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/passwd"), passwd).unwrap();
        std::fs::write(dir.path().join("etc/group"), group).unwrap();
        let accounts = Accounts::at(dir.path());
        (dir, accounts)
    }

    #[test]
    fn users_and_their_groups_are_read_from_the_files() {
        let (_dir, a) = tree(
            "# comment\nroot:x:0:0:root:/root:/bin/bash\n+nis\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nbroken:x:notanumber:1::/:\nmemcache:x:105:111::/nonexistent:/bin/false\n",
            "root:x:0:\nnogroup:x:65534:\nmemcache:x:111:\nadm:x:4:syslog,memcache\nwheel:x:10:memcachex\n",
        );
        let m = a.user_by_name("memcache").unwrap().unwrap();
        assert_eq!((m.uid, m.gid), (105, 111));
        assert_eq!(a.user_by_uid(65534).unwrap().unwrap().name, "nobody");
        assert_eq!(
            a.user_by_name("broken").unwrap(),
            None,
            "a bad uid is no entry"
        );
        assert_eq!(a.user_by_name("nis").unwrap(), None);
        assert_eq!(a.user_by_name("ghost").unwrap(), None);
        assert_eq!(a.groups_of("memcache", 111).unwrap(), vec![111, 4]);
        assert_eq!(a.groups_of("nobody", 65534).unwrap(), vec![65534]);
        assert_eq!(a.group_by_name("adm").unwrap(), Some(4));
        assert_eq!(a.group_by_name("ghost").unwrap(), None);
    }

    #[test]
    fn a_missing_passwd_is_an_error_a_missing_group_file_no_groups() {
        let dir = tempfile::tempdir().unwrap();
        let a = Accounts::at(dir.path());
        assert!(a.user_by_name("root").is_err());
        assert_eq!(a.groups_of("root", 0).unwrap(), vec![0]);
    }
}
