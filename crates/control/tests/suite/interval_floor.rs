//! Intervals below 1 ms (`policy.*.interval_s = 1e-300`, `0.0001`) were accepted and ticked
//! once per ms without a word (hostile pass 12, "Found, not fixed"): refused at validation,
//! naming the key, the value and the floor, in the file and live; the papers' defaults and
//! the floor itself still validate.

use crate::config_support;

use headroom_control::config::Config;

// The refusal tests' good config.
use config_support::GOOD as BASE;

/// Every interval key of every policy: (section, key).
const INTERVALS: &[(&str, &str)] = &[
    ("heracles", "interval_s"),
    ("heracles", "cores_interval_s"),
    ("heracles", "power_interval_s"),
    ("heracles", "net_interval_s"),
    ("hybrid", "interval_s"),
    ("multi", "interval_s"),
    ("weights", "interval_s"),
];

fn with(section: &str, key: &str, value: &str) -> String {
    format!("{BASE}[policy.{section}]\n{key} = {value}\n")
}

#[test]
fn intervals_below_one_ms_are_refused_naming_the_key_the_value_and_the_floor() {
    let base = Config::from_toml_str(BASE).expect("the base config (the papers' defaults) is good");
    for &(section, key) in INTERVALS {
        let name = format!("policy.{section}.{key}");
        for bad in ["1e-300", "0.0001", "0.0009"] {
            match Config::from_toml_str(&with(section, key, bad)) {
                Ok(_) => panic!("{name} = {bad} was accepted (below the 1 ms floor)"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(&name) && msg.contains("0.001 s"),
                        "{name} = {bad}: the refusal names neither the key nor the floor: {msg}"
                    );
                }
            }
            // Live, as `ctl set` does.
            let mut c = base.clone();
            let msg = match c.set(&name, bad) {
                Ok(()) => panic!("ctl set {name}={bad} was accepted (below the 1 ms floor)"),
                Err(e) => e.to_string(),
            };
            assert!(msg.contains(&name) && msg.contains("0.001 s"), "{msg}");
        }
        // The floor itself, and a paper-sized interval, are fine.
        for good in ["0.001", "1.0", "15"] {
            Config::from_toml_str(&with(section, key, good))
                .unwrap_or_else(|e| panic!("{name} = {good} refused: {e}"));
        }
    }
}

/// `lc.slo.window_s = 1e-300` was taken (hostile passes 14 and 15, "Found, not fixed": the
/// floor above was given to the policy intervals only), and so was `kubernetes.window_s`, the
/// window of every discovered LC. Both refused below 1 ms, naming the key and the floor; the
/// floor itself and Heracles' 15 s still validate. The latency source is a feed: a prober's
/// own count rule would refuse a tiny window for another reason.
#[test]
fn slo_windows_below_one_ms_are_refused_naming_the_key_and_the_floor() {
    let fed = BASE.replace(
        "source = \"probe\"\naddress = \"127.0.0.1:11211\"",
        "source = \"feed\"\nsocket = \"/run/headroom/lat.sock\"",
    );
    assert_ne!(fed, BASE, "the base config's latency source is a probe");
    let lc = |w: &str| {
        fed.replacen(
            "[lc.latency]",
            &format!("[lc.slo]\nwindow_s = {w}\n[lc.latency]"),
            1,
        )
    };
    let kube = |w: &str| format!("{fed}[kubernetes]\nwindow_s = {w}\n");
    for (key, text) in [
        ("lc.slo.window_s", &lc as &dyn Fn(&str) -> String),
        ("kubernetes.window_s", &kube),
    ] {
        for bad in ["1e-300", "0.0001", "0.0009"] {
            match Config::from_toml_str(&text(bad)) {
                Ok(_) => panic!("{key} = {bad} was accepted (below the 1 ms floor)"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(key) && msg.contains("0.001 s"),
                        "{key} = {bad}: the refusal names neither the key nor the floor: {msg}"
                    );
                }
            }
        }
        for good in ["0.001", "15"] {
            Config::from_toml_str(&text(good))
                .unwrap_or_else(|e| panic!("{key} = {good} refused: {e}"));
        }
    }
}
