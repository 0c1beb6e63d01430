//! Sensors → [`Observation`], once per tick.
//!
//! Per tick (cheap, what blind isolation needs at 1 ms): per-CPU idle — from the BPF idle
//! tracker when it loads (ns-exact, current, one syscall), else from `/proc/stat` (10 ms units,
//! busy time by the tick) — and the latest LC latency/load published by the source threads. Every [`SLOW_PERIOD`]: the LC
//! threads' affinity and run-queue delay, group CPU usage, PSI, memory. A failing sensor leaves
//! its field `None` and is counted by name (the `headroom_sensor_errors_total` metric).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_host::idle_bpf::BpfIdleSampler;
use headroom_host::{Cgroups, CpuIdleSampler, GroupPath, LinuxHost, PsiResource};

use crate::config::IdleSensor;

use crate::lc_signal::SignalCell;
use crate::observation::Observation;

/// How often the slower sensors are read.
pub const SLOW_PERIOD: Duration = Duration::from_millis(100);

/// PSI is read every this many slow samples (1 s).
const PSI_EVERY_SLOW: u64 = 10;

/// The LC group's thread list is re-read every this many slow samples (1 s).
const THREAD_LIST_EVERY_SLOW: u64 = 10;

/// Where the LC signals come from (cells filled by source threads).
#[derive(Debug, Clone, Default)]
pub struct LcSignals {
    pub latency: Option<Arc<SignalCell>>,
    pub qps: Option<Arc<SignalCell>>,
    /// `lc.load.peak_qps`.
    pub peak_qps: Option<f64>,
}

/// The per-CPU idle sensor in use.
pub enum IdleSource {
    Bpf(Box<BpfIdleSampler>),
    ProcStat(CpuIdleSampler),
}

impl IdleSource {
    /// Opens the sensor `choice` asks for (`Auto`: BPF, falling back to `/proc/stat` with the
    /// reason logged).
    pub fn open(
        host: &LinuxHost,
        choice: IdleSensor,
    ) -> Result<IdleSource, headroom_host::HostError> {
        let bpf = || BpfIdleSampler::attach(host.root()).map(|s| IdleSource::Bpf(Box::new(s)));
        match choice {
            IdleSensor::Bpf => bpf(),
            IdleSensor::ProcStat => host.idle_sampler().map(IdleSource::ProcStat),
            IdleSensor::Auto => bpf().or_else(|e| {
                tracing::info!(reason = %e, "BPF idle sensor unavailable; using /proc/stat (10 ms resolution)");
                host.idle_sampler().map(IdleSource::ProcStat)
            }),
        }
    }

    /// `"bpf"` or `"proc_stat"`.
    pub fn name(&self) -> &'static str {
        match self {
            IdleSource::Bpf(_) => "bpf",
            IdleSource::ProcStat(_) => "proc_stat",
        }
    }

    fn sample(&mut self) -> Result<&[(usize, f64)], headroom_host::HostError> {
        match self {
            IdleSource::Bpf(s) => s.sample(),
            IdleSource::ProcStat(s) => s.sample(),
        }
    }
}

/// Reads the machine and the groups into observations.
pub struct Sensors {
    cgroups: Cgroups,
    idle: Option<IdleSource>,
    host: LinuxHost,
    lc: GroupPath,
    be: Vec<GroupPath>,
    signals: LcSignals,
    slow_due: Instant,
    slow: Observation,
    usage_prev: Option<(Instant, u64, u64)>,
    runq_prev: BTreeMap<i32, (u64, u64)>,
    errors: BTreeMap<&'static str, u64>,
    idle_scratch: Vec<f64>,
    slow_count: u64,
    schedstat_readers: BTreeMap<i32, headroom_host::sensors::SchedstatReader>,
    lc_tids: Vec<i32>,
}

impl Sensors {
    pub fn new(
        host: &LinuxHost,
        cgroups: Cgroups,
        lc: GroupPath,
        be: Vec<GroupPath>,
        signals: LcSignals,
        idle_sensor: IdleSensor,
    ) -> Result<Sensors, headroom_host::HostError> {
        let mut errors = BTreeMap::new();
        let idle = match IdleSource::open(host, idle_sensor) {
            Ok(s) => {
                tracing::info!(sensor = s.name(), "per-CPU idle sensor");
                Some(s)
            }
            // `sensors.idle = "bpf"` asked for it: refuse to start without it.
            Err(e) if idle_sensor == IdleSensor::Bpf => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "no per-CPU idle sensor");
                errors.insert("cpu_idle", 1);
                None
            }
        };
        Ok(Sensors {
            cgroups,
            idle,
            host: host.clone(),
            lc,
            be,
            signals,
            slow_due: Instant::now(),
            slow: Observation::default(),
            usage_prev: None,
            runq_prev: BTreeMap::new(),
            errors,
            idle_scratch: Vec::new(),
            slow_count: 0,
            schedstat_readers: BTreeMap::new(),
            lc_tids: Vec::new(),
        })
    }

    /// The idle sensor in use (`None` when none could be opened).
    pub fn idle_source(&self) -> Option<&'static str> {
        self.idle.as_ref().map(IdleSource::name)
    }

    /// Errors per sensor name since start.
    pub fn errors(&self) -> &BTreeMap<&'static str, u64> {
        &self.errors
    }

    fn count_error(&mut self, name: &'static str, e: &dyn std::fmt::Display) {
        let n = self.errors.entry(name).or_insert(0);
        *n += 1;
        if *n == 1 || n.is_power_of_two() {
            tracing::warn!(sensor = name, error = %e, count = *n, "sensor error");
        }
    }

    /// One tick's observation.
    pub fn sample(&mut self, now: Instant) -> Observation {
        if now >= self.slow_due {
            self.slow_due = now + SLOW_PERIOD;
            self.sample_slow(now);
        }
        let mut obs = self.slow.clone();
        if let Some(sampler) = self.idle.as_mut() {
            match sampler.sample() {
                Ok(per_cpu) => {
                    self.idle_scratch.clear();
                    for &(cpu, frac) in per_cpu {
                        if self.idle_scratch.len() <= cpu {
                            self.idle_scratch.resize(cpu + 1, 0.0);
                        }
                        self.idle_scratch[cpu] = frac;
                    }
                    obs.cpu_idle = Some(self.idle_scratch.clone());
                }
                Err(e) => self.count_error("cpu_idle", &e),
            }
        }
        if let Some(cell) = &self.signals.latency {
            if let Some(r) = cell.latest() {
                obs.lc_latency_us = Some(r.value);
                obs.lc_latency_age_ms =
                    Some(now.saturating_duration_since(r.at).as_millis() as u64);
            }
        }
        if let Some(cell) = &self.signals.qps {
            if let Some(r) = cell.latest() {
                obs.lc_qps = Some(r.value);
                obs.lc_load = self
                    .signals
                    .peak_qps
                    .filter(|p| *p > 0.0)
                    .map(|p| r.value / p);
                obs.lc_load_age_ms = Some(now.saturating_duration_since(r.at).as_millis() as u64);
            }
        }
        obs
    }

    fn sample_slow(&mut self, now: Instant) {
        let mut o = Observation::default();
        // LC threads: their CPUs (union of affinities) and run-queue delay. The thread list
        // (a cgroup pid-list read, the dearest read here) is refreshed once a second, or at
        // once while empty; the known threads' affinity and schedstat every slow sample.
        self.slow_count += 1;
        let refresh = self.lc_tids.is_empty() || self.slow_count % THREAD_LIST_EVERY_SLOW == 1;
        let listed = if refresh {
            self.cgroups
                .threads(&self.lc)
                .inspect(|t| self.lc_tids.clone_from(t))
        } else {
            Ok(self.lc_tids.clone())
        };
        match listed {
            Ok(tids) if !tids.is_empty() => {
                let mut cpus: Vec<u32> = Vec::new();
                let (mut wait, mut slices) = (0u64, 0u64);
                let mut seen = BTreeMap::new();
                let mut kept = BTreeMap::new();
                for &tid in &tids {
                    if let Ok(set) = headroom_host::sched::affinity(tid) {
                        cpus.extend(set.iter().map(|c| c as u32));
                    }
                    // Readers stay open across samples (one pread each, not an open).
                    let reader = match self.schedstat_readers.remove(&tid) {
                        Some(r) => Some(r),
                        None => self.host.schedstat(tid, tid).ok(),
                    };
                    if let Some(mut r) = reader {
                        if let Ok(s) = r.read() {
                            if let Some((w0, n0)) = self.runq_prev.get(&tid) {
                                wait += s.wait_ns.saturating_sub(*w0);
                                slices += s.timeslices.saturating_sub(*n0);
                            }
                            seen.insert(tid, (s.wait_ns, s.timeslices));
                            kept.insert(tid, r);
                        }
                    }
                }
                self.runq_prev = seen;
                // threads gone since the last sample drop their readers here
                self.schedstat_readers = kept;
                cpus.sort_unstable();
                cpus.dedup();
                o.lc_cpus = (!cpus.is_empty()).then_some(cpus);
                if slices > 0 {
                    o.lc_runq_delay_us = Some(wait as f64 / slices as f64 / 1000.0);
                }
            }
            Ok(_) => {}
            Err(e) => self.count_error("lc_threads", &e),
        }
        // Group CPU usage in CPUs since the last slow sample.
        let lc_ns = self.cgroups.cpu_usage_ns(&self.lc);
        let be_ns: Result<u64, _> = self.be.iter().map(|g| self.cgroups.cpu_usage_ns(g)).sum();
        match (lc_ns, be_ns) {
            (Ok(lc), Ok(be)) => {
                if let Some((t, lc0, be0)) = self.usage_prev {
                    let dt = now.saturating_duration_since(t).as_nanos().max(1) as f64;
                    o.lc_cpu_usage = Some(lc.saturating_sub(lc0) as f64 / dt);
                    o.be_cpu_usage = Some(be.saturating_sub(be0) as f64 / dt);
                }
                self.usage_prev = Some((now, lc, be));
            }
            (Err(e), _) | (_, Err(e)) => self.count_error("cgroup_cpu_usage", &e),
        }
        // PSI's shortest average is over 10 s: once a second is plenty.
        let psi_due = self.slow_count % PSI_EVERY_SLOW == 1;
        if !psi_due {
            o.psi_cpu_some = self.slow.psi_cpu_some;
            o.psi_memory_some = self.slow.psi_memory_some;
            o.psi_memory_full = self.slow.psi_memory_full;
            o.psi_io_some = self.slow.psi_io_some;
        }
        for (res, name) in [
            (PsiResource::Cpu, "psi_cpu"),
            (PsiResource::Memory, "psi_memory"),
            (PsiResource::Io, "psi_io"),
        ]
        .into_iter()
        .filter(|_| psi_due)
        {
            match self.host.psi(res) {
                Ok(p) => match res {
                    PsiResource::Cpu => o.psi_cpu_some = Some(p.some.avg10),
                    PsiResource::Memory => {
                        o.psi_memory_some = Some(p.some.avg10);
                        o.psi_memory_full = p.full.map(|f| f.avg10);
                    }
                    PsiResource::Io => o.psi_io_some = Some(p.some.avg10),
                },
                Err(e) => self.count_error(name, &e),
            }
        }
        match self.host.meminfo() {
            Ok(m) => {
                o.mem_available_bytes = Some(m.available);
                o.mem_total_bytes = Some(m.total);
            }
            Err(e) => self.count_error("meminfo", &e),
        }
        let be_mem: Result<u64, _> = self.be.iter().map(|g| self.cgroups.memory_usage(g)).sum();
        match be_mem {
            Ok(b) => o.be_memory_bytes = Some(b),
            Err(e) => self.count_error("be_memory", &e),
        }
        self.slow = o;
    }
}
