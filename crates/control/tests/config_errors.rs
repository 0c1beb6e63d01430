// The tests read the shipped files and time nothing the crate does: the purity rule
// (crates/control/clippy.toml) is for the crate itself.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]
//! Bad configs are refused with the key, the value and the reason.

use headroom_control::config::Config;

const GOOD: &str = r#"
[lc]
name = "memcached"
cgroup = "headroom/lc"
[lc.latency]
source = "probe"
address = "127.0.0.1:11211"
[lc.load]
source = "memcache-stats"
address = "127.0.0.1:11211"
peak_qps = 100000
[[be]]
name = "batch"
cgroup = "headroom/be"
[policy]
kind = "heracles"
"#;

fn refuse(text: &str) -> String {
    match Config::from_toml_str(text) {
        Ok(c) => panic!("accepted a bad config: {c:?}\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// Replaces `from` in the good config (which must contain it) and expects a refusal naming `key`.
fn refused_with(from: &str, to: &str, key: &str) -> String {
    assert!(GOOD.contains(from), "{from:?} not in the base config");
    let msg = refuse(&GOOD.replacen(from, to, 1));
    assert!(msg.contains(key), "error does not name {key:?}: {msg}");
    msg
}

#[test]
fn the_base_config_is_good() {
    Config::from_toml_str(GOOD).expect("base config valid");
}

#[test]
fn cgroup_paths_that_escape_are_refused() {
    let msg = refused_with(
        "cgroup = \"headroom/lc\"",
        "cgroup = \"../../x\"",
        "lc.cgroup",
    );
    assert_eq!(msg, "lc.cgroup = \"../../x\": path escapes the cgroup root");
    let msg = refused_with(
        "cgroup = \"headroom/lc\"",
        "cgroup = \"/sys/fs/cgroup/x\"",
        "lc.cgroup",
    );
    assert!(msg.contains("absolute path"), "{msg}");
    refused_with(
        "cgroup = \"headroom/lc\"",
        "cgroup = \"a/../../b\"",
        "lc.cgroup",
    );
    refused_with("cgroup = \"headroom/lc\"", "cgroup = \"\"", "lc.cgroup");
    refused_with("cgroup = \"headroom/lc\"", "cgroup = \".\"", "lc.cgroup");
    let msg = refused_with(
        "cgroup = \"headroom/be\"",
        "cgroup = \"../be\"",
        "be[0].cgroup",
    );
    assert!(msg.contains("escapes"), "{msg}");
}

#[test]
fn be_group_overlapping_the_lc_is_refused() {
    let msg = refused_with(
        "cgroup = \"headroom/be\"",
        "cgroup = \"headroom/lc/be\"",
        "be[0].cgroup",
    );
    assert!(msg.contains("overlaps the LC group"), "{msg}");
    let msg = refused_with(
        "cgroup = \"headroom/be\"",
        "cgroup = \"headroom\"",
        "be[0].cgroup",
    );
    assert!(msg.contains("overlaps"), "{msg}");
}

#[test]
fn unknown_keys_are_refused_by_name() {
    let msg = refuse(&GOOD.replace("[policy]\n", "[policy]\nbufer_cores = 2\n"));
    assert!(msg.contains("bufer_cores"), "{msg}");
    let msg = refuse(&format!("{GOOD}[policy.blind]\nbuffer = 2\n"));
    assert!(msg.contains("buffer"), "{msg}");
    let msg = refuse(&format!("{GOOD}[extra]\nx = 1\n"));
    assert!(msg.contains("extra"), "{msg}");
    let msg = refuse(&GOOD.replace("kind = \"heracles\"", "kind = \"magic\""));
    assert!(msg.contains("magic"), "{msg}");
}

#[test]
fn bad_values_name_key_value_and_reason() {
    let cases: &[(&str, &str)] = &[
        (
            "[lc.slo]\npercentile = 100.0\n",
            "lc.slo.percentile = 100.0: must be in (0, 100)",
        ),
        (
            "[lc.slo]\ntarget_us = 0\n",
            "lc.slo.target_us = 0.0: must be a finite number > 0",
        ),
        (
            "[policy.blind]\npoll_ms = 0\n",
            "policy.blind.poll_ms = 0: must be in 1..=60000",
        ),
        (
            "[policy.blind]\nbuffer_cores = -1\n",
            "policy.blind.buffer_cores = -1.0: must be a finite number >= 0",
        ),
        (
            "[policy.blind]\nidle_threshold = 1.5\n",
            "policy.blind.idle_threshold = 1.5: must be a fraction in [0, 1]",
        ),
        (
            "[policy.blind]\nbe_cpus = [1, 1]\n",
            "policy.blind.be_cpus = [1, 1]: lists a CPU twice",
        ),
        (
            "[policy.heracles]\nload_enable = 0.9\n",
            "policy.heracles.load_enable = 0.9: must be <= load_disable (0.85) for hysteresis",
        ),
        (
            "[policy.heracles]\nslack_shrink = 0.2\n",
            "policy.heracles.slack_shrink = 0.2: must be <= slack_disallow_growth",
        ),
        (
            "[policy.heracles]\ndram_limit = 1.2\n",
            "policy.heracles.dram_limit = 1.2: must be a fraction in [0, 1]",
        ),
        (
            "[policy.heracles]\nbe_freq_max_mhz = 500\n",
            "policy.heracles.be_freq_max_mhz = 500.0: must be >= be_freq_min_mhz",
        ),
        (
            "[policy.weights]\nbe_shares = 1\n",
            "policy.weights.be_shares = 1: cpu.shares must be in 2..=262144",
        ),
        (
            "[policy.weights]\nlc_weight_v2 = 20000\n",
            "policy.weights.lc_weight_v2 = 20000: cpu.weight must be in 1..=10000",
        ),
        (
            "[policy.weights]\nw_min = 300000\n",
            "policy.weights.w_min = 300000: cpu.shares must be in 2..=262144",
        ),
        (
            "[policy.static-cycles]\npercent = 0\n",
            "policy.static-cycles.percent = 0.0: must be in (0, 100]",
        ),
        (
            "[policy.static-cycles]\nperiod_us = 10\n",
            "policy.static-cycles.period_us = 10: CFS period must be in 1000..=1000000 µs",
        ),
        (
            "[policy.hybrid]\nbuffer_min_cores = 3\nbuffer_max_cores = 2\n",
            "policy.hybrid.buffer_max_cores = 2.0: must be >= buffer_min_cores (or 0 for all CPUs)",
        ),
        (
            "[safety]\nlatency_max_age_ms = 0\n",
            "safety.latency_max_age_ms = 0: must be > 0",
        ),
        (
            "[[safety.be_io_limits]]\ndevice = \"sda\"\n",
            "safety.be_io_limits[0].device = \"sda\": expected MAJOR:MINOR, e.g. \"8:0\"",
        ),
        (
            "[api]\nmetrics = \"localhost\"\n",
            "api.metrics = \"localhost\": expected IP:PORT, e.g. 127.0.0.1:9464",
        ),
    ];
    for (extra, expected) in cases {
        // tables after the base config's [policy] (sub-tables of [lc] are inserted before it)
        let text = if extra.starts_with("[lc.") {
            GOOD.replacen("[lc.latency]", &format!("{extra}[lc.latency]"), 1)
        } else {
            format!("{GOOD}{extra}")
        };
        assert_eq!(&refuse(&text), expected, "for {extra:?}");
    }
}

#[test]
fn sources_need_their_settings() {
    let msg = refused_with(
        "address = \"127.0.0.1:11211\"\n[lc.load]",
        "[lc.load]",
        "lc.latency.address",
    );
    assert!(msg.contains("required"), "{msg}");
    refused_with(
        "address = \"127.0.0.1:11211\"\n[lc.load]",
        "address = \"nohost\"\n[lc.load]",
        "lc.latency.address",
    );
    refused_with(
        "source = \"probe\"",
        "source = \"prometheus\"",
        "lc.latency.url",
    );
    refused_with("peak_qps = 100000", "peak_qps = 0", "lc.load.peak_qps");
}

#[test]
fn latency_driven_policies_need_latency_and_load() {
    let no_sources = "[lc]\nname = \"x\"\ncgroup = \"lc\"\n[policy]\nkind = \"KIND\"\n";
    for kind in ["heracles", "hybrid"] {
        let msg = refuse(&no_sources.replace("KIND", kind));
        assert!(
            msg.starts_with(&format!("policy.kind = \"{kind}\": needs [lc.latency]")),
            "{msg}"
        );
    }
    let msg = refuse(&format!(
        "{}[policy.weights]\nmode = \"fair\"\n",
        no_sources.replace("KIND", "weights")
    ));
    assert!(msg.contains("needs [lc.latency]"), "{msg}");
    for kind in ["none", "static-cores", "static-cycles", "weights", "blind"] {
        Config::from_toml_str(&no_sources.replace("KIND", kind))
            .unwrap_or_else(|e| panic!("{kind} needs no latency source: {e}"));
    }
}

#[test]
fn lc_thread_treatment_is_checked() {
    let text = GOOD.replacen(
        "[lc.latency]",
        "[lc.threads]\nfifo_priority = 0\n[lc.latency]",
        1,
    );
    assert_eq!(
        refuse(&text),
        "lc.threads.fifo_priority = 0: must be in 1..=99"
    );
    let text = GOOD.replacen(
        "[lc.latency]",
        "[lc.threads]\nfifo_priority = 10\nslice_us = 100\n[lc.latency]",
        1,
    );
    assert!(refuse(&text).starts_with("lc.threads.slice_us = Some(100)"));
    let text = GOOD.replacen(
        "[lc.latency]",
        "[lc.threads]\nslice_us = 5\n[lc.latency]",
        1,
    );
    assert!(refuse(&text).contains("100..=100000"));
}

#[test]
fn duplicate_be_names_and_pid_command_conflicts() {
    let text = format!("{GOOD}[[be]]\nname = \"batch\"\ncgroup = \"headroom/be2\"\n");
    // [[be]] after [policy] is a new array element of the top-level be table
    let msg = refuse(&text);
    assert_eq!(msg, "be[1].name = \"batch\": duplicate BE name");
    let text = GOOD.replacen(
        "cgroup = \"headroom/lc\"",
        "cgroup = \"headroom/lc\"\npids = [12]\ncommand = [\"x\"]",
        1,
    );
    assert!(refuse(&text).starts_with("lc.command = [\"x\"]: give either lc.pids or lc.command"));
}

/// Issue 42: a prober that sends exactly the minimum a percentile needs is refused at start,
/// since a loaded host sends fewer probes than asked (500 Hz × 2 s was accepted, then 10 of 10
/// windows were refused with ~953 replies); the error names the margin and the rate to use.
#[test]
fn a_prober_at_exactly_the_minimum_is_refused_with_the_margin_named() {
    let exact = GOOD.replacen(
        "address = \"127.0.0.1:11211\"\n[lc.load]",
        "address = \"127.0.0.1:11211\"\nrate_hz = 500\n[lc.load]",
        1,
    );
    let msg = refuse(&format!("{exact}[lc.slo]\nwindow_s = 2\n"));
    assert!(msg.contains("lc.latency.rate_hz"), "{msg}");
    assert!(
        msg.contains("1000 probes") && msg.contains("1250") && msg.contains("1.25x margin"),
        "{msg}"
    );
    assert!(msg.contains("at least 625 Hz"), "{msg}");
    let enough = exact.replacen("rate_hz = 500", "rate_hz = 625", 1);
    Config::from_toml_str(&format!("{enough}[lc.slo]\nwindow_s = 2\n")).expect("1250 probes");
}

#[test]
fn a_prober_too_slow_for_its_percentile_is_refused() {
    // 10 probes/s over 15 s = 150 samples: never enough for a p99 (1000).
    let msg = refused_with(
        "address = \"127.0.0.1:11211\"\n[lc.load]",
        "address = \"127.0.0.1:11211\"\nrate_hz = 10\n[lc.load]",
        "lc.latency.rate_hz",
    );
    assert!(msg.contains("150 probes") && msg.contains("1000"), "{msg}");
    // The same rate over a long enough window, or with a looser floor, is fine.
    let slow = GOOD.replacen(
        "address = \"127.0.0.1:11211\"\n[lc.load]",
        "address = \"127.0.0.1:11211\"\nrate_hz = 10\n[lc.load]",
        1,
    );
    Config::from_toml_str(&format!("{slow}[lc.slo]\nwindow_s = 125\n"))
        .expect("1250 probes: the 1000 with the margin");
    Config::from_toml_str(&format!("{slow}[lc.slo]\nmin_samples = 100\n")).expect("floor 100");
    let zero = refuse(&format!("{GOOD}[lc.slo]\nmin_samples = 0\n"));
    assert!(zero.contains("lc.slo.min_samples"), "{zero}");
}

/// Values an SRE once got accepted and then hurt by (agent issue, defects 5 and 12).
#[test]
fn out_of_range_values_that_used_to_pass_are_refused() {
    let msg = refused_with(
        "[lc.latency]",
        "[lc.slo]\nwindow_s = 1e308\n[lc.latency]",
        "lc.slo.window_s",
    );
    assert!(msg.contains("3600"), "{msg}");
    // the prober is load on the LC: 1e9 Hz pushed its p99 from ~200 µs to 3-4 ms
    let msg = refused_with(
        "address = \"127.0.0.1:11211\"\n[lc.load]",
        "address = \"127.0.0.1:11211\"\nrate_hz = 1e9\n[lc.load]",
        "lc.latency.rate_hz",
    );
    assert!(msg.contains("5000 Hz"), "5% of the 100k peak: {msg}");
    // `./x` is not a group the agent can use: refused before start, not at it
    refused_with(
        "cgroup = \"headroom/be\"",
        "cgroup = \"./be\"",
        "be[0].cgroup",
    );
}

#[test]
fn be_groups_must_be_distinct_and_not_nested() {
    let two = |second: &str| {
        GOOD.replace(
            "[policy]",
            &format!("[[be]]\nname = \"other\"\ncgroup = \"{second}\"\n[policy]"),
        )
    };
    let msg = refuse(&two("headroom/be"));
    assert!(
        msg.contains("be[1].cgroup") && msg.contains("overlaps be[0]"),
        "{msg}"
    );
    let msg = refuse(&two("headroom/be/inner"));
    assert!(msg.contains("be[1].cgroup"), "{msg}");
}

#[test]
fn machine_checks_name_the_cpu_or_the_size() {
    let cfg = Config::from_toml_str(GOOD).unwrap();
    let mut big = cfg.clone();
    big.policy.blind.buffer_cores = 1000.0;
    let msg = big.validate_on(&[0, 1]).unwrap_err().to_string();
    assert!(
        msg.contains("policy.blind.buffer_cores") && msg.contains("2 CPUs"),
        "{msg}"
    );
    let mut pinned = cfg.clone();
    pinned.lc_mut().threads.cpus = [7].into();
    let msg = pinned.validate_on(&[0, 1]).unwrap_err().to_string();
    assert!(
        msg.contains("lc.threads.cpus") && msg.contains("CPU 7"),
        "{msg}"
    );
    cfg.validate_on(&[0, 1]).unwrap();
}

/// Paths, CPU sets and device numbers are types (`GroupPath`, `CpuSet`, `DeviceId`): a value
/// the type refuses is refused when the config is read, naming the key, the value and why.
#[test]
fn typed_values_are_refused_by_key_when_read() {
    let msg = refused_with(
        "cgroup = \"headroom/be\"",
        "cgroup = \"a//b\"",
        "be[0].cgroup",
    );
    assert_eq!(msg, "be[0].cgroup = \"a//b\": empty component (`a//b`)");
    let msg = refused_with("cgroup = \"headroom/lc\"", "cgroup = 7", "lc.cgroup");
    assert!(
        msg.contains("lc.cgroup = 7") && msg.contains("cgroup path"),
        "{msg}"
    );
    let msg = refuse(&format!("{GOOD}[policy.blind]\nbe_cpus = [1, 9000]\n"));
    assert!(
        msg.starts_with("policy.blind.be_cpus = [1, 9000]:") && msg.contains("CPU 9000"),
        "{msg}"
    );
    let msg = refuse(&format!("{GOOD}[policy.blind]\nbe_cpus = \"3-1\"\n"));
    assert!(
        msg.contains("policy.blind.be_cpus") && msg.contains("range"),
        "{msg}"
    );
    let msg = refuse(&format!(
        "{GOOD}[[policy.weights.groups]]\nname = \"a\"\ncgroup = \"../a\"\nrt_sla_us = 100\n"
    ));
    assert_eq!(
        msg,
        "policy.weights.groups[0].cgroup = \"../a\": path escapes the cgroup root"
    );
}

#[test]
fn typed_values_read_in_either_spelling() {
    let cfg = Config::from_toml_str(&format!(
        "{GOOD}[policy.blind]\nbe_cpus = \"2-3,6\"\n[policy.static-cores]\ncpus = [5, 4]\n"
    ))
    .unwrap();
    assert_eq!(cfg.policy.blind.be_cpus.to_vec(), [2, 3, 6]);
    assert_eq!(cfg.policy.static_cores.cpus.to_vec(), [4, 5]);
    assert_eq!(cfg.be[0].cgroup.as_str(), "headroom/be");
    // the TOML form round-trips (what `ctl status` shows and `set` edits)
    let again = Config::from_toml_str(&cfg.to_toml_string()).unwrap();
    assert_eq!(again, cfg);
}

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

/// A BE memory limit of 0 or a few bytes is no cap on a working set: v1 refuses it (EBUSY) and
/// v2 kills every BE task. Refused in the file and through `ctl set` alike.
#[test]
fn a_be_memory_limit_below_a_working_set_is_refused() {
    for bytes in ["0", "1", "2097152"] {
        let msg = refuse(&format!(
            "{GOOD}[safety]\nbe_memory_limit_bytes = {bytes}\n"
        ));
        assert!(msg.contains("safety.be_memory_limit_bytes"), "{msg}");
        assert!(msg.contains("4194304"), "names the least accepted: {msg}");
    }
    let mut c = Config::from_toml_str(GOOD).unwrap();
    let err = c.set("safety.be_memory_limit_bytes", "1").unwrap_err();
    assert!(
        err.to_string().contains("safety.be_memory_limit_bytes"),
        "{err}"
    );
    assert_eq!(c.safety.be_memory_limit_bytes, None, "unchanged on error");
    c.set("safety.be_memory_limit_bytes", "67108864").unwrap();
    assert_eq!(c.safety.be_memory_limit_bytes, Some(64 << 20));
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

/// Issue 42: durations that passed validation overflowed an instant at run time (exit 101).
/// They are bounded where accepted, in the file and through `set` alike.
#[test]
fn durations_too_large_to_add_to_an_instant_are_refused() {
    let text = GOOD.replacen(
        "kind = \"heracles\"",
        "kind = \"hybrid\"\n[policy.hybrid]\ninterval_s = 1e300\n[safety]\nviolation_cooldown_s = 1e300",
        1,
    );
    let msg = refuse(&text);
    assert!(msg.contains("policy.hybrid.interval_s"), "{msg}");
    assert!(msg.contains("safety.violation_cooldown_s"), "{msg}");
    let mut c = Config::from_toml_str(GOOD).unwrap();
    let before = c.clone();
    for (key, value) in [
        ("policy.hybrid.interval_s", "1e300"),
        ("safety.violation_cooldown_s", "1e300"),
        ("safety.violation_cooldown_s", "inf"),
    ] {
        let err = c.set(key, value).expect_err(value).to_string();
        assert!(err.contains(key), "{err}");
    }
    assert_eq!(c, before, "a refused set changes nothing");
}

/// A key read once at start is refused live, not acknowledged and ignored.
#[test]
fn start_only_safety_keys_are_refused_live() {
    let mut c = Config::from_toml_str(GOOD).unwrap();
    let err = c
        .set("safety.agent_fifo_priority", "99")
        .unwrap_err()
        .to_string();
    assert!(err.contains("safety.agent_fifo_priority"), "{err}");
    assert!(err.contains("restart"), "{err}");
}

/// Issue 42: configs that passed the start and then failed or misbehaved.
#[test]
fn configs_that_passed_then_failed_are_refused_at_once() {
    let cases: [(&str, &str, &str); 7] = [
        (
            "kind = \"heracles\"",
            "kind = \"heracles\"\n[safety]\nstate_file = \"/tmp/x.sock\"\n[api]\nsocket = \"/tmp/x.sock\"",
            "api.socket",
        ),
        (
            "kind = \"heracles\"",
            "kind = \"heracles\"\n[api]\nmetrics = \"127.0.0.1:11211\"",
            "api.metrics",
        ),
        (
            "cgroup = \"headroom/be\"",
            "cgroup = \"cpuset.cpus\"",
            "be[0].cgroup",
        ),
        ("cgroup = \"headroom/lc\"", "cgroup = \"headroom/lc/tasks\"", "lc.cgroup"),
        (
            "cgroup = \"headroom/be\"",
            "cgroup = \"headroom/be\"\ncommand = [\"\"]",
            "be[0].command",
        ),
        (
            "kind = \"heracles\"",
            "kind = \"heracles\"\n[api]\ndecision_log_max_mb = 0",
            "api.decision_log_max_mb",
        ),
        (
            "kind = \"heracles\"",
            "kind = \"heracles\"\n[api]\nmetrics = \"0.0.0.0:11211\"",
            "api.metrics",
        ),
    ];
    for (from, to, key) in cases {
        refused_with(from, to, key);
    }
    // Fourth hostile pass: a knob file above the group's own name (the start made the
    // groups above it, then failed at ENOTDIR), and a NUL byte in a command (the start
    // confined BE, then failed to launch it): both refused before anything is touched.
    for (from, to, key) in [
        (
            "cgroup = \"headroom/be\"",
            "cgroup = \"headroom/cpu.shares/be\"",
            "be[0].cgroup",
        ),
        (
            "cgroup = \"headroom/be\"",
            "cgroup = \"headroom/be\"\ncommand = [\"sleep\", \"1\\u0000\"]",
            "be[0].command",
        ),
    ] {
        let msg = refused_with(from, to, key);
        assert!(msg.contains("cpu.shares") || msg.contains("NUL"), "{msg}");
    }
    // A systemd-style group name with a dot is a group, not a knob file.
    let ok = GOOD.replacen(
        "cgroup = \"headroom/be\"",
        "cgroup = \"batch.slice/be.scope\"",
        1,
    );
    Config::from_toml_str(&ok).expect("dotted group names are groups");
}

#[test]
fn the_default_socket_is_the_deployed_one() {
    let deployed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/headroom.toml"),
    )
    .expect("deploy/headroom.toml");
    let c = Config::from_toml_str(&deployed).expect("the deployed config is valid");
    assert_eq!(c.api.socket, headroom_control::config::DEFAULT_SOCKET);
    let d = Config::from_toml_str(GOOD).unwrap();
    assert_eq!(d.api.socket, headroom_control::config::DEFAULT_SOCKET);
}

/// The second hostile pass: the socket and the state file (or the decision log) spelled
/// differently but naming one file (`./`, `//`, `a/../`) passed, and the first state write
/// replaced the control socket (the kill switch unreachable, nothing said). The same for the
/// socket on the state file's lock or temporary file.
#[test]
fn paths_that_alias_each_other_are_refused() {
    let cases = [
        ("/tmp/hr/state.json", "/tmp/hr/./state.json", "api.socket"),
        ("/tmp/hr/state.json", "/tmp//hr/state.json", "api.socket"),
        (
            "/tmp/hr/state.json",
            "/tmp/x/../hr/state.json",
            "api.socket",
        ),
        (
            "/tmp/hr/state.json",
            "/tmp/hr/state.json.lock",
            "api.socket",
        ),
        ("/tmp/hr/state.json", "/tmp/hr/state.json.tmp", "api.socket"),
    ];
    for (state, socket, key) in cases {
        refused_with(
            "kind = \"heracles\"",
            &format!(
                "kind = \"heracles\"\n[safety]\nstate_file = \"{state}\"\n[api]\nsocket = \"{socket}\""
            ),
            key,
        );
    }
    refused_with(
        "kind = \"heracles\"",
        "kind = \"heracles\"\n[api]\nsocket = \"/tmp/hr/ctl.sock\"\ndecision_log = \"/tmp/hr/./ctl.sock\"",
        "api.decision_log",
    );
}

/// Each pacing key is named by itself: a bad `grow_after_shrink_ms` was reported as
/// `grow_interval_ms`, a 0 `restart_backoff_ms` as `restart_backoff_max_ms`.
#[test]
fn a_bad_pacing_key_is_named_by_its_own_name() {
    let msg = refused_with(
        "kind = \"heracles\"",
        "kind = \"heracles\"\n[safety]\ngrow_after_shrink_ms = 99999999999",
        "safety.grow_after_shrink_ms",
    );
    assert!(!msg.contains("safety.grow_interval_ms"), "{msg}");
    refused_with(
        "cgroup = \"headroom/be\"",
        "cgroup = \"headroom/be\"\nrestart_backoff_ms = 0",
        "be[0].restart_backoff_ms = 0",
    );
}

/// Fourth hostile pass (a low left by the third): `policy.static-cores.cpus = "1,1,1"` was
/// taken as `{1}` although the code said CPUs listed twice are refused. A CPU named twice in
/// a written list — repeated, or by overlapping ranges — is refused with key and value, in the
/// file and through `set` alike, for every config CPU list.
#[test]
fn a_cpu_list_naming_a_cpu_twice_is_refused_in_the_file_and_live() {
    for (section, key) in [
        ("[policy.static-cores]\ncpus", "policy.static-cores.cpus"),
        ("[policy.blind]\nbe_cpus", "policy.blind.be_cpus"),
    ] {
        for (list, cpu) in [("1,1,1", 1), ("0-2,1", 1)] {
            let msg = refuse(&format!("{GOOD}{section} = \"{list}\"\n"));
            assert_eq!(
                msg,
                format!("{key} = \"{list}\": lists CPU {cpu} twice"),
                "{section}"
            );
        }
    }
    let threads = GOOD.replacen(
        "[lc.latency]",
        "[lc.threads]\ncpus = \"0,0\"\n[lc.latency]",
        1,
    );
    assert_eq!(
        refuse(&threads),
        "lc.threads.cpus = \"0,0\": lists CPU 0 twice"
    );
    let mut c = Config::from_toml_str(GOOD).unwrap();
    let before = c.clone();
    for key in ["policy.static-cores.cpus", "policy.blind.be_cpus"] {
        for value in ["1,1,1", "\"0-2,1\"", "[1, 1]"] {
            let err = c.set(key, value).expect_err(value).to_string();
            assert!(err.contains(key), "{err}");
            assert!(err.contains("twice"), "{err}");
        }
    }
    assert_eq!(c, before, "a refused set changes nothing");
    c.set("policy.static-cores.cpus", "0-1,3").unwrap();
    assert_eq!(c.policy.static_cores.cpus.to_vec(), [0, 1, 3]);
}

/// A control socket path longer than a Unix socket can hold passed the checks and failed at
/// start, in bind(2) (fifth hostile pass).
#[test]
fn a_socket_path_too_long_for_a_unix_socket_is_refused() {
    let long = format!("/run/{}/headroom.sock", "d".repeat(100));
    let msg = refuse(&format!("{GOOD}[api]\nsocket = \"{long}\"\n"));
    assert!(msg.contains("api.socket"), "{msg}");
    assert!(msg.contains("at most 107"), "{msg}");
    let fits = format!("/run/{}/h.sock", "d".repeat(90));
    Config::from_toml_str(&format!("{GOOD}[api]\nsocket = \"{fits}\"\n")).expect("fits");
}

/// A whole section of the wrong type (`be = 5`) is set aside and the rest read: the problems
/// its stand-in causes are dropped, but they were matched as words, so every message saying
/// "must be" went too and `lc.slo.target_us = -5` was never named (fifth hostile pass).
#[test]
fn a_section_set_aside_hides_no_other_error() {
    let text =
        GOOD.replacen(
            "[[be]]\nname = \"batch\"\ncgroup = \"headroom/be\"\n",
            "",
            1,
        )
        .replacen(
            "[lc]",
            "be = 5\n[safety]\nviolation_cooldown_s = -1\n[lc]",
            1,
        ) + "[lc.slo]\ntarget_us = -5\n";
    let msg = refuse(&text);
    for key in ["be = 5", "lc.slo.target_us", "safety.violation_cooldown_s"] {
        assert!(msg.contains(key), "{key} not named:\n{msg}");
    }
}

/// Seventh hostile pass: `safety.state_file = "state.json"` was accepted and resolved against
/// the working directory; a restart from another one (a unit file's `/` after an operator's
/// shell) found no state, a first start that took the confined settings as originals.
#[test]
fn a_relative_state_file_is_refused() {
    for rel in ["state.json", "./state.json", "../lib/headroom/state.json"] {
        let to = format!("kind = \"heracles\"\n[safety]\nstate_file = \"{rel}\"");
        let msg = refused_with("kind = \"heracles\"", &to, "safety.state_file");
        assert!(msg.contains("absolute"), "{msg}");
    }
}

/// Eighth hostile pass (a seventh-pass low): `api.socket`, `api.decision_log` and the feed
/// sockets were accepted relative and resolved against the agent's working directory, so
/// `ctl`, a log reader or `headroom load --feed` started elsewhere looked in another place.
#[test]
fn relative_socket_log_and_feed_paths_are_refused() {
    for rel in ["ctl.sock", "./run/ctl.sock", "../ctl.sock"] {
        let to = format!("kind = \"heracles\"\n[api]\nsocket = \"{rel}\"");
        let msg = refused_with("kind = \"heracles\"", &to, "api.socket");
        assert!(msg.contains("give an absolute path"), "{msg}");
    }
    for rel in ["decisions.jsonl", "./log/d.jsonl"] {
        let to = format!("kind = \"heracles\"\n[api]\ndecision_log = \"{rel}\"");
        let msg = refused_with("kind = \"heracles\"", &to, "api.decision_log");
        assert!(msg.contains("give an absolute path"), "{msg}");
    }
    let to = "kind = \"heracles\"\n[api]\ndecision_log = \"\"";
    let msg = refused_with("kind = \"heracles\"", to, "api.decision_log");
    assert!(msg.contains("must not be empty"), "{msg}");
    let feed = GOOD
        .replace(
            "source = \"probe\"\naddress = \"127.0.0.1:11211\"",
            "source = \"feed\"\nsocket = \"feed.sock\"",
        )
        .replace(
            "source = \"memcache-stats\"\naddress = \"127.0.0.1:11211\"",
            "source = \"feed\"\nsocket = \"load.sock\"",
        );
    assert!(feed.contains("feed.sock") && feed.contains("load.sock"));
    let msg = refuse(&feed);
    for key in [
        "lc.latency.socket",
        "lc.load.socket",
        "give an absolute path",
    ] {
        assert!(msg.contains(key), "{key} not named:\n{msg}");
    }
    // Absolute ones pass.
    let ok = GOOD.replace(
        "kind = \"heracles\"",
        "kind = \"heracles\"\n[api]\nsocket = \"/run/x/ctl.sock\"\ndecision_log = \"/var/log/d.jsonl\"",
    );
    Config::from_toml_str(&ok).expect("absolute paths are accepted");
}

/// Eighth hostile pass: a feed socket (`lc.latency.socket`) on the control socket's path was
/// accepted; the feed's bind replaced the control socket, so `ctl off` reached the feed.
#[test]
fn a_feed_socket_on_the_control_socket_or_state_file_is_refused() {
    let base = GOOD.replace(
        "source = \"probe\"\naddress = \"127.0.0.1:11211\"",
        "source = \"feed\"\nsocket = \"/run/headroom/x.sock\"",
    );
    assert!(base.contains("/run/headroom/x.sock"));
    Config::from_toml_str(&base).expect("the base feed config is good");
    for (api, feed) in [
        ("socket = \"/run/headroom/x.sock\"", "/run/headroom/x.sock"),
        (
            "socket = \"/run/headroom//./ctl.sock\"",
            "/run/headroom/ctl.sock",
        ),
    ] {
        let text = base.replace("/run/headroom/x.sock", feed).replace(
            "kind = \"heracles\"",
            &format!("kind = \"heracles\"\n[api]\n{api}"),
        );
        let msg = refuse(&text);
        assert!(msg.contains("lc.latency.socket"), "{msg}");
    }
    let text = base.replace("/run/headroom/x.sock", "/var/lib/headroom/state.json.tmp");
    let msg = refuse(&text);
    assert!(msg.contains("lc.latency.socket"), "{msg}");
}

/// Eighth hostile pass (host, low): a feed socket longer than a Unix socket path holds passed
/// validation and failed at start in bind(2); it is refused as `api.socket` is.
#[test]
fn a_feed_socket_too_long_for_a_unix_path_is_refused() {
    let long = format!("/run/headroom/{}.sock", "f".repeat(100));
    let text = GOOD.replace(
        "source = \"probe\"\naddress = \"127.0.0.1:11211\"",
        &format!("source = \"feed\"\nsocket = \"{long}\""),
    );
    assert!(text.contains(&long));
    let msg = refuse(&text);
    assert!(msg.contains("lc.latency.socket"), "{msg}");
    assert!(msg.contains("holds at most 107"), "{msg}");
    let ok = format!("/run/headroom/{}.sock", "f".repeat(107 - 19));
    assert_eq!(ok.len(), 107);
    Config::from_toml_str(&text.replace(&long, &ok)).expect("107 bytes fit");
}
