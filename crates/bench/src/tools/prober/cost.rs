//! `bench prober --cost S`: what one probe costs the agent. The prober runs in this process
//! for `S` seconds at `--probe-hz` against a loopback stand-in LC (answering each GET at
//! once, on the last CPU), the prober on CPU 0; its thread's CPU time (schedstat, ns) over the
//! probes the stand-in answered is the cost per probe, and over the seconds its share of a CPU.
//! An idle host is the comparison the issue sets (≤ 1.5% of a CPU at 500 probes/s); what else
//! ran is printed beside it.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_agent::sensors::lc_signal::SignalCell;
use headroom_agent::sensors::probe::ProbeSpec;
use headroom_control::config::ProbeProtocol;

use super::super::error::{Context, Result, ToolError};

/// Pins the calling thread to `cpu` (the threads it spawns inherit it).
fn pin(cpu: usize) -> Result<()> {
    headroom_host::sched::pin_this_thread(cpu).with_context(|| format!("pinning to CPU {cpu}"))
}

/// The CPU time (ns) of this process's thread named `name`.
fn thread_cpu_ns(name: &str) -> Result<u64> {
    Ok(headroom_host::process::own_thread_run_time(name)?.as_nanos() as u64)
}

/// Measures and prints the prober's cost.
pub fn run(seconds: f64, probe_hz: f64) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let listener = TcpListener::bind("127.0.0.1:0").context("binding the stand-in LC")?;
    let addr = listener.local_addr().context("the stand-in LC's address")?;
    let answered = Arc::new(AtomicU64::new(0));
    let counted = answered.clone();
    let server_cpu = cpus - 1;
    // as many connections as the prober may open (one probe in flight on each), each served
    // by its own thread on the last CPU
    std::thread::spawn(move || {
        for _ in 0..16 {
            let Ok((s, _)) = listener.accept() else {
                return;
            };
            let counted = counted.clone();
            std::thread::spawn(move || {
                let _ = pin(server_cpu);
                let _ = s.set_nodelay(true);
                let Ok(mut w) = s.try_clone() else {
                    return;
                };
                let mut lines = BufReader::new(s).lines();
                while let Some(Ok(line)) = lines.next() {
                    if line.starts_with("get ") {
                        if w.write_all(b"END\r\n").is_err() {
                            break;
                        }
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    // the prober thread inherits CPU 0 from the thread that spawns it
    let spawner = std::thread::spawn(move || -> Result<_> {
        pin(0)?;
        let cell = SignalCell::new();
        let stop = Arc::new(AtomicBool::new(false));
        let spec = ProbeSpec::new(
            ProbeProtocol::Memcache,
            &addr.to_string(),
            probe_hz,
            99.0,
            10.0,
        );
        let t = headroom_agent::sensors::probe::spawn(spec, cell.clone(), stop.clone())
            .context("starting the prober")?;
        Ok((t, stop, cell))
    });
    let (handle, stop, cell) = spawner
        .join()
        .map_err(|_| ToolError::Measurement("the prober's spawner panicked".into()))??;
    // one second to connect and settle, then the measured span
    std::thread::sleep(Duration::from_secs(1));
    let cpu0 = thread_cpu_ns("headroom-probe")?;
    let n0 = answered.load(Ordering::Relaxed);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    let cpu1 = thread_cpu_ns("headroom-probe")?;
    let n1 = answered.load(Ordering::Relaxed);
    let span = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = handle.join();
    let probes = n1 - n0;
    if probes == 0 {
        return Err(ToolError::Measurement(format!(
            "the stand-in LC answered no probe in {span:.1} s: {:?}",
            cell.last_error()
        )));
    }
    let cpu_s = (cpu1 - cpu0) as f64 / 1e9;
    let per_probe_us = 1e6 * cpu_s / probes as f64;
    println!(
        "prober cost: {:.2}% of a CPU at {:.0} probes/s ({probes} probes in {span:.1} s), {per_probe_us:.1} µs of CPU per probe (wake-up, send, reap of the stamps and reply); {}",
        100.0 * cpu_s / span,
        probes as f64 / span,
        cell.detail()
    );
    // The part no prober can save: a thread on the same CPU that only sleeps to Poisson
    // deadlines at the same rate (the prober's one wake-up per probe).
    let rate = probes as f64 / span;
    let floor = std::thread::spawn(move || -> Result<(f64, u64)> {
        pin(0)?;
        Ok(wake_up_floor(rate, seconds.min(5.0)))
    })
    .join()
    .map_err(|_| ToolError::Measurement("the wake-up floor thread panicked".into()))??;
    let floor_us = 1e6 * floor.0 / floor.1.max(1) as f64;
    println!(
        "  wake-up floor: a thread on CPU 0 sleeping to Poisson deadlines at {rate:.0}/s: {:.2}% of a CPU, {floor_us:.1} µs per wake-up; the probe's own work (send, reads, bookkeeping): {:.1} µs per probe",
        100.0 * floor.0 / seconds.min(5.0),
        per_probe_us - floor_us
    );
    Ok(())
}

/// CPU seconds and wake-ups of this thread sleeping to Poisson deadlines at `rate_hz` for
/// `seconds` (relative sleeps, default timer slack: as the prober sleeps).
fn wake_up_floor(rate_hz: f64, seconds: f64) -> (f64, u64) {
    // xorshift64: uniform (0, 1] without a dependency
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    };
    let cpu = || headroom_load::clock::thread_cpu_ns() as f64 * 1e-9;
    let mean = 1.0 / rate_hz.max(1.0);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let c0 = cpu();
    let mut next = start;
    let mut wakes = 0u64;
    while next < end {
        next += Duration::from_secs_f64(-uniform().ln() * mean);
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
            wakes += 1;
        }
    }
    (cpu() - c0, wakes)
}
