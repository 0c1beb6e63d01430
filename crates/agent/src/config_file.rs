//! Reading the agent's config file: the one place the config's text comes from disk (the
//! control crate parses and validates text, and reads no files).

use std::path::Path;

use headroom_types::other_writers::{other_writer, OtherWriter};

use headroom_control::config::{Config, ConfigError, KubernetesConfig};

/// Reads, parses and validates the config file at `path`; every error names the file.
pub fn read_config(path: &Path) -> Result<Config, ConfigError> {
    Config::from_file_text(&read(path)?, path)
}

/// The `[kubernetes]` section alone of the config file at `path` (default when absent).
pub fn read_kubernetes_config(path: &Path) -> Result<KubernetesConfig, ConfigError> {
    KubernetesConfig::from_config_text(&read(path)?, path)
}

/// The largest config file read (a config is a few KiB; `/dev/zero` or a 1 GB file named by
/// mistake grew the agent by a gigabyte in 4 s, fourteenth hostile pass).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// The config's text: a regular file (a FIFO's open waited for a writer for ever), of at
/// most [`MAX_CONFIG_BYTES`], owned by root or this user and writable by no one else (nor by
/// a group other than root's): its `[[be]] command` runs as this user (root), and its groups are frozen and throttled (a
/// config owned by uid 65534 had root run its command, fourteenth hostile pass). Links are
/// followed (a ConfigMap's file is one); the file they end at is checked, after its open.
fn read(path: &Path) -> Result<String, ConfigError> {
    read_checked(path, true)
}

/// A config file's text read as [`read`] reads it (O_NONBLOCK, a regular file of at most
/// [`MAX_CONFIG_BYTES`]) but whoever owns it: for a reader that runs nothing the file names
/// and crosses no privilege (`headroom sim fleet --agent-config`, whose `read_to_string` hung on
/// a FIFO and grew to a gigabyte on `/dev/zero`, sixteenth hostile pass). Errors name the file.
pub fn read_bounded_text(path: &Path) -> Result<String, ConfigError> {
    read_checked(path, false)
}

fn read_checked(path: &Path, owner_rule: bool) -> Result<String, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let refused = |reason: String| ConfigError::Io {
        path: path.display().to_string(),
        reason,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|e| refused(e.to_string()))?;
    let meta = file.metadata().map_err(|e| refused(e.to_string()))?;
    if !meta.is_file() {
        return Err(refused("not a regular file".into()));
    }
    let me = headroom_host::process::effective_uid();
    // A group other than root's may not write it either: a `root:65534` config of mode 0664
    // ran its command as root (fifteenth hostile pass).
    let writer = if owner_rule {
        other_writer(meta.uid(), meta.gid(), meta.mode(), &[me])
    } else {
        None
    };
    match writer {
        Some(OtherWriter::Owner(uid)) => return Err(refused(format!(
            "owned by uid {uid}: another user's config would have its BE command run (and its groups managed) as uid {me}; chown it to root"
        ))),
        Some(OtherWriter::Everyone { mode }) => return Err(refused(format!(
            "mode {mode:04o}: any user could write it, and its BE command runs as uid {me}; chmod o-w it"
        ))),
        Some(OtherWriter::Group { gid, mode }) => return Err(refused(format!(
            "mode {mode:04o} with group gid {gid}: that group's users could write it, and its BE command runs as uid {me}; chmod g-w it"
        ))),
        None => {}
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(refused(format!(
            "{} bytes: a config is at most {MAX_CONFIG_BYTES} bytes",
            meta.len()
        )));
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| refused(e.to_string()))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(refused(format!(
            "grew past {MAX_CONFIG_BYTES} bytes while read"
        )));
    }
    Ok(text)
}
