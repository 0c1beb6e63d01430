//! Coverage of headroom load's confidence intervals against an M/M/1 server whose response-time
//! distribution is known in closed form (Exp(μ − λ)): runs `--runs` short runs at each utilisation
//! and prints, per percentile, how often the nominal 95% interval contains the analytic value —
//! with the batch-means intervals the result reports and with the independent-sample intervals
//! they replaced.
//!
//! `cargo run --release -p headroom-load --example ci_coverage -- --runs 40`

use std::sync::Mutex;

use clap::Parser;
use headroom_load::checks::{inflation_at, rule_inflation, run_checks};
use headroom_load::stats::batch::mm1_quantile_us;
use headroom_load::stats::{enough_samples, summary_blocked};
use headroom_load::testkit::Mm1Server;
use headroom_load::LoadOptions;

#[derive(Parser, Debug)]
struct Args {
    /// Runs per utilisation.
    #[arg(long, default_value_t = 40)]
    runs: usize,
    /// Utilisations with their service rates, RHO:MU (MU per second).
    #[arg(long, value_delimiter = ',', default_values_t = ["0.5:500".to_string(), "0.9:2000".to_string()])]
    cases: Vec<String>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    time: f64,
    /// Warmup seconds per run (the queue starts empty).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Runs at once (each its own server and client). With `--pin` only one: every run's client
    /// is pinned to CPU 0 and its fixture to the last CPU, so two runs at once put two
    /// busy-polling real-time clients on one CPU, where each waits for the other's spin (send lag
    /// p99 425–470 µs instead of 17, p50 10–17% high, with either engine).
    #[arg(long, default_value_t = 2)]
    parallel: usize,
    /// Connections of each client (depth 256 each: arrivals are never held back).
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Runs whose fixture replied later than this (µs) past a modelled completion are not M/M/1
    /// (the VM descheduled the server) and are left out of the table, counted apart.
    #[arg(long, default_value_t = 20_000.0)]
    max_fixture_late_us: f64,
    /// Only tally the rows of an earlier `--rows` file (with the overhead calibrated now at
    /// `--calibrate-qps`), no runs.
    #[arg(long)]
    summarize: Option<std::path::PathBuf>,
    /// Rate of the overhead calibration for `--summarize`.
    #[arg(long, default_value_t = 500.0)]
    calibrate_qps: f64,
    /// Pin the client's load thread to CPU 0 and the fixture to the last CPU.
    #[arg(long)]
    pin: bool,
    /// Also write one CSV row per run (rho, run, n, p50, its CIs, p99, …, fixture lateness) here.
    #[arg(long)]
    rows: Option<std::path::PathBuf>,
    /// Client busy-waits the last N µs before a send (this VM's timer wake-up is ~35 µs late).
    #[arg(long, default_value_t = 80)]
    spin_us: u64,
    /// Client event loop: auto, io_uring or epoll.
    #[arg(long, default_value = "auto")]
    engine: headroom_load::engine::EngineChoice,
}

/// The client side of every run: `connections` × depth 256 (arrivals are never held back).
fn load_opts(
    args: &Args,
    addr: std::net::SocketAddr,
    qps: f64,
    time_s: f64,
    seed: u64,
) -> LoadOptions {
    LoadOptions {
        servers: vec![addr.to_string()],
        qps: qps.round() as u64,
        time_s,
        warmup_s: args.warmup,
        connections: args.connections,
        depth: 256,
        noload: true,
        records: 1000,
        seed: Some(seed),
        spin_us: args.spin_us,
        // The client thread on CPU 0, the fixture on the last CPU (see Mm1Server::start_on).
        affinity: args.pin,
        engine: args.engine,
        ..LoadOptions::default()
    }
}

fn server_cpu(args: &Args) -> Option<usize> {
    args.pin
        .then(|| headroom_load::clock::online_cpus().saturating_sub(1))
}

/// The client's overhead at rate `qps`: the median latency against the fixture in its no-queue
/// mode (every reply exactly 1 ms after its request arrived) less that 1 ms: loopback, the
/// client's send lag and its wake-up for the reply. What a client measures on top of the modelled
/// response time.
fn overhead_p50_us(args: &Args, qps: f64) -> f64 {
    let server = Mm1Server::start_delay(std::time::Duration::from_millis(1), server_cpu(args))
        .expect("starting the calibration server");
    let opts = load_opts(args, server.addr(), qps, 3.0, 7);
    let raw = headroom_load::run_raw(&opts, &mut |_| {}).expect("calibration run");
    raw.load.read.percentile_us(50.0) - 1000.0
}

/// Coverage of the rows a previous run wrote (`--rows`), against the analytic values and against
/// them plus `overhead` µs: the table without re-running.
fn summarize_rows(path: &std::path::Path, overhead: f64) {
    let text = std::fs::read_to_string(path).expect("reading --summarize");
    let rows: Vec<Vec<f64>> = text
        .lines()
        .map(|l| {
            l.split(',')
                .map(|v| v.parse::<f64>().unwrap_or(f64::NAN))
                .collect()
        })
        .filter(|r: &Vec<f64>| r.len() >= 22)
        .collect();
    let mut cases: Vec<(f64, f64)> = rows.iter().map(|r| (r[0], r[1])).collect();
    cases.dedup();
    println!(
        "{:>5} {:>6} {:>5} {:>5} {:>9} {:>9} {:>9}",
        "rho", "mu", "pct", "runs", "cov", "cov+ovh", "iid cov"
    );
    for (rho, mu) in cases {
        let rs: Vec<&Vec<f64>> = rows.iter().filter(|r| r[0] == rho && r[1] == mu).collect();
        // Columns: p50 at 4, its CI at 5–6, iid CI at 7–8; p99 at 9, CI 10–11, iid 12–13.
        for (p, lo, hi, ilo, ihi) in [(0.5, 5, 6, 7, 8), (0.99, 10, 11, 12, 13)] {
            let truth = mm1_quantile_us(rho * mu, mu, p);
            let n = rs.len() as f64;
            let cov = |t: f64, a: usize, b: usize| {
                rs.iter().filter(|r| r[a] <= t && t <= r[b]).count() as f64 / n
            };
            println!(
                "{rho:>5} {mu:>6} {:>5} {:>5} {:>9.3} {:>9.3} {:>9.3}",
                format!("p{}", p * 100.0),
                rs.len(),
                cov(truth, lo, hi),
                cov(truth + overhead, lo, hi),
                cov(truth, ilo, ihi)
            );
        }
    }
}

/// The independence rule n / inflation(pX) ≥ 10/(1 − 0.99) judged for several X (and for the
/// rule the check uses, min(p50, p99), last): how many runs each accepts and how often the p99
/// interval of an accepted run covers the analytic p99.
const RULE_PERCENTILES: [f64; 5] = [50.0, 75.0, 90.0, 99.0, f64::NAN];

#[derive(Default, Clone)]
struct RuleTally {
    accepted: usize,
    covered: usize,
}

#[derive(Default, Clone)]
struct Tally {
    covered_shifted: usize,
    runs: usize,
    claimed: usize,
    covered: usize,
    covered_iid: usize,
    width: f64,
    measured: f64,
}

fn main() {
    let args = Args::parse();
    if let Some(path) = &args.summarize {
        let overhead = overhead_p50_us(&args, args.calibrate_qps);
        println!(
            "client overhead (p50 beyond a fixed 1 ms reply, at {} QPS): {overhead:.1} us",
            args.calibrate_qps
        );
        summarize_rows(path, overhead);
        return;
    }
    println!(
        "M/M/1 FIFO server (timer-driven, memcached ASCII), {} runs per case of {} s after {} s warmup, {} connections",
        args.runs, args.time, args.warmup, args.connections
    );
    println!(
        "{:>5} {:>6} {:>7} {:>10} {:>10} {:>7} {:>10} {:>10} {:>9} {:>7} {:>8}",
        "rho",
        "mu",
        "pct",
        "analytic",
        "mean est",
        "runs",
        "batch cov",
        "iid cov",
        "rel width",
        "valid",
        "cov+ovh"
    );
    println!("(cov+ovh: batch-means coverage of the analytic value plus the fixture's measured overhead)");
    for case in &args.cases {
        let (rho, mu) = case
            .split_once(':')
            .and_then(|(r, m)| Some((r.parse::<f64>().ok()?, m.parse::<f64>().ok()?)))
            .unwrap_or_else(|| panic!("--cases {case}: expected RHO:MU, e.g. 0.9:2000"));
        let lambda = rho * mu;
        let overhead = overhead_p50_us(&args, lambda);
        println!(
            "  rho {rho}: the fixture's overhead (p50 with no queue, at {lambda} QPS): {overhead:.1} us"
        );
        let pcts = [50.0, 99.0, 99.9];
        let tallies = Mutex::new(vec![Tally::default(); pcts.len()]);
        let valid = Mutex::new((0usize, 0usize));
        let rules = Mutex::new(vec![RuleTally::default(); RULE_PERCENTILES.len()]);
        let next = Mutex::new(0usize);
        let excluded = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            let parallel = if args.pin { 1 } else { args.parallel.max(1) };
            for _ in 0..parallel {
                s.spawn(|| loop {
                    let run = {
                        let mut n = next.lock().unwrap();
                        if *n >= args.runs {
                            return;
                        }
                        *n += 1;
                        *n
                    };
                    let server = Mm1Server::start_on(mu, 1000 + run as u64, server_cpu(&args))
                        .expect("starting the M/M/1 server");
                    let opts = load_opts(&args, server.addr(), lambda, args.time, run as u64);
                    let v = opts.validate().expect("valid options");
                    let raw = match headroom_load::run_raw(&opts, &mut |_| {}) {
                        Ok(r) => r,
                        Err(e) => {
                            eprintln!("run {run}: {e}");
                            continue;
                        }
                    };
                    let (late_mean, late_max, _) = server.lateness_us();
                    drop(server);
                    if late_max > args.max_fixture_late_us {
                        // The VM stalled the fixture itself: this run is not M/M/1.
                        eprintln!("rho {rho} run {run}: fixture replied {late_max:.0} us late: excluded");
                        excluded.lock().unwrap().push(run);
                        continue;
                    }
                    if std::env::var_os("VERBOSE").is_some() {
                        eprintln!(
                            "rho {rho} run {run}: server reply lateness mean {late_mean:.1} us max {late_max:.0} us; client send lag p50 {:.1} p99 {:.1} us",
                            raw.send_lag.percentile_us(50.0),
                            raw.send_lag.percentile_us(99.0)
                        );
                    }
                    let checks = run_checks(&raw, &v.iadist_unit, 99.0);
                    let all_ok = checks.iter().all(|c| c.ok);
                    for c in checks.iter().filter(|c| !c.ok) {
                        eprintln!("rho {rho} run {run}: [FAIL] {} {}", c.name, c.detail);
                    }
                    let stats = summary_blocked(&raw.load.read, &raw.load.read_blocks);
                    let n = raw.load.read.count();
                    if let Some(path) = &args.rows {
                        use std::io::Write as _;
                        let iid50 = raw.load.read.percentile_ci_us(50.0);
                        let iid99 = raw.load.read.percentile_ci_us(99.0);
                        let line = format!(
                            "{rho},{mu},{run},{n},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{late_mean:.1},{late_max:.0},{all_ok}\n",
                            stats.p50_us, stats.p50_ci_us[0], stats.p50_ci_us[1], iid50[0], iid50[1],
                            stats.p99_us, stats.p99_ci_us[0], stats.p99_ci_us[1], iid99[0], iid99[1],
                            stats.p999_us, stats.p999_ci_us[0], stats.p999_ci_us[1],
                            stats.p50_variance_inflation, stats.p99_variance_inflation,
                        );
                        let mut f = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(path)
                            .expect("opening --rows");
                        let _ = f.write_all(line.as_bytes());
                    }
                    let mut t = tallies.lock().unwrap();
                    for (i, p) in pcts.iter().enumerate() {
                        let truth = mm1_quantile_us(lambda, mu, p / 100.0);
                        let (est, ci) = match i {
                            0 => (stats.p50_us, stats.p50_ci_us),
                            1 => (stats.p99_us, stats.p99_ci_us),
                            _ => (stats.p999_us, stats.p999_ci_us),
                        };
                        let iid = raw.load.read.percentile_ci_us(*p);
                        let e = &mut t[i];
                        e.runs += 1;
                        e.measured += est;
                        if enough_samples(n, *p) {
                            e.claimed += 1;
                            e.covered += (ci[0] <= truth && truth <= ci[1]) as usize;
                            e.covered_iid += (iid[0] <= truth && truth <= iid[1]) as usize;
                            let shifted = truth + overhead;
                            e.covered_shifted += (ci[0] <= shifted && shifted <= ci[1]) as usize;
                            e.width += (ci[1] - ci[0]) / truth;
                        }
                    }
                    {
                        let truth = mm1_quantile_us(lambda, mu, 0.99);
                        let covers = stats.p99_ci_us[0] <= truth && truth <= stats.p99_ci_us[1];
                        let mut r = rules.lock().unwrap();
                        for (i, p) in RULE_PERCENTILES.iter().enumerate() {
                            let infl = if p.is_nan() {
                                rule_inflation(&raw.load.read, &raw.load.read_blocks, 99.0)
                            } else {
                                inflation_at(&raw.load.read, &raw.load.read_blocks, *p)
                            };
                            if enough_samples((n as f64 / infl) as u64, 99.0) {
                                r[i].accepted += 1;
                                r[i].covered += covers as usize;
                            }
                        }
                    }
                    let mut v = valid.lock().unwrap();
                    v.0 += 1;
                    v.1 += all_ok as usize;
                });
            }
        });
        let t = tallies.into_inner().unwrap();
        let (done, ok) = valid.into_inner().unwrap();
        for (p, r) in RULE_PERCENTILES.iter().zip(rules.into_inner().unwrap()) {
            println!(
                "  rho {rho}: independence rule on inflation({}): accepts {}/{done} runs, p99 coverage among them {}",
                if p.is_nan() { "min(p50, p99), the check's".to_string() } else { format!("p{p}") },
                r.accepted,
                if r.accepted == 0 { "-".to_string() } else { format!("{:.3}", r.covered as f64 / r.accepted as f64) }
            );
        }
        let excluded = excluded.into_inner().unwrap();
        if !excluded.is_empty() {
            println!(
                "  rho {rho}: {} runs excluded, the fixture itself late by more than {} us (runs {excluded:?})",
                excluded.len(),
                args.max_fixture_late_us
            );
        }
        for (i, p) in pcts.iter().enumerate() {
            let e = &t[i];
            let truth = mm1_quantile_us(lambda, mu, p / 100.0);
            if e.claimed == 0 {
                println!(
                    "{rho:>5} {mu:>6} {:>7} {truth:>10.1} {:>10.1} {:>7} {:>10} {:>10} {:>9} {:>7}",
                    format!("p{p}"),
                    e.measured / e.runs.max(1) as f64,
                    0,
                    "-",
                    "-",
                    "-",
                    "-"
                );
                continue;
            }
            println!(
                "{rho:>5} {mu:>6} {:>7} {truth:>10.1} {:>10.1} {:>7} {:>10.3} {:>10.3} {:>9.3} {:>7} {:>8.3}",
                format!("p{p}"),
                e.measured / e.runs.max(1) as f64,
                e.claimed,
                e.covered as f64 / e.claimed as f64,
                e.covered_iid as f64 / e.claimed as f64,
                e.width / e.claimed as f64,
                format!("{ok}/{done}"),
                e.covered_shifted as f64 / e.claimed as f64
            );
        }
    }
}
