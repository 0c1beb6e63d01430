//! Who the commands the agent launches run as, and whose programs it runs: `[[be]] user`
//! (and `[lc] user` for `[lc] command`) resolved once at start, and the program a command
//! names, found as `execvp` finds it, refused when someone other than root, the agent's user
//! or (for a command run as a non-root `user`) that user could write it. Before, every
//! command ran as root: a BE process could write its pid into the root group's
//! `cgroup.procs` and leave its confinement, and a BE program another user could write gave
//! that user root.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use headroom_control::config::{Config, ConfigError};
use headroom_host::spawn::RunAs;
use headroom_types::UserSpec;

use headroom_types::other_writers::{other_writer, OtherWriter};

/// The file `execvp` would run for `program`: the path itself when it holds a `/`, else the
/// first executable regular file named `program` in a `PATH` directory.
pub fn program_path(program: &str) -> Option<PathBuf> {
    program_path_in(program, std::env::var_os("PATH").as_deref())
}

/// [`program_path`] with `search` as `PATH`.
fn program_path_in(program: &str, search: Option<&OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return runnable(Path::new(program)).then(|| PathBuf::from(program));
    }
    let dirs: Vec<PathBuf> = search
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    dirs.iter().map(|d| d.join(program)).find(|p| runnable(p))
}

/// Why a bare `program` name found at `found` must not be run: a `PATH` directory searched
/// before `found`'s (or, where it does not exist, the nearest one above it) that someone else
/// could change: a `program` they put there later is what `execvp` runs at the next restart
/// (pass 22's low: root's `PATH` began with a 0777 directory, uid 65534 put `sleep` there and
/// a root BE's restart ran it). `None` for a path, or when every earlier directory passes.
fn earlier_path_refusal(
    program: &str,
    found: &Path,
    search: Option<&OsStr>,
    runs_as: Option<u32>,
) -> Option<String> {
    if program.contains('/') {
        return None;
    }
    let (_, may_own, as_whom) = owners(runs_as);
    for dir in std::env::split_paths(search?) {
        let candidate = dir.join(program);
        if candidate == found {
            return None;
        }
        // (a link to nothing first: the rule below climbs past it to the nearest directory
        // that exists, but `execvp` follows it to wherever someone makes its target: hostile
        // pass 29, uid 65534 made it in /tmp and a root BE's restart ran its program)
        let doubt = match link_to_nothing_above(&candidate) {
            Some(link) => Some(format!("{} is a link to nothing", link.display())),
            None => crate::trusted_dir::doubt_above(&candidate, may_own)
                .err()
                .map(|d| d.to_string()),
        };
        if let Some(doubt) = doubt {
            let shown = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                &dir
            };
            return Some(format!(
                "PATH directory {} is searched before {}, and others could change it ({doubt}): a {program} put there would run as {as_whom} instead at the next restart; take it out of the agent's PATH, or name the program by its path",
                shown.display(),
                found.parent().unwrap_or(found).display()
            ));
        }
    }
    None
}

/// The first directory above `file` that does not exist but is a link: what it points to
/// may be made later by whoever can write there.
fn link_to_nothing_above(file: &Path) -> Option<&Path> {
    file.ancestors()
        .skip(1)
        .take_while(|d| !d.as_os_str().is_empty() && std::fs::metadata(d).is_err())
        .find(|d| std::fs::symlink_metadata(d).is_ok())
}

/// Why the agent must not run `program` (as `execvp` finds it) as uid `runs_as` (`None`: the
/// agent's own user), or `None` when it may. The file (links followed) must be owned by root,
/// the agent's user or a non-root `runs_as` (who can run only what it could run anyway), and
/// writable by none else: not `o+w`, not `g+w` unless its group is root's; the directory it
/// is in, as spelled and as it resolves, must pass [`crate::trusted_dir::doubt`] for the same
/// owner (no one else could replace it). A program not found is left to the runnable check.
///
/// A script's `#!` interpreter is held to the same rule (it is what runs), and so is the
/// interpreter's own, as deep as the kernel nests them (4); for `#!/usr/bin/env X`, `X` as
/// `execvp` finds it too (pass 18: a root script naming uid 65534's interpreter ran that
/// user's code as root); an ELF program's loader (`PT_INTERP`) too. A `#!` line the agent
/// cannot read plainly is refused ([`crate::interpreter`]); an interpreter (or env's program)
/// that does not exist is refused when someone else could make it ([`missing_refusal`]).
pub fn program_refusal(program: &str, runs_as: Option<u32>) -> Option<String> {
    program_refusal_in(program, runs_as, std::env::var_os("PATH").as_deref())
}

/// [`program_refusal`] with `search` as `PATH`: a bare name (the command's, env's program) is
/// also refused when a `PATH` directory searched before the one it is found in fails the
/// directory rule ([`earlier_path_refusal`]).
fn program_refusal_in(
    program: &str,
    runs_as: Option<u32>,
    search: Option<&OsStr>,
) -> Option<String> {
    let mut path = program_path_in(program, search)?;
    if let Some(why) = earlier_path_refusal(program, &path, search, runs_as) {
        return Some(why);
    }
    for _ in 0..=MAX_INTERPRETERS + 1 {
        if let Some(why) = file_refusal(&path, runs_as) {
            return Some(why);
        }
        let next = match crate::interpreter::next(&path) {
            Ok(next) => next?,
            Err(why) => return Some(format!("{}: {why}", path.display())),
        };
        let interp = next.interp;
        if !interp.exists() {
            // the exec fails, unless someone else makes it before a restart
            return missing_refusal(&interp, runs_as)
                .map(|why| format!("interpreter of {}: {why}", path.display()));
        }
        if let Some(why) = file_refusal(&interp, runs_as) {
            return Some(format!("interpreter of {}: {why}", path.display()));
        }
        path = match next.env_program {
            Some(x) if interp.file_name().is_some_and(|n| n == "env") => {
                let Some(found) = program_path_in(&x, search) else {
                    let why = env_missing_refusal(&x, runs_as)?;
                    return Some(format!(
                        "{x} that {} runs through env: {why}",
                        path.display()
                    ));
                };
                if let Some(why) = earlier_path_refusal(&x, &found, search, runs_as)
                    .or_else(|| file_refusal(&found, runs_as))
                {
                    return Some(format!(
                        "{x} that {} runs through env: {why}",
                        path.display()
                    ));
                }
                found
            }
            _ => interp,
        };
    }
    None
}

/// How deep the kernel follows interpreters that are themselves scripts (one more step
/// here: an ELF interpreter's loader).
const MAX_INTERPRETERS: usize = 4;

/// Who may own what runs as `runs_as` besides root (the agent's user, `me`, and a non-root
/// `runs_as`), and that user in words.
fn owners(runs_as: Option<u32>) -> (u32, u32, String) {
    let me = headroom_host::process::effective_uid();
    let may_own = runs_as.filter(|&u| u != 0).unwrap_or(me);
    let as_whom = match runs_as {
        Some(u) => format!("uid {u}"),
        None => format!("uid {me}, the agent's user"),
    };
    (me, may_own, as_whom)
}

/// Why a file that does not exist (an interpreter, env's program) must not be left to the
/// exec: a link to nothing, or the nearest directory above it that exists fails
/// [`crate::trusted_dir::doubt`] (someone else could make it there before a restart; pass
/// 20: uid 65534 made a missing interpreter, the next start ran it as root). `None` when
/// only root or those [`owners`] names could make it.
fn missing_refusal(path: &Path, runs_as: Option<u32>) -> Option<String> {
    let (_, may_own, as_whom) = owners(runs_as);
    if std::fs::symlink_metadata(path).is_ok() {
        return Some(format!(
            "{} is a link to nothing: what it points to could be made by others and run as {as_whom}; point it at a file only root can write",
            path.display()
        ));
    }
    let dir = path
        .ancestors()
        .skip(1)
        .map(|d| match d.as_os_str().is_empty() {
            true => Path::new("."),
            false => d,
        })
        .find(|d| d.is_dir())?;
    let doubt = crate::trusted_dir::doubt(dir, may_own).err()?;
    Some(format!(
        "{} does not exist, and {} is a directory others could change ({doubt}): they could make it, and it would run as {as_whom}; name a program that exists in a directory only root can write",
        path.display(),
        dir.display()
    ))
}

/// [`missing_refusal`] for env's program `name` found nowhere: the path when it holds a `/`,
/// else that name in every `PATH` directory (env searches them all).
fn env_missing_refusal(name: &str, runs_as: Option<u32>) -> Option<String> {
    if name.contains('/') {
        return missing_refusal(Path::new(name), runs_as);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find_map(|d| missing_refusal(&d.join(name), runs_as))
}

/// [`program_refusal`]'s rule on one file found (`path`), interpreters aside.
fn file_refusal(path: &Path, runs_as: Option<u32>) -> Option<String> {
    let path = path.to_path_buf();
    let (me, may_own, as_whom) = owners(runs_as);
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

/// Why `user` could not run the file `path` names, or `None` when it can: the mode bits of
/// the file (execute) and of every directory above it, as spelled and as it resolves
/// (search), read for that uid, its group and its groups (root, and a file not found, are
/// left alone). Pass 18: a program the BE user could not reach was taken at start and then
/// ended 127 at every restart.
pub fn reach_refusal(path: &Path, user: &RunAs) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    if user.uid() == 0 {
        return None;
    }
    let groups = user.groups();
    let may = |meta: &std::fs::Metadata| {
        let mode = meta.permissions().mode();
        let bit = if meta.uid() == user.uid() {
            0o100
        } else if meta.gid() == user.gid() || groups.contains(&meta.gid()) {
            0o010
        } else {
            0o001
        };
        mode & bit != 0
    };
    let real = std::fs::canonicalize(path).ok()?;
    let meta = std::fs::metadata(&real).ok()?;
    let who = format!("uid {} (gid {}, groups {groups:?})", user.uid(), user.gid());
    for spelled in [path, real.as_path()] {
        for dir in spelled.ancestors().skip(1) {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            let Ok(m) = std::fs::metadata(dir) else {
                continue;
            };
            if !may(&m) {
                return Some(format!(
                        "{}: {who} may not search directory {} (mode {:04o}, owner uid {}, group gid {}): it could not run it",
                        path.display(),
                        dir.display(),
                        m.permissions().mode() & 0o7777,
                        m.uid(),
                        m.gid()
                    ));
            }
        }
    }
    (!may(&meta)).then(|| {
        format!(
            "{}: {who} may not execute it (mode {:04o}, owner uid {}, group gid {}): give it x for that user",
            path.display(),
            meta.permissions().mode() & 0o7777,
            meta.uid(),
            meta.gid()
        )
    })
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
        let user = lc.user.as_ref().and_then(|s| resolve_user(s).ok());
        commands.push((format!("{}.command", config.lc_key(i)), &lc.command, user));
    }
    for (i, be) in config.be.iter().enumerate() {
        let mut user = None;
        if let Some(spec) = &be.user {
            match resolve_user(spec) {
                Ok(u) => user = Some(u),
                Err(reason) => out.push(ConfigError::Invalid {
                    key: format!("be[{i}].user"),
                    value: format!("{:?}", spec.to_string()),
                    reason,
                }),
            }
        }
        if user.is_some() && be.group.is_some() {
            match be_user(i, be) {
                Ok(u) => user = u,
                Err(e) => out.push(e),
            }
        }
        commands.push((format!("be[{i}].command"), &be.command, user));
    }
    for (key, command, user) in commands {
        let Some(program) = command.first() else {
            continue;
        };
        let uid = user.as_ref().map(RunAs::uid);
        let reason = program_refusal(program, uid).or_else(|| {
            let path = program_path(program)?;
            reach_refusal(&path, user.as_ref()?)
        });
        if let Some(reason) = reason {
            out.push(ConfigError::Invalid {
                key,
                value: format!("{command:?}"),
                reason,
            });
        }
    }
    out
}

/// Why `user` is as good as root to the agent, or `None`: uid 0 under any name (`toor`, a
/// duplicate `nobody:x:0:0`), or gid 0 as its group or one of its groups (root's group can
/// write what the program-owner rule trusts).
pub fn root_like(user: &RunAs) -> Option<String> {
    if user.uid() == 0 {
        Some("its user is uid 0".into())
    } else if user.gid() == 0 || user.groups().contains(&0) {
        Some(format!("its user (uid {}) is in group 0", user.uid()))
    } else {
        None
    }
}

/// The warning said once at start when a BE command runs as root (no `[[be]] user`, or one
/// [`root_like`]): the names of those BE groups, or `None`.
pub fn root_be_warning(config: &Config) -> Option<String> {
    let root: Vec<String> = config
        .be
        .iter()
        .enumerate()
        .filter(|(_, b)| !b.command.is_empty())
        .filter_map(|(i, b)| match b.user {
            None => Some(b.name.clone()),
            Some(_) => match be_user(i, b) {
                Ok(Some(u)) => root_like(&u).map(|why| format!("{}: {why}", b.name)),
                _ => None,
            },
        })
        .collect();
    (!root.is_empty()).then(|| {
        format!(
            "BE runs as root: it can leave its group; set [[be]] user (BE {})",
            root.join(", ")
        )
    })
}

/// The warning said once at start when a BE command runs as the same user as an LC command
/// (pass 18: `nobody` both) or an LC process given by pid (`uid_of`: its effective uid):
/// that BE may signal or ptrace the LC. The BE groups and LCs it names, or `None`. Root on both sides is [`root_be_warning`]'s.
pub fn same_user_warning(config: &Config, uid_of: impl Fn(u32) -> Option<u32>) -> Option<String> {
    let me = headroom_host::process::effective_uid();
    let lcs: Vec<(&str, u32)> = config
        .lcs
        .iter()
        .filter(|lc| !lc.command.is_empty())
        .filter_map(|lc| {
            let uid = match &lc.user {
                None => me,
                Some(spec) => resolve_user(spec).ok()?.uid(),
            };
            Some((lc.name.as_str(), uid))
        })
        // An LC given by pid runs as its process's user (pass 25's low: not warned).
        .chain(config.lcs.iter().flat_map(|lc| {
            lc.pids
                .iter()
                .filter_map(|&pid| uid_of(pid))
                .map(move |uid| (lc.name.as_str(), uid))
        }))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let said: Vec<String> = config
        .be
        .iter()
        .enumerate()
        .filter(|(_, b)| !b.command.is_empty())
        .filter_map(|(i, b)| Some((b, be_user(i, b).ok()??.uid())))
        .filter(|&(_, uid)| uid != 0)
        .flat_map(|(b, uid)| {
            lcs.iter()
                .filter(move |&&(_, lc)| lc == uid)
                .map(move |(lc, _)| format!("BE {} and LC {lc} as uid {uid}", b.name))
        })
        .collect();
    (!said.is_empty()).then(|| {
        format!(
            "BE runs as the LC's user: it may kill or ptrace the LC; give [[be]] user a user of its own ({})",
            said.join(", ")
        )
    })
}

#[cfg(test)]
#[path = "run_as_tests.rs"]
mod tests;
