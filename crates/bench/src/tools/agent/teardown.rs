//! What `bench agent` leaves behind when it is stopped from outside. Its groups
//! (`headroom-bench-agent-<pid>`) and children are removed by [`Cleanup`]'s drop when the bench
//! ends on its own; a SIGTERM (a `timeout`), SIGINT (Ctrl-C) or SIGHUP (a closed terminal) would
//! skip that drop and leave a frozen BE group, spinners and agents behind. The process-wide
//! watcher (crate::stop_on_signal) takes those signals, stops the children first (so no agent
//! recreates a group being removed), then runs this clean-up and exits with 128 + the signal. A
//! bench killed with SIGKILL cannot clean up; the next `bench agent` removes groups whose bench
//! process is gone.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

use headroom_host::process::{exists, send_signal, Signal};
use headroom_host::Cgroups;
use headroom_types::GroupPath;

use crate::tools::error::{Context, Result};

/// The prefix of the bench's top group; the bench's pid follows it.
pub(super) const GROUP_PREFIX: &str = "headroom-bench-agent-";

/// The prefix of the bench's scratch directory under the temp dir; the bench's pid follows it.
pub(super) const SCRATCH_PREFIX: &str = "headroom-bench-agent-";

/// The bench's groups and the pids the watcher kills before removing them, and its scratch
/// directory.
struct Armed {
    cgroups: Cgroups,
    top: GroupPath,
    pids: Vec<u32>,
    scratch: PathBuf,
}

static ARMED: Mutex<Option<Armed>> = Mutex::new(None);

fn armed() -> std::sync::MutexGuard<'static, Option<Armed>> {
    ARMED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The bench's groups and children, removed on drop.
pub(super) struct Cleanup {
    cgroups: Cgroups,
    top: GroupPath,
    pub(super) children: Vec<Child>,
}

impl Cleanup {
    /// Removes the groups and scratch directories of earlier benches that are gone, then arms
    /// the watcher for `top` and `scratch`.
    pub fn arm(cgroups: Cgroups, top: GroupPath, scratch: &Path) -> Result<Cleanup> {
        remove_stale_groups(&cgroups);
        crate::runner::remove_dirs_of_gone_processes(SCRATCH_PREFIX);
        *armed() = Some(Armed {
            cgroups: cgroups.clone(),
            top: top.clone(),
            pids: Vec::new(),
            scratch: scratch.to_path_buf(),
        });
        start_watcher()?;
        Ok(Cleanup {
            cgroups,
            top,
            children: Vec::new(),
        })
    }

    /// Keeps `child` until the end (killed then) and lets the watcher kill it.
    pub fn adopt(&mut self, child: Child) {
        watch(child.id());
        self.children.push(child);
    }

    /// Forgets the children among `pids` (already stopped and reaped by the caller).
    pub fn forget(&mut self, pids: &[u32]) {
        self.children.retain(|c| !pids.contains(&c.id()));
        for &pid in pids {
            unwatch(pid);
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        remove_groups(&self.cgroups, &self.top);
        *armed() = None;
    }
}

/// Lets the watcher kill `pid` (a child this bench started) if the bench is stopped.
pub(super) fn watch(pid: u32) {
    if let Some(a) = armed().as_mut() {
        a.pids.push(pid);
    }
}

/// The child `pid` was reaped: its pid may be reused, so the watcher must not kill it.
pub(super) fn unwatch(pid: u32) {
    if let Some(a) = armed().as_mut() {
        a.pids.retain(|&p| p != pid);
    }
}

/// Thaws the bench's BE and LC groups, kills what is left in them and removes the top group.
fn remove_groups(cgroups: &Cgroups, top: &GroupPath) {
    for name in ["be", "lc"] {
        let Ok(g) = top.join(name) else { continue };
        if !cgroups.exists(&g) {
            continue;
        }
        let _ = cgroups.thaw(&g);
        for _ in 0..50 {
            let procs = cgroups.procs(&g).unwrap_or_default();
            if procs.is_empty() {
                break;
            }
            for pid in procs {
                let _ = send_signal(pid, Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = cgroups.remove(top);
}

/// The top groups of benches whose process is gone (killed with SIGKILL), removed.
fn remove_stale_groups(cgroups: &Cgroups) {
    let Ok(tops) = cgroups.children(&GroupPath::root()) else {
        return;
    };
    for top in tops {
        let name = top.to_string();
        let Some(pid) = name
            .strip_prefix(GROUP_PREFIX)
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if pid > 0 && !exists(pid) {
            eprintln!("headroom bench agent: removing {name}, left by a bench that is gone");
            remove_groups(cgroups, &top);
        }
    }
}

/// The process-wide watcher (crate::stop_on_signal) stops the children on SIGTERM, SIGINT or
/// SIGHUP; this bench's clean-up — kill what is left of the watched children, remove the armed
/// groups — runs after it. Registered once; it does nothing once the bench cleaned up itself.
fn start_watcher() -> Result<()> {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        crate::stop_on_signal::on_stop(|| {
            if let Some(a) = armed().take() {
                for &pid in &a.pids {
                    let _ = send_signal(pid as i32, Signal::SIGKILL);
                }
                remove_groups(&a.cgroups, &a.top);
                let _ = std::fs::remove_dir_all(&a.scratch);
                eprintln!(
                    "headroom bench agent: removed {}, its processes and {}",
                    a.top,
                    a.scratch.display()
                );
            }
        });
    });
    crate::stop_on_signal::install()
        .context("watching for SIGTERM, SIGINT and SIGHUP (to clean up on a stop)")
}
