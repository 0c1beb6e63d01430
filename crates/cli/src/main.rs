//! `headroom`: one binary, one subcommand per room (docs/architecture.md "The CLI contract").

mod cmd;
mod log_queue;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "headroom",
    version,
    about = "Run batch work on the idle capacity of latency-critical servers without hurting their tail latency"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Open-loop load generator (mutilate-compatible flags); `headroom load agent` runs a remote load agent
    Load(cmd::load::Args),
    /// The latency-critical service: a memcached-compatible server
    Serve(cmd::serve::Args),
    /// Interference workloads: spin power llc dram mix square net disk memory ht
    Antagonist(cmd::antagonist::Args),
    /// The colocation controller
    Agent(cmd::agent::Args),
    /// Talk to a running agent over its control socket
    Ctl(cmd::ctl::Args),
    /// What this kernel and hardware offer
    Doctor(cmd::doctor::Args),
    /// The node's latency-critical Kubernetes pods, discovered live (one JSON line per change)
    #[cfg(feature = "kube")]
    KubeDiscover(cmd::kube_discover::Args),
    /// Reproduce the papers' experiments and the tools' own benchmarks
    Bench(cmd::bench::Args),
    /// Re-render an experiment directory without re-running it
    Report(cmd::report::Args),
    /// The end-to-end colocation demo
    Demo(cmd::demo::Args),
    /// The real policies on modelled servers and fleets; calibrate and validate the model
    Sim(cmd::sim::Args),
    /// TCO planner (Leverich & Kozyrakis): servers and cost with and without colocation
    Plan(cmd::plan::Args),
}

/// The log filter: `HEADROOM_LOG` (default `warn`), with kube-rs's client and runtime muted
/// unless named there. The client logged every failed request again at ERROR, and every answer
/// it could not parse whole at WARN (a hostile 8 MB body: 40 MB of stderr in 6 s), at each
/// retry; the runtime's watcher warns at each watch error event: both under the discovery's and
/// the publisher's own warnings, which say each kind of error once.
fn log_filter(env: Option<&str>) -> tracing_subscriber::EnvFilter {
    let env = env.filter(|e| !e.trim().is_empty());
    let given = env.and_then(|e| tracing_subscriber::EnvFilter::try_new(e).ok());
    let valid = given.is_some();
    let names = |target: &str| valid && env.is_some_and(|e| e.contains(target));
    // A user-run command's output, relayed by the agent, at info (docs/agent.md).
    let mut filter = given.unwrap_or_else(|| {
        tracing_subscriber::EnvFilter::new(format!(
            "warn,{}=info",
            headroom_host::spawn::relay::TARGET
        ))
    });
    for target in ["kube_client", "kube_runtime"] {
        if names(target) {
            continue;
        }
        if let Ok(d) = format!("{target}=off").parse() {
            filter = filter.add_directive(d);
        }
    }
    filter
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(std::env::var("HEADROOM_LOG").ok().as_deref()))
        .with_writer(log_queue::start())
        .init();
    let cli = Cli::parse();
    // Commands that only print (`headroom ctl status | head`) end quietly on a closed pipe, as
    // Unix tools do; those that serve sockets keep SIGPIPE ignored (a peer hanging up must
    // not kill the agent or the server).
    if matches!(
        cli.command,
        Command::Ctl(_) | Command::Doctor(_) | Command::Report(_)
    ) {
        headroom_host::process::die_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Load(a) => cmd::load::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Antagonist(a) => cmd::antagonist::run(a),
        Command::Agent(a) => cmd::agent::run(a),
        Command::Ctl(a) => cmd::ctl::run(a),
        Command::Doctor(a) => cmd::doctor::run(a),
        #[cfg(feature = "kube")]
        Command::KubeDiscover(a) => cmd::kube_discover::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Plan(a) => cmd::plan::run(a),
    };
    // A bench or the demo being stopped by a signal: its watcher ends the process once it has
    // stopped the children (whose failures under that SIGTERM are no result).
    headroom_bench::stop_on_signal::wait_if_stopping();
    log_queue::flush(LOG_FLUSH);
    if let Err(err) = result {
        eprintln!("headroom: error: {}", cmd::error_text(&err));
        std::process::exit(cmd::exit_code(&err));
    }
}

/// How long the exit waits for queued log lines to reach stderr.
const LOG_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

#[cfg(test)]
mod tests {
    /// Pass 20's low, the relay: a user-run command's output is logged at info under
    /// `headroom_output`, which the default filter (`warn`) would hide.
    #[test]
    fn the_default_filter_lets_the_relayed_output_through() {
        let filter = super::log_filter(None).to_string();
        assert!(filter.contains("headroom_output=info"), "{filter}");
        let given = super::log_filter(Some("error")).to_string();
        assert!(!given.contains("headroom_output"), "{given}");
    }
}
