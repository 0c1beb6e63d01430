//! The load threads' scheduling class: SCHED_FIFO when asked for (`--fifo PRIO`) and allowed,
//! SCHED_OTHER otherwise, and why, for the output and the JSON. Nothing depends on real-time
//! priority (many hosts refuse it: a cgroup-v1 `cpu` group with `cpu.rt_runtime_us = 0`, a
//! cgroup-v2 host with real-time group scheduling); the engine keeps its schedule under
//! SCHED_OTHER by timer slack 1 ns and a busy-poll window sized from its measured wake-up error.

/// The class the load threads run in and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedInfo {
    /// "SCHED_OTHER", "SCHED_FIFO 10", "SCHED_RR 5", "SCHED_BATCH", "SCHED_IDLE".
    pub class: String,
    /// "not requested (--fifo N asks for SCHED_FIFO)", "SCHED_FIFO 10 refused (EPERM: …)", …
    pub reason: String,
}

impl SchedInfo {
    /// "SCHED_OTHER: SCHED_FIFO 10 refused (EPERM)", for the human output.
    pub fn line(&self) -> String {
        format!("{}: {}", self.class, self.reason)
    }
}

/// Policy and priority of the calling thread.
fn current() -> (libc::c_int, libc::c_int) {
    // SAFETY: sched_getscheduler/sched_getparam on this thread (0) write only into `p`.
    unsafe {
        let policy = libc::sched_getscheduler(0);
        let mut p: libc::sched_param = std::mem::zeroed();
        libc::sched_getparam(0, &mut p);
        (policy, p.sched_priority)
    }
}

fn class_name(policy: libc::c_int, prio: libc::c_int) -> String {
    match policy {
        libc::SCHED_FIFO => format!("SCHED_FIFO {prio}"),
        libc::SCHED_RR => format!("SCHED_RR {prio}"),
        libc::SCHED_BATCH => "SCHED_BATCH".into(),
        libc::SCHED_IDLE => "SCHED_IDLE".into(),
        _ => "SCHED_OTHER".into(),
    }
}

fn errno_name(e: &std::io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::EACCES) => "EACCES",
        _ => return e.to_string(),
    };
    format!("{name}: {e}")
}

/// Settles the calling thread's class before the load threads are started (they inherit it):
/// SCHED_FIFO at `fifo` when given and allowed; otherwise whatever the caller gave (`chrt`).
pub fn settle(fifo: Option<u32>) -> SchedInfo {
    let (policy, prio) = current();
    let inherited = class_name(policy, prio);
    let Some(want) = fifo else {
        let reason = if policy == libc::SCHED_FIFO || policy == libc::SCHED_RR {
            "inherited from the caller (e.g. chrt)".to_string()
        } else {
            "SCHED_FIFO not requested (--fifo N asks for it)".to_string()
        };
        return SchedInfo {
            class: inherited,
            reason,
        };
    };
    let param = libc::sched_param {
        sched_priority: want as libc::c_int,
    };
    // SAFETY: sched_setscheduler on this thread (0) with a parameter we own.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        return SchedInfo {
            class: format!("SCHED_FIFO {want}"),
            reason: format!("--fifo {want}"),
        };
    }
    let e = std::io::Error::last_os_error();
    SchedInfo {
        class: inherited,
        reason: format!("SCHED_FIFO {want} refused ({})", errno_name(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_requested_says_so_and_names_the_class() {
        let s = std::thread::spawn(|| settle(None)).join().unwrap();
        assert!(s.class.starts_with("SCHED_"), "{s:?}");
        assert!(!s.reason.is_empty(), "{s:?}");
    }

    #[test]
    fn an_invalid_priority_is_refused_with_the_errno() {
        // 0 is not a valid SCHED_FIFO priority: EINVAL for everyone, root or not.
        let s = std::thread::spawn(|| settle(Some(0))).join().unwrap();
        assert!(s.reason.contains("refused (EINVAL"), "{s:?}");
        assert!(!s.class.starts_with("SCHED_FIFO 0"), "{s:?}");
    }
}
