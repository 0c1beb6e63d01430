//! The commands a kubeconfig has this process run (an exec plugin's `command`, the gcp auth
//! provider's `cmd-path`): kube-rs runs them as this user (root, for the agent) when the client
//! is made, and again to refresh an expired credential. Each is looked up here as kube-rs's
//! `Command::new` would (a name with a `/` as given; a bare name on the `PATH`, the plugin's own
//! `env` `PATH` first), its links resolved, and taken only when it and every directory above it
//! are root's or this user's and writable by no one else (a sticky directory, `/tmp`, may be:
//! no one else may rename what root owns there); the absolute path found is what kube-rs is
//! given. Seventeenth hostile pass: pass 16 checked a plugin's own owner and mode only, so a
//! root plugin in another user's directory, one on a `PATH` entry another user could write, or
//! gcp's `cmd-path` (not checked at all) ran that user's command as root.

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use kube::config::Kubeconfig;

use crate::file_trust::{doubt, KubeconfigFileError};

/// The absolute path, links resolved, of the program `cmd` names (`field`: the kubeconfig's
/// field, for the error), looked up as `Command::new` does with `path` as the `PATH`, when it
/// passes the rule above. An error names the field and what broke the rule.
pub fn checked(
    field: &'static str,
    cmd: &str,
    path: Option<&OsStr>,
) -> Result<PathBuf, KubeconfigFileError> {
    let named = |at: &Path, e: KubeconfigFileError| KubeconfigFileError::Named {
        key: field,
        path: at.display().to_string(),
        source: Box::new(e),
    };
    let found = if cmd.contains('/') {
        PathBuf::from(cmd)
    } else {
        look_up(cmd, path).ok_or_else(|| {
            named(
                Path::new(cmd),
                KubeconfigFileError::NotTrusted(
                    "not found as an executable file on the PATH".into(),
                ),
            )
        })?
    };
    let real = trusted_path(field, &found)?;
    let meta = std::fs::metadata(&real).map_err(|e| named(&real, e.into()))?;
    if !meta.is_file() {
        return Err(named(&real, KubeconfigFileError::NotRegular("non-file")));
    }
    if let Some(why) = doubt(&meta, field) {
        return Err(named(&real, KubeconfigFileError::NotTrusted(why)));
    }
    Ok(real)
}

/// `file` with its links resolved, when every directory it then lies in is root's or this
/// user's and writable by no one else, or is a sticky directory of root's (`/tmp`: no one
/// else may rename or remove what root or this user owns there): only they could swap the
/// file after it is checked. Otherwise an error naming the first directory that breaks it.
pub(crate) fn trusted_path(
    field: &'static str,
    file: &Path,
) -> Result<PathBuf, KubeconfigFileError> {
    let named = |at: &Path, e: KubeconfigFileError| KubeconfigFileError::Named {
        key: field,
        path: at.display().to_string(),
        source: Box::new(e),
    };
    let real = std::fs::canonicalize(file).map_err(|e| named(file, e.into()))?;
    for dir in real.ancestors().skip(1) {
        let m = std::fs::metadata(dir).map_err(|e| named(dir, e.into()))?;
        let sticky = m.mode() & 0o1000 != 0;
        if let Some(why) = doubt(&m, field).filter(|_| !(sticky && m.uid() == 0)) {
            return Err(named(
                &real,
                KubeconfigFileError::NotTrusted(format!("it lies in {}, {why}", dir.display())),
            ));
        }
    }
    Ok(real)
}

/// The first executable regular file named `name` in `path`'s directories (this process's
/// `PATH` when `None`), as execvp looks.
fn look_up(name: &str, path: Option<&OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let value = path
        .map(OsStr::to_os_string)
        .or_else(|| std::env::var_os("PATH"))?;
    std::env::split_paths(&value)
        .map(|d| {
            if d.as_os_str().is_empty() {
                PathBuf::from(".").join(name)
            } else {
                d.join(name)
            }
        })
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Every command `kc` has this process run, checked by [`checked`] and replaced by the
/// absolute path found.
pub fn take_commands(kc: &mut Kubeconfig) -> Result<(), KubeconfigFileError> {
    for a in kc
        .auth_infos
        .iter_mut()
        .filter_map(|n| n.auth_info.as_mut())
    {
        if let Some(exec) = a.exec.as_mut() {
            if let Some(cmd) = exec.command.clone() {
                let path = exec.env.as_ref().and_then(|env| {
                    env.iter()
                        .rev()
                        .find(|e| e.get("name").map(String::as_str) == Some("PATH"))
                        .and_then(|e| e.get("value"))
                        .map(|v| OsStr::new(v.as_str()).to_os_string())
                });
                let real = checked("exec command", &cmd, path.as_deref())?;
                exec.command = Some(real.to_string_lossy().into_owned());
            }
        }
        if let Some(provider) = a.auth_provider.as_mut() {
            if let Some(cmd) = provider.config.get("cmd-path").cloned() {
                let real = checked("auth-provider cmd-path", &cmd, None)?;
                provider
                    .config
                    .insert("cmd-path".into(), real.to_string_lossy().into_owned());
            }
        }
    }
    Ok(())
}
