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

/// `keyctl(2)`'s operation that makes the caller join a session keyring (a new anonymous one
/// for a NULL name): `linux/keyctl.h`.
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
/// `keyctl(2)`'s operation that describes a key ("type;uid;gid;perm;description").
const KEYCTL_DESCRIBE: libc::c_long = 6;
/// The caller's session keyring, as a key id (`linux/keyctl.h`).
const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;

/// Whether a variable of the agent's environment is passed on to a command run as a user
/// (twenty-first hostile pass: the whole of it was, so a secret root exported in the shell
/// that started the agent, a token or a key, was another user's to read). Only these: the
/// search path, locale and time zone, and the terminal type; the command's own `HOME`, `USER`,
/// `LOGNAME` ([`RunAs::env`]) and whatever its starter sets are added on top. A command run as
/// root (no `user`) gets the agent's whole environment, as before.
pub fn passed_on(name: &[u8]) -> bool {
    matches!(name, b"PATH" | b"LANG" | b"LANGUAGE" | b"TZ" | b"TERM") || name.starts_with(b"LC_")
}

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
    /// change back); then leaves what the parent's user holds that `setuid` keeps (twenty-first
    /// hostile pass): its session keyring (a new empty one of this user's in its place; with
    /// the user's key quota full, its own user-session keyring: pass 21's low) and a
    /// working directory this user could not reach by its path (`/` in its place). Only
    /// async-signal-safe calls (system calls on a stack buffer), no allocation: callable
    /// between fork and exec.
    pub(crate) fn become_it(&self) -> io::Result<()> {
        // The working directory, read while still the parent's user (it may be one this user
        // cannot name).
        let mut here = [0u8; 4096];
        // SAFETY: getcwd into a live stack buffer of the length given.
        let known = unsafe { !libc::getcwd(here.as_mut_ptr().cast(), here.len()).is_null() }
            && here[0] == b'/';
        nix::unistd::setgroups(&self.groups).map_err(io::Error::from)?;
        nix::unistd::setgid(self.gid).map_err(io::Error::from)?;
        nix::unistd::setuid(self.uid).map_err(io::Error::from)?;
        // `setuid` keeps the session keyring: a login's (pam_keyinit), with root's user
        // keyring linked in, stayed "possessed", so this user read every key of root's there.
        // SAFETY: keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): a new anonymous session keyring.
        let joined = unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_JOIN_SESSION_KEYRING,
                std::ptr::null::<libc::c_char>(),
            )
        };
        if joined < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // A kernel without keys has no keyring to leave.
                Some(libc::ENOSYS) => {}
                // The new keyring is this user's, charged to its key quota: full (its own
                // keys), it joins its own user-session keyring instead (pass 21's low: its
                // commands could not start at all), never keeping the agent's.
                Some(libc::EDQUOT) => self.join_own_session_keyring().inspect_err(|_| {
                    say(b"headroom: not run: its user's key quota is full and it has no session keyring of its own to join; it never runs with the agent's\n");
                })?,
                _ => {
                    say(b"headroom: not run: it could not leave the agent's session keyring (keyctl KEYCTL_JOIN_SESSION_KEYRING failed)\n");
                    return Err(e);
                }
            }
        }
        // Entered again by its path, now as this user: a directory under one it may not
        // search (root's 0700 home) would otherwise let it read what lies there.
        // SAFETY: chdir to a NUL-terminated path in a live buffer (getcwd terminates it), or
        // to a static one.
        unsafe {
            if (!known || libc::chdir(here.as_ptr().cast()) != 0) && libc::chdir(c"/".as_ptr()) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Joins this user's own user-session keyring (`_uid_ses.<uid>`, made by the kernel for
    /// the user, or by a login) as the session keyring, by its name: no new key, so it needs
    /// no quota. Only a keyring owned by this user is kept (a keyring of that name another
    /// user made and let this one search is refused). Called as the user, between fork and
    /// exec: system calls on stack buffers only.
    fn join_own_session_keyring(&self) -> io::Result<()> {
        let mut name = [0u8; 32];
        let prefix = b"_uid_ses.";
        name[..prefix.len()].copy_from_slice(prefix);
        let end = prefix.len() + decimal(self.uid.as_raw(), &mut name[prefix.len()..]);
        name[end] = 0;
        // SAFETY: keyctl(KEYCTL_JOIN_SESSION_KEYRING, name): a NUL-terminated stack buffer.
        if unsafe { libc::syscall(libc::SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, name.as_ptr()) }
            < 0
        {
            return Err(io::Error::last_os_error());
        }
        // "keyring;<uid>;...": the session keyring now is this user's own.
        let mut about = [0u8; 256];
        // SAFETY: keyctl(KEYCTL_DESCRIBE, the session keyring, a stack buffer, its length).
        let n = unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_DESCRIBE,
                KEY_SPEC_SESSION_KEYRING,
                about.as_mut_ptr(),
                about.len(),
            )
        };
        let mut want = [0u8; 32];
        let kind = b"keyring;";
        want[..kind.len()].copy_from_slice(kind);
        let end = kind.len() + decimal(self.uid.as_raw(), &mut want[kind.len()..]);
        want[end] = b';';
        if n <= end as libc::c_long || about[..=end] != want[..=end] {
            return Err(io::Error::from_raw_os_error(libc::EACCES));
        }
        Ok(())
    }
}

/// `n` in decimal at the start of `out`; returns how many bytes (no allocation).
fn decimal(mut n: u32, out: &mut [u8]) -> usize {
    let mut digits = [0u8; 10];
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for (o, d) in out.iter_mut().zip(digits[..len].iter().rev()) {
        *o = *d;
    }
    len
}

/// Writes `text` to fd 2 (a user-run command's: the relay's pipe, logged by the agent), for a
/// command refused between fork and exec: async-signal-safe.
fn say(text: &[u8]) {
    // SAFETY: write of a live buffer of its length to fd 2.
    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

#[cfg(test)]
#[path = "user_tests.rs"]
mod keyring_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spawn::{Gated, StartIn};
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::process::Command;

    /// This thread joins a new session keyring named `name` (`keyctl(2)`
    /// `KEYCTL_JOIN_SESSION_KEYRING`: this thread's credentials only), as the agent's own
    /// session keyring stands in the tests.
    pub(super) fn join_session_keyring_named(name: &str) {
        let c_name = std::ffi::CString::new(name).unwrap();
        // SAFETY: keyctl with a NUL-terminated name; it changes this thread's creds only.
        let id = unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_JOIN_SESSION_KEYRING,
                c_name.as_ptr(),
            )
        };
        assert!(id > 0, "join: {}", io::Error::last_os_error());
    }

    /// uid 65534 as the agent looks it up; `None` (after a SKIP line) when not root or absent.
    fn nobody(test: &str) -> Option<RunAs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP {test}: needs root");
            return None;
        }
        match RunAs::resolve(&UserSpec::uid(65534).unwrap()) {
            Ok(Some(u)) => Some(u),
            other => {
                eprintln!("SKIP {test}: uid 65534 does not resolve here ({other:?})");
                None
            }
        }
    }

    /// What `script` wrote to its stdout, redirected to `out` (a path `user` may write), run
    /// the BE's way (`Gated`) as `user` (empty when it wrote nothing), and how it ended.
    pub(super) fn gated(
        user: &RunAs,
        script: &str,
        out: &Path,
    ) -> (String, nix::sys::wait::WaitStatus) {
        let argv = [
            "sh".to_string(),
            "-c".to_string(),
            format!("{script} > {}", out.display()),
        ];
        let gated =
            Gated::fork_as(&argv, &[], Some(user), crate::spawn::ProcessScope::Any).expect("fork");
        assert!(gated.wait_ready(std::time::Duration::from_secs(10)));
        let pid = nix::unistd::Pid::from_raw(gated.pid());
        gated.open();
        let end = nix::sys::wait::waitpid(pid, None).expect("waitpid");
        (std::fs::read_to_string(out).unwrap_or_default(), end)
    }

    /// Twenty-first hostile pass: a BE run as nobody by an agent started from a login (whose
    /// session keyring pam_keyinit made, root's user keyring linked in) read root's keys
    /// there: `setuid` keeps the session keyring, and its keys stay "possessed". Here this
    /// test's thread alone (a keyring is in its credentials, not the process's) joins a new
    /// session keyring of a name of its own; a command run as uid 65534 — the LC's way
    /// (`StartIn`) and the BE's (`Gated`) — must not see it in `/proc/keys`, which lists what
    /// the reader may view (a possessed keyring included).
    #[test]
    fn a_command_run_as_a_user_leaves_the_parents_session_keyring() {
        const TEST: &str = "a_command_run_as_a_user_leaves_the_parents_session_keyring";
        let Some(nobody) = nobody(TEST) else { return };
        if !Path::new("/proc/keys").exists() {
            return eprintln!("SKIP {TEST}: no /proc/keys (a kernel without keys)");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let out = dir.path().join("keys");
        let name = format!("hr-keyring-test-{}", std::process::id());
        let (seen_here, lc, be) = std::thread::scope(|s| {
            s.spawn(|| {
                join_session_keyring_named(&name);
                let seen_here = std::fs::read_to_string("/proc/keys").unwrap();
                let mut cmd = Command::new("cat");
                cmd.arg("/proc/keys");
                StartIn::parent()
                    .in_own_session()
                    .as_user(nobody.clone())
                    .apply(&mut cmd)
                    .unwrap();
                let lc = cmd.output().expect("spawn");
                let be = gated(&nobody, "cat /proc/keys", &out).0;
                (
                    seen_here,
                    String::from_utf8_lossy(&lc.stdout).into_owned(),
                    be,
                )
            })
            .join()
            .unwrap()
        });
        assert!(
            seen_here.contains(&name),
            "this thread's keyring: {seen_here}"
        );
        assert!(
            !lc.is_empty() && !lc.contains(&name),
            "StartIn as 65534: {lc}"
        );
        assert!(
            !be.is_empty() && !be.contains(&name),
            "Gated as 65534: {be}"
        );
    }

    /// Twenty-first hostile pass: a command run as nobody got the agent's whole environment,
    /// a token root exported in the shell that started it included. Run as uid 65534, the
    /// LC's way (`StartIn`) and the BE's (`Gated`), a command gets none of this process's
    /// variables but those `passed_on` allows (and its `HOME`, `USER`, `LOGNAME`, which this
    /// test does not set). This process's environment is read, never changed: a variable of
    /// it outside the list is what is looked for.
    #[test]
    fn a_command_run_as_a_user_gets_only_the_listed_variables_of_the_agents() {
        const TEST: &str = "a_command_run_as_a_user_gets_only_the_listed_variables_of_the_agents";
        let Some(nobody) = nobody(TEST) else { return };
        let shells = ["PWD", "OLDPWD", "SHLVL", "_", "HOME", "USER", "LOGNAME"];
        let Some(name) = std::env::vars_os()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .find(|k| !passed_on(k.as_bytes()) && !shells.contains(&k.as_str()))
        else {
            return eprintln!("SKIP {TEST}: this process has no variable outside the list");
        };
        let listed = |text: &str| {
            text.split(['\0', '\n'])
                .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_string()))
                .collect::<Vec<_>>()
        };
        let mut cmd = Command::new("cat");
        cmd.arg("/proc/self/environ");
        StartIn::parent()
            .as_user(nobody.clone())
            .apply(&mut cmd)
            .unwrap();
        let lc = String::from_utf8_lossy(&cmd.output().expect("spawn").stdout).into_owned();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let out = dir.path().join("env");
        let be = gated(&nobody, "exec cat /proc/self/environ", &out).0;
        for (how, text) in [("StartIn", &lc), ("Gated", &be)] {
            let names = listed(text);
            assert!(
                !names.contains(&name),
                "{how} as 65534 got {name}: {names:?}"
            );
            let other: Vec<_> = names
                .iter()
                .filter(|k| !passed_on(k.as_bytes()) && !shells.contains(&k.as_str()))
                .collect();
            assert!(other.is_empty(), "{how} as 65534 got {other:?}");
        }
    }

    /// Twenty-first hostile pass: a command run as nobody kept the agent's working directory
    /// and read, through relative paths, files under root's 0700 home that it could not reach
    /// by their paths. A directory the user cannot reach by its path is left for `/`.
    #[test]
    fn a_command_run_as_a_user_leaves_a_working_directory_it_cannot_reach() {
        const TEST: &str = "a_command_run_as_a_user_leaves_a_working_directory_it_cannot_reach";
        let Some(nobody) = nobody(TEST) else { return };
        let home = tempfile::tempdir().unwrap();
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let inner = home.path().join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(inner.join("f"), "root-file\n").unwrap();
        std::fs::set_permissions(inner.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = tempfile::tempdir().unwrap();
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let run = |dir: &Path| {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", "pwd; cat f 2>/dev/null; true"])
                .current_dir(dir);
            StartIn::parent()
                .as_user(nobody.clone())
                .apply(&mut cmd)
                .unwrap();
            let out = cmd.output().expect("spawn");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(run(&inner), "/\n", "under root's 0700 directory");
        // One it can reach stays its working directory.
        assert_eq!(run(open.path()), format!("{}\n", open.path().display()));
    }

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
