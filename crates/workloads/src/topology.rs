//! CPU lists, affinity and process CPU time: what serve and the antagonists need to place
//! themselves (the machine's cache and SMT topology is the host's: `headroom_host::Topology`).

use std::time::Duration;

use nix::sched::CpuSet;

/// Errors reading topology or changing affinity.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("bad CPU list {input:?}: {reason}")]
    BadCpuList { input: String, reason: String },
    #[error("{what}: {source}")]
    Sys { what: String, source: nix::Error },
    #[error("{what}: {source}")]
    Host {
        what: String,
        source: headroom_host::HostError,
    },
}

/// Parses a kernel-style CPU list: `0-3,5,7-8` → [0,1,2,3,5,7,8] (sorted, deduplicated), by
/// the one rule set of [`headroom_types::CpuSet`]. An empty list is refused here: a place to
/// run or a sibling list names at least one CPU, and the affinity mask holds only so many.
pub fn parse_cpu_list(input: &str) -> Result<Vec<usize>, TopologyError> {
    let bad = |reason: String| TopologyError::BadCpuList {
        input: input.to_string(),
        reason,
    };
    let set = headroom_types::CpuSet::parse_list(input).map_err(|e| bad(e.reason))?;
    if set.is_empty() {
        return Err(bad("empty".into()));
    }
    if let Some(c) = set.last().filter(|&c| c as usize >= CpuSet::count()) {
        return Err(bad(format!(
            "CPU {c} is beyond the affinity mask's {} CPUs",
            CpuSet::count()
        )));
    }
    Ok(set.iter().map(|c| c as usize).collect())
}

/// The CPUs this process may run on, ascending.
pub fn allowed_cpus() -> Result<Vec<usize>, TopologyError> {
    let set = headroom_host::sched::affinity(0).map_err(|e| TopologyError::Host {
        what: "the CPUs this process may run on".into(),
        source: e,
    })?;
    Ok(set.iter().map(|c| c as usize).collect())
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> Result<(), TopologyError> {
    headroom_host::sched::pin_this_thread(cpu).map_err(|e| TopologyError::Sys {
        what: format!("sched_setaffinity to CPU {cpu}"),
        source: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EINVAL)),
    })
}

/// CPU time (user + system) of this process so far.
pub fn process_cpu_time() -> Duration {
    use headroom_host::process::{cpu_split, Usage};
    Duration::from_secs_f64(cpu_split(Usage::Process).total_s())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,5,7-8").unwrap(),
            vec![0, 1, 2, 3, 5, 7, 8]
        );
        assert_eq!(parse_cpu_list(" 2,1,2 ").unwrap(), vec![1, 2]);
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert!(parse_cpu_list("1,,2").is_err());
        let e = parse_cpu_list("x-2").unwrap_err().to_string();
        assert!(e.contains("x-2"), "{e}");
    }

    #[test]
    fn own_cpu_time_counts_work() {
        crate::serve::work::burn_cpu(Duration::from_millis(30));
        assert!(process_cpu_time() >= Duration::from_millis(30));
    }
}
