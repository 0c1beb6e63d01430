//! The load threads' scheduling class: SCHED_FIFO when asked for (`--fifo PRIO`) and allowed,
//! SCHED_OTHER otherwise, and why, for the output and the JSON. Nothing depends on real-time
//! priority (many hosts refuse it: a cgroup-v1 `cpu` group with `cpu.rt_runtime_us = 0`, a
//! cgroup-v2 host with real-time group scheduling); the engine keeps its schedule under
//! SCHED_OTHER by timer slack 1 ns and a busy-poll window sized from its measured wake-up error.

use headroom_host::sched::{self, SchedPolicy};
use headroom_host::HostError;

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

/// The calling thread's policy (`None` where it cannot be read or is one we do not name).
fn current() -> Option<SchedPolicy> {
    sched::sched(0).ok().and_then(|a| a.policy())
}

fn class_name(policy: Option<SchedPolicy>) -> String {
    match policy {
        Some(SchedPolicy::Fifo { priority }) => format!("SCHED_FIFO {priority}"),
        Some(SchedPolicy::RoundRobin { priority }) => format!("SCHED_RR {priority}"),
        Some(SchedPolicy::Batch { .. }) => "SCHED_BATCH".into(),
        Some(SchedPolicy::Idle) => "SCHED_IDLE".into(),
        _ => "SCHED_OTHER".into(),
    }
}

/// Why the kernel (or the host layer, for a priority out of range) refused: "EPERM: …".
fn refusal(e: &HostError) -> String {
    let HostError::Syscall { source, .. } = e else {
        return e.to_string();
    };
    let name = match source.raw_os_error() {
        Some(libc::EPERM) => "EPERM",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::EACCES) => "EACCES",
        _ => return source.to_string(),
    };
    format!("{name}: {source}")
}

/// Settles the calling thread's class before the load threads are started (they inherit it):
/// SCHED_FIFO at `fifo` when given and allowed; otherwise whatever the caller gave (`chrt`).
pub fn settle(fifo: Option<u32>) -> SchedInfo {
    let policy = current();
    let inherited = class_name(policy);
    let Some(want) = fifo else {
        let reason = if matches!(
            policy,
            Some(SchedPolicy::Fifo { .. } | SchedPolicy::RoundRobin { .. })
        ) {
            "inherited from the caller (e.g. chrt)".to_string()
        } else {
            "SCHED_FIFO not requested (--fifo N asks for it)".to_string()
        };
        return SchedInfo {
            class: inherited,
            reason,
        };
    };
    match sched::set_sched(0, SchedPolicy::Fifo { priority: want }) {
        Ok(()) => SchedInfo {
            class: format!("SCHED_FIFO {want}"),
            reason: format!("--fifo {want}"),
        },
        Err(e) => SchedInfo {
            class: inherited,
            reason: format!("SCHED_FIFO {want} refused ({})", refusal(&e)),
        },
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
    fn an_invalid_priority_is_refused_and_says_why() {
        // 0 is not a SCHED_FIFO priority: refused before the kernel is asked, root or not.
        let s = std::thread::spawn(|| settle(Some(0))).join().unwrap();
        assert!(s.reason.starts_with("SCHED_FIFO 0 refused ("), "{s:?}");
        assert!(s.reason.contains("1..=99"), "{s:?}");
        assert!(!s.class.starts_with("SCHED_FIFO 0"), "{s:?}");
    }
}
