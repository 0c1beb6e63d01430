//! sched_setattr / sched_getattr and affinity on a thread of this test (real kernel), and input
//! validation before any syscall.

use std::sync::mpsc;

use headroom_host::{sched, SchedPolicy};
use headroom_types::CpuSet;

/// Runs `f` on a fresh thread with its tid, so the test harness's threads keep their settings.
fn on_thread<T: Send + 'static>(f: impl FnOnce(i32) -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let tid = nix::unistd::gettid().as_raw();
        tx.send(f(tid)).unwrap();
    })
    .join()
    .unwrap();
    rx.recv().unwrap()
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn nice_and_an_eevdf_slice_request_read_back() {
    let attr = on_thread(|tid| {
        sched::set_sched(
            tid,
            SchedPolicy::Other {
                nice: 5,
                slice_ns: Some(1_000_000),
            },
        )
        .map(|_| sched::sched(tid))
    })
    .unwrap()
    .unwrap();
    assert_eq!(attr.policy, libc::SCHED_OTHER as u32);
    assert_eq!(attr.nice, 5);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    if (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 12) {
        assert_eq!(
            attr.runtime_ns, 1_000_000,
            "EEVDF slice request not applied: {attr:?}"
        );
        assert_eq!(
            attr.policy(),
            Some(SchedPolicy::Other {
                nice: 5,
                slice_ns: Some(1_000_000)
            })
        );
    } else {
        eprintln!("SKIP slice read-back: kernel {release} predates custom slices (6.12)");
    }
}

#[test]
fn sched_idle_reads_back() {
    let attr = on_thread(|tid| sched::set_sched(tid, SchedPolicy::Idle).map(|_| sched::sched(tid)))
        .unwrap()
        .unwrap();
    assert_eq!(attr.policy(), Some(SchedPolicy::Idle));
}

#[test]
fn fifo_and_rr_with_priority_read_back_as_root() {
    if !is_root() {
        eprintln!("SKIP fifo_and_rr_with_priority_read_back_as_root: not root");
        return;
    }
    for policy in [
        SchedPolicy::Fifo { priority: 10 },
        SchedPolicy::RoundRobin { priority: 20 },
    ] {
        let attr = on_thread(move |tid| sched::set_sched(tid, policy).map(|_| sched::sched(tid)))
            .unwrap()
            .unwrap();
        assert_eq!(attr.policy(), Some(policy));
    }
}

#[test]
fn negative_nice_needs_privilege_and_works_as_root() {
    let result = on_thread(|tid| {
        sched::set_sched(
            tid,
            SchedPolicy::Other {
                nice: -5,
                slice_ns: None,
            },
        )
    });
    if is_root() {
        result.unwrap();
    } else {
        let err = result.unwrap_err();
        assert!(err.is_permission(), "{err}");
    }
}

#[test]
fn out_of_range_values_are_refused_naming_them() {
    for (policy, needle) in [
        (
            SchedPolicy::Other {
                nice: 25,
                slice_ns: None,
            },
            "25",
        ),
        (
            SchedPolicy::Other {
                nice: 0,
                slice_ns: Some(10),
            },
            "10 ns",
        ),
        (SchedPolicy::Fifo { priority: 0 }, "\"0\""),
        (SchedPolicy::RoundRobin { priority: 100 }, "100"),
        (SchedPolicy::Batch { nice: -21 }, "-21"),
    ] {
        let err = sched::set_sched(0, policy).unwrap_err().to_string();
        assert!(err.contains(needle), "{policy:?}: {err}");
    }
}

#[test]
fn a_missing_thread_is_esrch_naming_the_tid() {
    let err = sched::set_sched(i32::MAX - 7, SchedPolicy::Idle).unwrap_err();
    assert_eq!(err.errno(), Some(nix::errno::Errno::ESRCH));
    assert!(
        err.to_string().contains(&format!("tid {}", i32::MAX - 7)),
        "{err}"
    );
    let err = sched::set_affinity(i32::MAX - 7, &CpuSet::from(vec![0])).unwrap_err();
    assert!(
        err.to_string().contains("sched_setaffinity") && err.to_string().contains("ESRCH"),
        "{err}"
    );
}

#[test]
fn affinity_pins_a_thread_and_reads_back() {
    let online = headroom_host::LinuxHost::system()
        .topology()
        .unwrap()
        .cpus_online;
    let last = online.iter().last().unwrap();
    let (set, read) = on_thread(move |tid| {
        let want = CpuSet::from(vec![last]);
        sched::set_affinity(tid, &want).unwrap();
        (want, sched::affinity(tid).unwrap())
    });
    assert_eq!(set, read);
    assert!(sched::set_affinity(0, &CpuSet::new()).is_err());
}

#[test]
fn threads_of_this_process_include_a_new_thread() {
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        tx.send(nix::unistd::gettid().as_raw()).unwrap();
        let _ = done_rx.recv();
    });
    let tid = rx.recv().unwrap();
    let tids = headroom_host::LinuxHost::system()
        .threads(std::process::id() as i32)
        .unwrap();
    done_tx.send(()).unwrap();
    handle.join().unwrap();
    assert!(tids.contains(&tid), "{tid} not in {tids:?}");
    let cpu = sched::last_cpu(std::path::Path::new("/"), std::process::id() as i32, tid);
    assert!(cpu.is_ok() || cpu.unwrap_err().is_not_found());
}

/// As root: a SCHED_FIFO thread set with reset-on-fork hands its children SCHED_OTHER (the
/// agent's control loop launches BE commands).
#[test]
fn reset_on_fork_keeps_children_out_of_fifo() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP reset_on_fork_keeps_children_out_of_fifo: needs root");
        return;
    }
    let policies = std::thread::spawn(|| {
        use headroom_host::sched::{set_sched_reset_on_fork, SchedPolicy};
        if let Err(e) = set_sched_reset_on_fork(0, SchedPolicy::Fifo { priority: 1 }) {
            return Err(e.to_string());
        }
        // SAFETY: sched_getscheduler on the calling thread.
        let me = unsafe { libc::sched_getscheduler(0) };
        let mut child = std::process::Command::new("sleep")
            .arg("1")
            .spawn()
            .map_err(|e| e.to_string())?;
        // SAFETY: sched_getscheduler on our own child.
        let theirs = unsafe { libc::sched_getscheduler(child.id() as i32) };
        let _ = child.kill();
        let _ = child.wait();
        Ok((me, theirs))
    })
    .join()
    .expect("thread");
    match policies {
        Err(e) => eprintln!("SKIP reset_on_fork_keeps_children_out_of_fifo: {e}"),
        Ok((me, child)) => {
            assert_eq!(me & !libc::SCHED_RESET_ON_FORK, libc::SCHED_FIFO);
            assert_eq!(child, libc::SCHED_OTHER, "the child did not inherit FIFO");
        }
    }
}
