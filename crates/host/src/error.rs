//! One error type for every kernel interaction: it names the operation, the path (or the thread,
//! or the command), the value involved and the errno, so a failed write reads like
//! `writing "50000 100000" to /sys/fs/cgroup/cpu/x/cpu.cfs_quota_us: EINVAL (Invalid argument)`.

use std::fmt;
use std::io;
use std::path::PathBuf;

use nix::errno::Errno;

/// What the host layer was doing when an I/O error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    CreateDir,
    RemoveDir,
    ListDir,
    Open,
}

impl fmt::Display for IoOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoOp::Read => "reading",
            IoOp::Write => "writing",
            IoOp::CreateDir => "creating directory",
            IoOp::RemoveDir => "removing directory",
            IoOp::ListDir => "listing directory",
            IoOp::Open => "opening",
        })
    }
}

/// Every failure of the host layer.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A file-system operation on a kernel interface failed; `value` is what was being written.
    #[error("{}", io_message(*.op, .path, .value.as_deref(), .source))]
    Io {
        op: IoOp,
        path: PathBuf,
        value: Option<String>,
        #[source]
        source: io::Error,
    },
    /// A syscall on a thread or process failed (`sched_setattr`, `sched_setaffinity`, …).
    #[error("{call}({target}, {value}): {}", errno_text(.source))]
    Syscall {
        call: &'static str,
        target: String,
        value: String,
        #[source]
        source: io::Error,
    },
    /// Input refused before touching the kernel (a bad group path, an out-of-range value).
    #[error("invalid {what} {value:?}: {reason}")]
    Invalid {
        what: &'static str,
        value: String,
        reason: String,
    },
    /// A kernel file held something this layer does not understand.
    #[error("parsing {path}: {reason} (content {content:?})")]
    Parse {
        path: PathBuf,
        content: String,
        reason: String,
    },
    /// The mechanism does not exist here (not mounted, kernel or hardware lacks it).
    #[error("{what} is not available: {reason}")]
    Unavailable { what: String, reason: String },
    /// A state did not settle in time (e.g. a freezer that stays FREEZING).
    #[error("timed out after {waited_ms} ms waiting for {path} to become {expected:?} (last read {last:?})")]
    Timeout {
        path: PathBuf,
        expected: String,
        last: String,
        waited_ms: u64,
    },
    /// An external command (`tc`) failed.
    #[error("running `{command}`: {reason}")]
    Command { command: String, reason: String },
}

fn errno_text(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(raw) => {
            let errno = Errno::from_raw(raw);
            format!("{errno:?} ({})", errno.desc())
        }
        None => err.to_string(),
    }
}

fn io_message(op: IoOp, path: &std::path::Path, value: Option<&str>, err: &io::Error) -> String {
    match (op, value) {
        (IoOp::Write, Some(v)) => format!(
            "writing {:?} to {}: {}",
            v.trim_end_matches('\n'),
            path.display(),
            errno_text(err)
        ),
        (_, Some(v)) => format!("{op} {} ({v}): {}", path.display(), errno_text(err)),
        (_, None) => format!("{op} {}: {}", path.display(), errno_text(err)),
    }
}

impl HostError {
    /// The errno behind this error, if it came from the kernel.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            HostError::Io { source, .. } | HostError::Syscall { source, .. } => {
                source.raw_os_error().map(Errno::from_raw)
            }
            _ => None,
        }
    }

    /// True when the file or directory does not exist (ENOENT).
    pub fn is_not_found(&self) -> bool {
        self.errno() == Some(Errno::ENOENT)
    }

    /// True when the caller lacks the privilege (EACCES / EPERM).
    pub fn is_permission(&self) -> bool {
        matches!(self.errno(), Some(Errno::EACCES) | Some(Errno::EPERM))
    }

    pub fn io(op: IoOp, path: impl Into<PathBuf>, value: Option<&str>, source: io::Error) -> Self {
        HostError::Io {
            op,
            path: path.into(),
            value: value.map(str::to_owned),
            source,
        }
    }

    pub fn parse(path: impl Into<PathBuf>, content: &str, reason: impl Into<String>) -> Self {
        let mut content = content.trim_end().to_owned();
        if content.len() > 200 {
            let mut cut = 200;
            while !content.is_char_boundary(cut) {
                cut -= 1;
            }
            content.truncate(cut);
            content.push('…');
        }
        HostError::Parse {
            path: path.into(),
            content,
            reason: reason.into(),
        }
    }

    pub fn invalid(
        what: &'static str,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        HostError::Invalid {
            what,
            value: value.into(),
            reason: reason.into(),
        }
    }

    pub fn unavailable(what: impl Into<String>, reason: impl Into<String>) -> Self {
        HostError::Unavailable {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

/// Shorthand used across the crate.
pub type Result<T, E = HostError> = std::result::Result<T, E>;

/// A value refused by its type's constructor (a group path, a CPU list, a device number).
impl From<headroom_types::ValueError> for HostError {
    fn from(e: headroom_types::ValueError) -> Self {
        HostError::Invalid {
            what: e.what,
            value: e.value,
            reason: e.reason,
        }
    }
}
