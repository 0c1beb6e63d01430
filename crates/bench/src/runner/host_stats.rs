//! What the bench reads from the host around a run (through the host crate): the machine's
//! description, CPU ticks (idle and steal shares), and the antagonists' progress files.

use super::Runner;
use std::path::Path;

use headroom_host::LinuxHost;
use serde_json::Value;

use headroom_report::model::Machine;

/// Records the machine: kernel, CPU model, CPU count, host name and `doctor --json`.
pub fn record_machine(runner: &Runner, notes: &mut Vec<String>) -> Machine {
    let host = LinuxHost::new("/");
    let kernel = host.kernel_release().unwrap_or_else(|_| "unknown".into());
    let cpu_model = host.cpu_model().unwrap_or_else(|_| "unknown".into());
    let hostname = host.hostname().unwrap_or_default();
    let doctor = match runner.doctor() {
        Ok(v) => Some(v),
        Err(e) => {
            notes.push(format!("`headroom doctor --json` failed: {e}"));
            None
        }
    };
    if !runner.pin {
        notes.push(
            "taskset was not found: the load generator was NOT pinned apart from the LC and BE."
                .into(),
        );
    }
    Machine {
        kernel,
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        hostname,
        doctor,
        loadgen_cpus: runner.placement.loadgen.clone(),
        server_cpus: runner.placement.server.clone(),
        be_cpus: runner.placement.be_cpus().to_vec(),
    }
}

/// `(t_unix_ms, ops_total)` samples of an antagonist's progress file (contract 5); lines that do
/// not parse (a half-written last line) are skipped.
pub fn read_progress(path: &Path) -> Vec<(u64, f64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut v: Vec<(u64, f64)> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|j| Some((j.get("t_unix_ms")?.as_u64()?, j.get("ops_total")?.as_f64()?)))
        .collect();
    v.sort_by_key(|s| s.0);
    v
}

/// `(ops_total, cpu_s)` at the first and last progress lines that report the BE's own CPU time
/// (`cpu_s`, an optional field beside contract 5), `None` without two such lines.
pub fn progress_cpu_span(path: &Path) -> Option<((f64, f64), (f64, f64))> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|j| Some((j.get("ops_total")?.as_f64()?, j.get("cpu_s")?.as_f64()?)))
        .collect();
    if v.len() < 2 {
        return None;
    }
    Some((v[0], v[v.len() - 1]))
}

/// Idle and total ticks of the given CPUs now (the host's `/proc/stat` reader); `None` when
/// unreadable.
pub fn cpu_jiffies(cpus: &[usize]) -> Option<(u64, u64)> {
    let times = LinuxHost::new("/").cpu_times().ok()?;
    Some(
        times
            .iter()
            .filter(|t| cpus.contains(&t.cpu))
            .fold((0, 0), |(idle, total), t| {
                (idle + t.idle_ticks(), total + t.total_ticks())
            }),
    )
}

/// Steal and total ticks of the whole machine now: time the hypervisor ran something else
/// while this VM's vCPUs wanted to run.
pub fn steal_jiffies() -> Option<(u64, u64)> {
    let times = LinuxHost::new("/").cpu_times().ok()?;
    Some(times.iter().fold((0, 0), |(steal, total), t| {
        (steal + t.steal, total + t.total_ticks())
    }))
}

/// Steal (percent of all CPU time) since `before`, a [`steal_jiffies`] reading.
pub fn steal_pct_since(before: Option<(u64, u64)>) -> Option<f64> {
    idle_pct(before?, steal_jiffies()?)
}

/// Share (percent) of the first count in the second between two readings of ([`cpu_jiffies`]
/// idle or [`steal_jiffies`] steal, total).
pub fn idle_pct(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let dt = after.1.checked_sub(before.1)?;
    if dt == 0 {
        return None;
    }
    Some((after.0.saturating_sub(before.0)) as f64 / dt as f64 * 100.0)
}
