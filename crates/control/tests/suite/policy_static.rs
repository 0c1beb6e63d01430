//! PerfIso's baselines: `static-cores` and `static-cycles`; and `none`.

use headroom_types::CpuSet;
use std::time::Duration;

use headroom_control::config::Config;
use headroom_control::policy::{self, MachineInfo};
use headroom_types::observation::Observation;

fn cfg(kind: &str, extra: &str) -> Config {
    Config::from_toml_str(&format!(
        "[lc]\nname = \"svc\"\ncgroup = \"headroom/lc\"\n[policy]\nkind = \"{kind}\"\n{extra}"
    ))
    .expect("valid")
}

#[test]
fn static_cores_confines_be_to_the_top_n_cores_away_from_lc() {
    let mut p = policy::build_unguarded(
        &cfg("static-cores", "[policy.static-cores]\ncores = 3\n"),
        &MachineInfo::with_cpus(8),
    );
    let d = p.decide(&Observation::default(), Duration::ZERO);
    assert_eq!(d.allocation.be_cpus, Some(CpuSet::from([5, 6, 7])));
    let o = Observation {
        lc_cpus: Some(vec![6, 7]),
        ..Observation::default()
    };
    let d = p.decide(&o, Duration::from_secs(1));
    assert_eq!(d.allocation.be_cpus, Some(CpuSet::from([3, 4, 5])));
    // explicit CPUs
    let mut p = policy::build_unguarded(
        &cfg("static-cores", "[policy.static-cores]\ncpus = [1, 2]\n"),
        &MachineInfo::with_cpus(8),
    );
    let d = p.decide(&o, Duration::ZERO);
    assert_eq!(d.allocation.be_cpus, Some(CpuSet::from([1, 2])));
    // every CPU pinned to LC: BE disabled
    let o = Observation {
        lc_cpus: Some(vec![1, 2]),
        ..Observation::default()
    };
    let d = p.decide(&o, Duration::ZERO);
    assert!(!d.allocation.be_enabled);
    assert_eq!(d.reason, "static-cores:no-cpu-left:disable");
}

#[test]
fn static_cycles_limits_be_to_a_share_of_machine_time() {
    let mut p = policy::build_unguarded(&cfg("static-cycles", ""), &MachineInfo::with_cpus(48));
    let d = p.decide(&Observation::default(), Duration::ZERO);
    // PerfIso's 5% of a 48-core machine = 2.4 CPUs = 240% of one CPU
    assert_eq!(d.allocation.be_quota_pct, Some(240.0));
    assert_eq!(d.allocation.be_quota_period_us, Some(100_000));
    assert_eq!(d.allocation.be_cpus, None);
}

#[test]
fn none_leaves_be_unrestricted() {
    let mut p = policy::build(&cfg("none", ""), &MachineInfo::with_cpus(2));
    let d = p.decide(&Observation::default(), Duration::ZERO);
    assert!(d.allocation.be_enabled);
    assert_eq!(d.allocation.be_cpus, None);
    assert_eq!(d.allocation.be_quota_pct, None);
    assert_eq!(d.allocation.be_cpu_weight, None);
}
