//! One 16-core server over a day under every policy (development aid).
use headroom_sim::host::SimHost;
use headroom_sim::model::ServerModel;
use headroom_sim::run::{run_server, ServerSpec, SimSetup, ALL_POLICIES};
use headroom_sim::trace::LoadTrace;

fn main() {
    let mut setup = SimSetup::new(ServerModel::default(), LoadTrace::default());
    setup.agent_extra = std::env::args()
        .nth(1)
        .unwrap_or_default()
        .replace("\\n", "\n");
    let cores = 16;
    let peak = SimHost::peak_qps(&setup.model, cores);
    println!("peak {peak:.0} qps");
    for kind in ALL_POLICIES {
        let spec = ServerSpec {
            cores,
            seed: 1,
            start_s: 0.0,
            duration_s: 86400.0,
        };
        let t = std::time::Instant::now();
        let o = run_server(&setup, &spec, kind, peak, false, |_, _| {}).unwrap();
        println!(
            "{:14} viol {:4}/{} emu {:.3} min {:.3} be {:.3} p99max {:.0} writes {} decisions {} {:?}",
            kind.as_str(), o.violations, o.windows, o.emu_mean(), o.emu_min,
            o.be_norm_sum / o.windows as f64, o.p99_max, o.writes, o.decisions, t.elapsed()
        );
    }
}
