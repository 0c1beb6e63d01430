//! `headroom load`: mutilate's flags (same names, same meaning) plus `--protocol`, `--json`,
//! `--csv`, `--hdr`, `--feed`, `--seed`, `--popularity`; `headroom load agent` (or `-A`) runs a
//! remote load agent. See docs/load.md.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use headroom_load::options::DEFAULT_AGENT_PORT;
use headroom_load::report::{csv_header, csv_row, format_checks, format_table, LoadReport};
use headroom_load::sweep::{self, SweepRow};
use headroom_load::{Interval, LoadError, LoadOptions, Popularity, ProtocolKind};

/// Flags of `headroom load` (mutilate-compatible).
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub sub: Option<Sub>,
    /// Memcached server hostname[:port]; repeat for several servers
    #[arg(short = 's', long = "server", value_name = "H[:P]")]
    pub server: Vec<String>,
    /// Use the binary memcached protocol instead of ASCII (same as --protocol binary)
    #[arg(long)]
    pub binary: bool,
    /// Wire protocol: memcache | binary | redis
    #[arg(long, value_name = "P")]
    pub protocol: Option<String>,
    /// Target aggregate QPS; 0 = peak
    #[arg(short = 'q', long, default_value_t = 0)]
    pub qps: u64,
    /// Seconds to measure (after the warmup)
    #[arg(short = 't', long, default_value_t = 5.0)]
    pub time: f64,
    /// Length of memcached keys (distribution)
    #[arg(short = 'K', long, default_value = "30")]
    pub keysize: String,
    /// Length of memcached values (distribution)
    #[arg(short = 'V', long, default_value = "200")]
    pub valuesize: String,
    /// Number of records (divided among the servers)
    #[arg(short = 'r', long, default_value_t = 10000)]
    pub records: u64,
    /// Ratio of set:get commands
    #[arg(short = 'u', long, default_value_t = 0.0)]
    pub update: f64,
    /// Number of load threads
    #[arg(short = 'T', long, default_value_t = 1)]
    pub threads: usize,
    /// Pin threads to CPUs round-robin
    #[arg(long)]
    pub affinity: bool,
    /// Connections per server per thread, or `auto`: sized from the round trip measured before
    /// the run and the rate, grown during the run when every connection is at its depth cap
    #[arg(short = 'c', long, default_value = "1", value_name = "N|auto")]
    pub connections: String,
    /// Maximum requests in flight per connection
    #[arg(short = 'd', long, default_value_t = 1)]
    pub depth: usize,
    /// Inter-arrival distribution (its mean follows --qps)
    #[arg(short = 'i', long, default_value = "exponential")]
    pub iadist: String,
    /// Skip loading the keys
    #[arg(long)]
    pub noload: bool,
    /// Load the keys and exit
    #[arg(long)]
    pub loadonly: bool,
    /// Seconds of load before measuring
    #[arg(short = 'w', long, default_value_t = 0.0)]
    pub warmup: f64,
    /// Scan latency across QPS: MIN:MAX:STEP
    #[arg(long, value_name = "MIN:MAX:STEP")]
    pub scan: Option<String>,
    /// Highest QPS whose P-th percentile stays under TARGET_US (P may be fractional: 99.9:500)
    #[arg(long, value_name = "P:TARGET_US")]
    pub search: Option<String>,
    /// Measurement connections per server (dedicated, low-rate; their latency is reported)
    #[arg(
        short = 'C',
        long = "measure_connections",
        alias = "measure-connections"
    )]
    pub measure_connections: Option<usize>,
    /// QPS of the measurement connections together
    #[arg(short = 'Q', long = "measure_qps", alias = "measure-qps")]
    pub measure_qps: Option<u64>,
    /// Depth of each measurement connection
    #[arg(short = 'D', long = "measure_depth", alias = "measure-depth")]
    pub measure_depth: Option<usize>,
    /// Run as a load agent (same as `headroom load agent`)
    #[arg(short = 'A', long = "agentmode")]
    pub agentmode: bool,
    /// Enlist a remote agent (HOST or HOST:PORT); repeatable
    #[arg(short = 'a', long = "agent", value_name = "HOST")]
    pub agent: Vec<String>,
    /// Agent port
    #[arg(short = 'p', long = "agent_port", alias = "agent-port", default_value_t = DEFAULT_AGENT_PORT)]
    pub agent_port: u16,
    /// mutilate's remaining flags (boxed: keeps the CLI's command enum small).
    #[command(flatten)]
    pub compat: Box<Compat>,
    /// More output (one progress line per second even when stderr is not a terminal)
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// No progress output
    #[arg(long)]
    pub quiet: bool,
    /// Outputs and headroom's own extensions (boxed: keeps the CLI's command enum small).
    #[command(flatten)]
    pub extra: Box<Extra>,
}

/// mutilate's scheduling, socket and agent flags beyond the basic ones.
#[derive(clap::Args, Debug)]
pub struct Compat {
    /// Assign threads to servers round-robin (thread t: servers t, t+T, …) instead of every
    /// thread to every server
    #[arg(short = 'R', long)]
    pub roundrobin: bool,
    /// Skip sends on a connection more than 5 ms behind at its depth cap (counted, and the rate
    /// check says so)
    #[arg(short = 'S', long)]
    pub skip: bool,
    /// Keep at least 250 µs between a connection's last reply and its next send
    #[arg(long)]
    pub moderate: bool,
    /// Blocking epoll (mutilate's -B): headroom's loop always blocks in epoll, so this changes
    /// nothing; accepted for mutilate command lines
    #[arg(short = 'B', long)]
    pub blocking: bool,
    /// Leave Nagle's algorithm on (no TCP_NODELAY)
    #[arg(long = "no_nodelay", alias = "no-nodelay")]
    pub no_nodelay: bool,
    /// Seconds after startup before the run starts (mutilate's -W)
    #[arg(short = 'W', long = "wait", value_name = "S")]
    pub wait: Option<f64>,
    /// This client's weight in the split of the rate among clients (agents send theirs)
    #[arg(
        short = 'l',
        long = "lambda_mul",
        alias = "lambda-mul",
        default_value_t = 1
    )]
    pub lambda_mul: u64,
    /// SASL username (mutilate's -U): not supported
    #[arg(short = 'U', long)]
    pub username: Option<String>,
    /// SASL password (mutilate's -P): not supported
    #[arg(short = 'P', long)]
    pub password: Option<String>,
}

/// `headroom load` flags beyond mutilate's run settings: outputs and extensions.
#[derive(clap::Args, Debug)]
pub struct Extra {
    /// Write every measured request's scheduled time and latency to F
    #[arg(long, value_name = "F")]
    pub save: Option<PathBuf>,
    /// Write the result JSON to F (docs/architecture.md "The JSON contracts"; an array for --scan)
    #[arg(long, value_name = "F")]
    pub json: Option<PathBuf>,
    /// Write the figures as CSV to F (one row per run)
    #[arg(long, value_name = "F")]
    pub csv: Option<PathBuf>,
    /// Write the per-second histograms as an HdrHistogram interval log to F
    #[arg(long, value_name = "F")]
    pub hdr: Option<PathBuf>,
    /// Send one JSON line per second to this Unix socket (the agent's live feed)
    #[arg(long, value_name = "SOCKET")]
    pub feed: Option<PathBuf>,
    /// Seed for keys, sizes and send schedules
    #[arg(long)]
    pub seed: Option<u64>,
    /// Key popularity: uniform | zipf:S
    #[arg(long, default_value = "uniform")]
    pub popularity: String,
    /// Busy-poll at least this many µs before each send (the default lead is the timer's
    /// measured wake-up lateness)
    #[arg(long = "spin-us", default_value_t = 0)]
    pub spin_us: u64,
    /// Never busy-poll: sleep on the timer until each send (least CPU; sends late by the timer's
    /// wake-up, tens of µs on a VM)
    #[arg(long = "sleep-only")]
    pub sleep_only: bool,
    /// Event loop: auto (io_uring where the kernel allows it, else epoll with the reason
    /// printed), io_uring, or epoll
    #[arg(long, value_name = "auto|io_uring|epoll", default_value = "auto")]
    pub engine: String,
    /// Address the agent listens on (with -A)
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: String,
    /// Exit status when a self-check failed (the result is still printed and written); 0 makes
    /// invalid runs exit like valid ones
    #[arg(long = "invalid-exit-code", value_name = "N", default_value_t = CHECKS_FAILED_EXIT)]
    pub invalid_exit_code: i32,
    /// Ask for SCHED_FIFO at this priority for the load threads; where it is refused they run
    /// SCHED_OTHER (the output and the JSON say which class ran and why)
    #[arg(long, value_name = "PRIO")]
    pub fifo: Option<u32>,
}

/// Default exit status of a run (or a scan with a row, or a search whose answer) that failed its
/// self-checks: distinct from 1 (error) and 2 (usage) so scripts notice.
pub const CHECKS_FAILED_EXIT: i32 = 3;

/// Ends the process with `--invalid-exit-code` when the results were not valid (after the output
/// was flushed).
fn exit_if_invalid(args: &Args, valid: bool) {
    if !valid && args.extra.invalid_exit_code != 0 {
        let _ = std::io::stdout().flush();
        eprintln!(
            "headroom: self-checks failed (result not valid): exit {}",
            args.extra.invalid_exit_code
        );
        std::process::exit(args.extra.invalid_exit_code);
    }
}

/// `headroom load agent`.
#[derive(clap::Subcommand, Debug)]
pub enum Sub {
    /// Run a remote load agent for a master's `-a HOST`
    Agent {
        /// Port to listen on
        #[arg(short = 'p', long, default_value_t = DEFAULT_AGENT_PORT)]
        port: u16,
        /// Address to listen on
        #[arg(long, default_value = "0.0.0.0")]
        bind: String,
        /// Exit after serving this many masters (default: serve forever)
        #[arg(long)]
        sessions: Option<usize>,
        /// This agent's weight in the master's split of the rate (mutilate's -l)
        #[arg(
            short = 'l',
            long = "lambda_mul",
            alias = "lambda-mul",
            default_value_t = 1
        )]
        lambda_mul: u64,
    },
}

/// Maps library errors: bad option values are usage errors (exit 2).
fn lib_err(e: LoadError) -> anyhow::Error {
    if e.is_usage() {
        super::usage(e.to_string())
    } else {
        anyhow::Error::new(e)
    }
}

/// Builds the library options from the flags.
pub fn options_from(args: &Args) -> anyhow::Result<LoadOptions> {
    let protocol = match (&args.protocol, args.binary) {
        (Some(p), false) => p.parse::<ProtocolKind>().map_err(lib_err)?,
        (Some(p), true) if p == "binary" => ProtocolKind::Binary,
        (Some(p), true) => {
            return Err(super::usage(format!(
                "--binary conflicts with --protocol {p}"
            )))
        }
        (None, true) => ProtocolKind::Binary,
        (None, false) => ProtocolKind::Memcache,
    };
    let popularity: Popularity = args.extra.popularity.parse().map_err(lib_err)?;
    let (connections, connections_auto) = match args.connections.as_str() {
        "auto" => (1, true),
        n => (
            n.parse::<usize>().map_err(|_| {
                super::usage(format!(
                    "invalid value \"{n}\" for -c/--connections: expected a whole number or auto"
                ))
            })?,
            false,
        ),
    };
    let opts = LoadOptions {
        servers: args.server.clone(),
        protocol,
        qps: args.qps,
        time_s: args.time,
        keysize: args.keysize.clone(),
        valuesize: args.valuesize.clone(),
        records: args.records,
        update: args.update,
        threads: args.threads,
        affinity: args.affinity,
        connections,
        connections_auto,
        fifo: args.extra.fifo,
        depth: args.depth,
        iadist: args.iadist.clone(),
        noload: args.noload,
        loadonly: args.loadonly,
        warmup_s: args.warmup,
        measure_connections: args.measure_connections,
        measure_qps: args.measure_qps,
        measure_depth: args.measure_depth,
        agents: args.agent.clone(),
        agent_port: args.agent_port,
        save: args.extra.save.clone(),
        hdr_log: args.extra.hdr.clone(),
        feed: args.extra.feed.clone(),
        seed: args.extra.seed,
        popularity,
        spin_us: args.extra.spin_us,
        sleep_only: args.extra.sleep_only,
        engine: args.extra.engine.parse().map_err(lib_err)?,
        roundrobin: args.compat.roundrobin,
        skip: args.compat.skip,
        moderate: args.compat.moderate,
        no_nodelay: args.compat.no_nodelay,
        lambda_mul: args.compat.lambda_mul,
        ..LoadOptions::default()
    };
    Ok(opts)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    if let Some(Sub::Agent {
        port,
        bind,
        sessions,
        lambda_mul,
    }) = &args.sub
    {
        return run_agent(bind, *port, *sessions, *lambda_mul);
    }
    if args.compat.username.is_some() || args.compat.password.is_some() {
        return Err(super::usage(
            "-U/--username, -P/--password: not supported: SASL authentication (mutilate's binary-protocol SASL PLAIN) is not implemented; run against a server without authentication",
        ));
    }
    if args.compat.lambda_mul == 0 {
        return Err(super::usage(
            "invalid value \"0\" for -l/--lambda_mul: must be at least 1",
        ));
    }
    if args.agentmode {
        return run_agent(
            &args.extra.bind,
            args.agent_port,
            None,
            args.compat.lambda_mul,
        );
    }
    let opts = options_from(&args)?;
    let wait = match args.compat.wait {
        Some(w) if !(w >= 0.0 && w.is_finite()) => {
            return Err(super::usage(format!(
                "invalid value \"{w}\" for -W/--wait: must be zero or positive seconds"
            )));
        }
        Some(w) => Some(std::time::Duration::from_secs_f64(w)),
        None => None,
    };
    let scan = args
        .scan
        .as_deref()
        .map(|s| s.parse::<headroom_load::ScanSpec>())
        .transpose()
        .map_err(lib_err)?;
    let search = args
        .search
        .as_deref()
        .map(|s| s.parse::<headroom_load::SearchSpec>())
        .transpose()
        .map_err(lib_err)?;
    if scan.is_some() && search.is_some() {
        return Err(super::usage("--scan and --search cannot be combined"));
    }
    // Every value (distributions included) is checked before anything connects.
    let validated = opts.validate().map_err(lib_err)?;
    let engine = headroom_load::engine::choose_engine(opts.engine).map_err(lib_err)?;
    if let Some(reason) = &engine.fallback_reason {
        eprintln!("headroom load: {reason}; using epoll");
    }
    if opts.loadonly {
        let stats = headroom_load::preload(&opts, &validated).map_err(lib_err)?;
        println!(
            "Loaded {} records on each of {} server(s) in {:.2} s",
            stats.records_per_server, stats.servers, stats.seconds
        );
        return Ok(());
    }
    // -W: the run starts W seconds after startup (the preload counts towards it).
    if let Some(w) = wait {
        if let Some(left) = w.checked_sub(started.elapsed()) {
            std::thread::sleep(left);
        }
    }
    if let Some(spec) = scan {
        return run_scan(&args, &opts, &spec);
    }
    if let Some(spec) = search {
        return run_search(&args, &opts, &spec);
    }
    let mut ticker = Ticker::new(args.quiet, args.verbose);
    let report = headroom_load::run_report(&opts, &mut |iv| ticker.tick(iv)).map_err(lib_err)?;
    ticker.done();
    print!("{}", format_table(&report));
    if let Some(p) = &args.extra.json {
        write_file(p, &(serde_json::to_string_pretty(&report)? + "\n"))?;
    }
    if let Some(p) = &args.extra.csv {
        write_file(p, &format!("{}\n{}\n", csv_header(), csv_row(&report)))?;
    }
    if let Some(why) = &report.result.client.limited_by {
        eprintln!("headroom load: rate not carried: limited by {why}");
    }
    exit_if_invalid(&args, report.result.valid);
    Ok(())
}

fn run_agent(
    bind: &str,
    port: u16,
    sessions: Option<usize>,
    lambda_mul: u64,
) -> anyhow::Result<()> {
    let addr = format!("{bind}:{port}");
    let listener = std::net::TcpListener::bind(&addr)
        .with_context(|| format!("listening for load masters on {addr}"))?;
    eprintln!(
        "headroom load agent: listening on {} (protocol version {})",
        listener.local_addr().map(|a| a.to_string()).unwrap_or(addr),
        headroom_load::agent::AGENT_PROTOCOL_VERSION
    );
    headroom_load::agent::serve_weighted(listener, sessions, lambda_mul.max(1)).map_err(lib_err)
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

const SWEEP_HEADER: &str =
    "#    target   achieved       p50       p90       p99     p99.9    p99.99  p99(unc)    late  valid";

fn sweep_line(row: &SweepRow) -> String {
    let r = &row.report.result;
    let target = if row.qps == 0 {
        "peak".to_string()
    } else {
        row.qps.to_string()
    };
    format!(
        "{target:>10} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>6}",
        r.achieved_qps,
        r.read.p50_us,
        r.read.p90_us,
        r.read.p99_us,
        r.read.p999_us,
        r.read.p9999_us,
        r.read_uncorrected.p99_us,
        r.late,
        if r.valid { "yes" } else { "NO" }
    )
}

fn write_sweep_outputs(
    args: &Args,
    reports: &[&LoadReport],
    json: serde_json::Value,
) -> anyhow::Result<()> {
    if let Some(p) = &args.extra.json {
        write_file(p, &(serde_json::to_string_pretty(&json)? + "\n"))?;
    }
    if let Some(p) = &args.extra.csv {
        let mut text = csv_header() + "\n";
        for r in reports {
            text.push_str(&csv_row(r));
            text.push('\n');
        }
        write_file(p, &text)?;
    }
    Ok(())
}

fn print_failed_checks(row: &SweepRow) {
    if !row.report.result.valid {
        for c in row.report.result.checks.iter().filter(|c| !c.ok) {
            println!("{:>10}   ! {}: {}", "", c.name, c.detail);
        }
    }
}

fn run_scan(args: &Args, opts: &LoadOptions, spec: &headroom_load::ScanSpec) -> anyhow::Result<()> {
    println!("{SWEEP_HEADER}");
    let rows = sweep::scan(opts, spec, &mut |row| {
        println!("{}", sweep_line(row));
        print_failed_checks(row);
        let _ = std::io::stdout().flush();
    })
    .map_err(lib_err)?;
    let reports: Vec<&LoadReport> = rows.iter().map(|r| &r.report).collect();
    let json = serde_json::to_value(&reports)?;
    write_sweep_outputs(args, &reports, json)?;
    exit_if_invalid(args, reports.iter().all(|r| r.result.valid));
    Ok(())
}

fn run_search(
    args: &Args,
    opts: &LoadOptions,
    spec: &headroom_load::SearchSpec,
) -> anyhow::Result<()> {
    if !args.quiet {
        eprintln!(
            "searching for the highest QPS with p{} <= {} us ({} s per run)",
            spec.percentile, spec.target_us, opts.time_s
        );
    }
    let outcome = sweep::search(opts, spec, &mut |row| {
        if !args.quiet {
            eprintln!(
                "  tried {:>10}: p{} = {:.1} us, achieved {:.1} QPS",
                if row.qps == 0 {
                    "peak".to_string()
                } else {
                    row.qps.to_string()
                },
                spec.percentile,
                row.percentile_us,
                row.report.result.achieved_qps
            );
        }
    })
    .map_err(lib_err)?;
    println!("{SWEEP_HEADER}   p{}", spec.percentile);
    for row in &outcome.curve {
        let mark = match &outcome.best {
            Some(b) if b.qps == row.qps => "  <== best",
            _ => "",
        };
        println!("{} {:>9.1}{mark}", sweep_line(row), row.percentile_us);
    }
    match &outcome.best {
        Some(b) => println!(
            "\nHighest QPS with p{} <= {} us: {} (p{} = {:.1} us, achieved {:.1})",
            spec.percentile,
            spec.target_us,
            b.qps,
            spec.percentile,
            b.percentile_us,
            b.report.result.achieved_qps
        ),
        None => println!(
            "\nNo QPS tried kept p{} under {} us (lowest tried: {})",
            spec.percentile,
            spec.target_us,
            outcome
                .curve
                .iter()
                .map(|r| r.qps)
                .filter(|q| *q > 0)
                .min()
                .unwrap_or(0)
        ),
    }
    if let Some(b) = &outcome.best {
        print!("{}", format_checks(&b.report.result));
    }
    let reports: Vec<&LoadReport> = outcome.curve.iter().map(|r| &r.report).collect();
    let json = serde_json::json!({
        "search": {"percentile": spec.percentile, "target_us": spec.target_us,
                   "best_qps": outcome.best.as_ref().map(|b| b.qps),
                   "best_percentile_us": outcome.best.as_ref().map(|b| b.percentile_us)},
        "best": outcome.best.as_ref().map(|b| &b.report),
        "curve": reports,
    });
    write_sweep_outputs(args, &reports, json)?;
    exit_if_invalid(
        args,
        outcome.best.as_ref().is_none_or(|b| b.report.result.valid),
    );
    Ok(())
}

/// One-line progress on stderr: rewritten in place on a terminal, a line per second with -v.
struct Ticker {
    on_tty: bool,
    lines: bool,
    shown: bool,
}

impl Ticker {
    fn new(quiet: bool, verbose: u8) -> Ticker {
        let tty = std::io::stderr().is_terminal();
        Ticker {
            on_tty: !quiet && tty,
            lines: !quiet && !tty && verbose > 0,
            shown: false,
        }
    }

    fn tick(&mut self, iv: &Interval) {
        if !self.on_tty && !self.lines {
            return;
        }
        let p99 = if iv.hist.count() > 0 {
            format!("{:.1} us", iv.hist.percentile_us(99.0))
        } else {
            "-".into()
        };
        let line = format!(
            "[{:>5.1}s]{} qps {:>10.1}  p99 {p99}",
            iv.t_s,
            if iv.warmup { " warmup" } else { "" },
            iv.qps
        );
        let mut err = std::io::stderr().lock();
        if self.on_tty {
            let _ = write!(err, "\r\x1b[2K{line}");
            self.shown = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    fn done(&mut self) {
        if self.shown {
            eprintln!();
        }
    }
}
