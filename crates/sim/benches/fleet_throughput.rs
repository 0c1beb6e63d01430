//! Simulation speed: a fleet day under every policy, printed as server-hours simulated per
//! CPU-second and the projected wall time of 1000 servers × 24 h on the cores rayon uses.
//! `cargo bench -p headroom-sim --bench fleet_throughput` (HEADROOM_SIM_BENCH_SERVERS=N to size).

use std::time::Instant;

use headroom_host::process::{cpu_split, Usage};
use headroom_sim::fleet::{run_fleet, FleetSpec};
use headroom_sim::model::ServerModel;
use headroom_sim::run::{SimSetup, ALL_POLICIES};
use headroom_sim::trace::LoadTrace;

fn main() {
    // `cargo test --all-targets` runs this without `--bench`: a smoke run, no figures
    let measuring = std::env::args().any(|a| a == "--bench");
    let servers: usize = std::env::var("HEADROOM_SIM_BENCH_SERVERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if measuring { 40 } else { 2 });
    let hours = if measuring { 24.0 } else { 0.5 };
    let setup = SimSetup::new(ServerModel::default(), LoadTrace::default());
    let threads = rayon::current_num_threads();
    println!(
        "fleet_throughput: {servers} servers × {hours} h, 16 CPUs each, {threads} rayon threads"
    );
    let mut total_cpu = 0.0;
    for kind in ALL_POLICIES {
        let spec = FleetSpec {
            servers,
            hours,
            cores: vec![16],
            seed: 1,
            policies: vec![kind],
        };
        let (wall0, cpu0) = (Instant::now(), cpu_split(Usage::Process).total_s());
        let r = run_fleet(&setup, &spec, &|_, _| {}).expect("fleet runs");
        let (wall, cpu) = (
            wall0.elapsed().as_secs_f64(),
            cpu_split(Usage::Process).total_s() - cpu0,
        );
        total_cpu += cpu;
        let sh = servers as f64 * hours;
        println!(
            "  {:<14} {:>8.0} server-hours in {:>6.2} s wall, {:>6.2} CPU-s: {:>7.0} server-hours/CPU-s; 1000 × 24 h ≈ {:>5.0} CPU-s ({} decisions)",
            kind.as_str(),
            sh,
            wall,
            cpu,
            sh / cpu,
            24_000.0 / (sh / cpu),
            r[0].decisions
        );
    }
    if !measuring {
        return;
    }
    let sh_all = servers as f64 * hours * ALL_POLICIES.len() as f64;
    println!(
        "all {} policies: {:.0} server-hours per CPU-second; 1000 servers × 24 h × every policy ≈ {:.0} CPU-s ≈ {:.0} s wall on {threads} threads",
        ALL_POLICIES.len(),
        sh_all / total_cpu,
        1000.0 * 24.0 * ALL_POLICIES.len() as f64 / (sh_all / total_cpu),
        1000.0 * 24.0 * ALL_POLICIES.len() as f64 / (sh_all / total_cpu) / threads as f64
    );
}
