//! Keeping the v1 freezer fast: an empty group held frozen for the agent's lifetime.
//!
//! Since Linux 6.1 the legacy freezer counts its freezing groups in a static key
//! (`freezer_active`): the first group to freeze turns the key on and the last to thaw turns it
//! off, and each turn patches kernel text on every CPU (`static_branch_inc`/`dec`, IPIs to all
//! vCPUs). On the 2-vCPU development VM that made a BE freeze cost ~270 µs instead of ~170 µs —
//! most of the agent's reaction. An empty group that stays frozen keeps the key on, so the BE
//! group's freeze and thaw only bump a counter. It holds no process, so it freezes nothing; the
//! cost is the kernel's slow `freezing()` check (a task's cgroup look-up) on the paths that
//! test for a freeze, which the key being on for any frozen group already implies.
//!
//! cgroup v2's freeze (`cgroup.freeze`) does not use that key: nothing is held there.

use std::path::{Path, PathBuf};

use crate::error::{HostError, IoOp, Result};

use super::{Cgroups, Controller};

/// The name of a holder's group at the root of the v1 freezer hierarchy: this prefix, a dot,
/// the holding process's pid, a dot, a count of the holds that process took (tests run several
/// agents in one process).
pub const FREEZER_KEY_PREFIX: &str = "headroom-freezer-key";

/// An empty v1 freezer group kept FROZEN until dropped (then thawed and removed).
#[derive(Debug)]
pub struct FreezerKeyHold {
    dir: PathBuf,
}

impl FreezerKeyHold {
    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for FreezerKeyHold {
    fn drop(&mut self) {
        release(&self.dir);
    }
}

/// Thaws and removes one key group (a frozen empty group can be removed as it is; the thaw is
/// for a kernel that would refuse).
fn release(dir: &Path) {
    let state = dir.join("freezer.state");
    if state.exists() {
        let _ = std::fs::write(state, "THAWED");
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove the freezer key group");
    }
}

impl Cgroups {
    /// Holds the v1 freezer's static key on for as long as the returned value lives (see the
    /// module docs). `Ok(None)` where the freezer is v2 or absent. Key groups left by holders
    /// that died (their pid no longer running) are removed first.
    pub fn hold_freezer_key(&self) -> Result<Option<FreezerKeyHold>> {
        let Some(backend) = self.layout.backend(Controller::Freezer) else {
            return Ok(None);
        };
        if backend.is_v2() {
            return Ok(None);
        }
        let mount = backend.mount();
        if !is_cgroup_fs(mount) {
            // a test's fake tree: nothing to keep warm
            return Ok(None);
        }
        sweep_stale(mount, Path::new("/proc"));
        static HOLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = HOLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = mount.join(format!("{FREEZER_KEY_PREFIX}.{}.{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => return Err(HostError::io(IoOp::CreateDir, dir, None, source)),
        }
        let hold = FreezerKeyHold { dir };
        self.knobs
            .write(&hold.dir.join("freezer.state"), "FROZEN")?;
        Ok(Some(hold))
    }
}

/// Whether `dir` is on a cgroup v1 filesystem (not a test's directory tree).
fn is_cgroup_fs(dir: &Path) -> bool {
    use nix::sys::statfs::{statfs, CGROUP_SUPER_MAGIC};
    statfs(dir).is_ok_and(|s| s.filesystem_type() == CGROUP_SUPER_MAGIC)
}

/// Removes the key groups under `mount` whose holder no longer runs (kill -9 leaves one).
fn sweep_stale(mount: &Path, proc_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(mount) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(FREEZER_KEY_PREFIX))
            .and_then(|rest| rest.strip_prefix('.'))
            .and_then(|rest| rest.split('.').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        // Only an empty group is a key group: a group that holds processes is someone's
        // (named with the prefix by chance or by hand), and thawing it would undo a freeze
        // (fifth hostile pass).
        let holds_processes = std::fs::read_to_string(entry.path().join("cgroup.procs"))
            .is_ok_and(|t| !t.trim().is_empty());
        if pid != std::process::id() && !proc_dir.join(pid.to_string()).exists() && !holds_processes
        {
            tracing::info!(dir = %entry.path().display(), "removing the freezer key group of a holder that is gone");
            release(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_key_groups_are_swept_and_live_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let mount = tmp.path().join("freezer");
        let proc_dir = tmp.path().join("proc");
        std::fs::create_dir_all(proc_dir.join("4242")).unwrap();
        for name in [
            format!("{FREEZER_KEY_PREFIX}.4242.0"), // holder alive
            format!("{FREEZER_KEY_PREFIX}.4243.1"), // holder gone
            format!("{FREEZER_KEY_PREFIX}-other.1"),
            format!("{FREEZER_KEY_PREFIX}.4244.0"), // holder gone, but not empty
            "be".to_string(),
        ] {
            std::fs::create_dir_all(mount.join(name)).unwrap();
        }
        let busy = mount.join(format!("{FREEZER_KEY_PREFIX}.4244.0"));
        std::fs::write(busy.join("cgroup.procs"), "777\n").unwrap();
        std::fs::write(busy.join("freezer.state"), "FROZEN\n").unwrap();
        sweep_stale(&mount, &proc_dir);
        let mut left: Vec<String> = std::fs::read_dir(&mount)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![
                "be".to_string(),
                format!("{FREEZER_KEY_PREFIX}-other.1"),
                format!("{FREEZER_KEY_PREFIX}.4242.0"),
                format!("{FREEZER_KEY_PREFIX}.4244.0"),
            ]
        );
        assert_eq!(
            std::fs::read_to_string(busy.join("freezer.state")).unwrap(),
            "FROZEN\n",
            "a group holding processes is never thawed"
        );
    }

    #[test]
    fn a_held_key_group_is_frozen_and_removed_when_dropped() {
        let Ok(cgroups) = crate::LinuxHost::new("/").cgroups() else {
            eprintln!("SKIP a_held_key_group_is_frozen_and_removed_when_dropped: no cgroup mounts");
            return;
        };
        let hold = match cgroups.hold_freezer_key() {
            Ok(Some(hold)) => hold,
            Ok(None) => {
                eprintln!(
                    "SKIP a_held_key_group_is_frozen_and_removed_when_dropped: no v1 freezer here"
                );
                return;
            }
            Err(e) => {
                eprintln!("SKIP a_held_key_group_is_frozen_and_removed_when_dropped: {e}");
                return;
            }
        };
        let dir = hold.dir().to_path_buf();
        let state = std::fs::read_to_string(dir.join("freezer.state")).unwrap();
        assert_eq!(state.trim(), "FROZEN");
        assert_eq!(
            std::fs::read_to_string(dir.join("cgroup.procs")).unwrap(),
            "",
            "the key group holds no process"
        );
        drop(hold);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
