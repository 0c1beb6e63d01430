//! `headroom antagonist KIND`: the interference suite (Heracles §3.2/§5.1, PerfIso's bullies,
//! Leverich's square wave). Every kind runs `threads` workers that count operations into one
//! counter; the driver reports the rate once per second (docs/architecture.md, contract 5) until the duration
//! ends or a stop is requested.
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//! use headroom_workloads::antagonist::{run, AntagonistConfig, Kind};
//! let cfg = AntagonistConfig {
//!     kind: Kind::Spin,
//!     threads: 1,
//!     cpus: None,
//!     duration: Some(Duration::from_secs(2)),
//! };
//! let summary = run(&cfg, &AtomicBool::new(false), &mut |p| println!("{}", p.to_json_line()))?;
//! println!("{} ops/s", summary.ops_per_s);
//! # Ok::<(), headroom_workloads::antagonist::AntagonistError>(())
//! ```

mod cpu;
mod disk;
mod mem;
mod mix;
mod net;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::topology::{self, TopologyError};
use headroom_host::Topology;

pub use net::{is_local_address, Sink};

/// Which antagonist, with its own parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// Tight integer loop (PerfIso's CPU bully). Op = 65,536 dependent multiply-adds.
    Spin,
    /// Power virus: 256-bit FMA on every iteration (AVX2+FMA when the CPU has it, portable
    /// vector code otherwise). Op = 2^20 FMA vector instructions.
    Power,
    /// Streams through `fraction` × LLC size (read-modify-write of every cache line).
    /// Op = 1 MiB streamed.
    Llc { fraction: f64, llc_bytes: u64 },
    /// Streams through an array far larger than the LLC. Op = 1 MiB streamed.
    Dram { array_bytes: u64 },
    /// A batch job of alternating phases: `MIX_PHASE_OPS` spin ops, then as many MiB streamed
    /// through an `array_bytes` (DRAM-sized) array. Op = one spin op or one MiB streamed.
    Mix { array_bytes: u64 },
    /// Spins `on` of CPU time at the start of every `on + off` period, sleeps the rest
    /// (Leverich Fig. 5). Op = 65,536 spin iterations.
    Square { on: Duration, off: Duration },
    /// TCP flows of `size`-byte messages to `to`. Op = one message sent.
    Net {
        to: SocketAddr,
        flows: usize,
        size: usize,
        /// Also run the sink (at `to`) in this process.
        sink: bool,
    },
    /// Only the sink, listening on `listen`. Op = one `size`-byte message received.
    NetSink { listen: SocketAddr, size: usize },
    /// 33% read / 67% write sequential synchronous I/O on a file in `dir` (PerfIso's disk
    /// bully). Op = one I/O of `block_bytes`.
    Disk {
        dir: PathBuf,
        file_bytes: u64,
        block_bytes: usize,
    },
    /// Allocates up to `mb` MiB at `rate_mb_s` (0 = as fast as possible), then keeps re-touching
    /// it at that rate. Op = 1 MiB touched.
    Memory { mb: u64, rate_mb_s: f64 },
    /// Spins on the SMT siblings of `cpu` (Heracles' HyperThread antagonist). Op as spin.
    Ht { cpu: usize, siblings: Vec<usize> },
}

impl Kind {
    /// The name used on the command line and in progress lines.
    pub fn name(&self) -> &'static str {
        match self {
            Kind::Spin => "spin",
            Kind::Power => "power",
            Kind::Llc { .. } => "llc",
            Kind::Dram { .. } => "dram",
            Kind::Mix { .. } => "mix",
            Kind::Square { .. } => "square",
            Kind::Net { .. } => "net",
            Kind::NetSink { .. } => "net-sink",
            Kind::Disk { .. } => "disk",
            Kind::Memory { .. } => "memory",
            Kind::Ht { .. } => "ht",
        }
    }

    /// What one op is.
    pub fn unit(&self) -> &'static str {
        match self {
            Kind::Spin | Kind::Square { .. } | Kind::Ht { .. } => "65536 spin iterations",
            Kind::Power => "2^20 FMA vector instructions",
            Kind::Llc { .. } | Kind::Dram { .. } | Kind::Memory { .. } => "MiB",
            Kind::Mix { .. } => "65536 spin iterations or 1 MiB streamed, in equal phases",
            Kind::Net { .. } | Kind::NetSink { .. } => "messages",
            Kind::Disk { .. } => "I/Os",
        }
    }

    /// The `ht` kind for `cpu`, with its siblings from the host's topology; a clear error when
    /// the CPU has no SMT sibling.
    pub fn ht(topology: &Topology, cpu: usize) -> Result<Kind, AntagonistError> {
        let siblings: Vec<usize> = topology
            .siblings_of(cpu as u32)
            .map(|s| s.iter().map(|c| c as usize).filter(|&c| c != cpu).collect())
            .unwrap_or_default();
        if siblings.is_empty() {
            return Err(AntagonistError::NoSmtSibling { cpu });
        }
        Ok(Kind::Ht { cpu, siblings })
    }

    /// The `llc` kind for `fraction` of the host's LLC size.
    pub fn llc(topology: &Topology, fraction: f64) -> Result<Kind, AntagonistError> {
        if !(fraction > 0.0 && fraction <= 4.0) {
            return Err(AntagonistError::Usage(format!(
                "--fraction {fraction}: expected a number in (0, 4] (0.25/0.5/1.0 = LLC small/medium/big)"
            )));
        }
        Ok(Kind::Llc {
            fraction,
            llc_bytes: topology.llc_bytes.ok_or(AntagonistError::NoLlc)?,
        })
    }

    /// The `dram` kind: `mb` MiB when given, else 8 × LLC (at least 256 MiB).
    pub fn dram(topology: &Topology, mb: Option<u64>) -> Result<Kind, AntagonistError> {
        Ok(Kind::Dram {
            array_bytes: dram_array_bytes(topology, mb)?,
        })
    }

    /// The `mix` kind: its streaming phases use the `dram` array size.
    pub fn mix(topology: &Topology, mb: Option<u64>) -> Result<Kind, AntagonistError> {
        Ok(Kind::Mix {
            array_bytes: dram_array_bytes(topology, mb)?,
        })
    }
}

/// `mb` MiB when given, else 8 × LLC (at least 256 MiB): far larger than any cache.
fn dram_array_bytes(topology: &Topology, mb: Option<u64>) -> Result<u64, AntagonistError> {
    match mb {
        Some(0) => Err(AntagonistError::Usage("--mb must be at least 1".into())),
        Some(mb) => Ok(mb << 20),
        None => {
            let llc = topology.llc_bytes.unwrap_or(32 << 20);
            Ok((8 * llc).max(256 << 20))
        }
    }
}

/// One antagonist run.
#[derive(Debug, Clone)]
pub struct AntagonistConfig {
    pub kind: Kind,
    pub threads: usize,
    /// Pin worker i to `cpus[i % len]`.
    pub cpus: Option<Vec<usize>>,
    /// Run this long (None = until the stop flag is set).
    pub duration: Option<Duration>,
}

/// One progress line (docs/architecture.md, contract 5, plus `unit` and `cpu_s`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub t_unix_ms: u64,
    pub kind: String,
    pub ops_per_s: f64,
    pub ops_total: u64,
    pub threads: usize,
    /// What one op is.
    #[serde(default)]
    pub unit: String,
    /// Process CPU time (user + system) so far, seconds.
    #[serde(default)]
    pub cpu_s: f64,
}

impl Progress {
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("progress serializes")
    }
}

/// What a finished run did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub kind: String,
    pub unit: String,
    pub threads: usize,
    pub ops_total: u64,
    pub elapsed_s: f64,
    pub ops_per_s: f64,
    pub cpu_s: f64,
    /// How it ran here (SIMD path, I/O mode, sink address, …); empty when there is nothing to say.
    pub detail: String,
}

/// Errors of the antagonists.
#[derive(Debug, thiserror::Error)]
pub enum AntagonistError {
    /// Bad input from the user.
    #[error("{0}")]
    Usage(String),
    #[error("CPU {cpu} has no SMT sibling (its thread_siblings_list names only itself): the ht antagonist needs a HyperThread/SMT core")]
    NoSmtSibling { cpu: usize },
    #[error("the LLC size is unknown here (no cache size under /sys/devices/system/cpu/cpu*/cache nor in /proc/cpuinfo): the llc antagonist sizes its array from it")]
    NoLlc,
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("antagonist worker thread panicked")]
    WorkerPanicked,
}

impl AntagonistError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        AntagonistError::Io {
            what: what.into(),
            source,
        }
    }

    /// Whether the user asked for something impossible (exit code 2 on the command line).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            AntagonistError::Usage(_)
                | AntagonistError::NoSmtSibling { .. }
                | AntagonistError::Topology(TopologyError::BadCpuList { .. })
        )
    }
}

/// Shared by the workers of one run.
pub(crate) struct RunState {
    pub ops: AtomicU64,
    pub stop: AtomicBool,
}

impl RunState {
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    pub fn add(&self, n: u64) {
        self.ops.fetch_add(n, Ordering::Relaxed);
    }
}

/// Per-run prepared work: each kind's setup (sinks, files, connections) happens before the clock
/// starts; `run_thread` is the worker body.
pub(crate) trait Workload: Send + Sync {
    fn run_thread(&self, index: usize, state: &RunState) -> Result<(), AntagonistError>;
    /// How it runs on this machine (e.g. which SIMD path, which I/O mode), for the summary.
    fn detail(&self) -> String {
        String::new()
    }
}

impl AntagonistConfig {
    /// Checks threads, CPUs and duration.
    pub fn validate(&self) -> Result<(), AntagonistError> {
        if self.threads == 0 || self.threads > 4096 {
            return Err(AntagonistError::Usage(format!(
                "--threads must be between 1 and 4096, got {}",
                self.threads
            )));
        }
        if let Some(d) = self.duration {
            if d.is_zero() {
                return Err(AntagonistError::Usage("--duration must be positive".into()));
            }
        }
        if let Some(cpus) = &self.cpus {
            if cpus.is_empty() {
                return Err(AntagonistError::Usage("--cpus names no CPU".into()));
            }
            let allowed = topology::allowed_cpus()?;
            if let Some(c) = cpus.iter().find(|c| !allowed.contains(c)) {
                return Err(AntagonistError::Usage(format!(
                    "--cpus: CPU {c} is not in this process's allowed set {allowed:?}"
                )));
            }
        }
        if matches!(self.kind, Kind::Ht { .. }) && self.cpus.is_some() {
            return Err(AntagonistError::Usage(
                "ht places itself on the SMT sibling of --cpu; do not give --cpus".into(),
            ));
        }
        Ok(())
    }
}

/// Runs an antagonist until its duration passes or `stop` is set, calling `on_progress` about
/// once per second (and once for the final partial second if it lasted ≥ 0.2 s).
pub fn run(
    config: &AntagonistConfig,
    stop: &AtomicBool,
    on_progress: &mut dyn FnMut(&Progress),
) -> Result<Summary, AntagonistError> {
    config.validate()?;
    let threads = match &config.kind {
        Kind::NetSink { .. } => 1,
        _ => config.threads,
    };
    let workload: Arc<dyn Workload> = match &config.kind {
        Kind::Spin | Kind::Ht { .. } => Arc::new(cpu::Spin),
        Kind::Power => Arc::new(cpu::Power::detect()),
        Kind::Square { on, off } => Arc::new(cpu::Square::new(*on, *off)?),
        Kind::Llc {
            fraction,
            llc_bytes,
        } => Arc::new(mem::Stream::new(
            ((*llc_bytes as f64) * fraction) as u64,
            threads,
        )?),
        Kind::Dram { array_bytes } => Arc::new(mem::Stream::new(*array_bytes, threads)?),
        Kind::Mix { array_bytes } => Arc::new(mix::Mix::new(*array_bytes, threads)?),
        Kind::Memory { mb, rate_mb_s } => Arc::new(mem::Memory::new(*mb, *rate_mb_s, threads)?),
        Kind::Net {
            to,
            flows,
            size,
            sink,
        } => Arc::new(net::Flows::connect(*to, *flows, *size, *sink, threads)?),
        Kind::NetSink { listen, size } => Arc::new(net::SinkOnly::bind(*listen, *size)?),
        Kind::Disk {
            dir,
            file_bytes,
            block_bytes,
        } => Arc::new(disk::Disk::create(dir, *file_bytes, *block_bytes, threads)?),
    };
    let pins: Vec<Option<usize>> = (0..threads)
        .map(|i| match (&config.kind, &config.cpus) {
            (Kind::Ht { siblings, .. }, _) => Some(siblings[i % siblings.len()]),
            (_, Some(cpus)) => Some(cpus[i % cpus.len()]),
            _ => None,
        })
        .collect();

    let state = Arc::new(RunState {
        ops: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let mut handles = Vec::with_capacity(threads);
    for (i, pin) in pins.into_iter().enumerate() {
        let thread_state = Arc::clone(&state);
        let workload = Arc::clone(&workload);
        let h = std::thread::Builder::new()
            .name(format!("antagonist-{i}"))
            .spawn(move || -> Result<(), AntagonistError> {
                let r = (|| {
                    if let Some(cpu) = pin {
                        topology::pin_current_thread(cpu)?;
                    }
                    workload.run_thread(i, &thread_state)
                })();
                if r.is_err() {
                    // One failed worker ends the run so the error surfaces at once.
                    thread_state.stop.store(true, Ordering::SeqCst);
                }
                r
            })
            .map_err(|e| AntagonistError::io("spawning an antagonist thread", e));
        match h {
            Ok(h) => handles.push(h),
            Err(e) => {
                state.stop.store(true, Ordering::SeqCst);
                for h in handles {
                    let _ = h.join();
                }
                return Err(e);
            }
        }
    }

    let kind = config.kind.name().to_string();
    let unit = config.kind.unit().to_string();
    let start = Instant::now();
    let mut last_t = start;
    let mut last_ops = 0u64;
    let mut next_report = start + Duration::from_secs(1);
    let deadline = config.duration.map(|d| start + d);
    let make = |now: Instant, last_t: Instant, last_ops: u64, ops: u64| Progress {
        t_unix_ms: headroom_load::clock::unix_ms(),
        kind: kind.clone(),
        ops_per_s: (ops - last_ops) as f64 / now.duration_since(last_t).as_secs_f64().max(1e-9),
        ops_total: ops,
        threads,
        unit: unit.clone(),
        cpu_s: topology::process_cpu_time().as_secs_f64(),
    };
    loop {
        let now = Instant::now();
        let finished =
            stop.load(Ordering::SeqCst) || state.stopped() || deadline.is_some_and(|d| now >= d);
        if finished {
            state.stop.store(true, Ordering::SeqCst);
            break;
        }
        if now >= next_report {
            let ops = state.ops.load(Ordering::Relaxed);
            on_progress(&make(now, last_t, last_ops, ops));
            last_t = now;
            last_ops = ops;
            next_report += Duration::from_secs(1);
        }
        let mut wake = next_report;
        if let Some(d) = deadline {
            wake = wake.min(d);
        }
        // Short sleeps so a stop request is noticed within 20 ms.
        std::thread::sleep(
            wake.saturating_duration_since(now)
                .min(Duration::from_millis(20)),
        );
    }
    let mut first_err = None;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(AntagonistError::WorkerPanicked);
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    let end = Instant::now();
    let ops = state.ops.load(Ordering::Relaxed);
    if end.duration_since(last_t) >= Duration::from_millis(200) {
        on_progress(&make(end, last_t, last_ops, ops));
    }
    let elapsed = end.duration_since(start).as_secs_f64();
    Ok(Summary {
        kind,
        unit,
        threads,
        ops_total: ops,
        elapsed_s: elapsed,
        ops_per_s: ops as f64 / elapsed.max(1e-9),
        cpu_s: topology::process_cpu_time().as_secs_f64(),
        detail: workload.detail(),
    })
}

#[cfg(test)]
mod kind_tests {
    use super::{AntagonistError, Kind};
    use headroom_host::Topology;
    use headroom_types::CpuSet;

    fn topology(siblings: &[&[u32]], llc_bytes: Option<u64>) -> Topology {
        let sets: Vec<CpuSet> = siblings
            .iter()
            .map(|s| s.iter().copied().collect())
            .collect();
        Topology {
            cpus_online: sets.iter().flat_map(|s| s.iter()).collect(),
            smt_siblings: sets,
            numa_nodes: 1,
            llc_bytes,
        }
    }

    #[test]
    fn ht_spins_on_the_siblings_and_refuses_a_core_without_one() {
        let smt = topology(&[&[0, 2], &[1, 3]], Some(32 << 20));
        match Kind::ht(&smt, 1).unwrap() {
            Kind::Ht { cpu, siblings } => assert_eq!((cpu, siblings), (1, vec![3])),
            other => panic!("{other:?}"),
        }
        let no_smt = topology(&[&[0], &[1]], None);
        assert!(matches!(
            Kind::ht(&no_smt, 1),
            Err(AntagonistError::NoSmtSibling { cpu: 1 })
        ));
        assert!(matches!(
            Kind::ht(&no_smt, 7),
            Err(AntagonistError::NoSmtSibling { cpu: 7 })
        ));
    }

    #[test]
    fn llc_and_dram_size_from_the_llc_and_say_when_it_is_unknown() {
        let known = topology(&[&[0]], Some(32 << 20));
        match Kind::llc(&known, 0.5).unwrap() {
            Kind::Llc { llc_bytes, .. } => assert_eq!(llc_bytes, 32 << 20),
            other => panic!("{other:?}"),
        }
        let unknown = topology(&[&[0]], None);
        assert!(matches!(
            Kind::llc(&unknown, 0.5),
            Err(AntagonistError::NoLlc)
        ));
        assert!(Kind::llc(&known, 5.0).unwrap_err().is_usage());
        // 8 × 32 MiB; an unknown LLC counts as 32 MiB; at least 256 MiB; --mb wins.
        match Kind::dram(&known, None).unwrap() {
            Kind::Dram { array_bytes } => assert_eq!(array_bytes, 256 << 20),
            other => panic!("{other:?}"),
        }
        let big = topology(&[&[0]], Some(64 << 20));
        match Kind::mix(&big, None).unwrap() {
            Kind::Mix { array_bytes } => assert_eq!(array_bytes, 512 << 20),
            other => panic!("{other:?}"),
        }
        match Kind::dram(&unknown, Some(3)).unwrap() {
            Kind::Dram { array_bytes } => assert_eq!(array_bytes, 3 << 20),
            other => panic!("{other:?}"),
        }
        assert!(Kind::dram(&unknown, Some(0)).unwrap_err().is_usage());
    }
}
