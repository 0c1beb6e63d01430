//! `[lc.latency] source = "kernel"`: ports and fallback parse, and mistakes name their key.

use headroom_control::config::{Config, LatencyFallback, LatencySource};

fn config(latency: &str) -> String {
    format!(
        r#"
[lc]
name = "memcached"
cgroup = "lc"
[lc.slo]
target_us = 500
percentile = 99
window_s = 10
[lc.latency]
{latency}
[policy]
kind = "none"
"#
    )
}

#[test]
fn kernel_source_with_ports_and_fallback_parses() {
    let c = Config::from_toml_str(&config(
        "source = \"kernel\"\nports = [11212, 11211]\nport = 11211\nfallback = \"probe\"",
    ))
    .expect("valid");
    let lat = c.lc().latency.clone().unwrap();
    assert_eq!(lat.source, LatencySource::Kernel);
    assert_eq!(lat.kernel_ports(), vec![11211, 11212]);
    assert_eq!(lat.fallback, Some(LatencyFallback::Probe));
    assert_eq!(lat.probe_address(), "127.0.0.1:11211");
}

#[test]
fn kernel_source_mistakes_name_their_key() {
    let err = |l: &str| Config::from_toml_str(&config(l)).unwrap_err().to_string();
    let e = err("source = \"kernel\"");
    assert!(e.contains("lc.latency.port"), "{e}");
    let e = err("source = \"kernel\"\nports = [0]");
    assert!(e.contains("lc.latency.ports"), "{e}");
    let e = err("source = \"kernel\"\nport = 11211\nfallback = \"prober\"");
    assert!(e.contains("fallback"), "{e}");
    let e = err("source = \"probe\"\naddress = \"127.0.0.1:11211\"\nfallback = \"probe\"");
    assert!(e.contains("lc.latency.fallback"), "{e}");
    let e = err("source = \"probe\"\naddress = \"127.0.0.1:11211\"\nport = 11211");
    assert!(e.contains("lc.latency.port"), "{e}");
}
