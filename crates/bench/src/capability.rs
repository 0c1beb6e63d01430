//! What this process may do to the kernel: the agent needs root and a writable cgroupfs to act;
//! without them experiments run it with `--dry-run` and say so.

use std::ffi::CString;
use std::path::Path;

/// `Ok` when the agent can actuate here, else every reason it cannot.
pub fn agent_can_actuate(cgroup_root: &Path) -> Result<(), Vec<String>> {
    let mut why = Vec::new();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        why.push(format!(
            "not root (euid {euid}): the agent cannot create cgroups, move processes or change CPU sets"
        ));
    }
    let candidates = [
        cgroup_root.join("cpu"),
        cgroup_root.join("cpuset"),
        cgroup_root.to_path_buf(),
    ];
    let writable = candidates.iter().any(|p| {
        p.join("cgroup.procs").exists() && {
            let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap_or_default();
            // SAFETY: access(2) with a valid NUL-terminated path.
            unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
        }
    });
    if !writable {
        why.push(format!(
            "no writable cgroup hierarchy under {} (cpu, cpuset or cgroup2)",
            cgroup_root.display()
        ));
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why)
    }
}
