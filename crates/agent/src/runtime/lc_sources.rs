//! The LC's latency and load sources a start launches (prober, scrape, memcache stats, feed
//! socket), each on its own thread with its own cell.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::AgentError;
use crate::sensors::lc_signal::{SignalCell, StopFlag};
use crate::sensors::scrape::PullKind;
use crate::sensors::LcSignals;
use headroom_control::config::{Config, LatencySource, LcConfig, LoadSource};

pub(super) type Cells = Vec<(String, Arc<SignalCell>)>;

/// Starts every LC service's latency and load sources, each at that service's own percentile,
/// window and minimum samples: the signals per service in the config's order, and the cells by
/// name (`latency`, `load` for the first service; `<name>.latency`, `<name>.load` for others).
pub(super) fn lc_signals(
    config: &Config,
    stop: &StopFlag,
    threads: &mut Vec<JoinHandle<()>>,
) -> Result<(Vec<LcSignals>, Cells), AgentError> {
    let mut feeds: BTreeMap<String, crate::sensors::feed::FeedCells> = BTreeMap::new();
    let mut all = Vec::new();
    let mut cells = Vec::new();
    for (i, lc) in config.lcs.iter().enumerate() {
        let (signals, mine) = service_signals(config, lc, stop, threads, &mut feeds)?;
        let prefix = if i == 0 {
            String::new()
        } else {
            format!("{}.", lc.name)
        };
        cells.extend(mine.into_iter().map(|(n, c)| (format!("{prefix}{n}"), c)));
        all.push(signals);
    }
    Ok((all, cells))
}

/// One service's sources. A feed socket named by several services is bound once (its cells
/// shared, at the first service's window).
pub(super) fn service_signals(
    config: &Config,
    lc: &LcConfig,
    stop: &StopFlag,
    threads: &mut Vec<JoinHandle<()>>,
    feeds: &mut BTreeMap<String, crate::sensors::feed::FeedCells>,
) -> Result<(LcSignals, Cells), AgentError> {
    let mut signals = LcSignals::default();
    let mut cells = Vec::new();
    let slo = &lc.slo;
    let mut feed_cells = |socket: &str,
                          threads: &mut Vec<JoinHandle<()>>|
     -> Result<crate::sensors::feed::FeedCells, AgentError> {
        if let Some(c) = feeds.get(socket) {
            return Ok(c.clone());
        }
        let cells = crate::sensors::feed::FeedCells {
            latency: SignalCell::new(),
            qps: SignalCell::new(),
        };
        let t = crate::sensors::feed::spawn(
            Path::new(socket),
            slo.percentile,
            slo.window_s,
            slo.min_samples(),
            cells.clone(),
            stop.clone(),
        )?;
        threads.push(t);
        feeds.insert(socket.to_string(), cells.clone());
        Ok(cells)
    };
    let spawn_err = |what: &'static str| {
        move |source| AgentError::Io {
            what,
            path: PathBuf::new(),
            source,
        }
    };
    if let Some(lat) = &lc.latency {
        signals.latency_label = Some(match lat.source {
            LatencySource::Probe => "probe",
            LatencySource::Prometheus => "prometheus",
            LatencySource::Feed => "feed",
            LatencySource::Kernel => "kernel",
        });
        let cell = match lat.source {
            LatencySource::Probe => {
                let cell = SignalCell::new();
                let mut spec = crate::sensors::probe::ProbeSpec::new(
                    lat.protocol,
                    lat.address.as_deref().unwrap_or_default(),
                    lat.rate_hz,
                    slo.percentile,
                    slo.window_s,
                );
                spec.min_samples = slo.min_samples();
                spec.max_send_lag_us = lat.send_lag_bound_us(slo.target_us);
                spec.fifo_priority = config.safety.agent_fifo_priority;
                let t = crate::sensors::probe::spawn(spec, cell.clone(), stop.clone())
                    .map_err(spawn_err("starting the prober"))?;
                threads.push(t);
                cell
            }
            LatencySource::Prometheus => {
                let cell = SignalCell::new();
                let kind = PullKind::PromHistogram {
                    url: lat.url.clone().unwrap_or_default(),
                    metric: lat.metric.clone().unwrap_or_default(),
                    percentile: slo.percentile,
                    window_s: slo.window_s,
                    min_samples: slo.min_samples(),
                };
                let t = crate::sensors::scrape::spawn(
                    kind,
                    Duration::from_secs(1),
                    cell.clone(),
                    stop.clone(),
                )
                .map_err(spawn_err("starting the scraper"))?;
                threads.push(t);
                cell
            }
            LatencySource::Kernel => {
                let cell = SignalCell::new();
                let fallback = lat.fallback.map(|_| {
                    let mut spec = crate::sensors::probe::ProbeSpec::new(
                        lat.protocol,
                        &lat.probe_address(),
                        lat.rate_hz,
                        slo.percentile,
                        slo.window_s,
                    );
                    spec.min_samples = slo.min_samples();
                    spec.max_send_lag_us = lat.send_lag_bound_us(slo.target_us);
                    spec.fifo_priority = config.safety.agent_fifo_priority;
                    spec
                });
                let spec = crate::sensors::lc_kernel::KernelSpec {
                    ports: lat.kernel_ports(),
                    percentile: slo.percentile,
                    window_s: slo.window_s,
                    min_samples: slo.min_samples(),
                    fallback,
                };
                let (t, shared) = crate::sensors::lc_kernel::spawn(
                    spec,
                    cell.clone(),
                    stop.clone(),
                )
                .map_err(|reason| AgentError::Io {
                    what: "starting the kernel latency sensor ([lc.latency] source = \"kernel\")",
                    path: PathBuf::from("/sys/kernel/tracing"),
                    source: std::io::Error::other(reason),
                })?;
                threads.extend(t);
                signals.latency_sources = Some(shared);
                cell
            }
            LatencySource::Feed => {
                let socket = lat
                    .socket
                    .clone()
                    .unwrap_or_else(|| "/run/headroom-feed.sock".to_string());
                feed_cells(&socket, threads)?.latency
            }
        };
        cells.push(("latency".to_string(), cell.clone()));
        signals.latency = Some(cell);
    }
    if let Some(load) = &lc.load {
        signals.peak_qps = Some(load.peak_qps);
        let address = load.address.clone().unwrap_or_default();
        let pull = |kind: PullKind, threads: &mut Vec<JoinHandle<()>>| {
            let cell = SignalCell::new();
            crate::sensors::scrape::spawn(kind, Duration::from_secs(1), cell.clone(), stop.clone())
                .map(|t| {
                    threads.push(t);
                    cell
                })
                .map_err(spawn_err("starting the load source"))
        };
        let cell = match load.source {
            LoadSource::MemcacheStats => pull(PullKind::MemcacheStats { address }, threads)?,
            LoadSource::RedisInfo => pull(PullKind::RedisInfo { address }, threads)?,
            LoadSource::Prometheus => pull(
                PullKind::PromCounter {
                    url: load.url.clone().unwrap_or_default(),
                    metric: load.metric.clone().unwrap_or_default(),
                },
                threads,
            )?,
            LoadSource::Feed => {
                let socket = load
                    .socket
                    .clone()
                    .or_else(|| lc.latency.as_ref().and_then(|l| l.socket.clone()))
                    .unwrap_or_else(|| "/run/headroom-feed.sock".to_string());
                feed_cells(&socket, threads)?.qps
            }
        };
        cells.push(("load".to_string(), cell.clone()));
        signals.qps = Some(cell);
    }
    Ok((signals, cells))
}

/// Whether any thread of `pid` runs SCHED_FIFO or SCHED_RR (procfs under `root`; a process
/// that cannot be read counts as not real-time, and moving it reports the real error).
pub(super) fn has_realtime_thread(root: &Path, pid: i32) -> bool {
    use headroom_host::sched::SchedPolicy;
    headroom_host::sched::threads(root, pid)
        .unwrap_or_default()
        .into_iter()
        .any(|tid| {
            matches!(
                headroom_host::sched::sched(tid)
                    .ok()
                    .and_then(|a| a.policy()),
                Some(SchedPolicy::Fifo { .. } | SchedPolicy::RoundRobin { .. })
            )
        })
}
