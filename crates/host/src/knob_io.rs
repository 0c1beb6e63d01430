//! The narrow file-system seam under every cgroupfs / sysfs knob. Production uses [`RealIo`];
//! tests wrap it in a double that answers EINVAL or EBUSY the way a kernel would, because a
//! temp-dir fake cannot refuse a value by itself.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{HostError, IoOp, Result};

/// Reads and writes of kernel interface files and directories.
pub trait KnobIo: Send + Sync + std::fmt::Debug {
    /// The whole content of a file.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// Writes `value` in ONE write(2) without creating the file: cgroupfs parses each write as a
    /// whole, and a knob that does not exist must fail with ENOENT rather than appear.
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
    /// mkdir(2).
    fn create_dir(&self, path: &Path) -> io::Result<()>;
    /// rmdir(2).
    fn remove_dir(&self, path: &Path) -> io::Result<()>;
    /// Names of the subdirectories of `path`.
    fn list_dirs(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            // sysfs lists many directories as symlinks (powercap zones): follow them.
            if entry.path().is_dir() {
                out.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        out.sort();
        Ok(out)
    }
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealIo;

impl KnobIo for RealIo {
    fn read(&self, path: &Path) -> io::Result<String> {
        fs::read_to_string(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)?;
        let written = file.write(value.as_bytes())?;
        if written != value.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {written} of {} bytes", value.len()),
            ));
        }
        Ok(())
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir(path)
    }
}

/// A shared handle on the I/O seam plus the error mapping, used by every knob module.
#[derive(Debug, Clone)]
pub(crate) struct Knobs {
    pub(crate) io: Arc<dyn KnobIo>,
}

impl Knobs {
    pub(crate) fn new(io: Arc<dyn KnobIo>) -> Self {
        Knobs { io }
    }

    pub(crate) fn read(&self, path: &Path) -> Result<String> {
        self.io
            .read(path)
            .map_err(|e| HostError::io(IoOp::Read, path, None, e))
    }

    /// Reads a file and trims the trailing newline.
    pub(crate) fn read_trimmed(&self, path: &Path) -> Result<String> {
        Ok(self.read(path)?.trim().to_owned())
    }

    pub(crate) fn read_u64(&self, path: &Path) -> Result<u64> {
        let text = self.read(path)?;
        text.trim()
            .parse()
            .map_err(|_| HostError::parse(path, &text, "expected an unsigned integer"))
    }

    pub(crate) fn read_i64(&self, path: &Path) -> Result<i64> {
        let text = self.read(path)?;
        text.trim()
            .parse()
            .map_err(|_| HostError::parse(path, &text, "expected an integer"))
    }

    pub(crate) fn write(&self, path: &Path, value: &str) -> Result<()> {
        tracing::debug!(path = %path.display(), value, "write");
        self.io
            .write(path, value)
            .map_err(|e| HostError::io(IoOp::Write, path, Some(value), e))
    }

    pub(crate) fn create_dir(&self, path: &Path) -> Result<()> {
        self.io
            .create_dir(path)
            .map_err(|e| HostError::io(IoOp::CreateDir, path, None, e))
    }

    pub(crate) fn remove_dir(&self, path: &Path) -> Result<()> {
        self.io
            .remove_dir(path)
            .map_err(|e| HostError::io(IoOp::RemoveDir, path, None, e))
    }

    pub(crate) fn list_dirs(&self, path: &Path) -> Result<Vec<String>> {
        self.io
            .list_dirs(path)
            .map_err(|e| HostError::io(IoOp::ListDir, path, None, e))
    }
}

/// `root` joined with an absolute system path such as `/proc/stat`.
pub(crate) fn under(root: &Path, system_path: &str) -> PathBuf {
    root.join(system_path.trim_start_matches('/'))
}
