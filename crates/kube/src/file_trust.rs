//! Whether a file a kubeconfig is, or names, may be taken: the owner and mode rule (root's or
//! this user's, writable by no other user: the agent config's rule) and the error a refused
//! file gets. Below both [`crate::kubeconfig_file`] and [`crate::exec_command`], which use it.

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
    #[error("{0} bytes, more than the {MAX_KUBECONFIG_BYTES} bytes (1 MiB) a kubeconfig (or a file it names) may have")]
    TooLarge(u64),
    #[error("not UTF-8 (nor UTF-16 with a byte order mark)")]
    NotText,
    #[error("{0}")]
    Parse(String),
    /// Another user could have chosen what it holds (its owner or mode say so).
    #[error("{0}")]
    NotTrusted(String),
    /// A file the kubeconfig names (`key`: its field) that is not taken.
    #[error("its {key} {path}: {source}")]
    Named {
        key: &'static str,
        path: String,
        source: Box<KubeconfigFileError>,
    },
}

impl KubeconfigFileError {
    /// The file is not one a kubeconfig can be (its kind or size), whatever it holds.
    pub fn is_kind(&self) -> bool {
        matches!(
            self,
            KubeconfigFileError::NotRegular(_)
                | KubeconfigFileError::TooLarge(_)
                | KubeconfigFileError::NotTrusted(_)
                | KubeconfigFileError::Named { .. }
        )
    }
}

/// Why a file (`what`) with this owner and mode is not taken: another user owns it, or may
/// write it (all users, or a group other than root's): the config file's rule
/// (`headroom_types::other_writers`).
pub(crate) fn doubt(meta: &std::fs::Metadata, what: &str) -> Option<String> {
    use headroom_types::other_writers::{other_writer, OtherWriter};
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let (why, fix) = match other_writer(meta.uid(), meta.gid(), meta.mode(), &[me])? {
        OtherWriter::Owner(uid) => (format!("owned by uid {uid}"), "chown it to root"),
        OtherWriter::Everyone { mode } => (
            format!("mode {mode:04o}: any user could write it"),
            "chmod o-w it",
        ),
        OtherWriter::Group { gid, mode } => (
            format!("mode {mode:04o} with group gid {gid}: that group's users could write it"),
            "chmod g-w it",
        ),
    };
    Some(format!(
        "{why}: another user would choose the {what} this process (uid {me}) uses to reach the API server (a kubeconfig also names a command it runs); {fix}"
    ))
}
