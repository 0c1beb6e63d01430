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
use headroom_host::{Cgroups, CpuIdleSampler, LinuxHost, PsiResource};
use headroom_types::GroupPath;

use self::idle_wake::IdleEventSource;
use headroom_control::config::IdleSensor;

use self::lc_signal::SignalCell;
use headroom_types::observation::Observation;

pub mod feed;
mod hardware;
mod idle_events;
pub mod idle_wake;
pub mod lc_kernel;
pub mod lc_services;
pub mod lc_signal;
pub mod lc_threads;
pub mod probe;
mod sampling;
pub mod scrape;
pub use hardware::{DramSensor, EgressSensor, PowerSensor};

/// Why the idle sensor cannot drive the loop by events.
#[derive(Debug, thiserror::Error)]
pub enum IdleEventsError {
    #[error("the idle sensor is /proc/stat (the BPF idle program did not load): no events")]
    ProcStat,
    #[error("no per-CPU BPF idle sensor")]
    NoIdleSensor,
    #[error("adding fd {fd} to the idle ring buffer's epoll set: {source}")]
    Watch {
        fd: std::os::fd::RawFd,
        #[source]
        source: std::io::Error,
    },
}

/// Joins source threads whose stop flag is set: each is unparked first, so one asleep until
/// its next poll (a second away) sees the flag now.
pub fn wake_and_join(threads: impl IntoIterator<Item = std::thread::JoinHandle<()>>) {
    for t in threads {
        t.thread().unpark();
        let _ = t.join();
    }
}

/// Joins the threads of `threads` that have ended and keeps the others: a stopped discovered
/// service's source threads, kept until exit, grew the list with every LC pod that came and
/// went.
pub fn join_ended(threads: &mut Vec<std::thread::JoinHandle<()>>) {
    let (ended, running) = std::mem::take(threads)
        .into_iter()
        .partition::<Vec<_>, _>(|t| t.is_finished());
    *threads = running;
    for t in ended {
        let _ = t.join();
    }
}

/// Wakes source threads whose stop flag is set (to be joined later).
pub fn wake(threads: &[std::thread::JoinHandle<()>]) {
    for t in threads {
        t.thread().unpark();
    }
}

/// How often the slower sensors are read.
pub const SLOW_PERIOD: Duration = idle_wake::EVENT_PERIOD;

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
    /// The kernel sensor and its fallback prober side by side (`source = "kernel"`).
    pub latency_sources: Option<Arc<lc_kernel::KernelShared>>,
    /// The configured latency source (`probe`, `prometheus`, `feed`, `kernel`), named in
    /// `lc_groups[i].latency_source` where no kernel sensor says which figure it chose.
    pub latency_label: Option<&'static str>,
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
    /// With several `[[lc]]` services: the first's name and the others' sensors; the
    /// observation then lists every service in `lc_groups`.
    lc_name: String,
    more_lcs: Vec<lc_services::LcServiceSensor>,
    /// List every service in `lc_groups`, even the first alone (Kubernetes discovery).
    list_services: bool,
    slow_due: Instant,
    slow: Observation,
    usage_prev: Option<(Instant, u64, u64)>,
    runq_prev: BTreeMap<i32, (u64, u64)>,
    errors: BTreeMap<&'static str, u64>,
    /// The current observation (see [`Sensors::sample`]).
    current: Observation,
    slow_count: u64,
    schedstat_readers: BTreeMap<i32, headroom_host::sensors::SchedstatReader>,
    lc_tids: Vec<i32>,
    power: Option<PowerSensor>,
    dram: Option<DramSensor>,
    egress: Option<EgressSensor>,
    /// CPUs BE may use now (for its frequency reading), set by the runtime.
    be_cpus: Vec<u32>,
    /// Event-driven: each observation carries the kernel's idle count (`idle_cpus`).
    idle_events: bool,
    /// The BPF program's overrun counter at the last drain.
    idle_overruns: u64,
    /// How idle changes are sensed and, when polling, why (`ctl status`).
    idle_sensing: String,
    /// The idle count the kernel computed at the latest crossing drained, for the next
    /// observation (taken once).
    idle_event_count: Option<i64>,
    /// The last idle wait's timeout expiry and end (CLOCK_MONOTONIC ns): a crossing between
    /// them on the CPU the agent woke on may be its own wake-up ([`idle_wake::is_own_wake`]).
    last_wait_ns: Option<(u64, u64)>,
    /// Falls below `low` found to be the agent's own wake-up, since start.
    own_wakes: u64,
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
            lc_name: String::new(),
            more_lcs: Vec::new(),
            list_services: false,
            slow_due: Instant::now(),
            slow: Observation::default(),
            usage_prev: None,
            runq_prev: BTreeMap::new(),
            errors,
            current: Observation::default(),
            slow_count: 0,
            schedstat_readers: BTreeMap::new(),
            lc_tids: Vec::new(),
            power: PowerSensor::open(host),
            dram: DramSensor::open(host),
            egress: None,
            be_cpus: Vec::new(),
            idle_events: false,
            idle_overruns: 0,
            idle_sensing: "poll".to_owned(),
            idle_event_count: None,
            last_wait_ns: None,
            own_wakes: 0,
        })
    }

    /// Turns event-driven idle sensing on with the thresholds `(low, high)` on the idle count
    /// of the watched (online) CPUs; an error when the idle sensor has no events (not BPF).
    pub fn enable_idle_events(&mut self, low: i64, high: i64) -> Result<(), IdleEventsError> {
        self.arm_idle_thresholds(low, high)?;
        self.idle_events = true;
        self.idle_sensing = format!("events (BPF ring buffer; idle count < {low} or >= {high})");
        Ok(())
    }

    /// Records why the agent polls (`ctl status`, the log).
    pub fn set_idle_polling(&mut self, reason: &str) {
        self.idle_events = false;
        self.idle_sensing = format!("poll: {reason}");
    }

    /// How idle changes are sensed: `events (…)` or `poll: <why>`.
    pub fn idle_sensing(&self) -> &str {
        &self.idle_sensing
    }

    /// Sets the BPF program's thresholds without making the loop event-driven (a polling
    /// agent whose crossings are still timestamped, for `bench agent`).
    pub fn arm_idle_thresholds(&mut self, low: i64, high: i64) -> Result<(), IdleEventsError> {
        match self.idle.as_mut() {
            Some(IdleSource::Bpf(s)) => {
                let p = s.tracker().program();
                p.set_thresholds(low, high);
                self.idle_overruns = p.counters().overruns;
                Ok(())
            }
            Some(IdleSource::ProcStat(_)) => Err(IdleEventsError::ProcStat),
            None => Err(IdleEventsError::NoIdleSensor),
        }
    }

    /// The kernel latency sensor and the prober side by side, where both are configured.
    pub fn latency_sources(&self) -> Option<headroom_types::control::LatencySources> {
        self.signals.latency_sources.as_ref().map(|s| s.sources())
    }

    /// Whether observations come from idle events (see [`Sensors::enable_idle_events`]).
    pub fn idle_events_enabled(&self) -> bool {
        self.idle_events
    }

    /// Sets new thresholds when they differ from the current ones (a `ctl set` of the buffer).
    pub fn set_idle_thresholds(&mut self, low: i64, high: i64) {
        if let Some(IdleSource::Bpf(s)) = self.idle.as_ref() {
            let p = s.tracker().program();
            if p.thresholds() != Some((low, high.max(low))) {
                p.set_thresholds(low, high);
            }
        }
    }

    /// The BPF program's event counters (events, suppressed crossings, overruns).
    pub fn idle_event_counters(&self) -> Option<headroom_host::idle_bpf::EventCounters> {
        match self.idle.as_ref() {
            Some(IdleSource::Bpf(s)) => Some(s.tracker().program().counters()),
            _ => None,
        }
    }

    /// The idle-event source (the BPF ring buffer) while event-driven.
    pub fn idle_event_source(&mut self) -> Option<&mut dyn IdleEventSource> {
        if !self.idle_events {
            return None;
        }
        Some(self as &mut dyn IdleEventSource)
    }

    /// Adds `fd` (the control requests' doorbell) to the idle events' epoll set, so a request
    /// wakes the event-driven loop at once.
    pub fn watch_in_idle_wait(&mut self, fd: std::os::fd::RawFd) -> Result<(), IdleEventsError> {
        let Some(IdleSource::Bpf(s)) = self.idle.as_mut() else {
            return Err(IdleEventsError::NoIdleSensor);
        };
        s.tracker_mut()
            .program_mut()
            .ring()
            .watch(fd)
            .map_err(|source| IdleEventsError::Watch { fd, source })
    }

    /// Tells the sensors which CPUs BE may use now (its frequency is read there).
    pub fn set_be_cpus(&mut self, cpus: &[u32]) {
        if self.be_cpus != cpus {
            self.be_cpus = cpus.to_vec();
        }
    }

    /// Reads the LC/BE egress rates of the HTB tree the agent installs on `device`.
    pub fn set_egress(&mut self, sensor: EgressSensor) {
        self.egress = Some(sensor);
    }

    /// Whether package power is read (RAPL).
    pub fn has_power(&self) -> bool {
        self.power.is_some()
    }

    /// Falls below the low threshold that were the agent's own wake-up (not answered).
    pub fn own_wakes(&self) -> u64 {
        self.own_wakes
    }

    /// The idle sensor in use (`None` when none could be opened).
    pub fn idle_source(&self) -> Option<&'static str> {
        self.idle.as_ref().map(IdleSource::name)
    }

    /// Errors per sensor name since start.
    pub fn errors(&self) -> &BTreeMap<&'static str, u64> {
        &self.errors
    }

    /// Several LC services: the first's name (its signals are the ones given to
    /// [`Sensors::new`]) and the other services' sensors, in the config's order.
    pub fn set_lc_services(&mut self, first: &str, more: Vec<lc_services::LcServiceSensor>) {
        self.lc_name = first.to_string();
        self.more_lcs = more;
    }

    /// The other services' sensors, to add or drop one (Kubernetes discovery). With `listed`
    /// the observation lists every service in `lc_groups` even when there is only the first
    /// (the policy then finds each by name).
    pub fn lc_services_mut(&mut self) -> &mut Vec<lc_services::LcServiceSensor> {
        &mut self.more_lcs
    }

    /// See [`Sensors::lc_services_mut`].
    pub fn set_list_services(&mut self, first: &str, listed: bool) {
        self.lc_name = first.to_string();
        self.list_services = listed;
    }

    fn count_error(&mut self, name: &'static str, e: &dyn std::fmt::Display) {
        let n = self.errors.entry(name).or_insert(0);
        *n += 1;
        if *n == 1 || n.is_power_of_two() {
            tracing::warn!(sensor = name, error = %e, count = *n, "sensor error");
        }
    }

    /// The observation of the last [`Sensors::sample`] (all `None` before the first).
    pub fn last(&self) -> &Observation {
        &self.current
    }
}

#[cfg(test)]
mod tests;
