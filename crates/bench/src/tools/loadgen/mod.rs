//! `headroom bench loadgen [--peer PATH] [--time S] [--connections N] [--pin]`: the load generator's own
//! cost and precision against one memcached on loopback, side by side with mutilate when `--peer`
//! points at a mutilate binary (built outside this repository; run in its blocking mode `-B` with
//! `-i exponential:1`, since bare `exponential` crashes it):
//! - client CPU time per request at a fixed 20k and 50k QPS (getrusage of the child process),
//!   user and system apart, next to the CPU per request of a minimal blocking ping-pong client
//!   (the kernel's share is a floor no socket client gets under),
//! - the highest open-loop QPS one client thread holds within 1% of target (fixed gaps, 3 s runs),
//!   with memcached's own CPU share in each run (a run it saturates bounds the server, not the client),
//! - p50 added over a minimal blocking ping-pong client at a low rate.
//!
//! `--pin` gives the clients CPU 0 and memcached the last CPU. Figures go to stdout and, with
//! `--out DIR`, to DIR/loadgen.json. Flags: `--help`.

use super::flag_values::{at_least_one, existing_file};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use super::error::{Context, Result, ToolError};
use headroom_host::process::CpuSplit;
use serde::Serialize;

mod runs;

use super::memcached::start_memcached;

use runs::{headroom_exe, machine, max_held, mutilate, ours, pingpong, run_measured, OurMode};

/// One client run.
#[derive(Clone, Debug, Serialize)]
struct RunFigures {
    tool: String,
    target_qps: u64,
    achieved_qps: f64,
    requests: u64,
    cpu_s: f64,
    cpu_us_per_request: f64,
    user_us_per_request: f64,
    sys_us_per_request: f64,
    /// The client's CPU over the run (start to exit), % of one CPU.
    client_cpu_pct: Option<f64>,
    /// memcached's CPU over the run, % of one CPU (it runs one worker thread).
    server_cpu_pct: Option<f64>,
    p50_us: Option<f64>,
    /// p50 timed from the actual send (headroom only; mutilate only reports this one).
    p50_uncorrected_us: Option<f64>,
    /// headroom only: the event loop that ran, its send lag p99 and whether its self-checks
    /// passed.
    engine: Option<String>,
    send_lag_p99_us: Option<f64>,
    valid: Option<bool>,
}

impl RunFigures {
    /// A run's figures from what the client reported and the CPU it used; the CPU shares are
    /// filled in by the caller, which times the run. `p50` = (corrected, uncorrected).
    fn new(
        tool: &str,
        target_qps: u64,
        achieved_qps: f64,
        requests: u64,
        cpu: CpuSplit,
        p50: (Option<f64>, Option<f64>),
    ) -> RunFigures {
        let per_request = |s: f64| s * 1e6 / requests.max(1) as f64;
        RunFigures {
            tool: tool.into(),
            target_qps,
            achieved_qps,
            requests,
            cpu_s: cpu.total_s(),
            cpu_us_per_request: per_request(cpu.total_s()),
            user_us_per_request: per_request(cpu.user_s),
            sys_us_per_request: per_request(cpu.sys_s),
            client_cpu_pct: None,
            server_cpu_pct: None,
            p50_us: p50.0,
            p50_uncorrected_us: p50.1,
            engine: None,
            send_lag_p99_us: None,
            valid: None,
        }
    }
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
    /// headroom only: 50k/s from one thread in its default mode (busy-polling the last stretch
    /// before each send), for the send lag.
    on_time_50k: Option<RunFigures>,
}

#[derive(Debug, Serialize)]
struct Figures {
    machine: String,
    time_s: u64,
    connections: usize,
    hold_connections: usize,
    pingpong_p50_us: f64,
    pingpong_user_us_per_request: f64,
    pingpong_sys_us_per_request: f64,
    tools: Vec<ToolFigures>,
}

/// `headroom bench loadgen` flags.
#[derive(clap::Parser, Debug)]
#[command(
    name = "headroom bench loadgen",
    no_binary_name = true,
    about = "The load generator's CPU per request, highest held rate and added latency against one loopback memcached, side by side with mutilate (--peer)"
)]
pub struct Opts {
    /// A mutilate binary (built outside this repository) to run side by side, in its -B mode
    #[arg(long, value_name = "PATH", value_parser = existing_file)]
    peer: Option<PathBuf>,
    /// Directory for loadgen.json (overrides the global --out)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Seconds of each fixed-rate run
    #[arg(long = "time", value_name = "S", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    time_s: u64,
    /// Connections of the fixed-rate runs
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = at_least_one)]
    connections: usize,
    /// Connections of the highest-held-rate search
    #[arg(long, value_name = "N", default_value_t = HOLD_CONNECTIONS, value_parser = at_least_one)]
    hold_connections: usize,
    /// headroom's event loop (passed to `headroom load --engine`; its default when not given)
    #[arg(long, value_name = "auto|io_uring|epoll")]
    engine: Option<String>,
    /// Give client and server a CPU each: the benchmark and its clients on CPU 0, memcached on
    /// the last CPU (otherwise the scheduler places both)
    #[arg(long)]
    pin: bool,
}

/// Connections for the highest-held-rate search. An open-loop client at depth 1 can have at most
/// one request per connection in flight, so with c connections and a loopback round trip of
/// ~50 us the rate is capped near c / 50 us (80 000/s at c = 4) whatever the client costs; 16
/// lifts that cap above what two CPUs can carry, so the search finds the client's or the
/// machine's limit rather than Little's law.
const HOLD_CONNECTIONS: usize = 16;

/// Connections and depth of the 50k/s send-lag run (see where it runs).
const ON_TIME_CONNECTIONS: usize = 8;
const ON_TIME_DEPTH: usize = 4;

pub fn run(out: Option<PathBuf>, o: Opts) -> Result<()> {
    let out = o.out.clone().or(out);
    // Read before pinning: a pinned thread sees one CPU.
    let machine = machine();
    let cpus = headroom_load::clock::online_cpus();
    let server_cpu = if o.pin {
        if cpus < 2 {
            return Err(ToolError::Needs {
                tool: "headroom bench loadgen --pin",
                need: format!("two CPUs, this machine has {cpus}"),
            });
        }
        // Pinned before anything is started: every client this process runs inherits CPU 0.
        headroom_host::sched::pin_this_thread(0).context("pinning the benchmark to CPU 0")?;
        Some(cpus - 1)
    } else {
        None
    };
    let mc = start_memcached(server_cpu)?;
    let server = format!("127.0.0.1:{}", mc.port);
    // Keys loaded once; every run below uses --noload.
    run_measured(Command::new(headroom_exe()?).args(["load", "-s", &server, "--loadonly"]))?;
    eprintln!("bench loadgen: memcached on {server}; {machine}");
    let floor = pingpong(mc.port, 20_000)?;
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
        let frugal = OurMode {
            engine: o.engine.as_deref(),
            sleep_only: true,
            depth: 1,
        };
        let run_mode = |q: u64, t: u64, c: usize, ia: &str, mode: OurMode| {
            let (server_before, start) = (mc.cpu_s(), Instant::now());
            let mut r = match peer {
                None => ours(&server, q, t, c, ia, mode),
                Some(p) => mutilate(p, &server, q, t, c, ia),
            }?;
            let wall = start.elapsed().as_secs_f64();
            r.client_cpu_pct = (wall > 0.0).then(|| r.cpu_s * 100.0 / wall);
            r.server_cpu_pct = match (server_before, mc.cpu_s()) {
                (Some(b), Some(a)) if wall > 0.0 => Some((a - b) * 100.0 / wall),
                _ => None,
            };
            Ok::<_, ToolError>(r)
        };
        let run_at = |q: u64, t: u64, c: usize, ia: &str| run_mode(q, t, c, ia, frugal);
        let mut fixed = Vec::new();
        for q in [20_000u64, 50_000] {
            let r = run_at(q, o.time_s, o.connections, "exponential:1")?;
            eprintln!(
                "  {name} at {q}: achieved {:.0}, {:.2} us CPU/request",
                r.achieved_qps, r.cpu_us_per_request
            );
            fixed.push(r);
        }
        let (held, hold_runs) = max_held(|q| run_at(q, 3, o.hold_connections, "fixed:1"))?;
        let low = run_at(1000, 3, 1, "exponential:1")?;
        let on_time_50k = match peer {
            None => {
                // The bench runner's load shape (8 connections, depth 4): at depth 1 a few
                // connections carry at most connections / round trip, and with the server on
                // another CPU (--pin) 4 of them cannot carry 50k/s, so sends would wait for the
                // depth cap and the send lag would measure that rather than the sender.
                let mode = OurMode {
                    engine: o.engine.as_deref(),
                    sleep_only: false,
                    depth: ON_TIME_DEPTH,
                };
                let r = run_mode(50_000, o.time_s, ON_TIME_CONNECTIONS, "exponential:1", mode)?;
                eprintln!(
                    "  {name} at 50000 (8 connections x depth 4), busy-polling before sends: send lag p99 {:.1} us, self-checks {}",
                    r.send_lag_p99_us.unwrap_or(f64::NAN),
                    if r.valid == Some(true) { "passed" } else { "failed" }
                );
                Some(r)
            }
            Some(_) => None,
        };
        tools.push(ToolFigures {
            tool: name.into(),
            fixed,
            max_held_qps_one_thread: held,
            hold_runs,
            p50_low_rate_us: low.p50_us,
            p50_added_over_pingpong_us: low.p50_us.map(|p| p - floor.p50_us),
            p50_uncorrected_added_over_pingpong_us: low
                .p50_uncorrected_us
                .map(|p| p - floor.p50_us),
            on_time_50k,
        });
    }
    let figures = Figures {
        machine,
        time_s: o.time_s,
        connections: o.connections,
        hold_connections: o.hold_connections,
        pingpong_p50_us: floor.p50_us,
        pingpong_user_us_per_request: floor.cpu_per_request.user_s * 1e6,
        pingpong_sys_us_per_request: floor.cpu_per_request.sys_s * 1e6,
        tools,
    };
    print_figures(&figures);
    if let Some(dir) = out {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("loadgen.json");
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&figures).context("encoding the figures")? + "\n",
        )
        .with_context(|| format!("writing {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    Ok(())
}

fn print_figures(f: &Figures) {
    println!("machine: {}", f.machine);
    println!(
        "one memcached (-t 1) on loopback; clients: 1 thread, {} connections, {} s per fixed-rate run; {} connections in the highest-held-rate search",
        f.connections, f.time_s, f.hold_connections
    );
    println!(
        "ping-pong client: p50 {:.1} us, CPU {:.2} us/request (user {:.2} + system {:.2})\n",
        f.pingpong_p50_us,
        f.pingpong_user_us_per_request + f.pingpong_sys_us_per_request,
        f.pingpong_user_us_per_request,
        f.pingpong_sys_us_per_request
    );
    println!(
        "{:<10} {:>22} {:>22} {:>9} {:>9} {:>13} {:>13} {:>12}",
        "tool",
        "CPU/req@20k (usr+sys)",
        "CPU/req@50k (usr+sys)",
        "QPS@20k",
        "QPS@50k",
        "max held QPS",
        "p50 added us",
        "(from send)"
    );
    for t in &f.tools {
        let cpu = |q: u64| {
            at(t, q).map_or("-".into(), |r| {
                format!(
                    "{:.2} ({:.1}+{:.1}) us",
                    r.cpu_us_per_request, r.user_us_per_request, r.sys_us_per_request
                )
            })
        };
        let qps = |q: u64| at(t, q).map_or("-".into(), |r| format!("{:.0}", r.achieved_qps));
        let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        println!(
            "{:<10} {:>22} {:>22} {:>9} {:>9} {:>13} {:>13} {:>12}",
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
    println!();
    for t in &f.tools {
        println!("{}: {}", t.tool, held_bound(t));
        if let Some(engine) = t.fixed.first().and_then(|r| r.engine.as_deref()) {
            println!(
                "{}: engine {engine} (sleeping to each send in the runs above)",
                t.tool
            );
        }
        if let Some(r) = &t.on_time_50k {
            println!(
                "{} at 50k from one thread (8 connections x depth 4), busy-polling before sends: send lag p99 {:.1} us, self-checks {}, {:.2} us CPU/request ({:.1}+{:.1})",
                t.tool,
                r.send_lag_p99_us.unwrap_or(f64::NAN),
                if r.valid == Some(true) { "passed" } else { "FAILED" },
                r.cpu_us_per_request,
                r.user_us_per_request,
                r.sys_us_per_request
            );
        }
    }
    if let [ours, peer] = &f.tools[..] {
        for q in [20_000u64, 50_000] {
            if let (Some(a), Some(b)) = (at(ours, q), at(peer, q)) {
                println!(
                    "{} / {} CPU per request at {}k: {:.2}x; {}'s system time alone is {:.2}x of {}'s total",
                    ours.tool,
                    peer.tool,
                    q / 1000,
                    a.cpu_us_per_request / b.cpu_us_per_request,
                    ours.tool,
                    a.sys_us_per_request / b.cpu_us_per_request,
                    peer.tool
                );
            }
        }
    }
}

fn cpu_shares(client: Option<f64>, server: Option<f64>) -> String {
    let pct = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v:.0}%"));
    format!(
        "client at {} of a CPU, memcached at {}",
        pct(client),
        pct(server)
    )
}

/// The CPU share (of one CPU, over the run) from which a process that falls short of its rate
/// counts as having saturated its CPU: both are single-threaded here, and the run's wall time
/// includes start-up and connection set-up.
const SATURATED_PCT: f64 = 90.0;

fn at(t: &ToolFigures, qps: u64) -> Option<&RunFigures> {
    t.fixed.iter().find(|r| r.target_qps == qps)
}

/// What bounded the highest held rate: the first run that fell short, and which process, if
/// either, had saturated its CPU there.
fn held_bound(t: &ToolFigures) -> String {
    let short = t
        .hold_runs
        .iter()
        .filter(|r| r.target_qps > t.max_held_qps_one_thread)
        .min_by_key(|r| r.target_qps);
    let Some(r) = short else {
        return format!("held every rate tried, up to {}", t.max_held_qps_one_thread);
    };
    let saturated = |v: Option<f64>| v.is_some_and(|v| v >= SATURATED_PCT);
    let verdict = match (
        saturated(r.client_cpu_pct),
        saturated(r.server_cpu_pct),
    ) {
        (true, false) => "the client set the highest held rate",
        (false, true) => "the server, not the client, set the highest held rate",
        (true, true) => "both were saturated",
        (false, false) => {
            "neither saturated a CPU: the two share the machine's CPUs (and the kernel's loopback work)"
        }
    };
    format!(
        "fell short at {} ({:.0} achieved) with {}: {verdict}",
        r.target_qps,
        r.achieved_qps,
        cpu_shares(r.client_cpu_pct, r.server_cpu_pct)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn run(target: u64, achieved: f64, client: f64, server: f64) -> RunFigures {
        let mut r = RunFigures::new(
            "headroom",
            target,
            achieved,
            0,
            CpuSplit::default(),
            (None, None),
        );
        r.client_cpu_pct = Some(client);
        r.server_cpu_pct = Some(server);
        r
    }

    #[test]
    fn per_request_cpu_is_split_over_the_requests() {
        let cpu = CpuSplit {
            user_s: 0.5,
            sys_s: 1.5,
        };
        let r = RunFigures::new("x", 1000, 1000.0, 100_000, cpu, (Some(1.0), None));
        assert_eq!(r.cpu_s, 2.0);
        assert!((r.cpu_us_per_request - 20.0).abs() < 1e-9);
        assert!((r.user_us_per_request - 5.0).abs() < 1e-9);
        assert!((r.sys_us_per_request - 15.0).abs() < 1e-9);
        assert_eq!((r.p50_us, r.p50_uncorrected_us), (Some(1.0), None));
    }

    fn tool(held: u64, hold_runs: Vec<RunFigures>) -> ToolFigures {
        ToolFigures {
            tool: "headroom".into(),
            fixed: Vec::new(),
            max_held_qps_one_thread: held,
            hold_runs,
            p50_low_rate_us: None,
            p50_added_over_pingpong_us: None,
            p50_uncorrected_added_over_pingpong_us: None,
            on_time_50k: None,
        }
    }

    fn flags(a: &[&str]) -> Result<Opts, clap::Error> {
        use clap::Parser;
        Opts::try_parse_from(args(a))
    }

    #[test]
    fn defaults_and_flags() {
        let o = flags(&[]).unwrap();
        assert_eq!((o.time_s, o.connections), (5, 4));
        assert_eq!(o.hold_connections, HOLD_CONNECTIONS);
        let o = flags(&[
            "--time",
            "2",
            "--connections",
            "8",
            "--hold-connections",
            "32",
        ])
        .unwrap();
        assert_eq!((o.time_s, o.connections, o.hold_connections), (2, 8, 32));
        assert!(!o.pin && o.engine.is_none());
        let o = flags(&["--pin", "--engine", "epoll"]).unwrap();
        assert!(o.pin);
        assert_eq!(o.engine.as_deref(), Some("epoll"));
    }

    #[test]
    fn bad_values_are_named() {
        // a usage error: clap's own kinds (the CLI exits 2 on them), never help or version
        let usage = |e: &clap::Error| e.use_stderr();
        let e = flags(&["--hold-connections", "many"]).unwrap_err();
        assert!(e.to_string().contains("--hold-connections"), "{e}");
        assert!(e.to_string().contains("\"many\""), "{e}");
        assert!(usage(&e));
        let e = flags(&["--connections", "0"]).unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{e}");
        let e = flags(&["--time", "0"]).unwrap_err();
        assert!(e.to_string().contains("--time"), "{e}");
        let e = flags(&["--time"]).unwrap_err();
        assert!(e.to_string().contains("--time"), "{e}");
        let e = flags(&["--peer", "/nonexistent/mutilate"]).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/mutilate"), "{e}");
        let e = flags(&["--frobnicate"]).unwrap_err();
        assert!(e.to_string().contains("--frobnicate"), "{e}");
        assert!(usage(&e));
        assert!(
            e.to_string().starts_with("error: unexpected argument"),
            "{e}"
        );
    }

    #[test]
    fn held_bound_names_the_first_short_run_and_who_saturated() {
        // Held 60k; 80k fell short with the server saturated; 70k fell short first.
        let t = tool(
            60_000,
            vec![
                run(60_000, 60_000.0, 70.0, 60.0),
                run(80_000, 71_000.0, 80.0, 97.0),
                run(70_000, 66_000.0, 95.0, 70.0),
            ],
        );
        let s = held_bound(&t);
        assert!(s.starts_with("fell short at 70000 (66000 achieved)"), "{s}");
        assert!(s.ends_with("the client set the highest held rate"), "{s}");

        let t = tool(60_000, vec![run(70_000, 66_000.0, 50.0, 95.0)]);
        assert!(held_bound(&t).ends_with("the server, not the client, set the highest held rate"));
        let t = tool(60_000, vec![run(70_000, 66_000.0, 50.0, 60.0)]);
        assert!(held_bound(&t).contains("neither saturated a CPU"));
        let t = tool(60_000, vec![run(60_000, 60_000.0, 50.0, 60.0)]);
        assert_eq!(held_bound(&t), "held every rate tried, up to 60000");
    }
}
