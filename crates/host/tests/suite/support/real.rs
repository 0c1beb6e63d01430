//! Helpers for tests on the real kernel: skip unless root with writable cgroups, scratch groups
//! removed by a Drop guard even when the test fails, spinning children killed by a Drop guard.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use headroom_host::{Cgroups, Controller, LinuxHost};
use headroom_types::GroupPath;

/// Real-kernel tests measure CPU time: run them one at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// The real host's cgroups, or `None` after printing why the test is skipped.
pub fn real_cgroups(test: &str, needs: &[Controller]) -> Option<Cgroups> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP {test}: not root");
        return None;
    }
    let cgroups = match LinuxHost::system().cgroups() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            return None;
        }
    };
    for &c in needs {
        if let Err(e) = cgroups.backend(c) {
            eprintln!("SKIP {test}: {e}");
            return None;
        }
    }
    let probe = ScratchGroup::new(&cgroups, &format!("{test}-probe"));
    if let Err(e) = probe.as_ref() {
        eprintln!("SKIP {test}: cgroupfs not writable: {e}");
        return None;
    }
    drop(probe);
    Some(cgroups)
}

/// A uniquely named group removed on drop.
pub struct ScratchGroup {
    pub cgroups: Cgroups,
    pub path: GroupPath,
}

impl ScratchGroup {
    pub fn new(cgroups: &Cgroups, label: &str) -> Result<Self, headroom_host::HostError> {
        let path = GroupPath::new(&format!("headroom-test-{}/{label}", std::process::id()))?;
        cgroups.create(&path)?;
        Ok(ScratchGroup {
            cgroups: cgroups.clone(),
            path,
        })
    }
}

impl Drop for ScratchGroup {
    fn drop(&mut self) {
        if let Err(e) = self.cgroups.remove(&self.path) {
            eprintln!("removing {}: {e}", self.path);
        }
        // The per-process parent goes when its last child does.
        if let Some(parent) = self.path.parent() {
            if self
                .cgroups
                .children(&parent)
                .map(|c| c.is_empty())
                .unwrap_or(false)
            {
                let _ = self.cgroups.remove(&parent);
            }
        }
    }
}

/// A child process killed and reaped on drop.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// `sh -c 'while :; do :; done'`: one thread, always runnable.
    pub fn spinner() -> Self {
        ChildGuard(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn sh"),
        )
    }

    /// Runs `script` after a line arrives on stdin (so it can be moved into a group first).
    pub fn gated(script: &str) -> Self {
        ChildGuard(
            Command::new("sh")
                .args(["-c", &format!("read go; {script}")])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn sh"),
        )
    }

    pub fn release(&mut self) {
        let stdin = self.0.stdin.as_mut().expect("gated child");
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }

    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process's CPU time (utime + stime) in seconds.
pub fn cpu_seconds(pid: i32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &text[text.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 overall are indexes 11 and 12 after the command name.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / clock_ticks()
}

pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// CPU seconds `pid` used during `window`.
pub fn cpu_share_over(pid: i32, window: Duration) -> f64 {
    let before = cpu_seconds(pid);
    std::thread::sleep(window);
    (cpu_seconds(pid) - before) / window.as_secs_f64()
}
