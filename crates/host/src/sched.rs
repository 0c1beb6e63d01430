//! Thread placement: per-thread affinity and scheduling attributes through `sched_setattr(2)`
//! (not wrapped by libc, so called by number with the kernel's 56-byte `struct sched_attr`), and
//! a thread's timer slack.

use std::io;
use std::path::Path;

use nix::unistd::Pid;

use crate::error::{HostError, IoOp, Result};
use headroom_types::values::CpuSet;

/// The kernel's `struct sched_attr` (SCHED_ATTR_SIZE_VER1: 56 bytes, with the utilization clamps).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct RawSchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
    sched_util_min: u32,
    sched_util_max: u32,
}

const SCHED_ATTR_SIZE: u32 = 56;
const _: () = assert!(std::mem::size_of::<RawSchedAttr>() == SCHED_ATTR_SIZE as usize);

/// Bounds the kernel applies to an EEVDF slice request (0.1 ms ..= 100 ms).
pub const SLICE_MIN_NS: u64 = 100_000;
pub const SLICE_MAX_NS: u64 = 100_000_000;

/// A scheduling policy with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum SchedPolicy {
    /// SCHED_OTHER (EEVDF) with a nice value and optionally a custom slice request in ns
    /// (`sched_runtime`, kernel ≥ 6.12; shorter slices get picked sooner).
    Other { nice: i32, slice_ns: Option<u64> },
    /// SCHED_BATCH with a nice value.
    Batch { nice: i32 },
    /// SCHED_IDLE: runs only when nothing else wants the CPU.
    Idle,
    /// SCHED_FIFO with a real-time priority 1..=99.
    Fifo { priority: u32 },
    /// SCHED_RR with a real-time priority 1..=99.
    RoundRobin { priority: u32 },
}

impl SchedPolicy {
    fn validate(&self) -> Result<()> {
        match *self {
            SchedPolicy::Other { nice, slice_ns } => {
                check_nice(nice)?;
                if let Some(s) = slice_ns {
                    if !(SLICE_MIN_NS..=SLICE_MAX_NS).contains(&s) {
                        return Err(HostError::invalid(
                            "slice",
                            format!("{s} ns"),
                            "must be within 100000..=100000000 ns",
                        ));
                    }
                }
                Ok(())
            }
            SchedPolicy::Batch { nice } => check_nice(nice),
            SchedPolicy::Idle => Ok(()),
            SchedPolicy::Fifo { priority } | SchedPolicy::RoundRobin { priority } => {
                if (1..=99).contains(&priority) {
                    Ok(())
                } else {
                    Err(HostError::invalid(
                        "real-time priority",
                        priority.to_string(),
                        "must be within 1..=99",
                    ))
                }
            }
        }
    }

    fn to_raw(self) -> RawSchedAttr {
        let mut raw = RawSchedAttr {
            size: SCHED_ATTR_SIZE,
            ..Default::default()
        };
        match self {
            SchedPolicy::Other { nice, slice_ns } => {
                raw.sched_policy = libc::SCHED_OTHER as u32;
                raw.sched_nice = nice;
                raw.sched_runtime = slice_ns.unwrap_or(0);
            }
            SchedPolicy::Batch { nice } => {
                raw.sched_policy = libc::SCHED_BATCH as u32;
                raw.sched_nice = nice;
            }
            SchedPolicy::Idle => raw.sched_policy = libc::SCHED_IDLE as u32,
            SchedPolicy::Fifo { priority } => {
                raw.sched_policy = libc::SCHED_FIFO as u32;
                raw.sched_priority = priority;
            }
            SchedPolicy::RoundRobin { priority } => {
                raw.sched_policy = libc::SCHED_RR as u32;
                raw.sched_priority = priority;
            }
        }
        raw
    }
}

fn check_nice(nice: i32) -> Result<()> {
    if (-20..=19).contains(&nice) {
        Ok(())
    } else {
        Err(HostError::invalid(
            "nice",
            nice.to_string(),
            "must be within -20..=19",
        ))
    }
}

/// What `sched_getattr` reports for a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SchedAttr {
    /// Raw policy number (SCHED_OTHER = 0, FIFO = 1, RR = 2, BATCH = 3, IDLE = 5, DEADLINE = 6).
    pub policy: u32,
    pub nice: i32,
    pub priority: u32,
    /// For fair policies on kernels ≥ 6.12: the thread's slice in ns.
    pub runtime_ns: u64,
    pub flags: u64,
    pub util_min: u32,
    pub util_max: u32,
}

impl SchedAttr {
    /// The policy as [`SchedPolicy`] (`None` for SCHED_DEADLINE and unknown policies). The slice
    /// of a SCHED_OTHER thread is reported whether it is custom or the default.
    pub fn policy(&self) -> Option<SchedPolicy> {
        match self.policy as i32 {
            libc::SCHED_OTHER => Some(SchedPolicy::Other {
                nice: self.nice,
                slice_ns: (self.runtime_ns > 0).then_some(self.runtime_ns),
            }),
            libc::SCHED_BATCH => Some(SchedPolicy::Batch { nice: self.nice }),
            libc::SCHED_IDLE => Some(SchedPolicy::Idle),
            libc::SCHED_FIFO => Some(SchedPolicy::Fifo {
                priority: self.priority,
            }),
            libc::SCHED_RR => Some(SchedPolicy::RoundRobin {
                priority: self.priority,
            }),
            _ => None,
        }
    }
}

fn last_os_error(call: &'static str, tid: i32, value: String) -> HostError {
    HostError::Syscall {
        call,
        target: format!("tid {tid}"),
        value,
        source: io::Error::last_os_error(),
    }
}

/// Sets thread `tid`'s policy (0 = the calling thread).
pub fn set_sched(tid: i32, policy: SchedPolicy) -> Result<()> {
    set_sched_flags(tid, policy, 0)
}

/// `SCHED_FLAG_RESET_ON_FORK`: children start as SCHED_OTHER at nice 0.
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// Like [`set_sched`], but children the thread forks do not inherit the policy (an agent's
/// real-time control loop must not hand SCHED_FIFO to the BE commands it launches).
pub fn set_sched_reset_on_fork(tid: i32, policy: SchedPolicy) -> Result<()> {
    set_sched_flags(tid, policy, SCHED_FLAG_RESET_ON_FORK)
}

fn set_sched_flags(tid: i32, policy: SchedPolicy, flags: u64) -> Result<()> {
    policy.validate()?;
    let mut raw = policy.to_raw();
    raw.sched_flags |= flags;
    // SAFETY: raw is a valid, fully initialised sched_attr of the size it declares; the kernel
    // only reads it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setattr,
            tid,
            &raw as *const RawSchedAttr,
            0u32,
        )
    };
    if rc != 0 {
        return Err(last_os_error("sched_setattr", tid, format!("{policy:?}")));
    }
    Ok(())
}

/// Sets the calling thread's timer slack to `ns` (`PR_SET_TIMERSLACK`; 0 restores the default,
/// 50 µs): how late the kernel may end the thread's sleeps to batch wake-ups. A loop that keeps
/// a µs schedule asks for 1 ns.
pub fn set_timer_slack_ns(ns: u64) -> Result<()> {
    // SAFETY: prctl with integer arguments; it changes only the calling thread.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(last_os_error(
            "prctl(PR_SET_TIMERSLACK)",
            0,
            format!("{ns} ns"),
        ));
    }
    Ok(())
}

/// Reads thread `tid`'s scheduling attributes (0 = the calling thread).
pub fn sched(tid: i32) -> Result<SchedAttr> {
    let mut raw = RawSchedAttr::default();
    // SAFETY: the kernel writes at most `SCHED_ATTR_SIZE` bytes into raw, which is that large.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut raw as *mut RawSchedAttr,
            SCHED_ATTR_SIZE,
            0u32,
        )
    };
    if rc != 0 {
        return Err(last_os_error("sched_getattr", tid, "-".to_owned()));
    }
    Ok(SchedAttr {
        policy: raw.sched_policy,
        nice: raw.sched_nice,
        priority: raw.sched_priority,
        runtime_ns: raw.sched_runtime,
        flags: raw.sched_flags,
        util_min: raw.sched_util_min,
        util_max: raw.sched_util_max,
    })
}

/// Pins the calling thread to one CPU. Allocates nothing and touches no lock, so a child may
/// call it between fork and exec (`Command::pre_exec`); the threads it spawns inherit it.
pub fn pin_this_thread(cpu: usize) -> io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu)
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    nix::sched::sched_setaffinity(Pid::from_raw(0), &set)
        .map_err(|errno| io::Error::from_raw_os_error(errno as i32))
}

/// Pins thread `tid` to `cpus` (0 = the calling thread).
pub fn set_affinity(tid: i32, cpus: &CpuSet) -> Result<()> {
    if cpus.is_empty() {
        return Err(HostError::invalid(
            "affinity",
            "",
            "an empty CPU set is refused",
        ));
    }
    let mut set = nix::sched::CpuSet::new();
    for cpu in cpus.iter() {
        set.set(cpu as usize).map_err(|_| {
            HostError::invalid(
                "affinity",
                cpus.to_list(),
                format!(
                    "CPU {cpu} is beyond the supported {}",
                    nix::sched::CpuSet::count()
                ),
            )
        })?;
    }
    nix::sched::sched_setaffinity(Pid::from_raw(tid), &set).map_err(|errno| HostError::Syscall {
        call: "sched_setaffinity",
        target: format!("tid {tid}"),
        value: cpus.to_list(),
        source: io::Error::from_raw_os_error(errno as i32),
    })
}

/// The CPUs thread `tid` may run on.
pub fn affinity(tid: i32) -> Result<CpuSet> {
    // The mask as 64-bit words, walked by their set bits: testing each of the 1024 possible
    // CPUs one by one was most of the agent's 100 ms slow sample (one call per LC thread).
    let mut words = [0u64; CPU_MASK_WORDS];
    // SAFETY: the kernel writes at most the given size into `words`, which is that large.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getaffinity,
            tid,
            std::mem::size_of_val(&words),
            words.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(HostError::Syscall {
            call: "sched_getaffinity",
            target: format!("tid {tid}"),
            value: "-".to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(mask_cpus(&words).collect())
}

/// Words of the affinity mask read: 1024 CPUs, as glibc's `cpu_set_t`.
const CPU_MASK_WORDS: usize = 16;

/// The CPUs set in an affinity mask (bit `c % 64` of word `c / 64` is CPU `c`), ascending.
fn mask_cpus(words: &[u64]) -> impl Iterator<Item = u32> + '_ {
    words.iter().enumerate().flat_map(|(i, &w)| {
        let mut rest = w;
        std::iter::from_fn(move || {
            (rest != 0).then(|| {
                let bit = rest.trailing_zeros();
                rest &= rest - 1;
                i as u32 * 64 + bit
            })
        })
    })
}

/// The thread ids of process `pid` from `<root>/proc/<pid>/task`.
pub fn threads(root: &Path, pid: i32) -> Result<Vec<i32>> {
    let dir = root.join(format!("proc/{pid}/task"));
    let entries =
        std::fs::read_dir(&dir).map_err(|e| HostError::io(IoOp::ListDir, &dir, None, e))?;
    let mut tids: Vec<i32> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// The CPU the calling thread runs on now (`sched_getcpu`, vDSO); `None` where it fails.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments and only returns a number.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The CPU a thread last ran on (`/proc/<pid>/task/<tid>/stat` field 39).
pub fn last_cpu(root: &Path, pid: i32, tid: i32) -> Result<usize> {
    let path = root.join(format!("proc/{pid}/task/{tid}/stat"));
    let text =
        std::fs::read_to_string(&path).map_err(|e| HostError::io(IoOp::Read, &path, None, e))?;
    // The command name (field 2) may contain spaces: count fields after its closing paren.
    let after = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or_else(|| HostError::parse(&path, &text, "no `)` after the command name"))?;
    after
        .split_whitespace()
        .nth(39 - 3)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| HostError::parse(&path, &text, "no field 39 (processor)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_words_give_their_set_cpus_in_order() {
        let mut words = [0u64; CPU_MASK_WORDS];
        assert_eq!(mask_cpus(&words).count(), 0);
        words[0] = 0b1011;
        words[1] = 1 << 63;
        words[15] = 1 << 63;
        let cpus: Vec<u32> = mask_cpus(&words).collect();
        assert_eq!(cpus, vec![0, 1, 3, 127, 1023]);
    }

    #[test]
    fn affinity_of_this_thread_is_what_the_kernel_reports() {
        let mine = nix::sched::sched_getaffinity(Pid::from_raw(0)).expect("own affinity");
        let want: Vec<u32> = (0..nix::sched::CpuSet::count())
            .filter(|&c| mine.is_set(c).unwrap_or(false))
            .map(|c| c as u32)
            .collect();
        let got = affinity(0).expect("affinity");
        assert_eq!(got.iter().collect::<Vec<u32>>(), want);
        assert!(!want.is_empty());
    }

    #[test]
    fn the_timer_slack_is_the_calling_threads_own() {
        std::thread::spawn(|| {
            set_timer_slack_ns(1_234).expect("set the slack");
            // SAFETY: PR_GET_TIMERSLACK takes no pointer and returns the slack.
            let got = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
            assert_eq!(got, 1_234);
        })
        .join()
        .unwrap();
        // SAFETY: as above.
        let mine = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        assert_ne!(mine, 1_234, "another thread's slack is not this one's");
    }

    #[test]
    fn affinity_of_a_missing_thread_names_it() {
        let e = affinity(i32::MAX).expect_err("no such thread");
        assert!(e.to_string().contains(&format!("tid {}", i32::MAX)), "{e}");
    }
}
