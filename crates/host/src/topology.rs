//! CPU topology from sysfs: online CPUs, SMT siblings, NUMA nodes, LLC size.

use std::path::Path;

use crate::error::{HostError, IoOp, Result};
use headroom_types::values::CpuSet;

/// What the machine's CPUs look like.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Topology {
    pub cpus_online: CpuSet,
    /// Distinct SMT sibling groups (one entry per physical core).
    pub smt_siblings: Vec<CpuSet>,
    pub numa_nodes: usize,
    /// Last-level cache size in bytes, if the kernel tells.
    pub llc_bytes: Option<u64>,
}

impl Topology {
    /// True when some core has more than one hardware thread.
    pub fn smt(&self) -> bool {
        self.smt_siblings.iter().any(|s| s.len() > 1)
    }

    /// The siblings of `cpu` (itself included).
    pub fn siblings_of(&self, cpu: u32) -> Option<&CpuSet> {
        self.smt_siblings.iter().find(|s| s.contains(cpu))
    }

    /// Reads the topology below `root`.
    pub fn read(root: &Path) -> Result<Self> {
        let cpu_dir = root.join("sys/devices/system/cpu");
        let online_path = cpu_dir.join("online");
        let cpus_online = match std::fs::read_to_string(&online_path) {
            Ok(text) => CpuSet::parse_list(&text)
                .map_err(|e| HostError::parse(&online_path, &text, e.to_string()))?,
            Err(e) => return Err(HostError::io(IoOp::Read, &online_path, None, e)),
        };
        let mut smt_siblings: Vec<CpuSet> = Vec::new();
        for cpu in cpus_online.iter() {
            let path = cpu_dir.join(format!("cpu{cpu}/topology/thread_siblings_list"));
            let siblings = match std::fs::read_to_string(&path) {
                Ok(text) => CpuSet::parse_list(&text)
                    .map_err(|e| HostError::parse(&path, &text, e.to_string()))?,
                Err(_) => [cpu].into_iter().collect(),
            };
            if !smt_siblings.contains(&siblings) {
                smt_siblings.push(siblings);
            }
        }
        let numa_nodes = std::fs::read_to_string(root.join("sys/devices/system/node/online"))
            .ok()
            .and_then(|t| CpuSet::parse_list(&t).ok())
            .map_or(1, |s| s.len().max(1));
        let first = cpus_online.iter().next().unwrap_or(0);
        Ok(Topology {
            llc_bytes: llc_bytes(root, first as usize),
            cpus_online,
            smt_siblings,
            numa_nodes,
        })
    }
}

/// Parses a sysfs cache size (`32768K`, `8M`, `512`).
pub fn parse_cache_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, mult) = match t.chars().last()? {
        'K' | 'k' => (&t[..t.len() - 1], 1024),
        'M' | 'm' => (&t[..t.len() - 1], 1024 * 1024),
        'G' | 'g' => (&t[..t.len() - 1], 1024 * 1024 * 1024),
        _ => (t, 1),
    };
    digits.trim().parse::<u64>().ok().map(|v| v * mult)
}

/// The largest-level unified/data cache of `cpu` (level 3 normally), else `/proc/cpuinfo`'s
/// `cache size`.
fn llc_bytes(root: &Path, cpu: usize) -> Option<u64> {
    let cache = root.join(format!("sys/devices/system/cpu/cpu{cpu}/cache"));
    let mut best: Option<(u32, u64)> = None;
    if let Ok(entries) = std::fs::read_dir(&cache) {
        for entry in entries.flatten() {
            let dir = entry.path();
            if !entry.file_name().to_string_lossy().starts_with("index") {
                continue;
            }
            let level = std::fs::read_to_string(dir.join("level"))
                .ok()
                .and_then(|l| l.trim().parse::<u32>().ok());
            let kind = std::fs::read_to_string(dir.join("type")).unwrap_or_default();
            let size = std::fs::read_to_string(dir.join("size"))
                .ok()
                .and_then(|s| parse_cache_size(&s));
            if kind.trim() == "Instruction" {
                continue;
            }
            if let (Some(level), Some(size)) = (level, size) {
                if best.is_none_or(|(l, _)| level > l) {
                    best = Some((level, size));
                }
            }
        }
    }
    if let Some((_, size)) = best {
        return Some(size);
    }
    let cpuinfo = std::fs::read_to_string(root.join("proc/cpuinfo")).ok()?;
    cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("cache size")
                .and_then(|r| r.split(':').nth(1))
        })
        .and_then(|v| parse_cache_size(&v.replace(" KB", "K").replace(" MB", "M")))
}
