//! The agent configs the bench writes are ones the agent accepts, and say what the experiment
//! means: latency-blind baselines run without the SLO-violation cooldown, the others keep it, and
//! the prober's rate fills its window with the samples the percentile needs.

use crate::common;

use std::net::SocketAddr;

use headroom_bench::experiments::Experiment;
use headroom_bench::record::{self, AgentRun, Options, LATENCY_BLIND_POLICIES};
use headroom_control::config::{Config, LatencySource};

fn configs_for(percentile: f64, feed: Option<&str>) -> Vec<(String, Config)> {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("no-such-headroom");
    let mut opts = Options::defaults(Experiment::Isolation, false, bin);
    opts.percentile = percentile;
    let sweep = record::sweep_configs(Experiment::Isolation, &opts, false);
    let s = common::quiet_session(Experiment::Isolation, opts, &tmp.path().join("run"));
    let addr: SocketAddr = "127.0.0.1:11211".parse().unwrap();
    let mut out = Vec::new();
    for c in sweep {
        let Some((policy, tweak)) = c.agent else {
            continue;
        };
        let path = s
            .agent_config(&AgentRun {
                name: c.name.clone(),
                policy: policy.clone(),
                tweak,
                lc_pid: 4242,
                addr,
                be_argv: vec!["headroom".into(), "antagonist".into(), "spin".into()],
                slo_us: 500.0,
                peak_qps: 50_000.0,
                feed_socket: feed.map(Into::into),
            })
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let config = Config::from_toml_str(&text).unwrap_or_else(|e| {
            panic!("the agent refuses the bench's {policy} config: {e}\n{text}")
        });
        out.push((policy, config));
    }
    out
}

#[test]
fn isolation_configs_are_valid_and_blind_baselines_have_no_cooldown() {
    let configs = configs_for(99.0, None);
    let policies: Vec<&str> = configs.iter().map(|(p, _)| p.as_str()).collect();
    for p in [
        "static-cores",
        "static-cycles",
        "weights",
        "blind",
        "heracles",
        "hybrid",
    ] {
        assert!(policies.contains(&p), "{p} missing from {policies:?}");
    }
    for (policy, c) in &configs {
        let cooldown = c.safety.violation_cooldown_s;
        if LATENCY_BLIND_POLICIES.contains(&policy.as_str()) {
            assert_eq!(cooldown, 0.0, "{policy}");
        } else {
            assert_eq!(cooldown, 300.0, "{policy} keeps the production default");
        }
        let lat = c.lc().latency.as_ref().expect("a latency source");
        assert_eq!(lat.source, LatencySource::Probe);
        assert!(
            lat.rate_hz * c.lc().slo.window_s >= c.lc().slo.min_samples() as f64,
            "{policy}: {} Hz over {} s cannot give {} samples",
            lat.rate_hz,
            c.lc().slo.window_s,
            c.lc().slo.min_samples()
        );
    }
}

#[test]
fn a_tighter_percentile_gets_a_faster_prober() {
    // p99.9 needs 10000 samples per 15 s window: 200 probes/s would never publish a latency.
    let configs = configs_for(99.9, None);
    let (_, c) = configs.first().expect("some agent config");
    assert_eq!(c.lc().slo.min_samples(), 10_000);
    assert!(c.lc().latency.as_ref().unwrap().rate_hz >= 10_000.0 / 15.0);
    assert_eq!(record::probe_rate_hz(99.0, 15.0), 200.0);
}

#[test]
fn with_a_feed_the_agent_acts_on_the_load_generators_windows() {
    for (policy, c) in configs_for(99.0, Some("/tmp/headroom-feed-test.sock")) {
        let lat = c.lc().latency.as_ref().expect("a latency source");
        assert_eq!(lat.source, LatencySource::Feed, "{policy}");
        assert_eq!(lat.socket.as_deref(), Some("/tmp/headroom-feed-test.sock"));
    }
}

/// A colocation trace stands for a day: both cooldowns after an SLO violation — the safety
/// layer's and Heracles' own top level (hybrid's outer loop) — are the production 300 s scaled
/// by the trace's compression, so one bad window does not keep BE off for the rest of a demo.
#[test]
fn colocation_scales_both_cooldowns() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("no-such-headroom");
    let opts = Options::defaults(Experiment::Colocation, false, bin);
    let s = common::quiet_session(Experiment::Colocation, opts, &tmp.path().join("run"));
    for policy in ["hybrid", "heracles"] {
        let path = s
            .agent_config(&AgentRun {
                name: format!("coloc-{policy}"),
                policy: policy.into(),
                tweak: record::no_tweak,
                lc_pid: 4242,
                addr: "127.0.0.1:11211".parse().unwrap(),
                be_argv: vec!["headroom".into(), "antagonist".into(), "spin".into()],
                slo_us: 500.0,
                peak_qps: 50_000.0,
                feed_socket: None,
            })
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let c = Config::from_toml_str(&text)
            .unwrap_or_else(|e| panic!("the agent refuses the {policy} config: {e}\n{text}"));
        let safety = c.safety.violation_cooldown_s;
        assert!(safety < 300.0, "{policy}: safety cooldown {safety}\n{text}");
        assert_eq!(c.policy.heracles.cooldown_s, safety, "{policy}\n{text}");
    }
}

/// Every scheduling setting the agent runs gets a config the agent reads back as built: the
/// weights, the quota and the LC thread slice land in their typed keys.
#[test]
fn every_scheduling_settings_agent_config_is_read_back_as_built() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = Options::defaults(
        Experiment::Scheduling,
        true,
        tmp.path().join("no-such-headroom"),
    );
    let configs = record::sweep_configs(Experiment::Scheduling, &opts, false);
    let s = common::quiet_session(Experiment::Scheduling, opts, &tmp.path().join("run"));
    let addr: SocketAddr = "127.0.0.1:11211".parse().unwrap();
    let mut seen = Vec::new();
    for cfg in configs {
        let Some((policy, tweak)) = cfg.agent else {
            continue;
        };
        let path = s
            .agent_config(&AgentRun {
                name: cfg.name.replace(|c: char| !c.is_ascii_alphanumeric(), "-"),
                policy: policy.clone(),
                tweak,
                lc_pid: 4242,
                addr,
                be_argv: vec!["headroom".into(), "antagonist".into(), "spin".into()],
                slo_us: 500.0,
                peak_qps: 50_000.0,
                feed_socket: Some("/tmp/feed.sock".into()),
            })
            .unwrap_or_else(|e| panic!("{}: {e}", cfg.name));
        let text = std::fs::read_to_string(&path).unwrap();
        let c = Config::from_toml_str(&text)
            .unwrap_or_else(|e| panic!("{}: the agent refuses it: {e}\n{text}", cfg.name));
        assert_eq!(c.policy.kind.as_str(), policy, "{text}");
        match cfg.name.as_str() {
            "weights-10000:2" => assert_eq!(
                (c.policy.weights.lc_shares, c.policy.weights.be_shares),
                (10_000, 2)
            ),
            "be-cpu.idle" => assert!(c.policy.weights.be_cpu_idle),
            "lc-fifo+be-quota" => assert_eq!(c.policy.static_cycles.percent, 50.0),
            "lc-slice" => assert_eq!(c.lc().threads.slice_us, Some(100)),
            other => panic!("an agent setting this test does not know: {other}"),
        }
        seen.push(cfg.name);
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
}
