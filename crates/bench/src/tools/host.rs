//! `headroom bench host [--reads N] [--poll-seconds S] [--poll-hz HZ]`: what the host layer's
//! hot sensors cost. Figures: nanoseconds per read of the idle-core reader (`/proc/stat`, median
//! and p99 over N reads) and of a thread's schedstat reader, and the CPU share of a poll loop
//! at HZ over S seconds (getrusage of this thread). With `--out DIR` the figures also go to
//! `DIR/bench-host.json`.

use super::flag_values::{positive_at_most, positive_f64, FlagValueError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::error::{Context, Result};
use headroom_host::LinuxHost;

/// Flags of `headroom bench host`.
#[derive(clap::Parser, Debug)]
#[command(name = "headroom bench host", no_binary_name = true)]
pub struct Options {
    /// Reads per timed reader (median and p99 are reported)
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    reads: u64,
    /// Seconds of the poll-loop CPU measurement
    #[arg(long, default_value_t = 10.0, value_parser = positive_f64)]
    poll_seconds: f64,
    /// Poll frequency of the poll loop, Hz (at most 100000)
    #[arg(long, default_value_t = 1000.0, value_parser = poll_hz)]
    poll_hz: f64,
}

fn poll_hz(s: &str) -> Result<f64, FlagValueError> {
    positive_at_most(s, 100_000.0, "Hz")
}

/// (median, p99) of per-call durations in ns.
fn time_calls(n: usize, mut call: impl FnMut() -> Result<()>) -> Result<(u64, u64)> {
    let mut ns = Vec::with_capacity(n);
    for _ in 0..n.min(100) {
        call()?; // warm-up: buffers reach their size, page cache is hot
    }
    for _ in 0..n {
        let t = Instant::now();
        call()?;
        ns.push(t.elapsed().as_nanos() as u64);
    }
    ns.sort_unstable();
    Ok((
        ns[ns.len() / 2],
        ns[(ns.len() * 99 / 100).min(ns.len() - 1)],
    ))
}

pub fn run(out: Option<PathBuf>, o: Options) -> Result<()> {
    let host = LinuxHost::system();
    let cpus = host.topology().map(|t| t.cpus_online.len()).unwrap_or(0);
    let kernel = host.kernel_release().unwrap_or_default();

    let mut reader = host.proc_stat()?;
    let (stat_med, stat_p99) = time_calls(o.reads as usize, || {
        reader.read().map(|_| ()).map_err(Into::into)
    })?;
    let mut sampler = host.idle_sampler()?;
    let (idle_med, idle_p99) = time_calls(o.reads as usize, || {
        sampler.sample().map(|_| ()).map_err(Into::into)
    })?;
    let pid = std::process::id() as i32;
    let tid = headroom_host::process::thread_id();
    let schedstat = match host.schedstat(pid, tid) {
        Ok(mut r) => Some(time_calls(o.reads as usize, || {
            r.read().map(|_| ()).map_err(Into::into)
        })?),
        Err(_) => None,
    };

    // The poll loop: sample per-CPU idle at absolute deadlines, like the blind policy's loop.
    let period = Duration::from_secs_f64(1.0 / o.poll_hz);
    let wall = Duration::from_secs_f64(o.poll_seconds);
    let cpu_before = headroom_host::process::cpu_split(headroom_host::process::Usage::Thread);
    let start = Instant::now();
    let mut next = start;
    let mut polls = 0u64;
    let mut idle_sum = 0.0;
    while start.elapsed() < wall {
        for (_, idle) in sampler.sample()? {
            idle_sum += idle;
        }
        polls += 1;
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
    }
    let elapsed = start.elapsed();
    let cpu = (headroom_host::process::cpu_split(headroom_host::process::Usage::Thread)
        - cpu_before)
        .total_s();
    let share = cpu / elapsed.as_secs_f64();
    let achieved_hz = polls as f64 / elapsed.as_secs_f64();

    println!("headroom bench host  (kernel {kernel}, {cpus} CPUs)");
    println!(
        "  /proc/stat read (ProcStatReader::read)      median {stat_med} ns   p99 {stat_p99} ns   ({} reads)",
        o.reads
    );
    println!(
        "  per-CPU idle sample (CpuIdleSampler::sample) median {idle_med} ns   p99 {idle_p99} ns   ({} reads)",
        o.reads
    );
    if let Some((m, p)) = schedstat {
        println!("  thread schedstat read (SchedstatReader)      median {m} ns   p99 {p} ns   ({} reads)", o.reads);
    }
    println!(
        "  {:.0} Hz idle poll loop for {:.1} s: {:.0} polls ({:.0} Hz achieved), CPU {:.3} s = {:.2}% of one CPU",
        o.poll_hz,
        elapsed.as_secs_f64(),
        polls,
        achieved_hz,
        cpu,
        share * 100.0
    );
    // Keeps the sampled values observable so the loop cannot be optimised away.
    if idle_sum.is_nan() {
        println!("  (idle sum NaN)");
    }

    if let Some(dir) = out {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = serde_json::json!({
            "kernel": kernel, "cpus": cpus, "reads": o.reads,
            "proc_stat_read_ns": {"median": stat_med, "p99": stat_p99},
            "idle_sample_ns": {"median": idle_med, "p99": idle_p99},
            "schedstat_read_ns": schedstat.map(|(m, p)| serde_json::json!({"median": m, "p99": p})),
            "poll": {"hz": o.poll_hz, "seconds": elapsed.as_secs_f64(), "polls": polls,
                     "achieved_hz": achieved_hz, "cpu_s": cpu, "cpu_share": share},
        });
        let path = dir.join("bench-host.json");
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&json).context("encoding the figures")?,
        )
        .with_context(|| format!("writing {}", path.display()))?;
        println!("  wrote {}", path.display());
    }
    Ok(())
}
