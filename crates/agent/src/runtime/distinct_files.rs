//! The files the agent writes must be distinct files. The config's check (crates/control)
//! compares paths as spelled, so two keys naming one file through a link passed: a decision
//! log on the state file appended log lines to it between state writes, and each write
//! replaced the log (seventh hostile pass). Here, before anything is made, each path is
//! resolved to where it lands (the device and inode of its deepest existing directory or
//! file, links followed, and the names below that) and two that land on one place refuse the
//! start, naming both keys.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use headroom_control::config::{Config, ConfigError};

use super::machine_sidecar;

/// Links followed per path before giving up (a loop; the kernel's own limit is 40).
const MAX_LINKS: usize = 40;

/// Where a path lands: the device and inode of its deepest existing part (links followed) and
/// the names below it, which do not exist yet.
#[derive(Debug, PartialEq, Eq)]
struct Landing {
    dev: u64,
    ino: u64,
    below: Vec<OsString>,
}

/// One path the agent writes (or, for the config file, must not write), by the key naming it.
struct Named {
    key: String,
    value: PathBuf,
    /// The same owner's paths may share a file (feed sockets shared by services).
    owner: &'static str,
}

/// Refuses the start when two of the agent's files are one file. `log` is the `--log` override
/// of `api.decision_log`; `config_path` the config file (never to be written).
pub fn check(
    config: &Config,
    log: Option<&Path>,
    config_path: Option<&Path>,
) -> Result<(), ConfigError> {
    let mut named: Vec<Named> = Vec::new();
    let mut add = |key: &str, value: PathBuf, owner: &'static str| {
        named.push(Named {
            key: key.to_string(),
            value,
            owner,
        })
    };
    let state = PathBuf::from(&config.safety.state_file);
    add("safety.state_file", state.clone(), "state");
    for suffix in [".lock", ".tmp", ".lc", ".lc.tmp"] {
        add(
            &format!("safety.state_file (its {suffix})"),
            with_suffix(&state, suffix),
            "state",
        );
    }
    add("api.socket", PathBuf::from(&config.api.socket), "socket");
    let (log_key, log) = match log {
        Some(l) => ("--log", Some(l.to_path_buf())),
        None => (
            "api.decision_log",
            config.api.decision_log.as_ref().map(PathBuf::from),
        ),
    };
    if let Some(log) = log {
        add(
            &format!("{log_key} (its .1)"),
            with_suffix(&log, ".1"),
            "log",
        );
        add(
            &format!("{log_key} (its machine description)"),
            machine_sidecar(&log),
            "log",
        );
        add(log_key, log, "log");
    }
    for (i, lc) in config.lcs.iter().enumerate() {
        let key = config.lc_key(i);
        let latency = lc.latency.as_ref().and_then(|l| l.socket.as_deref());
        let load = lc.load.as_ref().and_then(|l| l.socket.as_deref());
        for (what, socket) in [("latency", latency), ("load", load)] {
            if let Some(s) = socket {
                add(&format!("{key}.{what}.socket"), PathBuf::from(s), "feed");
            }
        }
    }
    if let Some(c) = config_path {
        add("--config", c.to_path_buf(), "config");
    }
    let landed: Vec<(&Named, Option<Landing>)> =
        named.iter().map(|n| (n, landing(&n.value))).collect();
    for (i, (a, la)) in landed.iter().enumerate() {
        let Some(la) = la else { continue };
        for (b, lb) in &landed[..i] {
            if a.owner != b.owner && lb.as_ref() == Some(la) {
                let why = if a.owner == "config" || b.owner == "config" {
                    "the agent would write over its own config file"
                } else {
                    "the agent writes both"
                };
                return Err(ConfigError::Invalid {
                    key: a.key.clone(),
                    value: format!("{:?}", a.value),
                    reason: format!(
                        "names the same file as {} = {:?} (through a link or another spelling): {why}; give each a path of its own",
                        b.key, b.value
                    ),
                });
            }
        }
    }
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Where `path` lands now; `None` when it cannot be told (a link loop): the lexical check of
/// the config stands alone then. Walked one name at a time from the root, links followed as
/// the kernel does; a `..` below a missing directory folds the name before it, as it will once
/// the agent has made that directory (the state lock makes its directory before the other
/// files are opened: `<d>/nope/../agent.log` was not resolved and slipped past, ninth pass).
fn landing(path: &Path) -> Option<Landing> {
    // Command-line paths (`--log`, `--config`) may be relative: opened from here.
    let path = match path.is_absolute() {
        true => path.to_path_buf(),
        false => std::env::current_dir().ok()?.join(path),
    };
    // The names still to walk, the next one last.
    let mut todo = names_reversed(&path);
    // The existing part, links resolved (so its parent is its real parent).
    let mut real = PathBuf::from("/");
    let mut below: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(name) = todo.pop() {
        if name == ".." {
            if below.pop().is_none() {
                real.pop();
            }
            continue;
        }
        if !below.is_empty() {
            below.push(name);
            continue;
        }
        let next = real.join(&name);
        match std::fs::symlink_metadata(&next) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return None;
                }
                let target = std::fs::read_link(&next).ok()?;
                if target.is_absolute() {
                    real = PathBuf::from("/");
                }
                todo.extend(names_reversed(&target));
            }
            Ok(_) => real = next,
            // Missing (or not searchable): made there, below the existing part.
            Err(_) => below.push(name),
        }
    }
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(&real).ok()?;
    Some(Landing {
        dev: m.dev(),
        ino: m.ino(),
        below,
    })
}

/// The names of `path` (`..` kept, `.` and the root dropped), last first.
fn names_reversed(path: &Path) -> Vec<OsString> {
    let mut v: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    v.reverse();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn paths_through_links_land_on_one_place() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        symlink(&real, d.path().join("link")).unwrap();
        // Neither file exists: the directory is what they share.
        let a = landing(&real.join("state.json")).unwrap();
        let b = landing(&d.path().join("link/state.json")).unwrap();
        assert_eq!(a, b);
        // Missing directories below a link too.
        let a = landing(&real.join("x/y.log")).unwrap();
        let b = landing(&d.path().join("link/./x/y.log")).unwrap();
        assert_eq!(a, b);
        // A dangling link to a missing file lands at its target.
        symlink(real.join("later.json"), d.path().join("dangling")).unwrap();
        let a = landing(&real.join("later.json")).unwrap();
        let b = landing(&d.path().join("dangling")).unwrap();
        assert_eq!(a, b);
        // Existing files: by inode, whatever the spelling.
        std::fs::write(real.join("f"), b"x").unwrap();
        assert_eq!(
            landing(&real.join("f")).unwrap(),
            landing(&d.path().join("link/f")).unwrap()
        );
        assert_ne!(
            landing(&real.join("f")).unwrap(),
            landing(&real.join("g")).unwrap()
        );
        // `..` below a missing directory lands where it will once the directory is made, and
        // `..` after a link goes up from the link's target, as the kernel goes.
        assert_eq!(
            landing(&d.path().join("nope/../real/f")).unwrap(),
            landing(&real.join("f")).unwrap()
        );
        assert_eq!(
            landing(&real.join("nope/a/../../g.log")).unwrap(),
            landing(&real.join("g.log")).unwrap()
        );
        std::fs::create_dir(real.join("sub")).unwrap();
        symlink(real.join("sub"), d.path().join("sublink")).unwrap();
        assert_eq!(
            landing(&d.path().join("sublink/../f")).unwrap(),
            landing(&real.join("f")).unwrap()
        );
        // A loop is not resolved.
        symlink(d.path().join("loop"), d.path().join("loop")).unwrap();
        assert_eq!(landing(&d.path().join("loop")), None);
    }
}
