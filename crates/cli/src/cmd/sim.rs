//! `headroom sim`: the real policies on modelled servers (`fleet`), the model fitted from bench
//! results (`calibrate`) and checked against a real run (`validate`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use headroom_sim::fleet::{run_fleet, FleetSpec};
use headroom_sim::model::ServerModel;
use headroom_sim::multi::report::{text_table, write_multi_report};
use headroom_sim::multi::{run_multi_fleet, ServiceSpec, ServicesFile, DEFAULT_POLICIES};
use headroom_sim::queue::StallForm;
use headroom_sim::report::write_fleet_report;
use headroom_sim::run::{parse_policy, SimSetup, ALL_POLICIES};
use headroom_sim::trace::LoadTrace;
use headroom_sim::SimError;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: SimCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum SimCommand {
    /// M servers over a diurnal day under every policy: fleet EMU, SLO violations, BE work, fan-out tail
    Fleet(FleetArgs),
    /// Fit the server model from `headroom bench` result directories; writes a TOML model
    Calibrate(CalibrateArgs),
    /// Replay a real `bench colocation` / `demo` run on a model: predicted vs measured per window
    Validate(ValidateArgs),
    /// Print the built-in server model as TOML (every key with its default)
    Model,
}

#[derive(clap::Args, Debug)]
pub struct FleetArgs {
    /// Number of servers
    #[arg(long, default_value_t = 100)]
    pub servers: usize,
    /// Simulated hours
    #[arg(long, default_value_t = 24.0)]
    pub hours: f64,
    /// CPUs per server; a comma list assigns sizes round-robin (e.g. 16,32)
    #[arg(long, value_delimiter = ',', default_value = "16")]
    pub cores: Vec<u32>,
    /// Policies to compare (comma list); default every policy
    #[arg(long, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Seed of every random draw (load noise, BE jobs)
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// LC load trace CSV (`t_s,load` header, load as a fraction of peak); default the built-in
    /// Heracles-style day (20% at 04:00, 90% at 16:00, 3% noise)
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Server model TOML (from `headroom sim calibrate`); default the built-in model
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Extra agent config TOML appended to every simulated agent's config (e.g. [policy.blind])
    #[arg(long)]
    pub agent_config: Option<PathBuf>,
    /// BE kinds the job pool draws from (comma list of the model's `[be.NAME]`); default all
    #[arg(long, value_delimiter = ',')]
    pub be: Vec<String>,
    /// Use the model outside the load/size range its calibration covered
    #[arg(long)]
    pub allow_extrapolation: bool,
    /// Several LC services per server: a TOML file of `[[service]]` tables (`name`,
    /// `service_us`, `service_cv`, `slo_us`, `percentile`, `share`, `offset_h`, `priority`);
    /// reports violating windows per service (services.csv, multi.json); default policies
    /// none, hybrid, multi
    #[arg(long)]
    pub services: Option<PathBuf>,
    /// The cluster view instead of the policy comparison: every node under hybrid, then a
    /// synthetic batch job stream placed by advertised `headroom.io/be-cpu` vs blind
    /// (BestEffort pods); writes cluster.json (headroom_sim::cluster)
    #[arg(long)]
    pub cluster: bool,
    /// --cluster: offered batch CPU demand as a fraction of the fleet's mean granted BE CPUs
    #[arg(long, default_value_t = 0.6)]
    pub offered_load: f64,
    /// Output directory (report.html, summary.json, figures/, servers.csv)
    #[arg(long)]
    pub out: PathBuf,
    /// No progress line
    #[arg(long)]
    pub quiet: bool,
}

#[derive(clap::Args, Debug)]
pub struct CalibrateArgs {
    /// `headroom bench` result directories (latency-vs-load, interference, scheduling, isolation)
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Where to write the model TOML
    #[arg(long, default_value = "model.toml")]
    pub out: PathBuf,
    /// What the host stalls are a share of: `requests` (whatever the load) or `time` (a server
    /// vacation, whose backlog makes a busy server's requests meet it more often); the fit
    /// error of the other form is printed beside
    #[arg(long, value_enum, default_value_t = StallFormArg::Requests)]
    pub stall_form: StallFormArg,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallFormArg {
    Requests,
    Time,
}

#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    /// Model TOML
    pub model: PathBuf,
    /// A `headroom bench colocation` or `headroom demo` run directory not used for fitting
    pub run_dir: PathBuf,
    /// Print the comparison as JSON
    #[arg(long)]
    pub json: bool,
    /// Use the model outside the load/size range its calibration covered
    #[arg(long)]
    pub allow_extrapolation: bool,
    /// A second recording of the same trace: print the machine's own run-to-run error beside
    /// the model's (the floor no model can beat)
    #[arg(long, value_name = "RUN_DIR2")]
    pub repeat: Option<PathBuf>,
}

/// Bad input (file, line, value) → exit 2; anything else → 1.
fn classify(e: SimError) -> anyhow::Error {
    if e.is_bad_input() {
        super::usage(format!("headroom sim: {e}"))
    } else {
        anyhow::Error::new(e)
    }
}

/// A file the user named could not be read or parsed: exit 2.
fn input(e: SimError) -> anyhow::Error {
    super::usage(format!("headroom sim: {e}"))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        SimCommand::Fleet(a) => fleet(a),
        SimCommand::Calibrate(a) => calibrate(a),
        SimCommand::Validate(a) => validate(a),
        SimCommand::Model => {
            print!("{}", ServerModel::default().to_toml());
            Ok(())
        }
    }
}

/// `sim fleet --cluster`: the cluster scheduler's day; prints the table and writes cluster.json.
fn fleet_cluster(a: &FleetArgs, setup: &SimSetup, bar: ProgressBar) -> anyhow::Result<()> {
    use headroom_sim::cluster::{run_cluster, text_table, ClusterSpec};
    let spec = ClusterSpec {
        servers: a.servers,
        hours: a.hours,
        cores: a.cores.clone(),
        seed: a.seed,
        offered_load: a.offered_load,
        advertise: headroom_control::config::KubernetesConfig::default().advertise_params(),
        costs: headroom_sim::cluster::NodeCosts::default(),
    };
    bar.set_length(spec.servers as u64);
    let started = Instant::now();
    let report = run_cluster(setup, &spec, &|done, _| bar.set_position(done)).map_err(classify)?;
    bar.finish_and_clear();
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let path = a.out.join("cluster.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    print!("{}", text_table(&report));
    println!(
        "({:.0} s wall; wrote {})",
        started.elapsed().as_secs_f64(),
        path.display()
    );
    Ok(())
}

/// The most servers `sim fleet` simulates (each a day of the real policy's ticks).
const MAX_SERVERS: usize = 100_000;

/// Every problem with `sim fleet`'s flags, in words (empty when they are all good).
fn fleet_problems(a: &FleetArgs) -> Vec<String> {
    let mut problems = Vec::new();
    if !(1..=MAX_SERVERS).contains(&a.servers) {
        problems.push(format!(
            "--servers {}: must be in 1..={MAX_SERVERS}",
            a.servers
        ));
    }
    if !(a.hours > 0.0 && a.hours <= 24.0 * 366.0) {
        problems.push(format!(
            "--hours {}: must be above 0 and at most 8784 (a year)",
            super::number(a.hours)
        ));
    }
    if let Some(c) = a
        .cores
        .iter()
        .find(|c| **c == 0 || **c > headroom_sim::model::MAX_CORES)
    {
        problems.push(format!(
            "--cores {c}: must be in 1..={}",
            headroom_sim::model::MAX_CORES
        ));
    }
    if let Some(bad) = a.policies.iter().find(|p| parse_policy(p).is_err()) {
        problems.push(format!(
            "--policies {bad:?}: not a policy (one of {})",
            ALL_POLICIES
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    problems
}

fn fleet(a: FleetArgs) -> anyhow::Result<()> {
    let problems = fleet_problems(&a);
    match problems.len() {
        0 => {}
        1 => return Err(super::usage(format!("headroom sim fleet: {}", problems[0]))),
        n => {
            return Err(super::usage(format!(
                "headroom sim fleet: {n} problems: {}",
                problems.join("; ")
            )))
        }
    }
    let mut model = match &a.model {
        Some(p) => ServerModel::from_file(p).map_err(input)?,
        None => ServerModel::default(),
    };
    if a.allow_extrapolation {
        model.calibration.cores_range = None;
        model.calibration.load_range = None;
    }
    let trace = match &a.trace {
        Some(p) => LoadTrace::from_csv_file(p).map_err(input)?,
        None => LoadTrace::default(),
    };
    let mut setup = SimSetup::new(model, trace);
    if !a.be.is_empty() {
        for b in &a.be {
            setup.model.be_kind(b).map_err(classify)?;
        }
        setup.be_pool = a.be.clone();
    }
    if let Some(p) = &a.agent_config {
        // bounded, never waiting (a FIFO hung it, /dev/zero grew it: sixteenth hostile pass)
        setup.agent_extra = headroom_agent::config_file::read_bounded_text(p)
            .map_err(|e| super::usage(format!("headroom sim: --agent-config: {e}")))?;
    }
    let services = match &a.services {
        Some(p) => Some(ServicesFile::from_file(p).map_err(input)?.service),
        None => None,
    };
    let policies = if a.policies.is_empty() && services.is_some() {
        DEFAULT_POLICIES.to_vec()
    } else if a.policies.is_empty() {
        ALL_POLICIES.to_vec()
    } else {
        a.policies
            .iter()
            .map(|p| parse_policy(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(classify)?
    };
    let spec = FleetSpec {
        servers: a.servers,
        hours: a.hours,
        cores: a.cores.clone(),
        seed: a.seed,
        policies,
    };
    let total = (spec.servers * spec.policies.len()) as u64;
    let bar = if a.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total).with_style(
            ProgressStyle::with_template(
                "{spinner} sim fleet [{elapsed_precise}] {bar:30} {pos}/{len} server-days ({per_sec}, eta {eta}) {msg}",
            )
            .expect("template"),
        )
    };
    if let Some(services) = services {
        return fleet_services(&a, &setup, &spec, &services, bar);
    }
    if a.cluster {
        return fleet_cluster(&a, &setup, bar);
    }
    let started = Instant::now();
    let cpu_before =
        headroom_host::process::cpu_split(headroom_host::process::Usage::Process).total_s();
    let results = run_fleet(&setup, &spec, &|done, _| bar.set_position(done)).map_err(classify)?;
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    let cpu = headroom_host::process::cpu_split(headroom_host::process::Usage::Process).total_s()
        - cpu_before;
    let invocation = std::env::args().collect::<Vec<_>>().join(" ");
    let files =
        write_fleet_report(&a.out, &setup, &spec, &results, &invocation).map_err(classify)?;
    let server_hours = spec.servers as f64 * spec.hours * spec.policies.len() as f64;
    println!(
        "{} servers × {} h × {} policies, SLO p{} ≤ {} µs per 15 s window",
        spec.servers,
        spec.hours,
        spec.policies.len(),
        setup.model.lc.percentile,
        setup.model.lc.slo_us
    );
    println!(
        "{:<14} {:>10} {:>8} {:>9} {:>8} {:>8} {:>10} {:>12} {:>12}",
        "policy",
        "violating",
        "windows",
        "servers",
        "EMU",
        "EMU p5",
        "BE norm",
        "k=10 p99 µs",
        "k=100 p99 µs"
    );
    for f in &results {
        println!(
            "{:<14} {:>10} {:>8} {:>9} {:>7.1}% {:>7.1}% {:>10.3} {:>12.0} {:>12.0}",
            f.policy.as_str(),
            f.total_violations(),
            f.total_windows(),
            f.violating_servers(),
            100.0 * f.emu_mean(),
            100.0 * f.emu_p5(),
            f.be_norm_mean(),
            f.fanout_quantile(0, 0.5),
            f.fanout_quantile(1, 0.5)
        );
    }
    println!(
        "simulated {server_hours:.0} server-hours in {wall:.1} s wall, {cpu:.1} CPU-s: {:.0} server-hours per CPU-second",
        server_hours / cpu.max(1e-9)
    );
    for f in files {
        println!("wrote {}", f.display());
    }
    Ok(())
}

/// `sim fleet --services F`: servers hosting several LC services.
fn fleet_services(
    a: &FleetArgs,
    setup: &SimSetup,
    spec: &FleetSpec,
    services: &[ServiceSpec],
    bar: ProgressBar,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let results = run_multi_fleet(setup, services, spec, &|done, _| bar.set_position(done))
        .map_err(classify)?;
    bar.finish_and_clear();
    let invocation = std::env::args().collect::<Vec<_>>().join(" ");
    let files = write_multi_report(&a.out, services, &results, &invocation).map_err(classify)?;
    let slos: Vec<String> = services
        .iter()
        .map(|s| format!("{} p{} ≤ {} µs", s.name, s.percentile, s.slo_us))
        .collect();
    println!(
        "{} servers × {} h × {} policies, {} services ({}) per 15 s window",
        spec.servers,
        spec.hours,
        spec.policies.len(),
        services.len(),
        slos.join(", ")
    );
    print!("{}", text_table(services, &results));
    println!("simulated in {:.1} s wall", started.elapsed().as_secs_f64());
    for f in files {
        println!("wrote {}", f.display());
    }
    Ok(())
}

fn calibrate(a: CalibrateArgs) -> anyhow::Result<()> {
    let form = match a.stall_form {
        StallFormArg::Requests => StallForm::Requests,
        StallFormArg::Time => StallForm::Time,
    };
    let fit = headroom_sim::calibrate::calibrate(&a.dirs, form).map_err(classify)?;
    std::fs::write(&a.out, fit.model.to_toml())
        .with_context(|| format!("writing {}", a.out.display()))?;
    for p in &fit.model.calibration.params {
        println!(
            "{:<28} {:>12.3}  fit error {:>5.1}%  from {}",
            p.key,
            p.value,
            100.0 * p.fit_error,
            p.source
        );
    }
    for n in &fit.notes {
        println!("{n}");
    }
    for r in &fit.refused {
        println!("refused: {r}");
    }
    println!("wrote {}", a.out.display());
    Ok(())
}

fn validate(a: ValidateArgs) -> anyhow::Result<()> {
    let mut model = ServerModel::from_file(&a.model).map_err(input)?;
    if a.allow_extrapolation {
        model.calibration.cores_range = None;
        model.calibration.load_range = None;
    }
    let mut v = headroom_sim::validate::validate(&model, &a.run_dir).map_err(classify)?;
    if let Some(repeat) = &a.repeat {
        v.repeatability =
            headroom_sim::validate::repeatability(&a.run_dir, repeat).map_err(classify)?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", v.render());
    }
    Ok(())
}
