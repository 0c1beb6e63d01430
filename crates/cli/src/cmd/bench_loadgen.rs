//! `headroom bench loadgen [--peer PATH] [--time S] [--connections N]`: the load generator's own
//! cost and precision against one memcached on loopback, side by side with mutilate when `--peer`
//! points at a mutilate binary (built outside this repository; run in its blocking mode `-B` with
//! `-i exponential:1`, since bare `exponential` crashes it):
//! - client CPU time per request at a fixed 20k and 50k QPS (getrusage of the child process),
//! - the highest open-loop QPS one client thread holds within 1% of target (fixed gaps, 3 s runs),
//! - p50 added over a minimal blocking ping-pong client at a low rate.
//!
//! Figures go to stdout and, with `--out DIR`, to DIR/loadgen.json.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

/// One client run.
#[derive(Clone, Debug, Serialize)]
struct RunFigures {
    tool: String,
    target_qps: u64,
    achieved_qps: f64,
    requests: u64,
    cpu_s: f64,
    cpu_us_per_request: f64,
    p50_us: Option<f64>,
    /// p50 timed from the actual send (headroom only; mutilate only reports this one).
    p50_uncorrected_us: Option<f64>,
}

#[derive(Debug, Serialize)]
struct ToolFigures {
    tool: String,
    fixed: Vec<RunFigures>,
    max_held_qps_one_thread: u64,
    hold_runs: Vec<RunFigures>,
    p50_low_rate_us: Option<f64>,
    p50_added_over_pingpong_us: Option<f64>,
    p50_uncorrected_added_over_pingpong_us: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Figures {
    machine: String,
    time_s: u64,
    connections: usize,
    pingpong_p50_us: f64,
    tools: Vec<ToolFigures>,
}

struct Opts {
    peer: Option<PathBuf>,
    out: Option<PathBuf>,
    time_s: u64,
    connections: usize,
}

fn parse(rest: &[String]) -> anyhow::Result<Opts> {
    let mut o = Opts {
        peer: None,
        out: None,
        time_s: 5,
        connections: 4,
    };
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| super::super::usage(format!("bench loadgen: {flag} needs a value")))
        };
        match a.as_str() {
            "--peer" => o.peer = Some(PathBuf::from(value("--peer")?)),
            "--out" => o.out = Some(PathBuf::from(value("--out")?)),
            "--time" => {
                let v = value("--time")?;
                o.time_s = v.parse().map_err(|_| {
                    super::super::usage(format!("bench loadgen: invalid --time {v:?}"))
                })?;
            }
            "--connections" => {
                let v = value("--connections")?;
                o.connections = v.parse().map_err(|_| {
                    super::super::usage(format!("bench loadgen: invalid --connections {v:?}"))
                })?;
            }
            other => {
                return Err(super::super::usage(format!(
                    "bench loadgen: unknown flag {other:?} (expected --peer PATH, --time S, --connections N, --out DIR)"
                )))
            }
        }
    }
    if let Some(p) = &o.peer {
        if !p.is_file() {
            return Err(super::super::usage(format!(
                "bench loadgen: --peer {} is not a file",
                p.display()
            )));
        }
    }
    Ok(o)
}

/// A memcached on a free loopback port, killed on drop.
struct Memcached {
    port: u16,
    child: Child,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_memcached() -> anyhow::Result<Memcached> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("memcached")
        .args([
            "-l",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "0",
            "-t",
            "1",
        ])
        .args(["-m", "256", "-u", "root"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting memcached (apt-get install memcached)")?;
    let mc = Memcached { port, child };
    let deadline = Instant::now() + Duration::from_secs(3);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("memcached did not listen on 127.0.0.1:{port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(mc)
}

/// A scratch directory removed on drop (the cli crate has no tempfile dependency).
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Scratch> {
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

fn children_cpu_s() -> f64 {
    headroom_load::clock::children_cpu_s()
}

/// Runs `cmd` to completion; returns stdout and the CPU seconds it used.
fn run_measured(cmd: &mut Command) -> anyhow::Result<(String, f64)> {
    let before = children_cpu_s();
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    let cpu = children_cpu_s() - before;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((String::from_utf8_lossy(&out.stdout).into_owned(), cpu))
}

fn headroom_exe() -> anyhow::Result<PathBuf> {
    match std::env::var_os("HEADROOM_BIN") {
        Some(p) => Ok(PathBuf::from(p)),
        None => std::env::current_exe().context("locating the headroom binary"),
    }
}

fn ours(
    server: &str,
    qps: u64,
    time_s: u64,
    conns: usize,
    iadist: &str,
) -> anyhow::Result<RunFigures> {
    let dir = Scratch::new()?;
    let json = dir.path().join("r.json");
    let (_, cpu) = run_measured(
        Command::new(headroom_exe()?)
            .args([
                "load", "-s", server, "--noload", "--quiet", "-T", "1", "-i", iadist,
            ])
            .args(["-c", &conns.to_string(), "-q", &qps.to_string()])
            .args(["-t", &time_s.to_string(), "--json"])
            .arg(&json),
    )?;
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json)?)?;
    let requests = v["completed"].as_u64().unwrap_or(0);
    Ok(RunFigures {
        tool: "headroom".into(),
        target_qps: qps,
        achieved_qps: v["achieved_qps"].as_f64().unwrap_or(0.0),
        requests,
        cpu_s: cpu,
        cpu_us_per_request: cpu * 1e6 / requests.max(1) as f64,
        p50_us: v["read"]["p50_us"].as_f64(),
        p50_uncorrected_us: v["read_uncorrected"]["p50_us"].as_f64(),
    })
}

fn mutilate(
    peer: &Path,
    server: &str,
    qps: u64,
    time_s: u64,
    conns: usize,
    iadist: &str,
) -> anyhow::Result<RunFigures> {
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
        .with_context(|| format!("no 'Total QPS' in mutilate's output:\n{stdout}"))?;
    let achieved: f64 = line
        .split_whitespace()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unreadable {line:?}"))?;
    let requests: u64 = line
        .split('(')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unreadable {line:?}"))?;
    let mut lat: Vec<f64> = std::fs::read_to_string(&save)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    lat.sort_by(f64::total_cmp);
    let p50 = (!lat.is_empty()).then(|| lat[lat.len() / 2]);
    Ok(RunFigures {
        tool: "mutilate".into(),
        target_qps: qps,
        achieved_qps: achieved,
        requests,
        cpu_s: cpu,
        cpu_us_per_request: cpu * 1e6 / requests.max(1) as f64,
        p50_us: p50,
        p50_uncorrected_us: p50,
    })
}

/// Highest rate held within 1%: grow by 1.25x until a run falls short, then bisect 3 times.
fn max_held(
    mut run: impl FnMut(u64) -> anyhow::Result<RunFigures>,
) -> anyhow::Result<(u64, Vec<RunFigures>)> {
    let holds =
        |r: &RunFigures| (r.achieved_qps - r.target_qps as f64).abs() <= 0.01 * r.target_qps as f64;
    let mut runs = Vec::new();
    let mut ok = 0u64;
    let mut q = 10_000u64;
    let mut bad = None;
    for _ in 0..12 {
        let r = run(q)?;
        eprintln!("  {} at {q}: achieved {:.0}", r.tool, r.achieved_qps);
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
            eprintln!("  {} at {mid}: achieved {:.0}", r.tool, r.achieved_qps);
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

/// p50 of a blocking one-request-at-a-time GET loop (the floor any client adds to).
fn pingpong_p50_us(port: u16, requests: usize) -> anyhow::Result<f64> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    let key = format!("{:030}", 1);
    let req = format!("get {key}\r\n");
    let mut buf = [0u8; 4096];
    let mut lat = Vec::with_capacity(requests);
    for _ in 0..requests {
        let t = Instant::now();
        s.write_all(req.as_bytes())?;
        let mut got = Vec::new();
        while !got.ends_with(b"END\r\n") {
            let n = s.read(&mut buf)?;
            if n == 0 {
                bail!("memcached closed the ping-pong connection");
            }
            got.extend_from_slice(&buf[..n]);
        }
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat[lat.len() / 2])
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{cpus} CPUs, kernel {}, load average at start {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

pub fn run(out: Option<PathBuf>, rest: &[String]) -> anyhow::Result<()> {
    let o = parse(rest)?;
    let out = o.out.clone().or(out);
    let mc = start_memcached()?;
    let server = format!("127.0.0.1:{}", mc.port);
    // Keys loaded once; every run below uses --noload.
    run_measured(Command::new(headroom_exe()?).args(["load", "-s", &server, "--loadonly"]))?;
    let machine = machine();
    eprintln!("bench loadgen: memcached on {server}; {machine}");
    let pingpong = pingpong_p50_us(mc.port, 20_000)?;
    let mut tools = Vec::new();
    let mut which: Vec<(&str, Option<&Path>)> = vec![("headroom", None)];
    if let Some(p) = &o.peer {
        which.push(("mutilate", Some(p.as_path())));
    }
    for (name, peer) in which {
        eprintln!("bench loadgen: {name}");
        // Exponential gaps (mutilate needs the explicit `:1`) for cost and latency; a fixed
        // schedule for the highest held rate, where the count of a random schedule would itself
        // stray by more than 1% in a short run.
        let run_at = |q: u64, t: u64, c: usize, ia: &str| match peer {
            None => ours(&server, q, t, c, ia),
            Some(p) => mutilate(p, &server, q, t, c, ia),
        };
        let mut fixed = Vec::new();
        for q in [20_000u64, 50_000] {
            let r = run_at(q, o.time_s, o.connections, "exponential:1")?;
            eprintln!(
                "  {name} at {q}: achieved {:.0}, {:.2} us CPU/request",
                r.achieved_qps, r.cpu_us_per_request
            );
            fixed.push(r);
        }
        let (held, hold_runs) = max_held(|q| run_at(q, 3, o.connections, "fixed:1"))?;
        let low = run_at(1000, 3, 1, "exponential:1")?;
        tools.push(ToolFigures {
            tool: name.into(),
            fixed,
            max_held_qps_one_thread: held,
            hold_runs,
            p50_low_rate_us: low.p50_us,
            p50_added_over_pingpong_us: low.p50_us.map(|p| p - pingpong),
            p50_uncorrected_added_over_pingpong_us: low.p50_uncorrected_us.map(|p| p - pingpong),
        });
    }
    let figures = Figures {
        machine,
        time_s: o.time_s,
        connections: o.connections,
        pingpong_p50_us: pingpong,
        tools,
    };
    print_figures(&figures);
    if let Some(dir) = out {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("loadgen.json");
        std::fs::write(&path, serde_json::to_string_pretty(&figures)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    Ok(())
}

fn print_figures(f: &Figures) {
    println!("machine: {}", f.machine);
    println!(
        "one memcached (-t 1) on loopback; clients: 1 thread, {} connections, {} s per fixed-rate run",
        f.connections, f.time_s
    );
    println!("ping-pong client p50: {:.1} us\n", f.pingpong_p50_us);
    println!(
        "{:<10} {:>12} {:>12} {:>12} {:>12} {:>14} {:>14} {:>14}",
        "tool",
        "CPU/req@20k",
        "CPU/req@50k",
        "QPS@20k",
        "QPS@50k",
        "max held QPS",
        "p50 added us",
        "(from send)"
    );
    for t in &f.tools {
        let at = |q: u64| t.fixed.iter().find(|r| r.target_qps == q);
        let cpu = |q: u64| at(q).map_or("-".into(), |r| format!("{:.2} us", r.cpu_us_per_request));
        let qps = |q: u64| at(q).map_or("-".into(), |r| format!("{:.0}", r.achieved_qps));
        let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        println!(
            "{:<10} {:>12} {:>12} {:>12} {:>12} {:>14} {:>14} {:>14}",
            t.tool,
            cpu(20_000),
            cpu(50_000),
            qps(20_000),
            qps(50_000),
            t.max_held_qps_one_thread,
            us(t.p50_added_over_pingpong_us),
            us(t.p50_uncorrected_added_over_pingpong_us)
        );
    }
}
