// The tests read the shipped files and time nothing the crate does: the purity rule
// (crates/control/clippy.toml) is for the crate itself.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]
//! Every problem of a config is named at once: each bad value, type and unknown key, across
//! sections, none hiding another.

use crate::config_support;

use config_support::{refuse, GOOD};
use headroom_control::config::Config;

#[test]
fn every_bad_value_is_named_at_once() {
    // Three independent mistakes in three sections: each is reported, one a line, with its
    // key, value and reason, in the order of the sections.
    let text = format!(
        "{}[policy.blind]\npoll_ms = 0\n[api]\nmetrics = \"localhost\"\n",
        GOOD.replacen(
            "[lc.latency]",
            "[lc.slo]\npercentile = 100.0\n[lc.latency]",
            1
        )
    );
    let err = Config::from_toml_str(&text).unwrap_err();
    assert_eq!(err.problems().len(), 3, "{err}");
    assert_eq!(
        err.to_string(),
        "lc.slo.percentile = 100.0: must be in (0, 100)\n\
         policy.blind.poll_ms = 0: must be in 1..=60000\n\
         api.metrics = \"localhost\": expected IP:PORT, e.g. 127.0.0.1:9464"
    );
}

#[test]
fn several_bad_values_in_one_section_are_all_named() {
    let text = format!(
        "{GOOD}[policy.heracles]\ndram_limit = 1.2\nllc_step_ways = 0\npower_interval_s = -1\n"
    );
    let msg = refuse(&text);
    for line in [
        "policy.heracles.dram_limit = 1.2: must be a fraction in [0, 1]",
        "policy.heracles.llc_step_ways = 0: must be >= 1",
        "policy.heracles.power_interval_s = -1.0: must be a finite number > 0",
    ] {
        assert!(
            msg.lines().any(|l| l == line),
            "{line:?} missing from:\n{msg}"
        );
    }
    assert_eq!(msg.lines().count(), 3, "{msg}");
}

#[test]
fn a_key_is_named_once_even_when_two_checks_refuse_it() {
    // w_min is out of range and above w_max: one line for it, the first reason.
    let msg = refuse(&format!("{GOOD}[policy.weights]\nw_min = 300000\n"));
    assert_eq!(
        msg,
        "policy.weights.w_min = 300000: cpu.shares must be in 2..=262144"
    );
}

#[test]
fn type_errors_in_several_sections_are_all_named() {
    // serde stops at the first wrong type; every other section is read on its own for its own.
    let text = format!(
        "{}[policy.blind]\npoll_ms = \"fast\"\n[safety]\non_exit = \"explode\"\n",
        GOOD.replacen("peak_qps = 100000", "peak_qps = \"lots\"", 1)
    );
    let err = Config::from_toml_str(&text).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.problems().len(), 3, "{msg}");
    for (key, value) in [
        ("lc.load.peak_qps", "\"lots\""),
        ("policy.blind.poll_ms", "\"fast\""),
        ("safety.on_exit", "\"explode\""),
    ] {
        assert!(
            msg.lines()
                .any(|l| l.starts_with(&format!("{key} = {value}: "))),
            "{key} missing from:\n{msg}"
        );
    }
}

#[test]
fn unknown_tables_beside_a_bad_value_are_named_too() {
    let text = format!("{GOOD}[policy.blind]\npoll_ms = 0\n[extra]\nx = 1\n[more]\ny = 2\n");
    let msg = refuse(&text);
    assert!(
        msg.contains("extra") && msg.contains("more"),
        "both unknown tables named:\n{msg}"
    );
}

/// Issue 42 / 41.6: a refused type or enum value does not hide the other sections' value
/// refusals — `policy.kind = "hybridd"` and `lc.slo.target_us = -5` are both named, each with
/// its value and what is accepted.
#[test]
fn a_bad_enum_does_not_hide_a_bad_value_elsewhere() {
    let text = GOOD
        .replacen("kind = \"heracles\"", "kind = \"hybridd\"", 1)
        .replacen("[lc.latency]", "[lc.slo]\ntarget_us = -5\n[lc.latency]", 1);
    let msg = refuse(&text);
    assert!(msg.contains("policy.kind"), "{msg}");
    assert!(msg.contains("hybridd"), "{msg}");
    assert!(
        msg.contains("hybrid"),
        "the accepted kinds are named: {msg}"
    );
    assert!(msg.contains("lc.slo.target_us"), "{msg}");
    assert!(msg.contains("-5"), "{msg}");
}

/// Two refused types in one section are both named (the first no longer hides the second).
#[test]
fn two_bad_types_in_one_section_are_both_named() {
    let text = GOOD.replacen(
        "peak_qps = 100000",
        "peak_qps = \"lots\"\n[lc.slo]\ntarget_us = \"fast\"",
        1,
    );
    let msg = refuse(&text);
    assert!(msg.contains("lc.load.peak_qps"), "{msg}");
    assert!(msg.contains("lc.slo.target_us"), "{msg}");
}

/// `[[be]] user` on a BE without `command` names who runs nothing: refused with its key, beside
/// the config's other problems; with a command it is taken, by name or uid.
#[test]
fn a_be_user_without_a_command_is_refused_with_the_rest() {
    let text = GOOD.replacen(
        "cgroup = \"headroom/be\"",
        "cgroup = \"headroom/be\"\nuser = \"nobody\"\nrestart_backoff_ms = 0",
        1,
    );
    let msg = refuse(&text);
    assert!(msg.contains("be[0].user"), "{msg}");
    assert!(msg.contains("set command or remove user"), "{msg}");
    assert!(
        msg.contains("be[0].restart_backoff_ms"),
        "both at once: {msg}"
    );
    for user in ["\"nobody\"", "65534"] {
        let text = GOOD.replacen(
            "cgroup = \"headroom/be\"",
            &format!("cgroup = \"headroom/be\"\ncommand = [\"sleep\", \"1\"]\nuser = {user}"),
            1,
        );
        let config = Config::from_toml_str(&text).expect("a BE user with a command");
        assert!(config.be[0].user.is_some());
    }
}
