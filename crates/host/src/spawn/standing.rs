//! A BE command starts with no better standing than an ordinary process: its nice value and
//! its OOM score adjustment at least 0. It inherited the agent's, which the shipped unit runs
//! at `Nice=-5` (and an operator may give a negative `OOMScoreAdjust`): a BE as `nobody` ran
//! at nice -5, which that user could not set itself, and a negative OOM adjustment would
//! have had the kernel kill the LC before it (hostile passes 24 and 25, lows). A higher value
//! the agent was given (an operator's `nice 10`) is kept.

use std::ffi::CStr;

/// `/proc/self/oom_score_adj`, made before the fork.
pub(crate) const OOM_SCORE_ADJ: &CStr = c"/proc/self/oom_score_adj";

/// In a forked child, before it becomes its user (a process that changed its credentials no
/// longer owns its `/proc/self` files): a negative nice value and a negative OOM score
/// adjustment set to 0. Async-signal-safe: `getpriority`, `setpriority`, `open`, `read`,
/// `write`, `close` on a stack buffer and a path made before the fork.
pub(crate) fn at_most_ordinary() {
    // SAFETY: system calls on this (forked) process and a NUL-terminated constant path.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice < 0 && *libc::__errno_location() == 0 {
            libc::setpriority(libc::PRIO_PROCESS, 0, 0);
        }
        let fd = libc::open(OOM_SCORE_ADJ.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let mut first = 0u8;
        if libc::read(fd, (&mut first as *mut u8).cast(), 1) == 1 && first == b'-' {
            libc::write(fd, b"0".as_ptr().cast(), 1);
        }
        libc::close(fd);
    }
}

#[cfg(test)]
mod tests {
    use crate::spawn::Gated;
    use nix::sys::wait::waitpid;
    use nix::unistd::Pid;
    use std::time::Duration;

    /// Set in this test binary run again for one test: the process first lowers its own OOM
    /// score adjustment to this value.
    const OOM: &str = "HEADROOM_TEST_STANDING_OOM";

    /// What a BE started through the gate reads as its nice value and OOM score adjustment.
    fn be_standing() -> (i32, i32) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("standing");
        let script = format!(
            "echo $(cut -d' ' -f19 /proc/self/stat) $(cat /proc/self/oom_score_adj) > {}",
            out.display()
        );
        let g = Gated::fork(&["sh".into(), "-c".into(), script]).expect("fork");
        let pid = Pid::from_raw(g.pid());
        assert!(g.wait_ready(Duration::from_secs(5)));
        g.open();
        waitpid(pid, None).unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let v: Vec<i32> = text
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        (v[0], v[1])
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// The forking thread at nice -5 (the shipped unit's): the BE starts at 0. A thread's
    /// nice is its own, so this test changes no other test's.
    #[test]
    fn a_be_started_by_a_thread_at_nice_minus_5_starts_at_0() {
        if !is_root() {
            return eprintln!("SKIP a_be_started_by_a_thread_at_nice_minus_5_starts_at_0: needs root (a negative nice)");
        }
        let (nice, _) = std::thread::spawn(|| {
            // SAFETY: this thread's own nice value (its tid).
            let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as u32, -5) };
            assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
            be_standing()
        })
        .join()
        .unwrap();
        assert_eq!(nice, 0, "the BE kept the agent's nice -5");
        // A higher nice (lower priority) the agent was given is kept.
        let (nice, _) = std::thread::spawn(|| {
            // SAFETY: as above.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as u32, 7) };
            be_standing()
        })
        .join()
        .unwrap();
        assert_eq!(nice, 7, "a BE of an agent at nice 7");
    }

    /// In a process of its own (the score is the whole process's): lowered to -300, its BE
    /// starts at 0; raised to 200, its BE keeps 200.
    #[test]
    fn a_be_of_an_agent_with_a_negative_oom_adjustment_starts_at_0() {
        const NAME: &str =
            "spawn::standing::tests::a_be_of_an_agent_with_a_negative_oom_adjustment_starts_at_0";
        if let Ok(value) = std::env::var(OOM) {
            if let Err(e) = std::fs::write("/proc/self/oom_score_adj", &value) {
                // lowering it needs CAP_SYS_RESOURCE, which a container's root may lack
                println!("BE_OOM=cannot set {value}: {e}");
                return;
            }
            let (_, oom) = be_standing();
            println!("BE_OOM={oom}");
            return;
        }
        if !is_root() {
            return eprintln!("SKIP a_be_of_an_agent_with_a_negative_oom_adjustment_starts_at_0: needs root (a negative score)");
        }
        for (agent, be) in [("-300", 0), ("200", 200)] {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
                .env(OOM, agent)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let got = text
                .lines()
                .find_map(|l| l.split_once("BE_OOM=").map(|(_, v)| v))
                .unwrap_or_else(|| panic!("no BE_OOM line: {text}"));
            if got.starts_with("cannot set") {
                eprintln!("SKIP a_be_of_an_agent_with_a_negative_oom_adjustment_starts_at_0 (at {agent}): {got}");
                continue;
            }
            assert_eq!(got, be.to_string(), "an agent at oom_score_adj {agent}");
        }
    }
}
