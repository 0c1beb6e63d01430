//! `[lc.latency] source = "kernel"`: the LC's own requests timed in the kernel
//! ([`headroom_host::latency_bpf`]), read once a second into the same sliding window the
//! prober keeps, and — with `fallback = "probe"` — the prober filling in.
//!
//! The prober is started only where it is needed: when the sensor cannot attach (for good,
//! with the reason), or when the kernel's window holds fewer requests than the percentile
//! needs (a nearly idle LC: during the first window, where the LC's rate so far would not fill
//! one; the kernel's figure is published as soon as it holds the floor, so a serving LC never
//! starts it). While it runs, its requests reach the LC and the kernel times them too, so the
//! kernel's figure is used as soon as its window holds enough, and the prober's may judge a
//! violation only where the kernel's figure over the same seconds agrees; the prober stops
//! once the window holds enough requests beyond its own (its rate × the window). Both figures
//! and the choice are published side by side ([`LatencySources`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use headroom_host::latency_bpf::{listening, LatencySensor};
use headroom_types::control::LatencySources;

use super::lc_signal::{SignalCell, StopFlag};
use super::probe::ProbeSpec;

mod window;
use window::KernelWindow;

/// Settings of the kernel source.
#[derive(Debug, Clone)]
pub struct KernelSpec {
    pub ports: Vec<u16>,
    pub percentile: f64,
    pub window_s: f64,
    pub min_samples: u64,
    /// The prober that fills in (`fallback = "probe"`).
    pub fallback: Option<ProbeSpec>,
}

/// The two sources' figures and the choice, shared with the status and the sensors.
#[derive(Debug, Default)]
pub struct KernelShared {
    pub sources: Mutex<LatencySources>,
}

impl KernelShared {
    pub fn sources(&self) -> LatencySources {
        self.sources.lock().expect("sources lock").clone()
    }

    fn set(&self, f: impl FnOnce(&mut LatencySources)) {
        f(&mut self.sources.lock().expect("sources lock"));
    }
}

/// The prober, started and stopped as the kernel's windows need it.
struct Prober {
    spec: ProbeSpec,
    cell: Arc<SignalCell>,
    running: Option<(StopFlag, JoinHandle<()>)>,
}

impl Prober {
    fn start(&mut self) {
        if self.running.is_some() {
            return;
        }
        let stop: StopFlag = Arc::new(AtomicBool::new(false));
        match super::probe::spawn(self.spec.clone(), self.cell.clone(), stop.clone()) {
            Ok(t) => {
                tracing::info!(address = %self.spec.address, "latency: the prober fills in for the kernel sensor");
                self.running = Some((stop, t));
            }
            Err(e) => self
                .cell
                .error("probe", format!("starting the fallback prober: {e}")),
        }
    }

    fn stop(&mut self) {
        if let Some((stop, t)) = self.running.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = t.join();
            tracing::info!("latency: the kernel sensor's windows are full again; the prober stops");
        }
    }

    /// The prober's latest figure, while it is fresh (its window ended within two seconds).
    fn fresh(&self, now: Instant) -> Option<super::lc_signal::Reading> {
        self.cell
            .latest()
            .filter(|r| now.saturating_duration_since(r.at) < Duration::from_secs(2))
    }
}

/// Why the kernel latency source did not start.
#[derive(Debug, thiserror::Error)]
pub enum KernelSourceError {
    /// The sensor cannot attach here and no fallback is configured.
    #[error("the kernel sensor cannot run here: {source}{listen_note} (set fallback = \"probe\" to use the prober)")]
    CannotAttach {
        #[source]
        source: headroom_host::HostError,
        listen_note: String,
    },
    /// A thread (the sensor's, or the fallback prober's) could not start.
    #[error("starting the {thread} thread: {source}")]
    Thread {
        thread: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Starts the kernel source publishing into `main` (the LC latency the policy reads).
/// Without a fallback, a sensor that cannot attach is an error here (never a silent empty
/// signal); with one, the prober takes over and the reason is kept for `ctl status`.
pub fn spawn(
    spec: KernelSpec,
    main: Arc<SignalCell>,
    stop: StopFlag,
) -> Result<(Vec<JoinHandle<()>>, Arc<KernelShared>), KernelSourceError> {
    let shared = Arc::new(KernelShared::default());
    let not_listening: Vec<u16> = spec
        .ports
        .iter()
        .copied()
        .filter(|&p| listening(std::path::Path::new("/"), p) == Some(false))
        .collect();
    let listen_note = if not_listening.is_empty() {
        String::new()
    } else {
        format!("; nothing listens on port(s) {not_listening:?} in the agent's network namespace")
    };
    if !listen_note.is_empty() {
        tracing::warn!(ports = ?not_listening, "latency: kernel sensor: {}", &listen_note[2..]);
    }
    let sensor = match LatencySensor::attach(&spec.ports) {
        Ok(s) => s,
        Err(e) => {
            let Some(probe) = spec.fallback else {
                return Err(KernelSourceError::CannotAttach {
                    source: e,
                    listen_note,
                });
            };
            let reason = format!("the kernel sensor cannot run here: {e}");
            tracing::warn!(%reason, "latency: the prober is the source");
            let t = super::probe::spawn(probe, main, stop).map_err(|source| {
                KernelSourceError::Thread {
                    thread: "prober",
                    source,
                }
            })?;
            shared.set(|s| {
                s.chosen = "probe".into();
                s.reason = reason;
                s.probe_running = true;
            });
            return Ok((vec![t], shared));
        }
    };
    tracing::info!(ports = ?spec.ports, "latency: kernel sensor attached");
    let shared2 = shared.clone();
    let t = std::thread::Builder::new()
        .name("headroom-klat".into())
        .spawn(move || run(spec, sensor, &main, &shared2, &stop, &listen_note))
        .map_err(|source| KernelSourceError::Thread {
            thread: "kernel sensor",
            source,
        })?;
    Ok((vec![t], shared))
}

fn run(
    spec: KernelSpec,
    sensor: LatencySensor,
    main: &SignalCell,
    shared: &KernelShared,
    stop: &StopFlag,
    listen_note: &str,
) {
    let mut prober = spec.fallback.clone().map(|s| Prober {
        spec: s,
        cell: SignalCell::new(),
        running: None,
    });
    let start = Instant::now();
    let mut window = KernelWindow::new(
        spec.window_s,
        spec.min_samples,
        sensor.snapshot().unwrap_or_default(),
    );
    let mut next = start + Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now < next {
            // One wake-up a second; a stop unparks the thread (see `super::wake_and_join`).
            std::thread::park_timeout(next - now);
            continue;
        }
        next += Duration::from_secs(1);
        let sec = now.saturating_duration_since(start).as_secs();
        match sensor.snapshot() {
            Ok(snap) => window.add(sec, snap),
            Err(e) => main.error("kernel", e.to_string()),
        }
        let (requests, kernel) = window.window(sec, spec.percentile);
        let segments = window.segments(sec);
        let probe_hz = prober
            .as_ref()
            .filter(|p| p.running.is_some())
            .map_or(0.0, |p| p.spec.rate_hz);
        let own = requests as f64 - probe_hz * spec.window_s;
        let filled = window.filled(sec);
        let covered = window.covered_s(sec).max(1);
        // During the first window: the LC's own rate so far, over a whole window, falls short
        // of the floor (an idle LC: the prober starts at once; a serving one: never).
        // With the margin: a projection that only just reaches the floor is short once the
        // LC's rate dips.
        let with_margin = headroom_types::resources::with_margin(spec.min_samples) as f64;
        let short_first =
            !filled && (requests as f64) * spec.window_s / (covered as f64) < with_margin;
        let reason = match kernel {
            Some(_) => String::new(),
            None if !filled && !short_first => format!(
                "the kernel sensor's first window holds {requests} requests after {covered} s, fewer than the {} a p{} needs yet",
                spec.min_samples, spec.percentile
            ),
            None => format!(
                "the kernel sensor timed {requests} requests in the last {covered} s, fewer than the {} a p{} needs{listen_note}",
                spec.min_samples, spec.percentile
            ),
        };
        if let Some(p) = prober.as_mut() {
            if kernel.is_none() && (filled || short_first) {
                p.start();
            } else if kernel.is_some() && own >= with_margin {
                // the LC's own requests fill the window with the margin (stopping at the bare
                // minimum, the next dip would leave a window short and BE held)
                p.stop();
            }
        }
        let probe = prober.as_ref().and_then(|p| p.fresh(now));
        let mut untrusted = None;
        let chosen = if let Some(v) = kernel {
            main.publish(v, now);
            "kernel"
        } else if let Some(r) = probe {
            main.publish(r.value, r.at);
            untrusted = cross_check(&mut window, sec, &spec, r.value);
            "probe"
        } else {
            "none"
        };
        shared.set(|s| {
            s.chosen = chosen.into();
            s.reason = reason;
            s.kernel_us = kernel;
            s.kernel_requests = requests;
            s.kernel_segments = segments;
            s.probe_us = probe.map(|r| r.value);
            s.probe_running = prober.as_ref().is_some_and(|p| p.running.is_some());
            s.untrusted = untrusted;
        });
    }
    if let Some(p) = prober.as_mut() {
        p.stop();
    }
}

/// The prober fills in while the kernel sensor holds too few of the LC's requests, but the
/// kernel times the probes too: the prober's figure may judge a violation only where the
/// kernel's figure over the same seconds agrees with it (within 20% or 30 µs: the kernel's
/// leaves out the loopback crossings) from at least a tenth of the floor's requests.
/// `Some(why)` where it may not.
fn cross_check(
    window: &mut KernelWindow,
    sec: u64,
    spec: &KernelSpec,
    probe_us: f64,
) -> Option<String> {
    let floor = (spec.min_samples / 10).max(1);
    match window.any(sec, spec.percentile) {
        (n, Some(k)) if n >= floor => (!agrees(probe_us, k)).then(|| {
            format!(
                "the prober's p{} {probe_us:.0} µs disagrees with the kernel sensor's {k:.0} µs over the same {n} requests",
                spec.percentile
            )
        }),
        (n, _) => Some(format!(
            "the prober's p{} {probe_us:.0} µs cannot be checked: the kernel sensor timed {n} requests, fewer than the {floor} a cross-check needs",
            spec.percentile
        )),
    }
}

/// Within 20% or 30 µs of the kernel's figure.
fn agrees(probe_us: f64, kernel_us: f64) -> bool {
    (probe_us - kernel_us).abs() <= (0.2 * kernel_us).max(30.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_host::latency_bpf::LatencySnapshot;

    #[test]
    fn a_probe_figure_is_trusted_only_where_the_kernel_agrees() {
        use headroom_host::latency_bpf::program::bucket_of;
        let spec = KernelSpec {
            ports: vec![1],
            percentile: 99.0,
            window_s: 15.0,
            min_samples: 1000,
            fallback: None,
        };
        let mut read = LatencySnapshot::default();
        let mut window = KernelWindow::new(15.0, 1000, read.clone());
        read.buckets[bucket_of(100_000)] += 50;
        window.add(1, read.clone());
        // 50 requests: fewer than the cross-check's 100
        let why = cross_check(&mut window, 1, &spec, 1200.0).expect("too few to check");
        assert!(why.contains("cannot be checked"), "{why}");
        read.buckets[bucket_of(100_000)] += 450;
        window.add(2, read);
        // the prober reads 1.2 ms where the kernel reads 100 µs: its own lateness
        let why = cross_check(&mut window, 2, &spec, 1200.0).expect("disagrees");
        assert!(why.contains("disagrees"), "{why}");
        assert_eq!(cross_check(&mut window, 2, &spec, 125.0), None);
        assert_eq!(cross_check(&mut window, 2, &spec, 80.0), None);
        assert!(agrees(600.0, 520.0) && !agrees(700.0, 520.0));
    }

    #[test]
    fn a_window_becomes_the_agents_histogram() {
        let mut w = LatencySnapshot::default();
        let b = headroom_host::latency_bpf::program::bucket_of(2_000_000);
        w.buckets[b] = 99;
        w.buckets[headroom_host::latency_bpf::program::bucket_of(10_000_000)] = 1;
        let mut window = KernelWindow::new(1.0, 1, LatencySnapshot::default());
        window.add(1, w);
        let (n, p50) = window.window(1, 50.0);
        assert_eq!(n, 100);
        let p50 = p50.expect("a full window");
        assert!((p50 / 2000.0 - 1.0).abs() < 0.04, "{p50}");
        let p100 = window.window(1, 100.0).1.expect("a full window");
        assert!((p100 / 10_000.0 - 1.0).abs() < 0.04, "{p100}");
    }
}
