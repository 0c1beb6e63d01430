// The tests read the shipped files and time nothing the crate does: the purity rule
// (crates/control/clippy.toml) is for the crate itself.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]
//! Several LC services (`[[lc]]`): refused by index, all at once, never sharing a group or a
//! name, each with the sources its policy steers by.

use crate::config_support;

use config_support::{refuse, refused_with, GOOD};
use headroom_control::config::Config;

/// Two LCs: the base config's and a second one given by `second` (its `[[lc]]` body).
fn two_lcs(second: &str) -> String {
    let both = GOOD.replacen("[lc]\n", "[[lc]]\n", 1).replacen(
        "[[be]]",
        &format!("[[lc]]\n{second}\n[[be]]"),
        1,
    );
    assert!(both.contains("[[lc]]\nname = \"memcached\""), "{both}");
    both
}

#[test]
fn several_lcs_are_refused_by_index_and_all_at_once() {
    let text = two_lcs(
        "name = \"serve\"\ncgroup = \"headroom/serve\"\n[lc.slo]\ntarget_us = 0\nwindow_s = -1",
    );
    let msg = refuse(&text);
    assert!(msg.contains("lc[1].slo.target_us = 0.0: "), "{msg}");
    assert!(msg.contains("lc[1].slo.window_s = -1.0: "), "{msg}");
    assert!(!msg.contains("\nlc.slo"), "{msg}");
    // A type error inside the second LC keeps its path.
    let msg = refuse(&two_lcs(
        "name = \"serve\"\ncgroup = \"headroom/serve\"\npriority = \"high\"",
    ));
    assert!(msg.contains("lc[1].priority"), "{msg}");
    let msg = refuse("lc = []\n");
    assert!(msg.contains("at least one LC service"), "{msg}");
}

#[test]
fn two_lcs_on_one_cgroup_or_one_name_are_refused() {
    let msg = refuse(&two_lcs("name = \"serve\"\ncgroup = \"headroom/lc\""));
    assert!(
        msg.contains("lc[1].cgroup = \"headroom/lc\": is the same group as lc[0].cgroup"),
        "{msg}"
    );
    assert!(msg.contains("\"memcached\""), "names the other LC: {msg}");
    let msg = refuse(&two_lcs("name = \"serve\"\ncgroup = \"headroom/lc/inner\""));
    assert!(
        msg.contains("lc[1].cgroup = \"headroom/lc/inner\": overlaps lc[0].cgroup"),
        "{msg}"
    );
    let msg = refuse(&two_lcs(
        "name = \"memcached\"\ncgroup = \"headroom/serve\"",
    ));
    assert!(
        msg.contains("lc[1].name = \"memcached\": lc[0] has the same name"),
        "{msg}"
    );
}

#[test]
fn an_lc_nested_in_be_or_be_in_an_lc_is_refused_with_the_lc_named() {
    let msg = refuse(&two_lcs("name = \"serve\"\ncgroup = \"headroom/be/serve\""));
    assert!(msg.contains("be[0].cgroup = \"headroom/be\": overlaps the LC group \"headroom/be/serve\" of lc[1] (\"serve\"): the LC nested inside BE"), "{msg}");
    let msg = refuse(&two_lcs("name = \"serve\"\ncgroup = \"headroom\""));
    assert!(
        msg.contains("of lc[1] (\"serve\"): BE nested inside the LC"),
        "{msg}"
    );
    // One LC keeps today's wording, with the nesting said.
    let msg = refused_with(
        "cgroup = \"headroom/be\"",
        "cgroup = \"headroom/lc/be\"",
        "be[0].cgroup",
    );
    assert!(
        msg.contains("overlaps the LC group \"headroom/lc\": BE nested inside the LC"),
        "{msg}"
    );
}

#[test]
fn several_lcs_run_and_each_needs_the_sources_its_policy_steers_by() {
    let second = "name = \"serve\"\ncgroup = \"headroom/serve\"";
    let text = two_lcs(second).replace("kind = \"heracles\"", "kind = \"none\"");
    let c =
        Config::from_toml_str(&text).expect("two LCs validate under a policy needing no latency");
    c.check_runnable().expect("several LCs run");
    // A latency-driven policy: the service without sources is named by its index.
    let msg = refuse(&two_lcs(second));
    assert!(
        msg.contains("lc[1].latency = \"none\": policy.kind = \"heracles\" needs [lc[1].latency] to be configured"),
        "{msg}"
    );
    assert!(
        !msg.contains("lc[0]"),
        "the first service has its sources: {msg}"
    );
}

#[test]
fn one_services_slo_changes_live_by_its_index() {
    let second = "name = \"serve\"\ncgroup = \"headroom/serve\"";
    let text = two_lcs(second).replace("kind = \"heracles\"", "kind = \"none\"");
    let mut c = Config::from_toml_str(&text).unwrap();
    c.set("lc[1].slo.target_us", "900").unwrap();
    assert_eq!(c.lcs[1].slo.target_us, 900.0);
    // `lc.slo.*` is the first service's
    c.set("lc.slo.target_us", "700").unwrap();
    assert_eq!(c.lcs[0].slo.target_us, 700.0);
    assert_eq!(c.lcs[1].slo.target_us, 900.0);
    let e = c.set("lc[1].slo.target_us", "0").unwrap_err().to_string();
    assert!(e.starts_with("lc[1].slo.target_us = 0.0"), "{e}");
    let e = c.set("lc[2].slo.target_us", "1").unwrap_err().to_string();
    assert!(e.contains("there is no lc[2]"), "{e}");
    let e = c.set("lc[1].cgroup", "\"x\"").unwrap_err().to_string();
    assert!(e.contains("not changeable at run time"), "{e}");
    assert_eq!(c.lcs[1].cgroup.as_str(), "headroom/serve");
    // Fourth hostile pass: what the latency sources were started with is not live (a
    // percentile set live was shown in `ctl status` while the sensors measured the old one).
    let before = c.clone();
    for (key, value) in [
        ("lc.slo.percentile", "99.9"),
        ("lc[1].slo.percentile", "50"),
        ("lc.slo.window_s", "60"),
        ("lc[1].slo.min_samples", "10"),
    ] {
        let e = c.set(key, value).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{key} = {value:?}")), "{e}");
        assert!(e.contains("restart"), "{e}");
    }
    assert_eq!(c, before);
}
