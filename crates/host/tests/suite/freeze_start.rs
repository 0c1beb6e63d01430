//! `Cgroups::start_freeze` on the real kernel: it returns without waiting for FROZEN, and the
//! kernel finishes the freeze on its own (nobody waits or writes again — as after an agent
//! crash right after the write): the spinning task stops consuming CPU. Needs root and a
//! writable freezer hierarchy; prints SKIP otherwise.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use headroom_host::{FreezeState, LinuxHost};
use headroom_types::GroupPath;

const TEST: &str = "start_freeze_returns_and_the_kernel_finishes_the_freeze";

/// CPU time (utime + stime, clock ticks) of `pid`.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn start_freeze_returns_and_the_kernel_finishes_the_freeze() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP {TEST}: needs root");
        return;
    }
    let Ok(cgroups) = LinuxHost::system().cgroups() else {
        eprintln!("SKIP {TEST}: no cgroups");
        return;
    };
    let group = GroupPath::new(&format!("headroom-freeze-start-{}", std::process::id())).unwrap();
    if let Err(e) = cgroups.create(&group) {
        eprintln!("SKIP {TEST}: creating {group}: {e}");
        return;
    }
    let mut spinner = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = spinner.id();
    let outcome = (|| -> Result<(), String> {
        cgroups
            .move_process(&group, pid as i32)
            .map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(50));
        cgroups.start_freeze(&group).map_err(|e| e.to_string())?;
        let state = cgroups.freeze_state(&group).map_err(|e| e.to_string())?;
        assert_ne!(state, FreezeState::Thawed, "freezing has started");
        let start = Instant::now();
        while cgroups.freeze_state(&group).map_err(|e| e.to_string())? != FreezeState::Frozen {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "not FROZEN 2 s after the write"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let before = cpu_ticks(pid);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(cpu_ticks(pid), before, "the frozen spinner still runs");
        cgroups.thaw(&group).map_err(|e| e.to_string())?;
        Ok(())
    })();
    let _ = cgroups.thaw(&group);
    let _ = spinner.kill();
    let _ = spinner.wait();
    std::thread::sleep(Duration::from_millis(20));
    let _ = cgroups.remove(&group);
    if let Err(e) = outcome {
        panic!("{e}");
    }
}
