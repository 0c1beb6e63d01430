//! `headroom bench NAME`: the papers' experiments (headroom-bench) and the tools' own benchmarks.
//!
//! The tools' benchmarks live in `headroom_bench::tools` (`loadgen`, `host`, `agent`, `prober`);
//! this module parses their flags and calls them.

use anyhow::Context as _;
use headroom_bench::tools;

/// Flags of `headroom bench`: one subcommand per experiment or benchmark, each parsing its own
/// flags with clap (`headroom bench NAME --help` lists them).
#[derive(clap::Args, Debug)]
#[command(subcommand_value_name = "NAME")]
pub struct Args {
    /// Output directory (also accepted after NAME)
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub which: Which,
}

/// The experiments (papers' figures) and the tools' own benchmarks.
#[derive(clap::Subcommand, Debug)]
pub enum Which {
    /// LC tail latency against load, alone (Heracles Fig. 1 baseline)
    #[command(disable_help_flag = true)]
    LatencyVsLoad(Rest),
    /// LC tail latency against load beside each antagonist (Heracles Fig. 1)
    #[command(disable_help_flag = true)]
    Interference(Rest),
    /// Scheduling-delay effect of BE sharing the LC's CPUs (Leverich & Kozyrakis)
    #[command(disable_help_flag = true)]
    Scheduling(Rest),
    /// Load imbalance across LC threads
    #[command(disable_help_flag = true)]
    Imbalance(Rest),
    /// Isolation mechanisms side by side (PerfIso's comparison)
    #[command(disable_help_flag = true)]
    Isolation(Rest),
    /// A diurnal colocation trace under each policy (Heracles Fig. 7-style EMU and SLO)
    #[command(disable_help_flag = true)]
    Colocation(Rest),
    /// The load generator against itself and mutilate
    #[command(disable_help_flag = true)]
    Loadgen(Rest),
    /// What the host layer's hot sensors cost
    #[command(disable_help_flag = true)]
    Host(Rest),
    /// The agent's CPU use and reaction time
    #[command(disable_help_flag = true)]
    Agent(Rest),
    /// The agent's latency prober against an independent load generator, with a CPU hog on the prober's CPU
    #[command(disable_help_flag = true)]
    Prober(Rest),
    /// Two LC services (memcached and serve, own SLOs, opposite load schedules) and one BE under none, the single-LC agent and multi
    #[command(disable_help_flag = true)]
    MultiLc(Rest),
    /// The node's advertised headroom.io/be-cpu beside what hybrid grants (memcached as a discovered LC at two loads, a BE pod committed, the stand-in API server)
    #[cfg(feature = "kube")]
    #[command(disable_help_flag = true)]
    Advertise(Rest),
}

/// The chosen benchmark's own flags, parsed by its own clap parser (`--help` included).
#[derive(clap::Args, Debug)]
pub struct Rest {
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "FLAGS"
    )]
    pub args: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Stopped from outside (a `timeout`, Ctrl-C, a closed terminal), a bench stops what it
    // started instead of leaving it running.
    headroom_bench::stop_on_signal::install().context("watching for SIGTERM, SIGINT and SIGHUP")?;
    let (name, rest) = match &args.which {
        Which::LatencyVsLoad(r) => ("latency-vs-load", r),
        Which::Interference(r) => ("interference", r),
        Which::Scheduling(r) => ("scheduling", r),
        Which::Imbalance(r) => ("imbalance", r),
        Which::Isolation(r) => ("isolation", r),
        Which::Colocation(r) => ("colocation", r),
        Which::Loadgen(r) => ("loadgen", r),
        Which::Host(r) => ("host", r),
        Which::Agent(r) => ("agent", r),
        Which::Prober(r) => ("prober", r),
        Which::MultiLc(r) => ("multi-lc", r),
        #[cfg(feature = "kube")]
        Which::Advertise(r) => ("advertise", r),
    };
    // `--out` may also come after NAME (it is then among the benchmark's flags).
    let (late_out, rest) = split_out(&rest.args)?;
    let out = args.out.or(late_out);
    match name {
        "loadgen" => Ok(tools::loadgen::run(out, super::parse_flags(&rest)?)?),
        "host" => Ok(tools::host::run(out, super::parse_flags(&rest)?)?),
        "agent" => Ok(tools::agent::run(out, super::parse_flags(&rest)?)?),
        "prober" => Ok(tools::prober::run(out, super::parse_flags(&rest)?)?),
        "multi-lc" => Ok(tools::multi_lc::run(out, super::parse_flags(&rest)?)?),
        #[cfg(feature = "kube")]
        "advertise" => Ok(tools::advertise::run(out, super::parse_flags(&rest)?)?),
        other => experiments(other, out, &rest),
    }
}

/// Flags of the papers' experiments (after `headroom bench NAME`).
#[derive(clap::Parser, Debug, Default)]
#[command(name = "headroom bench EXPERIMENT", no_binary_name = true)]
pub(crate) struct ExperimentFlags {
    /// The quick version (a couple of minutes): fewer load levels and configurations, short points
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seconds of load per point (per window for colocation)
    #[arg(long)]
    pub(crate) duration: Option<f64>,
    /// Repetitions of every point (median and spread are reported)
    #[arg(long)]
    pub(crate) repeats: Option<u32>,
    /// LC load levels in % of peak, comma-separated (e.g. 10,50,90)
    #[arg(long, value_delimiter = ',')]
    pub(crate) loads: Option<Vec<f64>>,
    /// LC tail-latency SLO in µs (default: 5x the LC-alone p99 at 50% of capacity)
    #[arg(long)]
    pub(crate) slo_us: Option<f64>,
    /// LC peak QPS (default: found by probing the LC alone)
    #[arg(long)]
    pub(crate) peak_qps: Option<f64>,
    /// SLO percentile
    #[arg(long, default_value_t = DEFAULT_PERCENTILE)]
    pub(crate) percentile: f64,
    /// BE workloads / antagonists, comma-separated (spin, dram, llc:0.5, spin-os, square, ...)
    #[arg(long, value_delimiter = ',')]
    pub(crate) be: Option<Vec<String>>,
    /// Policies or settings, comma-separated (colocation: none,hybrid; isolation: none,blind,...)
    #[arg(long, value_delimiter = ',')]
    pub(crate) policies: Option<Vec<String>>,
    /// Colocation trace length in minutes
    #[arg(long)]
    pub(crate) minutes: Option<f64>,
    /// CPUs for the load generator and the agent (default: one per 4 CPUs, at most 8, from CPU 0; given
    /// alone, the LC and BE get the rest)
    #[arg(long)]
    pub(crate) loadgen_cpus: Option<String>,
    /// CPUs for the LC service and the BE work (default: all others; given alone, the load
    /// generator gets the rest, at most 8)
    #[arg(long)]
    pub(crate) server_cpus: Option<String>,
    /// CPUs for the BE work only (default: the server CPUs, shared with the LC); e.g. the load
    /// generator's CPU, to measure interference through the LLC, memory and network without
    /// time-sharing the LC's CPU (Heracles Fig. 1 places antagonists on other cores)
    #[arg(long)]
    pub(crate) be_cpus: Option<String>,
    /// Run the agent with --dry-run (decide and log, change nothing)
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Run the load generator under SCHED_FIFO where allowed (default: the normal scheduler; a
    /// real-time client that polls most of a second is throttled by the kernel's real-time
    /// budget, docs/bench.md)
    #[arg(long)]
    pub(crate) realtime_loadgen: bool,
    /// The default, kept for scripts written when SCHED_FIFO was
    #[arg(long, hide = true, conflicts_with = "realtime_loadgen")]
    pub(crate) no_realtime_loadgen: bool,
}

/// The SLO percentile when `--percentile` is not given.
const DEFAULT_PERCENTILE: f64 = 99.0;

impl ExperimentFlags {
    /// What no flag at all gives (the flags' own defaults).
    pub(crate) fn defaults() -> ExperimentFlags {
        ExperimentFlags {
            percentile: DEFAULT_PERCENTILE,
            ..ExperimentFlags::default()
        }
    }
}

/// Builds the recording options from the command line's flags (bad values are usage errors).
fn experiment_options(
    exp: headroom_bench::experiments::Experiment,
    rest: &[String],
    invocation: String,
) -> anyhow::Result<headroom_bench::record::Options> {
    let flags: ExperimentFlags = super::parse_flags(rest)?;
    options_from_flags(exp, flags, invocation)
}

/// The longest colocation trace (`--minutes`): a day.
pub(crate) const MAX_MINUTES: f64 = 24.0 * 60.0;
/// The longest point or window (`--duration`): an hour.
const MAX_DURATION_S: f64 = 3600.0;
/// The most repetitions of a point.
const MAX_REPEATS: u32 = 1000;
/// The largest `--slo-us` (about 17 minutes) and `--peak-qps`: beyond either is a typo.
const MAX_SLO_US: f64 = 1e9;
const MAX_PEAK_QPS: f64 = 1e9;

/// A number in (0, max], else the problem in words.
fn within(flag: &str, v: f64, max: f64, unit: &str) -> Option<String> {
    (!(v.is_finite() && v > 0.0 && v <= max)).then(|| {
        format!(
            "{flag} {}: must be above 0 and at most {max} {unit}",
            super::number(v)
        )
    })
}

/// Every problem with the experiment flags' values, in words (empty when they are all good).
pub(crate) fn flag_problems(flags: &ExperimentFlags) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(d) = flags.duration {
        if !(d.is_finite() && (1.0..=MAX_DURATION_S).contains(&d)) {
            problems.push(format!(
                "--duration {}: must be between 1 and {MAX_DURATION_S} seconds",
                super::number(d)
            ));
        }
    }
    if let Some(r) = flags.repeats {
        if !(1..=MAX_REPEATS).contains(&r) {
            problems.push(format!(
                "--repeats {r}: must be between 1 and {MAX_REPEATS}"
            ));
        }
    }
    if let Some(l) = &flags.loads {
        if l.is_empty() || l.iter().any(|x| !(*x > 0.0 && *x <= 200.0)) {
            problems.push(format!(
                "--loads {l:?}: each level must be in (0, 200] % of peak"
            ));
        }
    }
    problems.extend(
        flags
            .slo_us
            .and_then(|s| within("--slo-us", s, MAX_SLO_US, "µs")),
    );
    problems.extend(
        flags
            .peak_qps
            .and_then(|p| within("--peak-qps", p, MAX_PEAK_QPS, "QPS")),
    );
    if !(flags.percentile > 0.0 && flags.percentile < 100.0) {
        problems.push(format!(
            "--percentile {}: must be in (0, 100)",
            flags.percentile
        ));
    }
    problems.extend(
        flags
            .minutes
            .and_then(|m| within("--minutes", m, MAX_MINUTES, "minutes (a day)")),
    );
    for (flag, list) in [
        ("--loadgen-cpus", &flags.loadgen_cpus),
        ("--server-cpus", &flags.server_cpus),
        ("--be-cpus", &flags.be_cpus),
    ] {
        if let Some(Err(e)) = list.as_deref().map(headroom_bench::runner::parse_cpu_list) {
            problems.push(format!("{flag}: {e}"));
        }
    }
    problems
}

/// Problems as one usage error (every one named), or nothing.
pub(crate) fn refuse(problems: Vec<String>) -> anyhow::Result<()> {
    match problems.len() {
        0 => Ok(()),
        1 => Err(super::usage(problems.concat())),
        n => Err(super::usage(format!(
            "{n} problems: {}",
            problems.join("; ")
        ))),
    }
}

/// Builds the recording options from flags parsed or built (bad values are usage errors, every
/// one at once).
pub(crate) fn options_from_flags(
    exp: headroom_bench::experiments::Experiment,
    flags: ExperimentFlags,
    invocation: String,
) -> anyhow::Result<headroom_bench::record::Options> {
    refuse(flag_problems(&flags))?;
    let bin = match std::env::var_os("HEADROOM_BIN") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::env::current_exe()?,
    };
    let mut o = headroom_bench::record::Options::defaults(exp, flags.quick, bin);
    o.invocation = invocation;
    if let Some(d) = flags.duration {
        o.duration_s = d;
    }
    if let Some(r) = flags.repeats {
        o.repeats = r;
    }
    if let Some(l) = flags.loads {
        o.loads = l.iter().map(|x| x / 100.0).collect();
    }
    o.slo_us = flags.slo_us.or(o.slo_us);
    o.peak_qps = flags.peak_qps.or(o.peak_qps);
    o.percentile = flags.percentile;
    if let Some(b) = flags.be {
        o.be = b;
    }
    if let Some(p) = flags.policies {
        o.policies = p;
    }
    if let Some(m) = flags.minutes {
        o.minutes = m;
    }
    // The lists parse (checked above).
    let cpus = |s: &Option<String>| {
        s.as_deref()
            .and_then(|c| headroom_bench::runner::parse_cpu_list(c).ok())
    };
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    o.placement = headroom_bench::runner::Placement::with_overrides(
        host_cpus,
        cpus(&flags.loadgen_cpus),
        cpus(&flags.server_cpus),
    );
    if let Some(be) = cpus(&flags.be_cpus) {
        o.placement.be = be;
    }
    o.dry_run = flags.dry_run;
    o.realtime_loadgen = flags.realtime_loadgen && !flags.no_realtime_loadgen;
    if !o.dry_run {
        if let Err(why) =
            headroom_bench::capability::agent_can_actuate(std::path::Path::new("/sys/fs/cgroup"))
        {
            let uses_agent = o.policies.iter().any(|p| p != "none" && p != "equal");
            if uses_agent {
                eprintln!(
                    "headroom bench: the agent cannot act here ({}); it runs with --dry-run",
                    why.join("; ")
                );
                o.dry_run = true;
            }
        }
    }
    Ok(o)
}

fn experiments(name: &str, out: Option<std::path::PathBuf>, rest: &[String]) -> anyhow::Result<()> {
    let exp: headroom_bench::experiments::Experiment = name.parse().map_err(|_| {
        super::usage(format!(
            "headroom bench: unknown experiment {name:?}: expected one of latency-vs-load, interference, scheduling, imbalance, isolation, colocation, loadgen, host, agent, prober, multi-lc"
        ))
    })?;
    let out = out.unwrap_or_else(|| std::path::PathBuf::from("headroom-results").join(name));
    let invocation = std::iter::once("headroom".to_string())
        .chain(std::env::args().skip(1))
        .map(|a| headroom_bench::runner::shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ");
    let opts = experiment_options(exp, rest, invocation)?;
    eprintln!(
        "headroom bench {name}: writing to {} (an interrupted run resumes where it stopped)",
        out.display()
    );
    let mut progress = |line: &str| eprintln!("{line}");
    let mut live = |w: &headroom_bench::record::WindowView| {
        eprintln!(
            "[{}] window {}/{}: load {:>3.0}%  p99 {:>6} µs (SLO {:.0})  BE CPUs {}  EMU {}",
            w.policy,
            w.index + 1,
            w.windows,
            w.load_pct,
            w.tail_us.map_or("–".into(), |t| format!("{t:.0}")),
            w.slo_us,
            w.be_cpus.map_or("–".into(), |c| format!("{c:.1}")),
            w.emu.map_or("–".into(), |e| format!("{:.0}%", e * 100.0)),
        )
    };
    let files = headroom_bench::record::run_experiment(exp, opts, &out, &mut progress, &mut live);
    remove_bench_groups();
    let files = files?;
    println!("report:  {}", files.html.display());
    println!("summary: {}", files.summary_json.display());
    println!("         {}", files.summary_md.display());
    Ok(())
}

/// The experiments' agents create `headroom-bench/{lc,be}`; an agent leaves the LC group while
/// the LC service is still in it, so once every run has stopped its processes the experiment
/// removes the (now empty) groups. Groups that still hold a process are left alone.
pub(crate) fn remove_bench_groups() {
    if !headroom_host::process::is_root() {
        return;
    }
    let Ok(cgroups) = headroom_host::LinuxHost::system().cgroups() else {
        return;
    };
    let Ok(top) = headroom_types::GroupPath::new("headroom-bench") else {
        return;
    };
    if !cgroups.exists(&top) {
        return;
    }
    let mut groups = cgroups.children(&top).unwrap_or_default();
    groups.push(top);
    for g in groups {
        let empty = cgroups.procs(&g).is_ok_and(|p| p.is_empty());
        if !empty {
            eprintln!("left cgroup {g}: it still holds processes");
            return;
        }
    }
    if let Err(e) =
        cgroups.remove(&headroom_types::GroupPath::new("headroom-bench").expect("valid"))
    {
        eprintln!("removing cgroup headroom-bench: {e}");
    }
}

/// Takes `--out DIR` / `--out=DIR` out of the trailing flags.
fn split_out(rest: &[String]) -> anyhow::Result<(Option<std::path::PathBuf>, Vec<String>)> {
    let mut out = None;
    let mut kept = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        if a == "--out" {
            let v = it
                .next()
                .ok_or_else(|| super::usage("--out needs a directory"))?;
            out = Some(std::path::PathBuf::from(v));
        } else if let Some(v) = a.strip_prefix("--out=") {
            out = Some(std::path::PathBuf::from(v));
        } else {
            kept.push(a.clone());
        }
    }
    Ok((out, kept))
}

#[cfg(test)]
mod tests {
    use super::experiment_options;
    use headroom_bench::experiments::Experiment;

    fn opts(args: &[&str]) -> anyhow::Result<headroom_bench::record::Options> {
        let rest: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        experiment_options(Experiment::Interference, &rest, String::new())
    }

    #[test]
    fn be_cpus_default_to_the_server_cpus_and_can_be_moved() {
        let o = opts(&["--server-cpus", "1"]).unwrap();
        assert!(o.placement.be.is_empty());
        assert_eq!(o.placement.be_cpus(), &[1]);
        let o = opts(&["--server-cpus", "1", "--be-cpus", "0"]).unwrap();
        assert_eq!(o.placement.be_cpus(), &[0]);
        assert_eq!(o.placement.server, vec![1]);
        let e = opts(&["--be-cpus", "zero"]).unwrap_err().to_string();
        assert!(e.contains("--be-cpus"), "{e}");
    }

    #[test]
    fn the_load_generator_is_a_normal_task_unless_asked() {
        assert!(!opts(&[]).unwrap().realtime_loadgen);
        assert!(opts(&["--realtime-loadgen"]).unwrap().realtime_loadgen);
        assert!(!opts(&["--no-realtime-loadgen"]).unwrap().realtime_loadgen);
        assert!(opts(&["--realtime-loadgen", "--no-realtime-loadgen"]).is_err());
    }
}
