//! A test's own top group and process marker (the hostile passes' set-up): root with a writable
//! cgroupfs, a fresh `<prefix>-<name>-<pid>` group, and a `sleep` argument no other process
//! carries; on drop every process carrying the marker is killed, then whatever is left below the
//! group, and the groups are removed — also when the test fails.
#![allow(dead_code)] // not every test that shares `live` uses each of these

use headroom_host::process::{send_signal, Signal};
use headroom_host::{Cgroups, LinuxHost};
use headroom_types::GroupPath;

/// Markers made so far in this process (the suite binary holds every file's tests).
static MARKERS_MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub struct MarkedGroup {
    pub cgroups: Cgroups,
    pub top: GroupPath,
    pub marker: String,
}

impl MarkedGroup {
    /// `None` after a SKIP line for `test`. The marker is `<digit><id><n>.<pid>`: `digit` (one per
    /// test file) and `id` (one per test) say whose it is, `n` (this process's count of markers)
    /// keeps it unique however many files' tests share the process.
    pub fn setup(test: &str, prefix: &str, digit: u32, name: &str, id: u32) -> Option<MarkedGroup> {
        if !super::is_root() {
            eprintln!("SKIP {test}: needs root (cgroups)");
            return None;
        }
        let cgroups = match LinuxHost::system().cgroups() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("SKIP {test}: no cgroups: {e}");
                return None;
            }
        };
        let top = GroupPath::new(&format!("{prefix}-{name}-{}", std::process::id())).unwrap();
        if let Err(e) = cgroups.create(&top) {
            eprintln!("SKIP {test}: cgroupfs not writable: {e}");
            return None;
        }
        let _ = cgroups.remove(&top);
        let n = MARKERS_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 1000;
        let marker = format!("{digit}{id:03}{n:03}.{}", std::process::id());
        Some(MarkedGroup {
            cgroups,
            top,
            marker,
        })
    }
}

impl Drop for MarkedGroup {
    fn drop(&mut self) {
        for pid in with_marker(&self.marker) {
            let _ = send_signal(pid as i32, Signal::SIGKILL);
        }
        let _ = self.cgroups.kill_all(&self.top);
        if let Err(e) = self.cgroups.remove(&self.top) {
            eprintln!("cleanup: removing {}: {e}", self.top);
        }
    }
}

/// The live processes (not zombies) whose command line holds `marker`.
pub fn with_marker(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .filter(|p| alive(*p))
        .collect()
}

/// The `sleep` processes among [`with_marker`]'s: the marked service itself, not a shell that
/// launched it and is about to exit (its command line holds the marker too).
pub fn sleeps_with_marker(marker: &str) -> Vec<u32> {
    with_marker(marker)
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
        .collect()
}

/// Whether `pid` runs (not a zombie).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .is_some_and(|st| st != "Z" && st != "X")
}

/// The group directory of `pid` in every v1 hierarchy (or the v2 one), from /proc.
pub fn groups_of(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2).map(str::to_string))
        .collect()
}
