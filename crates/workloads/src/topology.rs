//! CPU lists, affinity, cache and SMT topology from sysfs, and process CPU time: what serve and
//! the antagonists need to place themselves. Sysfs readers take the sysfs root as a parameter so
//! they are tested against fake trees.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sched::{sched_getaffinity, CpuSet};
use nix::unistd::Pid;

/// Errors reading topology or changing affinity.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("bad CPU list {input:?}: {reason}")]
    BadCpuList { input: String, reason: String },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad cache size {value:?} in {path}")]
    BadCacheSize { path: PathBuf, value: String },
    #[error("no level-3 cache listed under {dir}")]
    NoLlc { dir: PathBuf },
    #[error("{what}: {source}")]
    Sys { what: String, source: nix::Error },
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
    let set = sched_getaffinity(Pid::from_raw(0)).map_err(|source| TopologyError::Sys {
        what: "sched_getaffinity".into(),
        source,
    })?;
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> Result<(), TopologyError> {
    headroom_host::sched::pin_this_thread(cpu).map_err(|e| TopologyError::Sys {
        what: format!("sched_setaffinity to CPU {cpu}"),
        source: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EINVAL)),
    })
}

fn read_trimmed(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| TopologyError::Read {
            path: path.to_path_buf(),
            source,
        })
}

/// Parses sysfs cache sizes like `32768K`, `1M`, `512`.
fn parse_cache_size(value: &str) -> Option<u64> {
    let v = value.trim();
    let (num, mult) = match v.chars().last()? {
        'K' | 'k' => (&v[..v.len() - 1], 1u64 << 10),
        'M' | 'm' => (&v[..v.len() - 1], 1 << 20),
        'G' | 'g' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// LLC (level-3) size in bytes from `<sysfs>/devices/system/cpu/cpu0/cache/index*/`.
/// `sysfs` is normally `/sys`.
pub fn llc_bytes(sysfs: &Path) -> Result<u64, TopologyError> {
    let dir = sysfs.join("devices/system/cpu/cpu0/cache");
    let entries = std::fs::read_dir(&dir).map_err(|source| TopologyError::Read {
        path: dir.clone(),
        source,
    })?;
    let mut best: Option<u64> = None;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("index") {
            continue;
        }
        let level_path = entry.path().join("level");
        let Ok(level) = read_trimmed(&level_path) else {
            continue;
        };
        if level != "3" {
            continue;
        }
        let size_path = entry.path().join("size");
        let size = read_trimmed(&size_path)?;
        let bytes = parse_cache_size(&size).ok_or_else(|| TopologyError::BadCacheSize {
            path: size_path.clone(),
            value: size.clone(),
        })?;
        best = Some(best.map_or(bytes, |b: u64| b.max(bytes)));
    }
    best.ok_or(TopologyError::NoLlc { dir })
}

/// The SMT siblings of `cpu` (other logical CPUs on the same core), from
/// `<sysfs>/devices/system/cpu/cpuN/topology/thread_siblings_list`.
pub fn smt_siblings(sysfs: &Path, cpu: usize) -> Result<Vec<usize>, TopologyError> {
    let path = sysfs.join(format!(
        "devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    ));
    let list = read_trimmed(&path)?;
    Ok(parse_cpu_list(&list)?
        .into_iter()
        .filter(|&c| c != cpu)
        .collect())
}

/// CPU time (user + system) of this process so far.
pub fn process_cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF is valid and `ru` is a valid out pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
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
    fn llc_and_siblings_from_a_fake_sysfs() {
        let root = tempfile::tempdir().unwrap();
        let cache = root.path().join("devices/system/cpu/cpu0/cache");
        for (idx, level, size) in [(0, "1", "32K"), (2, "2", "1024K"), (3, "3", "32768K")] {
            let d = cache.join(format!("index{idx}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        assert_eq!(llc_bytes(root.path()).unwrap(), 32 << 20);
        let topo = root.path().join("devices/system/cpu/cpu1/topology");
        std::fs::create_dir_all(&topo).unwrap();
        std::fs::write(topo.join("thread_siblings_list"), "1,9\n").unwrap();
        assert_eq!(smt_siblings(root.path(), 1).unwrap(), vec![9]);
        std::fs::write(topo.join("thread_siblings_list"), "1\n").unwrap();
        assert!(smt_siblings(root.path(), 1).unwrap().is_empty());
        let empty = tempfile::tempdir().unwrap();
        assert!(llc_bytes(empty.path()).is_err());
    }

    #[test]
    fn own_cpu_time_counts_work() {
        crate::serve::work::burn_cpu(Duration::from_millis(30));
        assert!(process_cpu_time() >= Duration::from_millis(30));
    }
}
