//! Every number `ctl set` can change, under hostile values (fifth hostile pass, issue 42 item 5:
//! "every number bounded where it is accepted; no panic reaches a tick"). For each policy kind,
//! every live numeric key (`policy.*`, `safety.*`, `lc.slo.*`) is set to each value below; what
//! the config accepts must be accepted by the running policy too, and the policy must then
//! decide without a panic, at an interval a loop can add to its clock, over fresh, violating,
//! stale and missing latency, early and very late in a run.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use headroom_control::config::Config;
use headroom_control::policy::{self, MachineInfo, Policy};
use headroom_types::observation::Observation;

const BASE: &str = r#"
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
kind = "KIND"
"#;

/// Each kind, and the weights' dynamic modes (their update runs only there: a NaN `c_max` passed
/// the config and panicked in it, twelfth hostile pass).
const KINDS: &[&str] = &[
    "none",
    "static-cores",
    "static-cycles",
    "weights",
    "weights\"\n[policy.weights]\nmode = \"fair",
    "weights\"\n[policy.weights]\nmode = \"isolation",
    "blind",
    "heracles",
    "hybrid",
];

/// Values no number may take: a NaN or an infinity is never meant.
const NEVER: &[&str] = &["nan", "inf", "-inf"];

const HOSTILE: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1",
    "0.5",
    "1e-300",
    "1e300",
    "-1e300",
    "nan",
    "inf",
    "-inf",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
];

/// The dotted keys of `value`'s numeric leaves (arrays left out), below `prefix`.
fn numeric_leaves(prefix: &str, value: &toml::Value, out: &mut Vec<String>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                numeric_leaves(&key, v, out);
            }
        }
        toml::Value::Integer(_) | toml::Value::Float(_) => out.push(prefix.to_string()),
        _ => {}
    }
}

/// Observations a policy meets: fresh and good, violating, stale, none.
fn observations() -> Vec<Observation> {
    let with = |latency: Option<f64>, age: Option<u64>| Observation {
        lc_latency_us: latency,
        lc_latency_age_ms: age,
        lc_qps: Some(50_000.0),
        lc_load: Some(0.5),
        lc_load_age_ms: Some(10),
        lc_cpu_usage: Some(1.5),
        idle_cpus: Some(3.0),
        cpu_idle: Some(vec![0.9; 4]),
        mem_available_bytes: Some(1 << 30),
        mem_total_bytes: Some(4 << 30),
        ..Observation::default()
    };
    vec![
        with(Some(100.0), Some(10)),
        with(Some(1e9), Some(10)),
        with(Some(100.0), Some(u64::MAX)),
        with(None, None),
        Observation::default(),
    ]
}

/// Drives `p` over every observation at times from 0 to far into a run; the first problem.
fn drive(p: &mut dyn Policy, machine: &MachineInfo) -> Result<(), String> {
    let times = [0u64, 1, 100, 1_000, 60_000, 3_600_000, 10_000_000_000];
    let mut ticks = 0;
    for &ms in &times {
        for obs in observations() {
            let now = Duration::from_millis(ms + ticks);
            ticks += 1;
            let d = catch_unwind(AssertUnwindSafe(|| p.decide(&obs, now)))
                .map_err(|e| format!("decide panicked at {now:?}: {}", panic_text(&e)))?;
            let a = &d.allocation;
            if let Some(cpus) = &a.be_cpus {
                if cpus.iter().any(|c| !machine.cpus.contains(&c)) {
                    return Err(format!("BE on CPUs the machine lacks: {cpus:?}"));
                }
            }
            // (a tiny percent rounds to 0: the write path gives the kernel's least quota)
            if let Some(pct) = a.be_quota_pct {
                if !(pct.is_finite() && pct >= 0.0) {
                    return Err(format!("BE quota {pct}%"));
                }
            }
        }
    }
    let interval = catch_unwind(AssertUnwindSafe(|| p.poll_interval()))
        .map_err(|e| format!("poll_interval panicked: {}", panic_text(&e)))?;
    if interval > Duration::from_secs(3600) {
        return Err(format!("poll interval {interval:?}"));
    }
    Ok(())
}

fn panic_text(e: &Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn every_live_number_takes_hostile_values_without_a_panic() {
    let machine = MachineInfo::with_cpus(4);
    let mut problems = Vec::new();
    let mut tried = 0;
    let mut accepted = 0;
    // quiet: a panic caught here is reported in the list, not as a backtrace per value
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for kind in KINDS {
        let label = kind.replace('\n', " ");
        let base = Config::from_toml_str(&BASE.replace("KIND", kind))
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        let mut keys = Vec::new();
        numeric_leaves("", &toml::Value::try_from(&base).unwrap(), &mut keys);
        keys.retain(|k| {
            ["policy.", "safety.", "lc.slo."]
                .iter()
                .any(|p| k.starts_with(p))
        });
        for key in &keys {
            for value in HOSTILE {
                tried += 1;
                let mut c = base.clone();
                if c.set(key, value).is_err() {
                    continue;
                }
                accepted += 1;
                if NEVER.contains(value) {
                    problems.push(format!("{label}: {key}={value}: accepted"));
                }
                let mut p = policy::build(&base, &machine);
                let _ = drive(p.as_mut(), &machine);
                if let Err(e) = p.set_param(key, value) {
                    problems.push(format!(
                        "{label}: {key}={value}: config took it, policy refused: {e}"
                    ));
                    continue;
                }
                if let Err(e) = drive(p.as_mut(), &machine) {
                    problems.push(format!("{label}: {key}={value} (live): {e}"));
                }
                // the same value read from the file at start
                let mut fresh = policy::build(&c, &machine);
                if let Err(e) = drive(fresh.as_mut(), &machine) {
                    problems.push(format!("{label}: {key}={value} (at start): {e}"));
                }
            }
        }
    }
    std::panic::set_hook(hook);
    eprintln!("{tried} sets tried, {accepted} accepted");
    assert!(
        tried > 500,
        "only {tried} sets: the key walk found too few keys"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
