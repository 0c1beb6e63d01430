//! The egress classifier is attached through a bpf_link: when the process that owns it is
//! killed (SIGKILL: no destructor runs) the kernel detaches it, and restarts never stack
//! programs. Real kernel: root and a cgroup2 mount; skips with a printed reason elsewhere.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use headroom_host::bpf::{attached_egress_programs, EgressPriority};
use headroom_host::LinuxHost;
use headroom_types::GroupPath;

const CHILD_ENV: &str = "HEADROOM_BPF_CHILD_DIR";

/// Run only as the child of the test below: attaches and waits to be killed.
#[test]
#[ignore = "the child half of egress_link_detaches_when_its_owner_is_killed"]
fn child_attaches_and_waits() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let link = EgressPriority::attach(std::path::Path::new(&dir), 0x0001_0020).unwrap();
    println!("attached fd {}", link.link_fd());
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn egress_link_detaches_when_its_owner_is_killed() {
    const TEST: &str = "egress_link_detaches_when_its_owner_is_killed";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("SKIP {TEST}: not root");
    }
    let Ok(cgroups) = LinuxHost::system().cgroups() else {
        return eprintln!("SKIP {TEST}: no cgroups");
    };
    let g = GroupPath::new(&format!("headroom-bpf-link-{}", std::process::id())).unwrap();
    let dir = match cgroups.ensure_v2_group(&g) {
        Ok(d) => d,
        Err(e) => return eprintln!("SKIP {TEST}: no cgroup2 directory: {e}"),
    };
    let cleanup = || {
        let _ = std::fs::remove_dir(&dir);
    };
    match EgressPriority::attach(&dir, 0x0001_0020) {
        Ok(l) => drop(l),
        Err(e) => {
            cleanup();
            return eprintln!("SKIP {TEST}: cannot attach here: {e}");
        }
    }
    assert_eq!(
        attached_egress_programs(&dir).unwrap(),
        0,
        "detached on drop"
    );
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_attaches_and_waits",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_ENV, &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while attached_egress_programs(&dir).unwrap() == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            attached_egress_programs(&dir).unwrap(),
            1,
            "round {round}: attached once"
        );
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // the link's fd closed with the process: the kernel releases it (asynchronously)
        let end = Instant::now() + Duration::from_secs(5);
        while attached_egress_programs(&dir).unwrap() != 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            attached_egress_programs(&dir).unwrap(),
            0,
            "round {round}: nothing left attached after kill -9"
        );
    }
    cleanup();
}
