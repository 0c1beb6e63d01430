//! `[safety]`: rules that override every policy.

use crate::config::checks::*;
use crate::config::{invalid, Problems};
use headroom_types::allocation::IoLimit;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnExit {
    Freeze,
    Restore,
    Leave,
}

/// The smallest BE memory limit accepted (a limit is a cap on a working set, not a switch).
pub const MIN_BE_MEMORY_LIMIT_BYTES: u64 = 4 << 20;

/// The smallest `safety.be_pids_max` accepted: a shell, its command and a few helpers.
pub const MIN_BE_PIDS_MAX: u64 = 16;
/// The largest: the kernel's `PID_MAX_LIMIT` on 64-bit (`pids.max` refuses more, EINVAL).
pub const MAX_BE_PIDS_MAX: u64 = 4 << 20;
/// The default's ceiling: enough tasks for any batch job this agent runs beside an LC.
pub const DEFAULT_BE_PIDS_CAP: u64 = 32_768;
/// The kernel's default `pid_max`, taken where the host's is not known.
pub const KERNEL_DEFAULT_PID_MAX: u64 = 32_768;

/// The default process limit of each of `be_groups` BE groups on a host that hands out at
/// most `host_tasks` tasks (the lower of `kernel.pid_max` and `kernel.threads-max`,
/// [`crate::policy::MachineInfo::host_tasks`]): a quarter of them shared among the groups, at
/// least 16, at most [`DEFAULT_BE_PIDS_CAP`], so BE forking without end in every group at once
/// leaves three quarters to the LC, the agent and the host. A quarter of `pid_max` for each
/// group let four BE groups take every pid, and on a host whose `threads-max` is below
/// `pid_max` (4 GiB of memory or less beside systemd's `pid_max` of 4194304) one group's
/// 32768 took every task (hostile pass 26).
pub fn default_be_pids_max(host_tasks: Option<u64>, be_groups: usize) -> u64 {
    let quarter = host_tasks.unwrap_or(KERNEL_DEFAULT_PID_MAX) / 4;
    (quarter / be_groups.max(1) as u64).clamp(MIN_BE_PIDS_MAX, DEFAULT_BE_PIDS_CAP)
}

/// `[safety]`: rules that override every policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SafetyConfig {
    pub on_exit: OnExit,
    pub state_file: String,
    /// LC latency older than this is stale, ms.
    pub latency_max_age_ms: u64,
    /// BE disabled after this many consecutive ticks with unknown/stale latency (0 = by time only).
    pub stale_disable_ticks: u64,
    /// BE disabled after unknown/stale latency for this long, ms (0 = by ticks only).
    pub stale_disable_ms: u64,
    /// BE disabled for this long after an SLO violation, s (0 = off).
    pub violation_cooldown_s: f64,
    /// BE grows at most once per this many ms, whatever the policy wants (grow slowly).
    pub grow_interval_ms: u64,
    /// No BE growth for this many ms after any shrink (hysteresis against flapping).
    pub grow_after_shrink_ms: u64,
    /// BE disabled while MemAvailable is below this, bytes (PerfIso's low-memory kill switch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_mem_available_bytes: Option<u64>,
    /// BE killed while memory PSI "full" avg10 is above this, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_memory_psi_full: Option<f64>,
    /// Memory limit of the BE groups, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub be_memory_limit_bytes: Option<u64>,
    /// Most tasks (processes and threads) each BE group may hold (`pids.max`). Absent: a
    /// quarter of the host's tasks (the lower of `kernel.pid_max` and `kernel.threads-max`)
    /// shared among the BE groups, at most 32768 ([`default_be_pids_max`]); 0: no limit (the
    /// groups' `pids.max` is left as it was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub be_pids_max: Option<u64>,
    /// Disk throttles of the BE groups (PerfIso's static I/O limits).
    pub be_io_limits: Vec<IoLimit>,
    /// The control loop runs SCHED_FIFO at this priority so no BE (or LC) thread can delay a
    /// shrink by a scheduler slice; 0 leaves its scheduling alone. Where FIFO is refused (not
    /// root, or a cgroup-v1 cpu group without an RT budget) it falls back to nice -20.
    pub agent_fifo_priority: u8,
}

impl Default for SafetyConfig {
    fn default() -> Self {
        SafetyConfig {
            on_exit: OnExit::Freeze,
            state_file: "/var/lib/headroom/state.json".to_string(),
            latency_max_age_ms: 5000,
            stale_disable_ticks: 0,
            stale_disable_ms: 30_000,
            violation_cooldown_s: 300.0,
            grow_interval_ms: 20,
            grow_after_shrink_ms: 100,
            min_mem_available_bytes: None,
            max_memory_psi_full: None,
            be_memory_limit_bytes: None,
            be_pids_max: None,
            be_io_limits: Vec::new(),
            agent_fifo_priority: 1,
        }
    }
}

impl SafetyConfig {
    /// Each of `be_groups` BE groups' `pids.max` on a host that hands out `host_tasks` tasks
    /// ([`default_be_pids_max`]): `None` = left as it was.
    pub fn be_pids_limit(&self, host_tasks: Option<u64>, be_groups: usize) -> Option<u64> {
        match self.be_pids_max {
            None => Some(default_be_pids_max(host_tasks, be_groups)),
            Some(0) => None,
            Some(n) => Some(n),
        }
    }

    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, p: &mut Problems) {
        if self.agent_fifo_priority > 99 {
            p.push(invalid(
                "safety.agent_fifo_priority",
                self.agent_fifo_priority,
                "must be in 0..=99 (0 = leave the agent's scheduling alone)",
            ));
        }
        if self.state_file.trim().is_empty() {
            p.push(invalid(
                "safety.state_file",
                &self.state_file,
                "must not be empty",
            ));
        } else if !self.state_file.starts_with('/') {
            // Resolved against the working directory, which a unit file and an operator's
            // shell do not share: a restart from the other one found no record, took the
            // confined settings as originals and `restore` put those back (seventh pass).
            p.push(invalid(
                "safety.state_file",
                &self.state_file,
                "a relative path is resolved against the agent's working directory, so a restart from another one finds no record of the earlier run; give an absolute path (e.g. /var/lib/headroom/state.json)",
            ));
        }
        if self.latency_max_age_ms == 0 {
            p.push(invalid("safety.latency_max_age_ms", 0, "must be > 0"));
        }
        if self.stale_disable_ticks == 0 && self.stale_disable_ms == 0 {
            p.push(invalid(
                "safety.stale_disable_ms",
                0,
                "stale_disable_ticks and stale_disable_ms cannot both be 0",
            ));
        }
        p.check(duration_s(
            "safety.violation_cooldown_s",
            self.violation_cooldown_s,
            86_400.0,
            "a cooldown above a day would keep BE shrunk after one violation",
        ));
        if let Some(psi) = self.max_memory_psi_full {
            if !(0.0..=100.0).contains(&psi) {
                p.push(invalid(
                    "safety.max_memory_psi_full",
                    psi,
                    "PSI is a percentage in [0, 100]",
                ));
            }
        }
        // Each key by its own name (both were reported as grow_interval_ms).
        for (key, v) in [
            ("safety.grow_interval_ms", self.grow_interval_ms),
            ("safety.grow_after_shrink_ms", self.grow_after_shrink_ms),
        ] {
            if v > 3_600_000 {
                p.push(invalid(
                    key,
                    v,
                    "growth pacing above one hour would stop BE growing",
                ));
            }
        }
        if let Some(bytes) = self.be_memory_limit_bytes {
            if bytes < MIN_BE_MEMORY_LIMIT_BYTES {
                p.push(invalid(
                    "safety.be_memory_limit_bytes",
                    bytes,
                    "must be at least 4194304 (4 MiB): below that v1 refuses the write \
                     (EBUSY) and v2 kills every BE task; leave it out for no limit",
                ));
            }
        }
        if let Some(n) = self.be_pids_max {
            if n != 0 && !(MIN_BE_PIDS_MAX..=MAX_BE_PIDS_MAX).contains(&n) {
                p.push(invalid(
                    "safety.be_pids_max",
                    n,
                    "must be 16..=4194304 tasks (below 16 a BE's shell cannot start its \
                     command; above 4194304 the kernel refuses it), or 0 for no limit; leave \
                     it out for the default, a quarter of the host's tasks shared among the BE groups \
                     (at most 32768)",
                ));
            }
        }
        // Device numbers are checked when read (DeviceId).
    }
}
