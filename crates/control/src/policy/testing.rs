//! Checks every policy's unit tests share.

use std::time::Duration;

use super::{MachineInfo, Policy};
use crate::config::Config;
use headroom_types::observation::Observation;

/// With the decision state off (no decision log; the simulator) the policy `kind`, built by
/// `new`, decides exactly the same and builds no state: 600 polls of a sawtooth load with a
/// latency spike every 97th.
pub(crate) fn explain_off_changes_no_decision<P: Policy>(
    kind: &str,
    new: impl Fn(&Config, &MachineInfo) -> P,
) {
    let toml = format!(
        r#"
[lc]
name = "svc"
cgroup = "headroom/lc"
[lc.slo]
target_us = 500
window_s = 1
[lc.latency]
source = "feed"
[lc.load]
source = "feed"
peak_qps = 100000
[policy]
kind = "{kind}"
"#
    );
    let config = Config::from_toml_str(&toml).expect("valid config");
    let machine = MachineInfo::with_cpus(8);
    let mut on = new(&config, &machine);
    let mut off = new(&config, &machine);
    off.set_explain(false);
    for t in 0..600u64 {
        let load = 0.2 + 0.7 * ((t % 200) as f64 / 200.0);
        let latency = if t % 97 == 0 {
            900.0
        } else {
            150.0 + 300.0 * load
        };
        let obs = Observation {
            lc_latency_us: Some(latency),
            lc_latency_age_ms: Some(0),
            lc_load: Some(load),
            lc_load_age_ms: Some(0),
            idle_cpus: Some(8.0 * (1.0 - load)),
            ..Observation::default()
        };
        let now = Duration::from_millis(500 * t);
        let (a, b) = (on.decide(&obs, now), off.decide(&obs, now));
        assert_eq!(a.allocation, b.allocation, "t {t}");
        assert_eq!(a.reason, b.reason, "t {t}");
        assert!(!a.state.is_null());
        assert!(b.state.is_null());
    }
}
