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
            // The entry's type from getdents, without a stat per entry (a v1 cgroup directory
            // holds dozens of files, listed on every cpuset write); sysfs lists many
            // directories as symlinks (powercap zones): those are followed.
            let kind = entry.file_type()?;
            if kind.is_dir() || (kind.is_symlink() && entry.path().is_dir()) {
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

/// The real file system, keeping the descriptor of every file it read: a knob or `/proc` file
/// re-read every 100 ms costs one pread(2) at offset 0 (kernfs and seq files regenerate their
/// content for each read from 0) instead of open + fstat + read + read + close. A descriptor that
/// fails (its cgroup was removed: ENODEV) is dropped and the file opened afresh; `remove_dir`
/// drops the descriptors below the directory. At most [`CachedIo::MAX_OPEN`] are kept.
#[derive(Debug, Default)]
pub struct CachedIo {
    open: std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, fs::File>>,
    /// The read buffer, kept between reads: a zeroed 4 KB allocation per read was most of
    /// the instructions of the agent's steady 100 ms tick (its callgrind profile).
    scratch: std::sync::Mutex<Vec<u8>>,
}

impl CachedIo {
    pub const MAX_OPEN: usize = 256;

    /// Number of descriptors kept (for tests).
    pub fn open_count(&self) -> usize {
        self.open.lock().map_or(0, |m| m.len())
    }
}

/// The whole content of `file`, read from offset 0 with pread(2) into `buf` (at least 4 KB,
/// grown as needed, reused).
fn pread_to_string(file: &fs::File, buf: &mut Vec<u8>) -> io::Result<String> {
    use std::os::unix::fs::FileExt;
    if buf.len() < 4096 {
        buf.resize(4096, 0);
    }
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        let room = buf.len() - len;
        let n = file.read_at(&mut buf[len..], len as u64)?;
        len += n;
        // sysfs, cgroupfs and seq files hand out everything they have up to the buffer size:
        // a short read is the end (saves the second pread that would return 0).
        if n < room {
            break;
        }
    }
    String::from_utf8(buf[..len].to_vec())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

impl KnobIo for CachedIo {
    fn read(&self, path: &Path) -> io::Result<String> {
        let mut open = self
            .open
            .lock()
            .map_err(|_| io::Error::other("knob descriptor cache poisoned"))?;
        // cgroup v1 pid lists (`tasks`, `cgroup.procs`) are built once per open and reused by
        // later reads from 0 for up to a second: a kept descriptor would return stale pids.
        let pid_list = matches!(
            path.file_name().and_then(|n| n.to_str()),
            Some("tasks" | "cgroup.procs" | "cgroup.threads")
        );
        if pid_list {
            drop(open);
            return RealIo.read(path);
        }
        let mut scratch = self
            .scratch
            .lock()
            .map_err(|_| io::Error::other("knob read buffer poisoned"))?;
        if let Some(file) = open.get(path) {
            match pread_to_string(file, &mut scratch) {
                Ok(text) => return Ok(text),
                Err(_) => {
                    open.remove(path);
                }
            }
        }
        let file = fs::File::open(path)?;
        let text = pread_to_string(&file, &mut scratch)?;
        if open.len() >= Self::MAX_OPEN {
            open.clear();
        }
        open.insert(path.to_path_buf(), file);
        Ok(text)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        RealIo.write(path, value)
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        RealIo.create_dir(path)
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        if let Ok(mut open) = self.open.lock() {
            open.retain(|p, _| !p.starts_with(path));
        }
        RealIo.remove_dir(path)
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

#[cfg(test)]
mod cached_io_tests {
    use super::*;

    #[test]
    fn cached_reads_see_new_content_and_reopen_replaced_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let io = CachedIo::default();
        let knob = dir.path().join("cpu.shares");
        fs::write(&knob, "1024\n").expect("write");
        assert_eq!(io.read(&knob).expect("read"), "1024\n");
        assert_eq!(io.open_count(), 1);
        // a write through the seam (one write(2), truncating) is seen by the kept descriptor
        io.write(&knob, "2").expect("write");
        assert_eq!(io.read(&knob).expect("read"), "2");
        // a file longer than the first buffer is read whole
        let long = "x".repeat(10_000);
        fs::write(&knob, &long).expect("write");
        assert_eq!(io.read(&knob).expect("read"), long);
        // removing the directory drops its descriptors; a missing file is still an error
        let sub = dir.path().join("g");
        fs::create_dir(&sub).expect("mkdir");
        fs::write(sub.join("cpu.idle"), "1\n").expect("write");
        assert_eq!(io.read(&sub.join("cpu.idle")).expect("read"), "1\n");
        assert_eq!(io.open_count(), 2);
        // pid lists are never kept (v1 reuses a list built at open for up to a second)
        fs::write(sub.join("tasks"), "7\n").expect("write");
        assert_eq!(io.read(&sub.join("tasks")).expect("read"), "7\n");
        assert_eq!(io.open_count(), 2);
        fs::remove_file(sub.join("cpu.idle")).expect("rm");
        fs::remove_file(sub.join("tasks")).expect("rm");
        io.remove_dir(&sub).expect("rmdir");
        assert_eq!(io.open_count(), 1);
        assert!(io.read(&sub.join("cpu.idle")).is_err());
    }
}

#[cfg(test)]
mod cached_io_buffer_tests {
    use super::*;

    #[test]
    fn a_kept_open_file_reread_gives_fresh_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, big) = (dir.path().join("cpuacct.usage"), dir.path().join("big"));
        let io = CachedIo::default();
        fs::write(&a, "123456789\n").expect("write");
        assert_eq!(io.read(&a).expect("read"), "123456789\n");
        // rewritten in place (same inode, the kept descriptor), shorter: nothing of the old
        // content is left in the reused buffer's answer
        fs::write(&a, "42\n").expect("rewrite");
        assert_eq!(io.read(&a).expect("re-read"), "42\n");
        assert_eq!(io.open_count(), 1, "the descriptor was kept");
        // a file past the buffer's first 4 KB is read whole, and a small one after it still
        // reads its own bytes only
        let text = "y".repeat(9000);
        fs::write(&big, &text).expect("write big");
        assert_eq!(io.read(&big).expect("read big"), text);
        fs::write(&a, "7\n").expect("rewrite");
        assert_eq!(io.read(&a).expect("re-read"), "7\n");
    }
}
