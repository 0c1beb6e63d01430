//! What `headroom bench loadgen` runs and times: a memcached on a free loopback port, headroom's
//! and mutilate's clients (each a child process whose CPU is read with getrusage), the minimal
//! blocking ping-pong client that gives the kernel's floor, and the search for the highest rate a
//! client holds. The figures and their table are in `mod.rs`.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::tools::error::{Context, Result, ToolError};
use headroom_host::process::{cpu_split, CpuSplit, Usage};

use super::{cpu_shares, RunFigures};

/// A scratch directory removed on drop (the cli crate has no tempfile dependency).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("headroom-bench-loadgen-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(Scratch(p))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `cmd` to completion; returns stdout and the CPU it used.
pub(super) fn run_measured(cmd: &mut Command) -> Result<(String, CpuSplit)> {
    let before = cpu_split(Usage::Children);
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    let cpu = cpu_split(Usage::Children) - before;
    if !out.status.success() {
        return Err(ToolError::Command {
            command: format!("{cmd:?}"),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), cpu))
}

pub(super) fn headroom_exe() -> Result<PathBuf> {
    match std::env::var_os("HEADROOM_BIN") {
        Some(p) => Ok(PathBuf::from(p)),
        None => std::env::current_exe().context("locating the headroom binary"),
    }
}

/// How headroom runs: its engine, and whether it sleeps to each send (the frugal mode set
/// against mutilate's -B) or busy-polls the last stretch (its default, for on-time sends).
#[derive(Clone, Copy, Debug)]
pub(super) struct OurMode<'a> {
    pub(super) engine: Option<&'a str>,
    pub(super) sleep_only: bool,
    /// Requests in flight per connection (`-d`).
    pub(super) depth: usize,
}

pub(super) fn ours(
    server: &str,
    qps: u64,
    time_s: u64,
    conns: usize,
    iadist: &str,
    mode: OurMode,
) -> Result<RunFigures> {
    let dir = Scratch::new()?;
    let json = dir.path().join("r.json");
    let (_, cpu) = run_measured(
        Command::new(headroom_exe()?)
            .args([
                "load", "-s", server, "--noload", "--quiet", "-T", "1", "-i", iadist,
            ])
            // An invalid run is still a figure here (its validity is judged from the JSON).
            .args(["--invalid-exit-code", "0"])
            // Frugal mode against mutilate's -B: sleep on the timer, no busy-polling for send
            // times (the default buys on-time sends with CPU; see docs/load.md "Timers").
            .args(mode.sleep_only.then_some("--sleep-only"))
            .args(["-d", &mode.depth.to_string()])
            .args(mode.engine.map(|e| ["--engine", e]).into_iter().flatten())
            .args(["-c", &conns.to_string(), "-q", &qps.to_string()])
            .args(["-t", &time_s.to_string(), "--json"])
            .arg(&json),
    )?;
    let text =
        std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))?;
    let requests = v["completed"].as_u64().unwrap_or(0);
    let mut r = RunFigures::new(
        "headroom",
        qps,
        v["achieved_qps"].as_f64().unwrap_or(0.0),
        requests,
        cpu,
        (
            v["read"]["p50_us"].as_f64(),
            v["read_uncorrected"]["p50_us"].as_f64(),
        ),
    );
    r.engine = v["client"]["engine"].as_str().map(String::from);
    r.send_lag_p99_us = v["client"]["send_lag_p99_us"].as_f64();
    r.valid = v["valid"].as_bool();
    Ok(r)
}

pub(super) fn mutilate(
    peer: &Path,
    server: &str,
    qps: u64,
    time_s: u64,
    conns: usize,
    iadist: &str,
) -> Result<RunFigures> {
    let dir = Scratch::new()?;
    let save = dir.path().join("samples.txt");
    let (stdout, cpu) = run_measured(
        Command::new(peer)
            .args(["-s", server, "--noload", "-B", "-T", "1", "-i", iadist])
            .args(["-c", &conns.to_string(), "-q", &qps.to_string()])
            .args(["-t", &time_s.to_string(), "--save"])
            .arg(&save),
    )?;
    // "Total QPS = 19987.3 (99937 / 5.0s)"
    let line = stdout
        .lines()
        .find(|l| l.starts_with("Total QPS"))
        .ok_or_else(|| {
            ToolError::Measurement(format!("no 'Total QPS' in mutilate's output:\n{stdout}"))
        })?;
    let achieved: f64 = line
        .split_whitespace()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ToolError::Measurement(format!("mutilate's {line:?} is unreadable")))?;
    let requests: u64 = line
        .split('(')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ToolError::Measurement(format!("mutilate's {line:?} is unreadable")))?;
    let mut lat: Vec<f64> = std::fs::read_to_string(&save)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    lat.sort_by(f64::total_cmp);
    let p50 = (!lat.is_empty()).then(|| lat[lat.len() / 2]);
    Ok(RunFigures::new(
        "mutilate",
        qps,
        achieved,
        requests,
        cpu,
        (p50, p50),
    ))
}

fn achieved(r: &RunFigures) -> String {
    format!(
        "achieved {:.0}; {}",
        r.achieved_qps,
        cpu_shares(r.client_cpu_pct, r.server_cpu_pct)
    )
}

/// Highest rate held within 1%: grow by 1.25x until a run falls short, then bisect 3 times.
pub(super) fn max_held(
    mut run: impl FnMut(u64) -> Result<RunFigures>,
) -> Result<(u64, Vec<RunFigures>)> {
    let holds =
        |r: &RunFigures| (r.achieved_qps - r.target_qps as f64).abs() <= 0.01 * r.target_qps as f64;
    let mut runs = Vec::new();
    let mut ok = 0u64;
    let mut q = 10_000u64;
    let mut bad = None;
    // 1.25^20 x 10 000 = 870 000/s: past what one client thread on loopback can hold.
    for _ in 0..20 {
        let r = run(q)?;
        eprintln!("  {} at {q}: {}", r.tool, achieved(&r));
        let held = holds(&r);
        runs.push(r);
        if held {
            ok = q;
            q = q * 5 / 4;
        } else {
            bad = Some(q);
            break;
        }
    }
    if let Some(mut hi) = bad {
        for _ in 0..3 {
            let mid = (ok + hi) / 2;
            if hi - ok < 1000 {
                break;
            }
            let r = run(mid)?;
            eprintln!("  {} at {mid}: {}", r.tool, achieved(&r));
            if holds(&r) {
                ok = mid;
            } else {
                hi = mid;
            }
            runs.push(r);
        }
    }
    Ok((ok, runs))
}

/// A blocking one-request-at-a-time GET loop: the floor any client adds to, in latency and in
/// CPU (one write and one blocking read per request, nothing else).
pub(super) struct PingPong {
    pub(super) p50_us: f64,
    pub(super) cpu_per_request: CpuSplit,
}

pub(super) fn pingpong(port: u16, requests: usize) -> Result<PingPong> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to memcached on 127.0.0.1:{port}"))?;
    s.set_nodelay(true)
        .context("TCP_NODELAY on the ping-pong connection")?;
    let key = format!("{:030}", 1);
    let req = format!("get {key}\r\n");
    let mut buf = [0u8; 4096];
    let mut lat = Vec::with_capacity(requests);
    let cpu_before = cpu_split(Usage::Thread);
    for _ in 0..requests {
        let t = Instant::now();
        s.write_all(req.as_bytes())
            .context("sending a ping-pong request")?;
        let mut got = Vec::new();
        while !got.ends_with(b"END\r\n") {
            let n = s.read(&mut buf).context("reading a ping-pong reply")?;
            if n == 0 {
                return Err(ToolError::Measurement(
                    "memcached closed the ping-pong connection".into(),
                ));
            }
            got.extend_from_slice(&buf[..n]);
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let cpu = cpu_split(Usage::Thread) - cpu_before;
    lat.sort_by(f64::total_cmp);
    let per = |s: f64| s / requests.max(1) as f64;
    Ok(PingPong {
        p50_us: lat[lat.len() / 2],
        cpu_per_request: CpuSplit {
            user_s: per(cpu.user_s),
            sys_s: per(cpu.sys_s),
        },
    })
}

pub(super) fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    format!(
        "{cpus} CPUs, kernel {}, load average at start {}",
        headroom_host::process::kernel_release().unwrap_or_default(),
        headroom_host::process::load_average_text()
    )
}
