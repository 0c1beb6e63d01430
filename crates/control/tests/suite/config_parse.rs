// The tests read the shipped files and time nothing the crate does: the purity rule
// (crates/control/clippy.toml) is for the crate itself.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]
//! The example config in docs/policies.md parses, defaults are the papers' constants, and the
//! config survives a TOML round trip and live `set`.

use headroom_control::config::{
    Config, LatencySource, LowSlackAction, OnExit, PolicyKind, WeightsMode,
};
use headroom_types::CpuSet;

fn docs_example() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/policies.md");
    let text = std::fs::read_to_string(path).expect("docs/policies.md is readable");
    let start = text
        .find("<!-- example-config -->")
        .expect("example marker in docs");
    let rest = &text[start..];
    let open = rest.find("```toml\n").expect("toml fence") + "```toml\n".len();
    let close = rest[open..].find("```").expect("closing fence");
    rest[open..open + close].to_string()
}

#[test]
fn the_documented_example_parses() {
    let c = Config::from_toml_str(&docs_example()).expect("docs example is a valid config");
    assert_eq!(c.lc().name, "memcached");
    assert_eq!(c.lc().slo.target_us, 500.0);
    assert_eq!(
        c.lc().latency.as_ref().unwrap().source,
        LatencySource::Probe
    );
    assert_eq!(c.lc().load.as_ref().unwrap().peak_qps, 100_000.0);
    assert_eq!(c.be.len(), 1);
    assert_eq!(c.be[0].command, vec!["headroom", "antagonist", "spin"]);
    assert_eq!(c.policy.kind, PolicyKind::Hybrid);
    assert!(c.policy.weights.be_cpu_idle);
    assert_eq!(c.safety.on_exit, OnExit::Freeze);
    assert_eq!(c.safety.be_io_limits[0].write_bps, Some(62_914_560));
    assert_eq!(c.api.metrics.as_deref(), Some("127.0.0.1:9464"));
}

#[test]
fn the_architecture_example_parses() {
    // the example of docs/architecture.md "Config", verbatim
    let text = r#"
[lc]
name = "memcached"
cgroup = "headroom/lc"          # relative to the cgroup root; created if missing
pids = []                       # optional: processes to move in (or `command = [...]` to launch)
[lc.slo]
percentile = 99.0
target_us = 500
window_s = 15
[lc.latency]                    # where the tail latency comes from
source = "probe"                # probe | prometheus | feed
protocol = "memcache"           # probe protocol: memcache | redis | http
address = "127.0.0.1:11211"
rate_hz = 1000
[lc.load]
source = "memcache-stats"       # memcache-stats | redis-info | prometheus | feed
address = "127.0.0.1:11211"
peak_qps = 100000

[[be]]
name = "batch"
cgroup = "headroom/be"
command = ["headroom", "antagonist", "spin"]   # optional: the agent launches and owns it

[policy]
kind = "blind"                  # none | static-cores | static-cycles | weights | blind | heracles | hybrid
[policy.blind]
buffer_cores = 1
poll_ms = 1

[safety]
on_exit = "freeze"
state_file = "/var/lib/headroom/state.json"

[api]
socket = "/run/headroom.sock"
metrics = "127.0.0.1:9464"      # Prometheus exposition; localhost by default
"#;
    let c = Config::from_toml_str(text).expect("the architecture page's example is valid");
    assert_eq!(c.policy.kind, PolicyKind::Blind);
    assert_eq!(c.policy.blind.buffer_cores, 1.0);
    assert_eq!(c.policy.blind.poll_ms, 1);
}

#[test]
fn defaults_are_the_papers_constants() {
    let c =
        Config::from_toml_str("[lc]\nname = \"x\"\ncgroup = \"lc\"\n[policy]\nkind = \"none\"\n")
            .unwrap();
    let h = &c.policy.heracles;
    assert_eq!(
        (h.interval_s, h.cooldown_s, h.load_disable, h.load_enable),
        (15.0, 300.0, 0.85, 0.80)
    );
    assert_eq!((h.slack_disallow_growth, h.slack_shrink), (0.10, 0.05));
    assert_eq!(
        (h.slack_shrink_action, h.slack_shrink_cores),
        (LowSlackAction::Keep, 2)
    );
    assert_eq!(
        (h.cores_interval_s, h.dram_limit, h.initial_llc_frac),
        (2.0, 0.90, 0.10)
    );
    assert_eq!(
        (h.power_interval_s, h.power_tdp_frac, h.freq_step_mhz),
        (2.0, 0.90, 100.0)
    );
    assert_eq!(
        (h.net_interval_s, h.net_link_headroom, h.net_lc_headroom),
        (1.0, 0.05, 0.10)
    );
    let w = &c.policy.weights;
    assert_eq!(w.mode, WeightsMode::Static);
    assert_eq!((w.lc_shares, w.be_shares, w.interval_s), (10_000, 2, 5.0));
    assert_eq!((w.w_max, w.w_min), (262_144, 1024));
    assert_eq!(c.policy.static_cycles.percent, 5.0);
    assert_eq!(c.lc().slo.percentile, 99.0);
    // the default policy is hybrid
    let c = Config::from_toml_str(
        "[lc]\nname = \"x\"\ncgroup = \"lc\"\n[lc.latency]\nsource = \"feed\"\n[lc.load]\nsource = \"feed\"\npeak_qps = 1000\n",
    )
    .unwrap();
    assert_eq!(c.policy.kind, PolicyKind::Hybrid);
}

#[test]
fn toml_round_trip_is_lossless() {
    let c = Config::from_toml_str(&docs_example()).unwrap();
    let again = Config::from_toml_str(&c.to_toml_string()).expect("re-parses");
    assert_eq!(c, again);
}

#[test]
fn set_accepts_typed_and_bare_values() {
    let mut c = Config::from_toml_str(&docs_example()).unwrap();
    c.set("policy.blind.buffer_cores", "2.5").unwrap();
    assert_eq!(c.policy.blind.buffer_cores, 2.5);
    c.set("policy.blind.poll_ms", "10").unwrap();
    assert_eq!(c.policy.blind.poll_ms, 10);
    c.set("policy.weights.mode", "fair").unwrap();
    assert_eq!(c.policy.weights.mode, WeightsMode::Fair);
    c.set("policy.static-cores.cpus", "[2, 3]").unwrap();
    assert_eq!(c.policy.static_cores.cpus, CpuSet::from([2, 3]));
    c.set("policy.heracles.guaranteed_freq_mhz", "2200")
        .unwrap();
    assert_eq!(c.policy.heracles.guaranteed_freq_mhz, Some(2200.0));
    c.set("lc.slo.target_us", "800").unwrap();
    assert_eq!(c.lc().slo.target_us, 800.0);
    c.set("policy.kind", "heracles").unwrap();
    assert_eq!(c.policy.kind, PolicyKind::Heracles);
}

#[test]
fn metrics_endpoint_can_be_turned_off() {
    let base = "[lc]\nname = \"x\"\ncgroup = \"lc\"\n[policy]\nkind = \"none\"\n";
    let c = Config::from_toml_str(base).unwrap();
    assert_eq!(
        c.api.metrics.as_deref(),
        Some("127.0.0.1:9464"),
        "localhost by default"
    );
    let c = Config::from_toml_str(&format!("{base}[api]\nmetrics = \"\"\n")).unwrap();
    assert_eq!(c.api.metrics, None);
}

const TWO_LCS: &str = r#"
[[lc]]
name = "memcached"
cgroup = "headroom/lc"
priority = 2
[lc.slo]
target_us = 300
[lc.latency]
source = "probe"
address = "127.0.0.1:11211"
[lc.load]
source = "memcache-stats"
address = "127.0.0.1:11211"
peak_qps = 100000

[[lc]]
name = "serve"
cgroup = "headroom/serve"
[lc.slo]
percentile = 99.9
target_us = 2000
[lc.latency]
source = "feed"

[[be]]
name = "batch"
cgroup = "headroom/be"
"#;

#[test]
fn several_lcs_parse_each_with_its_own_slo_and_priority() {
    let c = Config::from_toml_str(TWO_LCS).expect("two LCs are a valid config");
    assert_eq!(c.lcs.len(), 2);
    let (mc, serve) = (&c.lcs[0], &c.lcs[1]);
    assert_eq!((mc.name.as_str(), mc.priority), ("memcached", 2));
    assert_eq!((mc.slo.percentile, mc.slo.target_us), (99.0, 300.0));
    assert_eq!((serve.name.as_str(), serve.priority), ("serve", 0));
    assert_eq!((serve.slo.percentile, serve.slo.target_us), (99.9, 2000.0));
    assert_eq!(serve.cgroup.as_str(), "headroom/serve");
    assert_eq!(serve.latency.as_ref().unwrap().source, LatencySource::Feed);
    assert!(serve.load.is_none());
    assert_eq!(c.lc(), mc, "the first is the primary");
    // The TOML form keeps both.
    let back = Config::from_toml_str(&c.to_toml_string()).expect("round trip");
    assert_eq!(back, c);
}

#[test]
fn a_single_lc_table_is_unchanged() {
    let c = Config::from_toml_str(&docs_example()).expect("docs example");
    assert_eq!(c.lcs.len(), 1);
    assert_eq!(c.lc().priority, 0);
    let text = c.to_toml_string();
    assert!(
        text.starts_with("[lc]\n") || text.contains("\n[lc]\n"),
        "one LC is written as a table:\n{text}"
    );
    assert!(!text.contains("[[lc]]"), "{text}");
    // A one-element `[[lc]]` is the same config as `[lc]`.
    let arrayed = text.replace("[lc]", "[[lc]]");
    assert_eq!(Config::from_toml_str(&arrayed).expect("[[lc]] of one"), c);
    c.check_runnable().expect("one LC runs");
}
