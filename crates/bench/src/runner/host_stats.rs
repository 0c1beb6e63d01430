//! What the bench reads from the host around a run: the machine's description, /proc/stat
//! jiffies (idle and steal shares), and the antagonists' progress files.

use super::Runner;
use std::path::Path;

use serde_json::Value;

use crate::model::Machine;

/// Records the machine: kernel, CPU model, CPU count, host name and `doctor --json`.
pub fn record_machine(runner: &Runner, notes: &mut Vec<String>) -> Machine {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
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

/// Busy and total jiffies of the given CPUs from a `/proc/stat`-format file.
pub fn cpu_jiffies(proc_stat: &Path, cpus: &[usize]) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(proc_stat).ok()?;
    let mut idle = 0;
    let mut total = 0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cpu") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let Some(Ok(n)) = parts.next().map(str::parse::<usize>) else {
            continue;
        };
        if !cpus.contains(&n) {
            continue;
        }
        let f: Vec<u64> = parts.filter_map(|x| x.parse().ok()).collect();
        if f.len() < 5 {
            continue;
        }
        // user nice system idle iowait irq softirq steal: idle + iowait count as idle.
        idle += f[3] + f[4];
        total += f.iter().take(8).sum::<u64>();
    }
    Some((idle, total))
}

/// Steal and total jiffies of the whole machine (the `cpu` line of a `/proc/stat`-format file):
/// time the hypervisor ran something else while this VM's vCPUs wanted to run.
pub fn steal_jiffies(proc_stat: &Path) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(proc_stat).ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if f.len() < 8 {
        return None;
    }
    Some((f[7], f.iter().take(8).sum()))
}

/// Steal (percent of all CPU time) since `before`, a [`steal_jiffies`] reading of the same file.
pub fn steal_pct_since(before: Option<(u64, u64)>, proc_stat: &Path) -> Option<f64> {
    idle_pct(before?, steal_jiffies(proc_stat)?)
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
