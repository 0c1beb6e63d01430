//! Prints one policy's windows on one 16-core server (development aid).
use headroom_sim::host::SimHost;
use headroom_sim::model::ServerModel;
use headroom_sim::run::{parse_policy, run_server, ServerSpec, SimSetup};
use headroom_sim::trace::LoadTrace;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind = parse_policy(&args[1]).unwrap();
    let every: usize = args.get(2).map_or(40, |s| s.parse().unwrap());
    let setup = SimSetup::new(ServerModel::default(), LoadTrace::default());
    let peak = SimHost::peak_qps(&setup.model, 16);
    let spec = ServerSpec {
        cores: 16,
        seed: 1,
        start_s: 0.0,
        duration_s: 86400.0,
    };
    let o = run_server(&setup, &spec, kind, peak, true, |_, _| {}).unwrap();
    for (i, r) in o.records.iter().enumerate() {
        if i % every == 0 || (r.violating && i % 4 == 0) {
            println!(
                "{:6.0} load {:.2} p99 {:8.0} be {:.3} cpus {:5.2} {} {} {}",
                r.t_s,
                r.load,
                r.p99_us,
                r.be_norm,
                r.be_cpus,
                r.be,
                if r.violating { "VIOL" } else { "" },
                r.reason
            );
        }
    }
}
