//! Kernel tunables under `/proc/sys`, by their sysctl name (`kernel.io_uring_disabled`), read
//! below `root` (`/` on the live host, a fake tree in tests).

use std::path::{Path, PathBuf};

use crate::error::{HostError, IoOp, Result};

/// Where sysctl `name` lives under `root` (`kernel.x` -> `<root>/proc/sys/kernel/x`).
pub fn path(root: &Path, name: &str) -> PathBuf {
    name.split('.')
        .fold(root.join("proc/sys"), |p, part| p.join(part))
}

/// The value of sysctl `name`, trimmed.
pub fn read(root: &Path, name: &str) -> Result<String> {
    let path = path(root, name);
    std::fs::read_to_string(&path)
        .map(|v| v.trim().to_owned())
        .map_err(|e| HostError::io(IoOp::Read, path, None, e))
}

/// `kernel.io_uring_disabled` (Linux 6.6+): 0 io_uring for all, 1 only for members of
/// `kernel.io_uring_group`, 2 for none.
pub fn io_uring_disabled(root: &Path) -> Result<u8> {
    const NAME: &str = "kernel.io_uring_disabled";
    let value = read(root, NAME)?;
    value
        .parse::<u8>()
        .ok()
        .filter(|v| *v <= 2)
        .ok_or_else(|| HostError::Parse {
            path: path(root, NAME),
            content: value,
            reason: "not 0, 1 or 2".to_owned(),
        })
}

/// `kernel.pid_max`: the most pids (processes and threads) the whole host hands out.
pub fn pid_max(root: &Path) -> Result<u64> {
    read_count(root, "kernel.pid_max")
}

/// `kernel.threads-max`: the most tasks the whole host runs; a fork past it fails (EAGAIN)
/// whatever `pid_max` is. The kernel sizes it by memory (an eighth of it in kernel stacks).
pub fn threads_max(root: &Path) -> Result<u64> {
    read_count(root, "kernel.threads-max")
}

fn read_count(root: &Path, name: &str) -> Result<u64> {
    let value = read(root, name)?;
    value.parse().map_err(|_| HostError::Parse {
        path: path(root, name),
        content: value,
        reason: "not a number".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_uring_disabled_is_read_under_root_and_checked() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let err = io_uring_disabled(r).unwrap_err();
        assert!(err.is_not_found(), "{err}");
        std::fs::create_dir_all(r.join("proc/sys/kernel")).unwrap();
        std::fs::write(r.join("proc/sys/kernel/io_uring_disabled"), "2\n").unwrap();
        assert_eq!(io_uring_disabled(r).unwrap(), 2);
        std::fs::write(r.join("proc/sys/kernel/io_uring_disabled"), "7\n").unwrap();
        let err = io_uring_disabled(r).unwrap_err().to_string();
        assert!(
            err.contains("proc/sys/kernel/io_uring_disabled") && err.contains("\"7\""),
            "{err}"
        );
    }
}
