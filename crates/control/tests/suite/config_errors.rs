// The tests read the shipped files and time nothing the crate does: the purity rule
// (crates/control/clippy.toml) is for the crate itself.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]
//! Bad configs are refused with the key, the value and the reason.

use crate::config_support;

use config_support::{refuse, refused_with, GOOD};
use headroom_control::config::Config;

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
