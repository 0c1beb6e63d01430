//! What this process may do to the kernel: the agent needs root and a writable cgroupfs to act
//! (the host crate finds the hierarchy); without them experiments run it with `--dry-run` and
//! say so.

use std::path::Path;

/// `Ok` when the agent can actuate here, else every reason it cannot.
pub fn agent_can_actuate(cgroup_root: &Path) -> Result<(), Vec<String>> {
    let mut why = Vec::new();
    if !headroom_host::process::is_root() {
        why.push(
            "not root: the agent cannot create cgroups, move processes or change CPU sets".into(),
        );
    }
    let writable = headroom_host::cgroup::writable_hierarchy(cgroup_root).is_some();
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
