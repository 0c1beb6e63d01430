//! The cluster scheduler's figures on a simulated cluster day (issue 40's target): every node
//! under hybrid on the built-in model and day, then the synthetic batch stream placed by
//! advertised `headroom.io/be-cpu` vs blind, once with the costs of crowding (NodeCosts'
//! defaults) and once without (the first model), over the same node runs. Prints the tables;
//! asserts nothing.
//!
//! `cargo run -p headroom-sim --example cluster_day -- [SERVERS] [HOURS] [OFFERED_LOAD,..] [CORES,..]
//! [PERCENTILE] [MIN_HISTORY_S] [SEED]` (default 100 24 0.6 8,16,32 the advertiser's defaults, seed 1; `headroom sim fleet --cluster` is the same through the CLI).

use headroom_control::config::KubernetesConfig;
use headroom_sim::cluster::{node_timelines, schedule_all, text_table, ClusterSpec, NodeCosts};
use headroom_sim::model::ServerModel;
use headroom_sim::run::SimSetup;
use headroom_sim::trace::LoadTrace;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
    let servers: usize = arg(0, "100").parse().expect("SERVERS: a count");
    let hours: f64 = arg(1, "24").parse().expect("HOURS: a number");
    // One offered load or several (comma list): each is scheduled over the same node runs.
    let offered_loads: Vec<f64> = arg(2, "0.6")
        .split(',')
        .map(|o| {
            o.parse()
                .expect("OFFERED_LOAD: a fraction, or a comma list of them")
        })
        .collect();
    let cores: Vec<u32> = arg(3, "8,16,32")
        .split(',')
        .map(|c| c.parse().expect("CORES: a comma list of counts"))
        .collect();
    let mut advertise = KubernetesConfig::default().advertise_params();
    if let Some(p) = args.get(4) {
        advertise.percentile = p.parse().expect("PERCENTILE: a number");
    }
    if let Some(m) = args.get(5) {
        let s: f64 = m.parse().expect("MIN_HISTORY_S: a number");
        advertise.min_history_ms = (s * 1000.0) as u64;
    }
    let seed: u64 = arg(6, "1").parse().expect("SEED: a number");
    let setup = SimSetup::new(ServerModel::default(), LoadTrace::default());
    let spec = ClusterSpec {
        servers,
        hours,
        cores,
        seed,
        offered_load: offered_loads[0],
        advertise,
        costs: NodeCosts::default(),
    };
    let started = std::time::Instant::now();
    let nodes = node_timelines(&setup, &spec, &|_, _| {}).expect("the cluster day runs");
    for &offered_load in &offered_loads {
        let costed = ClusterSpec {
            offered_load,
            ..spec.clone()
        };
        print!(
            "{}",
            text_table(&schedule_all(&nodes, setup.window_s, &costed))
        );
        let free = ClusterSpec {
            costs: NodeCosts::none(),
            ..costed
        };
        println!("without the costs of crowding (the first model):");
        print!(
            "{}",
            text_table(&schedule_all(&nodes, setup.window_s, &free))
        );
    }
    println!("({:.0} s wall)", started.elapsed().as_secs_f64());
}
