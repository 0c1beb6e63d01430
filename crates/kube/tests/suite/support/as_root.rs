//! What the kube tests that own files as another user share: root or a SKIP line, and modes.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Whether this runs as root; a SKIP line for `test` otherwise.
pub fn is_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("SKIP {test}: needs root (files owned by uid 65534)");
    }
    root
}

pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
