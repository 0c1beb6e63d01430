//! CPU cost of one decision, per policy, bare and inside the safety wrapper. A benchmark that
//! prints figures (ignored by default):
//!
//! `cargo test -p headroom-agent --release --test policy_cost -- --ignored --nocapture`

use std::time::Duration;

use headroom_control::config::Config;
use headroom_control::policy::{self, MachineInfo};
use headroom_types::observation::Observation;

/// CPU time of this thread, so other load on the machine does not count.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
fn cost_per_decision() {
    let machine = MachineInfo::with_cpus(16);
    // 16 observations cycling through idle counts 0..4 around the buffer
    let observations: Vec<Observation> = (0..16)
        .map(|i| Observation {
            lc_latency_us: Some(100.0),
            lc_latency_age_ms: Some(5),
            lc_load: Some(0.5),
            idle_cpus: Some((i % 5) as f64),
            cpu_idle: Some(vec![0.5; 16]),
            ..Observation::default()
        })
        .collect();
    println!("policy     wrapper  µs CPU per decide (16 CPUs, 100000 ticks 1 ms apart)");
    for kind in [
        "none",
        "static-cores",
        "weights",
        "blind",
        "heracles",
        "hybrid",
    ] {
        let text = format!(
            "[lc]\nname = \"m\"\ncgroup = \"lc\"\n[lc.latency]\nsource = \"feed\"\n[lc.load]\nsource = \"feed\"\npeak_qps = 1000\n[policy]\nkind = \"{kind}\"\n"
        );
        let config = Config::from_toml_str(&text).expect("valid");
        for guarded in [false, true] {
            let mut p = if guarded {
                policy::build(&config, &machine)
            } else {
                policy::build_unguarded(&config, &machine)
            };
            let ticks = 100_000u64;
            let mut enabled = 0u64;
            let start = thread_cpu_ns();
            for i in 0..ticks {
                let d = p.decide(&observations[(i % 16) as usize], Duration::from_millis(i));
                enabled += u64::from(d.allocation.be_enabled);
            }
            let ns = thread_cpu_ns() - start;
            println!(
                "{kind:12} {:7}  {:.2}",
                if guarded { "safety" } else { "bare" },
                ns as f64 / 1e3 / ticks as f64
            );
            assert!(enabled > 0, "{kind}: BE was never enabled");
        }
    }
}
