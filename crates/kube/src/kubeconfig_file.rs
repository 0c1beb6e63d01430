//! Reading a kubeconfig file before kube-rs sees it: opened without waiting (a FIFO would block
//! `open(2)` for ever), refused unless it is a regular file, and read to at most
//! [`MAX_KUBECONFIG_BYTES`] (kube-rs reads a file whole: a link to `/dev/zero` grew the agent by
//! 1.6 GB in 4 s, hostile pass 13). The contents read are what kube-rs parses
//! (`Kubeconfig::from_yaml`), so the file checked is the file used: no check-then-use race.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use kube::config::Kubeconfig;

/// The largest kubeconfig read: 1 MiB. A kubeconfig is a few KiB (a cluster's CA and a client
/// certificate embedded as base64 are ~2 KiB each), so this holds hundreds of clusters.
pub const MAX_KUBECONFIG_BYTES: u64 = 1 << 20;

/// Why a kubeconfig file was not taken (the caller names the path).
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigFileError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a regular file (a {0}): a kubeconfig is a file")]
    NotRegular(&'static str),
    #[error("{0} bytes, more than the {MAX_KUBECONFIG_BYTES} bytes (1 MiB) a kubeconfig may have")]
    TooLarge(u64),
    #[error("not UTF-8 (nor UTF-16 with a byte order mark)")]
    NotText,
    #[error("{0}")]
    Parse(String),
}

impl KubeconfigFileError {
    /// The file is not one a kubeconfig can be (its kind or size), whatever it holds.
    pub fn is_kind(&self) -> bool {
        matches!(
            self,
            KubeconfigFileError::NotRegular(_) | KubeconfigFileError::TooLarge(_)
        )
    }
}

/// What a file that is not a regular one is, in words.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "directory"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// The text of the kubeconfig at `path`, bounded: opened O_NONBLOCK (never waits), a regular
/// file of at most [`MAX_KUBECONFIG_BYTES`] (checked on the open file, and the read stops there
/// even if it grows meanwhile).
pub fn read_text(path: &Path) -> Result<String, KubeconfigFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(KubeconfigFileError::NotRegular(kind_of(meta.file_type())));
    }
    if meta.len() > MAX_KUBECONFIG_BYTES {
        return Err(KubeconfigFileError::TooLarge(meta.len()));
    }
    let mut bytes = Vec::new();
    Read::by_ref(&mut &file)
        .take(MAX_KUBECONFIG_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_KUBECONFIG_BYTES {
        return Err(KubeconfigFileError::TooLarge(bytes.len() as u64));
    }
    drop::<File>(file);
    decode(bytes)
}

/// As kube-rs's reader: UTF-16 (either order) or UTF-8 after a byte order mark, else UTF-8.
fn decode(bytes: Vec<u8>) -> Result<String, KubeconfigFileError> {
    let utf16 = |b: &[u8], be: bool| {
        let units: Vec<u16> = b
            .chunks(2)
            .map(|c| {
                let pair = [c[0], *c.get(1).unwrap_or(&0)];
                if be {
                    u16::from_be_bytes(pair)
                } else {
                    u16::from_le_bytes(pair)
                }
            })
            .collect();
        String::from_utf16(&units).map_err(|_| KubeconfigFileError::NotText)
    };
    match bytes.as_slice() {
        [0xFF, 0xFE, rest @ ..] => utf16(rest, false),
        [0xFE, 0xFF, rest @ ..] => utf16(rest, true),
        [0xEF, 0xBB, 0xBF, rest @ ..] => {
            String::from_utf8(rest.to_vec()).map_err(|_| KubeconfigFileError::NotText)
        }
        _ => String::from_utf8(bytes).map_err(|_| KubeconfigFileError::NotText),
    }
}

/// The kubeconfig at `path`, read by [`read_text`] and parsed from memory; the files it names
/// by relative paths (CA, client certificate and key, token file, an exec command with a `/`)
/// are made absolute against its directory, as kube-rs's `Kubeconfig::read_from` does.
pub fn read(path: &Path) -> Result<Kubeconfig, KubeconfigFileError> {
    let text = read_text(path)?;
    let mut kc =
        Kubeconfig::from_yaml(&text).map_err(|e| KubeconfigFileError::Parse(e.to_string()))?;
    if let Some(dir) = path.parent() {
        absolute_paths(&mut kc, dir);
    }
    Ok(kc)
}

fn absolute_paths(kc: &mut Kubeconfig, dir: &Path) {
    let abs = |p: &mut Option<String>| {
        if let Some(s) = p.as_ref() {
            if Path::new(s).is_relative() {
                if let Some(a) = dir.join(s).to_str() {
                    *p = Some(a.to_owned());
                }
            }
        }
    };
    for named in kc.clusters.iter_mut() {
        if let Some(cluster) = named.cluster.as_mut() {
            abs(&mut cluster.certificate_authority);
        }
    }
    for named in kc.auth_infos.iter_mut() {
        if let Some(auth) = named.auth_info.as_mut() {
            abs(&mut auth.client_certificate);
            abs(&mut auth.client_key);
            abs(&mut auth.token_file);
            if let Some(exec) = auth.exec.as_mut() {
                if exec
                    .command
                    .as_deref()
                    .is_some_and(|c| c.contains(std::path::MAIN_SEPARATOR))
                {
                    abs(&mut exec.command);
                }
            }
        }
    }
}

/// `KUBECONFIG`'s files (`:`-separated, empty names ignored), else `~/.kube/config` where it
/// exists: what kube-rs's inference reads before it falls back to the pod's service account.
pub fn inferred_paths() -> Vec<std::path::PathBuf> {
    if let Some(value) = std::env::var_os("KUBECONFIG") {
        let paths: Vec<_> = std::env::split_paths(&value)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if !paths.is_empty() {
            return paths;
        }
    }
    std::env::home_dir()
        .map(|h| h.join(".kube").join("config"))
        .filter(|p| p.symlink_metadata().is_ok())
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_as_kube_rs_does() {
        assert_eq!(decode(b"a: 1".to_vec()).unwrap(), "a: 1");
        assert_eq!(decode(b"\xEF\xBB\xBFa".to_vec()).unwrap(), "a");
        assert_eq!(decode(b"\xFF\xFEa\x00".to_vec()).unwrap(), "a");
        assert_eq!(decode(b"\xFE\xFF\x00a".to_vec()).unwrap(), "a");
        assert!(decode(b"\xC3".to_vec()).is_err());
    }
}
