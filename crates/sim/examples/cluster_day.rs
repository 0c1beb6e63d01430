//! The cluster scheduler's figures on a simulated cluster day (issue 40's target): every node
//! under hybrid on the built-in model and day, then the synthetic batch stream placed by
//! advertised `headroom.io/be-cpu` vs blind. Prints the table; asserts nothing.
//!
//! `cargo run -p headroom-sim --example cluster_day -- [SERVERS] [HOURS] [OFFERED_LOAD] [CORES,..]
//! [PERCENTILE] [MIN_HISTORY_S]` (default 100 24 0.6 8,16,32 and the advertiser's defaults; `headroom sim fleet --cluster` is the same through the CLI).

use headroom_control::config::KubernetesConfig;
use headroom_sim::cluster::{run_cluster, text_table, ClusterSpec};
use headroom_sim::model::ServerModel;
use headroom_sim::run::SimSetup;
use headroom_sim::trace::LoadTrace;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, d: &str| args.get(i).cloned().unwrap_or_else(|| d.to_string());
    let servers: usize = arg(0, "100").parse().expect("SERVERS: a count");
    let hours: f64 = arg(1, "24").parse().expect("HOURS: a number");
    let offered_load: f64 = arg(2, "0.6").parse().expect("OFFERED_LOAD: a fraction");
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
    let setup = SimSetup::new(ServerModel::default(), LoadTrace::default());
    let spec = ClusterSpec {
        servers,
        hours,
        cores,
        seed: 1,
        offered_load,
        advertise,
    };
    let started = std::time::Instant::now();
    let report = run_cluster(&setup, &spec, &|_, _| {}).expect("the cluster day runs");
    print!("{}", text_table(&report));
    println!("({:.0} s wall)", started.elapsed().as_secs_f64());
}
