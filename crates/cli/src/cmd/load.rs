//! `headroom load`: mutilate's flags (same names, same meaning) plus `--protocol`, `--json`,
//! `--csv`, `--hdr`, `--feed`, `--seed`, `--popularity`; `headroom load agent` (or `-A`) runs a
//! remote load agent. See docs/load.md.

use std::io::{IsTerminal, Write};
use std::path::Path;

use anyhow::Context;
use headroom_load::options::DEFAULT_AGENT_PORT;
use headroom_load::report::{csv_header, csv_row, format_checks, format_table, LoadReport};
use headroom_load::sweep::{self, SweepRow};
use headroom_load::{Interval, LoadArgs, LoadError, LoadOptions, Sweep};

/// Flags of `headroom load`: the load crate's (mutilate-compatible), and `headroom load agent`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    pub sub: Option<Sub>,
    #[command(flatten)]
    pub load: LoadArgs,
}

/// Ends the process with `--invalid-exit-code` when the results were not valid (after the output
/// was flushed).
fn exit_if_invalid(args: &LoadArgs, valid: bool) {
    if !valid && args.extra.invalid_exit_code != 0 {
        let _ = std::io::stdout().flush();
        eprintln!(
            "headroom: self-checks failed (result not valid): exit {}",
            args.extra.invalid_exit_code
        );
        crate::log_queue::flush(crate::LOG_FLUSH);
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
    let flags = &args.load;
    flags.refuse_unsupported().map_err(lib_err)?;
    if flags.agentmode {
        return run_agent(
            &flags.extra.bind,
            flags.agent_port,
            None,
            flags.compat.lambda_mul,
        );
    }
    let opts = flags.to_options().map_err(lib_err)?;
    let wait = flags.wait().map_err(lib_err)?;
    let sweep = flags.sweep().map_err(lib_err)?;
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
    match sweep {
        Sweep::Scan(spec) => return run_scan(flags, &opts, &spec),
        Sweep::Search(spec) => return run_search(flags, &opts, &spec),
        Sweep::Single => {}
    }
    let mut ticker = Ticker::new(flags.quiet, flags.verbose);
    let report = headroom_load::run_report(&opts, &mut |iv| ticker.tick(iv)).map_err(lib_err)?;
    ticker.done();
    print!("{}", format_table(&report));
    if let Some(p) = &flags.extra.json {
        write_file(p, &(serde_json::to_string_pretty(&report)? + "\n"))?;
    }
    if let Some(p) = &flags.extra.csv {
        write_file(p, &format!("{}\n{}\n", csv_header(), csv_row(&report)))?;
    }
    if let Some(why) = &report.result.client.limited_by {
        eprintln!("headroom load: rate not carried: limited by {why}");
    }
    exit_if_invalid(flags, report.result.valid);
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
    args: &LoadArgs,
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

fn run_scan(
    args: &LoadArgs,
    opts: &LoadOptions,
    spec: &headroom_load::ScanSpec,
) -> anyhow::Result<()> {
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
    args: &LoadArgs,
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

/// One-line progress on stderr: a live line (indicatif) on a terminal, a line per second with -v
/// when stderr is not one, nothing otherwise.
struct Ticker {
    live: Option<indicatif::ProgressBar>,
    lines: bool,
}

impl Ticker {
    fn new(quiet: bool, verbose: u8) -> Ticker {
        let tty = std::io::stderr().is_terminal();
        let live = (!quiet && tty).then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(indicatif::ProgressStyle::with_template("{msg}").expect("template"));
            bar
        });
        Ticker {
            live,
            lines: !quiet && !tty && verbose > 0,
        }
    }

    fn tick(&mut self, iv: &Interval) {
        if self.live.is_none() && !self.lines {
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
        match &self.live {
            Some(bar) => bar.set_message(line),
            None => eprintln!("{line}"),
        }
    }

    /// Leaves the last live line on the terminal, as the table follows on stdout.
    fn done(&mut self) {
        if let Some(bar) = self.live.take() {
            bar.finish();
        }
    }
}
