//! `headroom bench NAME`: the papers' experiments (headroom-bench) and the tools' own benchmarks.
//!
//! Tool benchmarks live in their own modules, each owned by the crate they measure:
//! `loadgen` (bench_loadgen.rs), `host` (bench_host.rs), `agent` (bench_agent.rs).

#[path = "bench_agent.rs"]
mod bench_agent;
#[path = "bench_host.rs"]
mod bench_host;
#[path = "bench_loadgen.rs"]
mod bench_loadgen;

/// Flags of `headroom bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Experiment or benchmark: latency-vs-load interference scheduling imbalance isolation colocation
    /// | loadgen host agent
    pub name: String,
    /// Output directory
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// Further flags for the chosen benchmark
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.name.as_str() {
        "loadgen" => bench_loadgen::run(args.out, &args.rest),
        "host" => bench_host::run(args.out, &args.rest),
        "agent" => bench_agent::run(args.out, &args.rest),
        other => experiments(other, args.out, &args.rest),
    }
}

fn experiments(
    name: &str,
    _out: Option<std::path::PathBuf>,
    _rest: &[String],
) -> anyhow::Result<()> {
    Err(super::usage(format!("headroom bench: unknown experiment {name:?}")))
}
