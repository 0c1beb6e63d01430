//! Reading a kubeconfig file before kube-rs sees it: opened without waiting (a FIFO would block
//! `open(2)` for ever), refused unless it is a regular file, and read to at most
//! [`MAX_KUBECONFIG_BYTES`] (kube-rs reads a file whole: a link to `/dev/zero` grew the agent by
//! 1.6 GB in 4 s, hostile pass 13). The contents read are what kube-rs parses
//! (`Kubeconfig::from_yaml`), so the file checked is the file used: no check-then-use race.
//!
//! It and the files it names (certificate authority, client certificate and key, token file,
//! an exec plugin given by path) must be root's or this user's and writable by no other user:
//! a kubeconfig chooses the API server, the credentials and a command that runs as this user
//! (root, for the agent). Sixteenth hostile pass: uid 65534's kubeconfig had root run its exec
//! plugin, and kube-rs read a certificate authority, client key or token file named by the
//! kubeconfig whole (a FIFO hung the start, `/dev/zero` grew it without end). The certificate
//! authority, client certificate and key are read here, bounded, and given to kube-rs as data.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use kube::config::Kubeconfig;

use crate::file_trust::doubt;
pub use crate::file_trust::{KubeconfigFileError, MAX_KUBECONFIG_BYTES};

/// The text of the kubeconfig at `path`, bounded: opened O_NONBLOCK (never waits), a regular
/// file of at most [`MAX_KUBECONFIG_BYTES`] (checked on the open file, and the read stops there
/// even if it grows meanwhile), owned by root or this user and writable by no other user.
pub fn read_text(path: &Path) -> Result<String, KubeconfigFileError> {
    decode(read_bounded(path, "kubeconfig")?)
}

/// The bytes of the file at `path` (a kubeconfig, or a file it names: `what`), bounded and
/// checked as [`read_text`] says, all on the one open file.
fn read_bounded(path: &Path, what: &str) -> Result<Vec<u8>, KubeconfigFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(KubeconfigFileError::NotRegular(
            headroom_types::other_writers::special_file_kind(meta.file_type()),
        ));
    }
    if let Some(why) = doubt(&meta, what) {
        return Err(KubeconfigFileError::NotTrusted(why));
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
    Ok(bytes)
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

/// The files `kc` names, checked as the kubeconfig itself is ([`read_text`]): the certificate
/// authority, client certificate and key read here and put in as data (kube-rs reads a named
/// file whole, once, when the client is made); the token file checked (kube-rs reads it again
/// each minute: it is rotated), with the directories it lies in; the commands it runs (an exec
/// plugin, the gcp auth provider's `cmd-path`) checked by [`crate::exec_command::take_commands`].
/// An error names the field and the file.
///
/// Only the current context's cluster and user are checked and kept: kube-rs uses no other.
/// The others are dropped from `kc`, and a file of theirs that would be refused is a warning,
/// not a refusal (seventeenth hostile pass's low: a kubeconfig whose unused users named a
/// plugin this host lacks, or another user's token file, was refused).
pub fn take_named_files(kc: &mut Kubeconfig) -> Result<(), KubeconfigFileError> {
    for missing in missing_in_use(kc) {
        tracing::warn!(
            current_context = kc.current_context.as_deref().unwrap_or(""),
            "kubernetes: the kubeconfig's current context names {missing}, which the kubeconfig lacks: the API server is asked without it"
        );
    }
    let (cluster, user) = in_use(kc);
    let mut unused = Kubeconfig::default();
    (kc.clusters, unused.clusters) = std::mem::take(&mut kc.clusters)
        .into_iter()
        .partition(|n| cluster.as_deref() == Some(n.name.as_str()));
    (kc.auth_infos, unused.auth_infos) = std::mem::take(&mut kc.auth_infos)
        .into_iter()
        .partition(|n| user.as_deref() == Some(n.name.as_str()));
    if let Err(e) = take_files_of(&mut unused) {
        let names = |v: Vec<String>| v.join(", ");
        tracing::warn!(
            unused_users = %names(unused.auth_infos.iter().map(|n| n.name.clone()).collect()),
            unused_clusters = %names(unused.clusters.iter().map(|n| n.name.clone()).collect()),
            "kubernetes: an entry the kubeconfig's current context does not use would be refused ({e}); not used"
        );
    }
    take_files_of(kc)
}

/// The cluster and user the current context names (kube-rs's `ConfigLoader` takes these and
/// no others); `None` where there is no such context or it names none.
fn in_use(kc: &Kubeconfig) -> (Option<String>, Option<String>) {
    let context = kc.current_context.as_ref().and_then(|name| {
        kc.contexts
            .iter()
            .find(|c| &c.name == name)
            .and_then(|c| c.context.as_ref())
    });
    (
        context.map(|c| c.cluster.clone()),
        context.and_then(|c| c.user.clone()),
    )
}

/// What the current context names that `kc` does not hold (`user "x"`, `cluster "y"`): kube-rs
/// goes on without a missing user's credentials and says nothing (nineteenth hostile pass's low).
fn missing_in_use(kc: &Kubeconfig) -> Vec<String> {
    let (cluster, user) = in_use(kc);
    let mut out = Vec::new();
    if let Some(u) = user.filter(|u| !kc.auth_infos.iter().any(|n| &n.name == u)) {
        out.push(format!("user {u:?}"));
    }
    if let Some(c) = cluster.filter(|c| !kc.clusters.iter().any(|n| &n.name == c)) {
        out.push(format!("cluster {c:?}"));
    }
    out
}

/// [`take_named_files`] for every cluster and user `kc` holds.
fn take_files_of(kc: &mut Kubeconfig) -> Result<(), KubeconfigFileError> {
    let named =
        |key: &'static str, path: &str, e: KubeconfigFileError| KubeconfigFileError::Named {
            key,
            path: path.to_owned(),
            source: Box::new(e),
        };
    let data = |key: &'static str, path: &str| {
        read_bounded(Path::new(path), key)
            .map(|b| base64(&b))
            .map_err(|e| named(key, path, e))
    };
    for c in kc.clusters.iter_mut().filter_map(|n| n.cluster.as_mut()) {
        if let Some(p) = c.certificate_authority.take() {
            if c.certificate_authority_data.is_none() {
                c.certificate_authority_data = Some(data("certificate-authority", &p)?);
            }
        }
    }
    for a in kc
        .auth_infos
        .iter_mut()
        .filter_map(|n| n.auth_info.as_mut())
    {
        if let Some(p) = a.client_certificate.take() {
            if a.client_certificate_data.is_none() {
                a.client_certificate_data = Some(data("client-certificate", &p)?);
            }
        }
        if let Some(p) = a.client_key.take() {
            if a.client_key_data.is_none() {
                a.client_key_data = Some(data("client-key", &p)?.into());
            }
        }
        if let Some(p) = a.token_file.clone() {
            read_bounded(Path::new(&p), "tokenFile").map_err(|e| named("tokenFile", &p, e))?;
            // kube-rs reads it again each minute: the directories it lies in must be root's
            // too (another user's would let them swap it after this check), and kube-rs is
            // given the path with its links resolved (seventeenth hostile pass)
            let real = crate::exec_command::trusted_path("tokenFile", Path::new(&p))?;
            a.token_file = Some(real.to_string_lossy().into_owned());
        }
    }
    // the commands it runs (an exec plugin, gcp's `cmd-path`): their directories too, and a
    // bare name on the PATH (seventeenth hostile pass)
    crate::exec_command::take_commands(kc)?;
    Ok(())
}

/// Standard base64 with padding (what a kubeconfig's `*-data` fields hold).
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
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

    #[test]
    fn a_user_or_cluster_the_current_context_names_and_the_file_lacks_is_found() {
        let kc = |user: &str| {
            Kubeconfig::from_yaml(&format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 contexts: [{{name: c, context: {{cluster: k, user: {user}}}}}]\n\
                 clusters: [{{name: k, cluster: {{server: \"https://127.0.0.1:1\"}}}}]\n\
                 users: [{{name: admin, user: {{token: t}}}}]\n"
            ))
            .unwrap()
        };
        assert_eq!(missing_in_use(&kc("admin")), Vec::<String>::new());
        assert_eq!(
            missing_in_use(&kc("ghost")),
            vec!["user \"ghost\"".to_string()]
        );
        let mut no_cluster = kc("admin");
        no_cluster.clusters.clear();
        assert_eq!(
            missing_in_use(&no_cluster),
            vec!["cluster \"k\"".to_string()]
        );
    }

    #[test]
    fn base64_as_the_standard_says() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0x00, 0x01]), "//4AAQ==");
    }
}
