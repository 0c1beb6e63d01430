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
        let lines = match read_lines(&path) {
            Ok((lines, _)) => lines,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut groups = vec![gid];
        for line in entries(&lines) {
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
        let (lines, _) = read_lines(&self.path("etc/group"))?;
        let gid = entries(&lines).find_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.first() == Some(&name)).then(|| f.get(2)?.parse().ok())?
        });
        Ok(gid)
    }

    fn users(&self) -> io::Result<Vec<PasswdEntry>> {
        let (lines, _) = read_lines(&self.path("etc/passwd"))?;
        Ok(entries(&lines)
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

    /// How many lines of `/etc/passwd` and of `/etc/group` are not UTF-8, and so skipped by
    /// every lookup (a missing `/etc/group` has none).
    pub fn lines_not_utf8(&self) -> io::Result<(usize, usize)> {
        let (_, passwd) = read_lines(&self.path("etc/passwd"))?;
        let group = match read_lines(&self.path("etc/group")) {
            Ok((_, n)) => n,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok((passwd, group))
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

/// The lines that are entries: not blank, not comments, not NIS compat markers (`+`/`-`).
fn entries(lines: &[String]) -> impl Iterator<Item = &str> {
    lines
        .iter()
        .map(|l| l.trim_end())
        .filter(|l| !l.is_empty() && !l.starts_with(['#', '+', '-']))
}

/// The file's lines that are UTF-8, and how many were not: those are skipped, with a
/// warning, rather than failing every lookup (pass 18: one Latin-1 GECOS byte in
/// `/etc/passwd` made every user, by name and by uid, unknown).
fn read_lines(path: &Path) -> io::Result<(Vec<String>, usize)> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: over {MAX_FILE_BYTES} bytes", path.display()),
        ));
    }
    let mut skipped = 0;
    let lines = bytes
        .split(|&b| b == b'\n')
        .filter_map(|l| match std::str::from_utf8(l) {
            Ok(l) => Some(l.to_string()),
            Err(_) => {
                skipped += 1;
                None
            }
        })
        .collect();
    if skipped > 0 && first_time(path, skipped) {
        tracing::warn!(
            file = %path.display(), lines = skipped,
            "lines that are not UTF-8 skipped: the users or groups they name are not known \
             by name (give a uid or gid)"
        );
    }
    Ok((lines, skipped))
}

/// Whether `skipped` lines of `path` are said for the first time in this process: every
/// lookup reads the file, and one start said the same warning 4 times (pass 20).
fn first_time(path: &Path, skipped: usize) -> bool {
    static SAID: std::sync::Mutex<Vec<(PathBuf, usize)>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    let key = (path.to_path_buf(), skipped);
    if said.contains(&key) {
        return false;
    }
    if said.len() < 64 {
        said.push(key); // bounded: past 64 files, each warning is said again
    }
    true
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

    /// Pass 18's low: one non-UTF-8 byte (a Latin-1 GECOS) in `/etc/passwd` or `/etc/group`
    /// made every lookup fail. Such a line is skipped (and counted); the others are read.
    #[test]
    fn a_line_that_is_not_utf8_is_skipped_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        let mut passwd =
            b"root:x:0:0:root:/root:/bin/bash\njos:x:1000:1000:Jos\xe9:/home/jos:/bin/sh\n"
                .to_vec();
        passwd.extend_from_slice(b"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
        std::fs::write(dir.path().join("etc/passwd"), &passwd).unwrap();
        std::fs::write(
            dir.path().join("etc/group"),
            b"root:x:0:\ncaf\xe9:x:7:nobody\nadm:x:4:nobody\n",
        )
        .unwrap();
        let a = Accounts::at(dir.path());
        assert_eq!(a.user_by_name("nobody").unwrap().unwrap().uid, 65534);
        assert_eq!(a.user_by_uid(0).unwrap().unwrap().name, "root");
        assert_eq!(a.user_by_uid(1000).unwrap(), None, "its line is skipped");
        assert_eq!(a.groups_of("nobody", 65534).unwrap(), vec![65534, 4]);
        assert_eq!(a.group_by_name("adm").unwrap(), Some(4));
        assert_eq!(a.lines_not_utf8().unwrap(), (1, 1));
    }

    /// Counts the events said on the thread it is the default of.
    struct Count(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl tracing::Subscriber for Count {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// Pass 20's low: every lookup reads the file and said its not-UTF-8 warning again (4
    /// times in one start); said once now, and again only when the count changes.
    #[test]
    fn the_not_utf8_warning_is_said_once() {
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            b"root:x:0:0:root:/root:/bin/sh\njos:x:1:1:Jos\xe9:/:/\n",
        )
        .unwrap();
        let said = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Count(said.clone());
        tracing::subscriber::with_default(count, || {
            for _ in 0..4 {
                assert_eq!(read_lines(&passwd).unwrap().1, 1);
            }
        });
        assert_eq!(
            said.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "said once"
        );
    }
}
