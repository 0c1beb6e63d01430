//! Who the commands the agent launches run as, and whose programs it runs: `[[be]] user`
//! (and `[lc] user` for `[lc] command`) resolved once at start, and the program a command
//! names, found as `execvp` finds it, refused when someone other than root, the agent's user
//! or (for a command run as a non-root `user`) that user could write it. Before, every
//! command ran as root: a BE process could write its pid into the root group's
//! `cgroup.procs` and leave its confinement, and a BE program another user could write gave
//! that user root.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use headroom_control::config::{Config, ConfigError};
use headroom_host::spawn::RunAs;
use headroom_types::UserSpec;

use headroom_types::other_writers::{other_writer, OtherWriter};

/// The file `execvp` would run for `program`: the path itself when it holds a `/`, else the
/// first executable regular file named `program` in a `PATH` directory.
pub fn program_path(program: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return runnable(Path::new(program)).then(|| PathBuf::from(program));
    }
    let dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.iter().map(|d| d.join(program)).find(|p| runnable(p))
}

/// Why the agent must not run `program` (as `execvp` finds it) as uid `runs_as` (`None`: the
/// agent's own user), or `None` when it may. The file (links followed) must be owned by root,
/// the agent's user or a non-root `runs_as` (who can run only what it could run anyway), and
/// writable by none else: not `o+w`, not `g+w` unless its group is root's; the directory it
/// is in, as spelled and as it resolves, must pass [`crate::trusted_dir::doubt`] for the same
/// owner (no one else could replace it). A program not found is left to the runnable check.
pub fn program_refusal(program: &str, runs_as: Option<u32>) -> Option<String> {
    let path = program_path(program)?;
    let me = headroom_host::process::effective_uid();
    let may_own = runs_as.filter(|&u| u != 0).unwrap_or(me);
    let as_whom = match runs_as {
        Some(u) => format!("uid {u}"),
        None => format!("uid {me}, the agent's user"),
    };
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) => return Some(format!("{}: {e}", path.display())),
    };
    match other_writer(meta.uid(), meta.gid(), meta.mode(), &[me, may_own]) {
        Some(OtherWriter::Owner(uid)) => {
            return Some(format!(
                "{} is owned by uid {uid}: that user could change what runs as {as_whom}; chown it to root (or set user to its owner)",
                path.display()
            ))
        }
        Some(OtherWriter::Everyone { mode }) => {
            return Some(format!(
                "{} has mode {mode:04o}: any user could change what runs as {as_whom}; chmod o-w it",
                path.display()
            ))
        }
        Some(OtherWriter::Group { gid, mode }) => {
            return Some(format!(
                "{} has mode {mode:04o} with group gid {gid}: that group's users could change what runs as {as_whom}; chmod g-w it",
                path.display()
            ))
        }
        None => {}
    }
    let real = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    for dir in [path.parent(), real.parent()].into_iter().flatten() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Err(doubt) = crate::trusted_dir::doubt(dir, may_own) {
            return Some(format!(
                "{} is in a directory others could change ({doubt}): they could replace what runs as {as_whom}; keep it in a directory only root can write",
                path.display()
            ));
        }
    }
    None
}

/// `spec` looked up on this host: the user, or why it cannot be run as.
pub fn resolve_user(spec: &UserSpec) -> Result<RunAs, String> {
    match RunAs::resolve(spec) {
        Ok(Some(user)) => Ok(user),
        Ok(None) => Err("no such user on this host: give a login name it knows (or a uid)".into()),
        Err(e) => Err(format!(
            "looking the user up failed ({e}): give the uid instead"
        )),
    }
}

/// The user a command runs as (`key`: `be[i].user`, `lc.user`): `None` when `spec` is; an
/// error, never a fall back to root, when the host does not know it (the start checked it
/// already; a user removed since is refused here).
pub fn user_for(key: &str, spec: Option<&UserSpec>) -> Result<Option<RunAs>, ConfigError> {
    spec.map(|spec| {
        resolve_user(spec).map_err(|reason| ConfigError::Invalid {
            key: key.to_string(),
            value: format!("{:?}", spec.to_string()),
            reason,
        })
    })
    .transpose()
}

/// Who `[[be]]` entry `i` (`be`) runs its command as: its `user` ([`user_for`]), with its
/// `group` in place of the user's primary group when set; an error names `be[i].group` when
/// this host has no such group.
pub fn be_user(
    i: usize,
    be: &headroom_control::config::BeConfig,
) -> Result<Option<RunAs>, ConfigError> {
    let user = user_for(&format!("be[{i}].user"), be.user.as_ref())?;
    match (user, &be.group) {
        (Some(u), Some(spec)) => {
            let refused = |reason: String| ConfigError::Invalid {
                key: format!("be[{i}].group"),
                value: format!("{:?}", spec.to_string()),
                reason,
            };
            match u.with_group(spec) {
                Ok(Some(u)) => Ok(Some(u)),
                Ok(None) => Err(refused(
                    "no such group on this host (/etc/group): give a group name it knows (or a gid)".into(),
                )),
                Err(e) => Err(refused(format!("looking the group up failed ({e}): give the gid instead"))),
            }
        }
        (user, _) => Ok(user),
    }
}

/// Every `[[be]] user` this host does not know, and every BE or LC command whose program
/// [`program_refusal`] refuses (for the user it runs as), in the config's errors' form.
pub fn problems(config: &Config) -> Vec<ConfigError> {
    let mut out = Vec::new();
    let mut commands = Vec::new();
    for (i, lc) in config.lcs.iter().enumerate() {
        let uid = lc
            .user
            .as_ref()
            .and_then(|s| resolve_user(s).ok())
            .map(|u| u.uid());
        commands.push((format!("{}.command", config.lc_key(i)), &lc.command, uid));
    }
    for (i, be) in config.be.iter().enumerate() {
        let mut uid = None;
        if let Some(spec) = &be.user {
            match resolve_user(spec) {
                Ok(u) => uid = Some(u.uid()),
                Err(reason) => out.push(ConfigError::Invalid {
                    key: format!("be[{i}].user"),
                    value: format!("{:?}", spec.to_string()),
                    reason,
                }),
            }
        }
        if uid.is_some() && be.group.is_some() {
            if let Err(e) = be_user(i, be) {
                out.push(e);
            }
        }
        commands.push((format!("be[{i}].command"), &be.command, uid));
    }
    for (key, command, uid) in commands {
        if let Some(reason) = command.first().and_then(|p| program_refusal(p, uid)) {
            out.push(ConfigError::Invalid {
                key,
                value: format!("{command:?}"),
                reason,
            });
        }
    }
    out
}

/// The warning said once at start when a BE command runs as root (no `[[be]] user`): the
/// names of those BE groups, or `None`.
pub fn root_be_warning(config: &Config) -> Option<String> {
    let root: Vec<&str> = config
        .be
        .iter()
        .filter(|b| !b.command.is_empty() && b.user.is_none())
        .map(|b| b.name.as_str())
        .collect();
    (!root.is_empty()).then(|| {
        format!(
            "BE runs as root: it can leave its group; set [[be]] user (BE {})",
            root.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The rule on the program file and its directory; relaxed for a non-root user's own.
    #[test]
    fn a_program_others_could_change_is_refused() {
        if headroom_host::process::effective_uid() != 0 {
            return eprintln!("SKIP a_program_others_could_change_is_refused: needs root (chown)");
        }
        assert_eq!(program_refusal("sh", None), None);
        assert_eq!(
            program_refusal("bu-no-such-program", None),
            None,
            "left to not_runnable"
        );
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(dir.path(), 0o755);
        let job = dir.path().join("job");
        std::fs::write(&job, "#!/bin/sh\n").unwrap();
        let path = job.to_str().unwrap();
        mode(&job, 0o755);
        assert_eq!(program_refusal(path, None), None);
        mode(&job, 0o757);
        assert!(program_refusal(path, None).unwrap().contains("chmod o-w"));
        mode(&job, 0o775);
        std::os::unix::fs::chown(&job, None, Some(65534)).unwrap();
        assert!(program_refusal(path, None).unwrap().contains("chmod g-w"));
        mode(&job, 0o755);
        std::os::unix::fs::chown(&job, Some(65534), Some(0)).unwrap();
        let why = program_refusal(path, None).unwrap();
        assert!(why.contains("owned by uid 65534"), "{why}");
        assert_eq!(
            program_refusal(path, Some(65534)),
            None,
            "its owner runs it"
        );
        assert!(
            program_refusal(path, Some(0)).is_some(),
            "root named: as root"
        );
        std::os::unix::fs::chown(&job, Some(0), Some(0)).unwrap();
        mode(dir.path(), 0o777);
        let why = program_refusal(path, None).unwrap();
        assert!(why.contains("directory others could change"), "{why}");
    }

    #[test]
    fn root_be_is_said_by_name() {
        let text = |user: &str| {
            format!(
                "[lc]\nname = \"lc\"\ncgroup = \"a/lc\"\n[[be]]\nname = \"batch\"\ncgroup = \"a/be\"\ncommand = [\"sleep\", \"1\"]\n{user}\n[policy]\nkind = \"static-cores\"\n"
            )
        };
        let root = Config::from_toml_str(&text("")).unwrap();
        let said = root_be_warning(&root).unwrap();
        assert!(said.starts_with("BE runs as root: it can leave its group; set [[be]] user"));
        assert!(said.contains("batch"), "{said}");
        let nobody = Config::from_toml_str(&text("user = \"nobody\"")).unwrap();
        assert_eq!(root_be_warning(&nobody), None);
    }
}
