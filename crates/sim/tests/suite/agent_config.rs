//! The agent config a simulated server runs is built as a typed value; the user's
//! `--agent-config` TOML is laid over it key by key and the whole validated once.

use headroom_control::config::{LatencySource, PolicyKind};
use headroom_sim::model::ServerModel;
use headroom_sim::run::agent_config;

#[test]
fn the_built_config_has_the_models_slo_a_fed_lc_and_quarter_baselines() {
    let m = ServerModel::default();
    let c = agent_config(PolicyKind::Hybrid, &m, 16, 12_345.4, 10.0, "").unwrap();
    assert_eq!(c.policy.kind, PolicyKind::Hybrid);
    assert_eq!(c.lc().slo.target_us, m.lc.slo_us);
    assert_eq!(c.lc().slo.window_s, 10.0);
    assert_eq!(c.lc().latency.as_ref().unwrap().source, LatencySource::Feed);
    assert_eq!(c.lc().load.as_ref().unwrap().peak_qps, 12_345.0);
    assert_eq!(c.policy.static_cores.cores, 4);
    assert_eq!(c.policy.static_cycles.percent, 25.0);
}

#[test]
fn the_users_toml_is_laid_over_key_by_key_and_a_bad_key_is_named() {
    let m = ServerModel::default();
    let c = agent_config(
        PolicyKind::Blind,
        &m,
        16,
        1000.0,
        10.0,
        "[policy.blind]\nbuffer_cores = 2.0\n[policy.static-cycles]\npercent = 40.0\n",
    )
    .unwrap();
    assert_eq!(c.policy.blind.buffer_cores, 2.0);
    assert_eq!(c.policy.static_cycles.percent, 40.0);
    // the keys the user did not name stay as built
    assert_eq!(c.policy.static_cores.cores, 4);
    assert_eq!(c.lc().slo.target_us, m.lc.slo_us);
    let e = agent_config(
        PolicyKind::Blind,
        &m,
        16,
        1000.0,
        10.0,
        "[policy.blind]\nbuffer_corez = 2.0\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("buffer_corez"), "{e}");
}
