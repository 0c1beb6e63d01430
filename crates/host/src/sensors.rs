//! Cheap sensors for tight polling loops: files are opened once and re-read with pread(2) from
//! offset 0 into a buffer that is reused, so a poll allocates nothing.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{HostError, IoOp, Result};

/// A kernel file opened once and re-read in place.
#[derive(Debug)]
pub struct PolledFile {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    len: usize,
}

impl PolledFile {
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let file = File::open(&path).map_err(|e| HostError::io(IoOp::Open, &path, None, e))?;
        Ok(PolledFile {
            path,
            file,
            buf: vec![0; 4096],
            len: 0,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-reads the whole file; the buffer only grows (rarely) when the file outgrows it.
    pub fn read(&mut self) -> Result<&[u8]> {
        let mut len = 0;
        loop {
            if len == self.buf.len() {
                let new_len = self.buf.len() * 2;
                self.buf.resize(new_len, 0);
            }
            let n = self
                .file
                .read_at(&mut self.buf[len..], len as u64)
                .map_err(|e| HostError::io(IoOp::Read, &self.path, None, e))?;
            if n == 0 {
                break;
            }
            len += n;
        }
        self.len = len;
        Ok(&self.buf[..len])
    }

    /// Re-reads a file the kernel writes as one record (a one-line proc file): one pread, and a
    /// read shorter than the buffer is the whole file (the second pread, which would return 0,
    /// is saved); a read that fills the buffer goes on as [`PolledFile::read`].
    pub fn read_record(&mut self) -> Result<&[u8]> {
        let n = self
            .file
            .read_at(&mut self.buf, 0)
            .map_err(|e| HostError::io(IoOp::Read, &self.path, None, e))?;
        if n == self.buf.len() {
            return self.read();
        }
        self.len = n;
        Ok(&self.buf[..n])
    }

    /// The last content read, as text.
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

/// Cumulative time of one CPU from `/proc/stat`, in USER_HZ ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuTimes {
    pub cpu: usize,
    pub user: u64,
    pub nice: u64,
    pub system: u64,
    pub idle: u64,
    pub iowait: u64,
    pub irq: u64,
    pub softirq: u64,
    pub steal: u64,
}

impl CpuTimes {
    /// Idle time (idle + iowait).
    pub fn idle_ticks(&self) -> u64 {
        self.idle + self.iowait
    }

    /// Busy time (everything else; guest time is already inside user).
    pub fn busy_ticks(&self) -> u64 {
        self.user + self.nice + self.system + self.irq + self.softirq + self.steal
    }

    pub fn total_ticks(&self) -> u64 {
        self.idle_ticks() + self.busy_ticks()
    }
}

/// Per-CPU times from `/proc/stat`, re-read without allocating.
#[derive(Debug)]
pub struct ProcStatReader {
    file: PolledFile,
    cpus: Vec<CpuTimes>,
}

impl ProcStatReader {
    /// Opens `<root>/proc/stat`.
    pub fn open(root: &Path) -> Result<Self> {
        Ok(ProcStatReader {
            file: PolledFile::open(root.join("proc/stat"))?,
            cpus: Vec::with_capacity(64),
        })
    }

    /// Reads the per-CPU lines (`cpuN …`); the slice is ordered as the kernel lists them
    /// (online CPUs only).
    pub fn read(&mut self) -> Result<&[CpuTimes]> {
        self.file.read()?;
        self.cpus.clear();
        let text = self.file.text();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("cpu") else {
                if !self.cpus.is_empty() {
                    break; // per-CPU lines are contiguous
                }
                continue;
            };
            if rest.starts_with(' ') {
                continue; // the aggregate line
            }
            let times = parse_cpu_line(rest)
                .ok_or_else(|| HostError::parse(self.file.path(), line, "malformed cpu line"))?;
            self.cpus.push(times);
        }
        if self.cpus.is_empty() {
            return Err(HostError::parse(self.file.path(), text, "no per-CPU lines"));
        }
        Ok(&self.cpus)
    }
}

fn parse_cpu_line(rest: &str) -> Option<CpuTimes> {
    let mut parts = rest.split_ascii_whitespace();
    let cpu = parts.next()?.parse().ok()?;
    let mut field = || -> Option<u64> { parts.next().map_or(Some(0), |v| v.parse().ok()) };
    Some(CpuTimes {
        cpu,
        user: field()?,
        nice: field()?,
        system: field()?,
        idle: field()?,
        iowait: field()?,
        irq: field()?,
        softirq: field()?,
        steal: field()?,
    })
}

/// Per-CPU idle fraction between consecutive samples (PerfIso's idle-core signal).
#[derive(Debug)]
pub struct CpuIdleSampler {
    reader: ProcStatReader,
    prev: Vec<CpuTimes>,
    idle: Vec<(usize, f64)>,
    scratch: Vec<(usize, f64)>,
}

impl CpuIdleSampler {
    pub fn open(root: &Path) -> Result<Self> {
        let mut reader = ProcStatReader::open(root)?;
        let prev = reader.read()?.to_vec();
        let idle = prev
            .iter()
            .map(|t| {
                let total = t.total_ticks().max(1);
                (t.cpu, t.idle_ticks() as f64 / total as f64)
            })
            .collect::<Vec<_>>();
        Ok(CpuIdleSampler {
            reader,
            prev,
            scratch: Vec::with_capacity(idle.len()),
            idle,
        })
    }

    /// `(cpu, idle fraction 0..=1)` since the previous sample. A CPU whose counters did not move
    /// (sampled faster than the kernel's tick) keeps its previous fraction.
    pub fn sample(&mut self) -> Result<&[(usize, f64)]> {
        let now = self.reader.read()?;
        self.scratch.clear();
        for cur in now {
            let before = self.prev.iter().find(|p| p.cpu == cur.cpu);
            let last = self
                .idle
                .iter()
                .find(|(c, _)| *c == cur.cpu)
                .map(|(_, f)| *f);
            let fraction = match before {
                Some(b) if cur.total_ticks() > b.total_ticks() => {
                    let total = cur.total_ticks() - b.total_ticks();
                    let idle_ticks = cur.idle_ticks().saturating_sub(b.idle_ticks());
                    (idle_ticks as f64 / total as f64).clamp(0.0, 1.0)
                }
                _ => last.unwrap_or(0.0),
            };
            self.scratch.push((cur.cpu, fraction));
        }
        self.prev.clear();
        self.prev.extend_from_slice(now);
        std::mem::swap(&mut self.idle, &mut self.scratch);
        Ok(&self.idle)
    }

    /// The reader underneath (for raw counters).
    pub fn reader_mut(&mut self) -> &mut ProcStatReader {
        &mut self.reader
    }
}

/// One thread's scheduler statistics (`/proc/<pid>/task/<tid>/schedstat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ThreadSchedstat {
    /// Time spent on a CPU (ns).
    pub run_ns: u64,
    /// Time spent runnable but waiting on a run queue (ns): the scheduling delay.
    pub wait_ns: u64,
    /// Number of times it ran.
    pub timeslices: u64,
}

/// A thread's schedstat, re-read without allocating.
#[derive(Debug)]
pub struct SchedstatReader {
    file: PolledFile,
}

impl SchedstatReader {
    /// Opens `<root>/proc/<pid>/task/<tid>/schedstat`.
    pub fn open(root: &Path, pid: i32, tid: i32) -> Result<Self> {
        Ok(SchedstatReader {
            file: PolledFile::open(root.join(format!("proc/{pid}/task/{tid}/schedstat")))?,
        })
    }

    pub fn read(&mut self) -> Result<ThreadSchedstat> {
        // one line, produced whole by the kernel: one pread per read
        self.file.read_record()?;
        let text = self.file.text();
        let mut parts = text.split_ascii_whitespace().map(|v| v.parse::<u64>());
        match (parts.next(), parts.next(), parts.next()) {
            (Some(Ok(run_ns)), Some(Ok(wait_ns)), Some(Ok(timeslices))) => Ok(ThreadSchedstat {
                run_ns,
                wait_ns,
                timeslices,
            }),
            _ => Err(HostError::parse(
                self.file.path(),
                text,
                "expected `RUN_NS WAIT_NS SLICES`",
            )),
        }
    }
}

/// A PSI resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PsiResource {
    Cpu,
    Memory,
    Io,
}

impl PsiResource {
    pub fn name(self) -> &'static str {
        match self {
            PsiResource::Cpu => "cpu",
            PsiResource::Memory => "memory",
            PsiResource::Io => "io",
        }
    }
}

/// One PSI line: share of wall time stalled (percent) over 10/60/300 s, and the total in µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PsiLine {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total_us: u64,
}

/// Pressure stall information of one resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Psi {
    /// Some tasks stalled.
    pub some: PsiLine,
    /// All non-idle tasks stalled (absent for system-wide CPU on old kernels).
    pub full: Option<PsiLine>,
}

/// Parses a `*.pressure` / `/proc/pressure/*` file.
pub fn parse_psi(path: &Path, text: &str) -> Result<Psi> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let kind = parts.next();
        let mut psi = PsiLine::default();
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| HostError::parse(path, text, "expected KEY=VALUE"))?;
            let bad = || HostError::parse(path, text, format!("bad value for `{k}`"));
            match k {
                "avg10" => psi.avg10 = v.parse().map_err(|_| bad())?,
                "avg60" => psi.avg60 = v.parse().map_err(|_| bad())?,
                "avg300" => psi.avg300 = v.parse().map_err(|_| bad())?,
                "total" => psi.total_us = v.parse().map_err(|_| bad())?,
                _ => {}
            }
        }
        match kind {
            Some("some") => some = Some(psi),
            Some("full") => full = Some(psi),
            _ => {}
        }
    }
    Ok(Psi {
        some: some.ok_or_else(|| HostError::parse(path, text, "no `some` line"))?,
        full,
    })
}

/// System memory from `/proc/meminfo`, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemInfo {
    pub total: u64,
    pub free: u64,
    pub available: u64,
}

/// Parses `/proc/meminfo` (values in kB).
pub fn parse_meminfo(path: &Path, text: &str) -> Result<MemInfo> {
    let field = |key: &str| -> Result<u64> {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
                let kb: u64 = rest
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| {
                        HostError::parse(path, text, format!("bad value for `{key}`"))
                    })?;
                return Ok(kb * 1024);
            }
        }
        Err(HostError::parse(path, text, format!("no `{key}` line")))
    };
    Ok(MemInfo {
        total: field("MemTotal")?,
        free: field("MemFree")?,
        available: field("MemAvailable")?,
    })
}

/// Byte and packet counters of a network device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetDevStats {
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
}

/// Finds `device` in `/proc/net/dev` text.
pub fn parse_proc_net_dev(path: &Path, text: &str, device: &str) -> Result<NetDevStats> {
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        if name.trim() != device {
            continue;
        }
        let v: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if v.len() < 10 {
            return Err(HostError::parse(path, line, "expected 16 counters"));
        }
        return Ok(NetDevStats {
            rx_bytes: v[0],
            rx_packets: v[1],
            tx_bytes: v[8],
            tx_packets: v[9],
        });
    }
    Err(HostError::unavailable(
        format!("network device {device}"),
        format!("not listed in {}", path.display()),
    ))
}

#[cfg(test)]
mod polled_file_tests {
    use super::*;

    #[test]
    fn a_kept_open_record_reread_gives_fresh_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("schedstat");
        std::fs::write(&path, "1 2 3\n").expect("write");
        let mut r = SchedstatReader {
            file: PolledFile::open(&path).expect("open"),
        };
        assert_eq!(r.read().expect("read").wait_ns, 2);
        std::fs::write(&path, "10 20000 30\n").expect("rewrite");
        let s = r.read().expect("re-read");
        assert_eq!((s.run_ns, s.wait_ns, s.timeslices), (10, 20000, 30));
        // shorter than before: nothing of the old content is left over
        std::fs::write(&path, "4 5 6\n").expect("rewrite");
        let s = r.read().expect("re-read");
        assert_eq!((s.run_ns, s.wait_ns, s.timeslices), (4, 5, 6));
    }

    #[test]
    fn a_record_larger_than_the_buffer_is_read_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big");
        let text = "x".repeat(10_000) + "end";
        std::fs::write(&path, &text).expect("write");
        let mut f = PolledFile::open(&path).expect("open");
        assert_eq!(f.read_record().expect("read").len(), text.len());
        assert!(f.text().ends_with("end"));
    }

    #[test]
    fn this_threads_schedstat_is_read() {
        let Ok(mut r) = SchedstatReader::open(
            Path::new("/"),
            std::process::id() as i32,
            std::process::id() as i32,
        ) else {
            eprintln!("SKIP this_threads_schedstat_is_read: no /proc/PID/task/TID/schedstat here");
            return;
        };
        let a = r.read().expect("read");
        let b = r.read().expect("re-read");
        assert!(b.run_ns >= a.run_ns && b.timeslices >= a.timeslices);
    }
}
