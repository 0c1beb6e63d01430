//! `headroom bench host [--reads N] [--poll-seconds S] [--poll-hz HZ]`: what the host layer's
//! hot sensors cost. Figures: nanoseconds per read of the idle-core reader (`/proc/stat`, median
//! and p99 over N reads) and of a thread's schedstat reader, and the CPU share of a poll loop
//! at HZ over S seconds (getrusage of this thread). With `--out DIR` the figures also go to
//! `DIR/bench-host.json`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use headroom_host::LinuxHost;

struct Options {
    reads: usize,
    poll_seconds: f64,
    poll_hz: f64,
}

fn parse(rest: &[String]) -> anyhow::Result<Options> {
    let mut o = Options {
        reads: 20_000,
        poll_seconds: 10.0,
        poll_hz: 1000.0,
    };
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> anyhow::Result<String> {
            it.next().cloned().ok_or_else(|| {
                crate::cmd::usage(format!("headroom bench host: {name} needs a value"))
            })
        };
        let bad = |name: &str, v: &str| {
            crate::cmd::usage(format!(
                "headroom bench host: {name} {v:?} is not a positive number"
            ))
        };
        match flag.as_str() {
            "--reads" => {
                let v = value("--reads")?;
                o.reads = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| bad("--reads", &v))?;
            }
            "--poll-seconds" => {
                let v = value("--poll-seconds")?;
                o.poll_seconds = v.parse().ok().filter(|n: &f64| *n > 0.0).ok_or_else(|| bad("--poll-seconds", &v))?;
            }
            "--poll-hz" => {
                let v = value("--poll-hz")?;
                o.poll_hz = v
                    .parse()
                    .ok()
                    .filter(|n: &f64| *n > 0.0 && *n <= 100_000.0)
                    .ok_or_else(|| bad("--poll-hz", &v))?;
            }
            other => {
                return Err(crate::cmd::usage(format!(
                    "headroom bench host: unknown flag {other:?} (expected --reads N, --poll-seconds S, --poll-hz HZ)"
                )))
            }
        }
    }
    Ok(o)
}

/// (median, p99) of per-call durations in ns.
fn time_calls(
    n: usize,
    mut call: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<(u64, u64)> {
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

pub fn run(out: Option<PathBuf>, rest: &[String]) -> anyhow::Result<()> {
    let o = parse(rest)?;
    let host = LinuxHost::system();
    let cpus = host.topology().map(|t| t.cpus_online.len()).unwrap_or(0);
    let kernel = host.kernel_release().unwrap_or_default();

    let mut reader = host.proc_stat().context("opening /proc/stat")?;
    let (stat_med, stat_p99) =
        time_calls(o.reads, || reader.read().map(|_| ()).map_err(Into::into))?;
    let mut sampler = host.idle_sampler().context("opening /proc/stat")?;
    let (idle_med, idle_p99) =
        time_calls(o.reads, || sampler.sample().map(|_| ()).map_err(Into::into))?;
    let pid = std::process::id() as i32;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let schedstat = match host.schedstat(pid, tid) {
        Ok(mut r) => Some(time_calls(o.reads, || {
            r.read().map(|_| ()).map_err(Into::into)
        })?),
        Err(_) => None,
    };

    // The poll loop: sample per-CPU idle at absolute deadlines, like the blind policy's loop.
    let period = Duration::from_secs_f64(1.0 / o.poll_hz);
    let wall = Duration::from_secs_f64(o.poll_seconds);
    let cpu_before = headroom_load::clock::thread_cpu_split();
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
    let cpu = (headroom_load::clock::thread_cpu_split() - cpu_before).total_s();
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
        std::fs::write(&path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("  wrote {}", path.display());
    }
    Ok(())
}
