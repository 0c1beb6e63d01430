//! The publisher's tests: latency windows, the decision log's cap and runs, a full disk.

use super::DecisionLog;

/// A publisher of `policy` writing its decision log to `path`, as the agent builds it.
pub(in crate::runtime) fn publisher(
    path: &std::path::Path,
    policy: &'static str,
    slo_us: f64,
    lcs: Vec<crate::publish::metrics::ServiceSlo>,
) -> super::Publisher {
    let (metrics, _registry) = crate::publish::metrics::Metrics::new();
    super::Publisher::new(
        Some(DecisionLog::open(path, 1 << 30).unwrap()),
        metrics,
        policy,
        slo_us,
        lcs,
        0,
    )
}

/// The one LC service of the publisher tests' configs: `svc`, its SLO 500 µs, its latency
/// probed on 127.0.0.1:11211.
pub(in crate::runtime) const SVC_LC: &str = r#"
[lc]
name = "svc"
cgroup = "headroom/lc"
[lc.slo]
target_us = 500
window_s = 15
[lc.latency]
source = "probe"
address = "127.0.0.1:11211"
"#;

/// A window is known by its end (tick time − age): the same window a tick later is not a
/// new one; another end is, even with the same figure and the same age (ticks a second
/// apart, each a second after a publication); a service's own window counts too, and a
/// window appearing or going stale is a change.
#[test]
fn a_new_latency_window_is_told_from_the_same_one_aging() {
    use super::new_latency_window;
    use headroom_types::observation::LcGroupObservation;
    use headroom_types::observation::Observation;
    use std::time::Duration;
    let obs = |age: Option<u64>, group_age: Option<u64>| Observation {
        lc_latency_us: age.map(|_| 100.0),
        lc_latency_age_ms: age,
        lc_groups: vec![LcGroupObservation {
            name: "b".into(),
            latency_us: group_age.map(|_| 80.0),
            latency_age_ms: group_age,
            ..LcGroupObservation::default()
        }],
        ..Observation::default()
    };
    let s = Duration::from_secs;
    let a = obs(Some(10), Some(10));
    // the same windows, 890 ms older
    assert!(!new_latency_window(
        &a,
        s(10),
        &obs(Some(900), Some(900)),
        s(10) + Duration::from_millis(890)
    ));
    // a tick a second later with the same age: the next window
    assert!(new_latency_window(
        &a,
        s(10),
        &obs(Some(10), Some(1010)),
        s(11)
    ));
    // the other service's window only
    assert!(new_latency_window(
        &a,
        s(10),
        &obs(Some(1010), Some(10)),
        s(11)
    ));
    // appearing, going stale
    assert!(new_latency_window(&obs(None, None), s(10), &a, s(10)));
    assert!(new_latency_window(&a, s(10), &obs(None, Some(10)), s(10)));
    assert!(!new_latency_window(
        &obs(None, None),
        s(10),
        &obs(None, None),
        s(11)
    ));
}

/// At 1 ms a log grows ~1.5 MB/s: past its cap it is rotated once, so the disk holds at
/// most twice the cap however long the agent runs.
#[test]
fn the_decision_log_is_capped_and_rotated_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let mut log = DecisionLog::open(&path, 8192).unwrap();
    let line = format!("{{\"t_ms\":1,\"pad\":\"{}\"}}", "x".repeat(100));
    for _ in 0..10_000 {
        log.write_line(&line);
    }
    log.flush();
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let rotated = dir.path().join("decisions.jsonl.1");
    assert!(size(&path) <= 8192, "{}", size(&path));
    assert!(size(&rotated) <= 8192 && size(&rotated) > 0);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    // every line kept is whole
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.lines().all(|l| l == line));
    assert_eq!(log.lost, 0);
}

/// A CPU flapping between 0 and 2 idle while hybrid holds BE disabled: 10 000 ticks make a
/// handful of lines (each run of identical holds one line with its count), the kernel's
/// thresholds are disarmed, and `--replay` reproduces every decision.
#[test]
fn identical_holds_are_one_line_and_replay() {
    use headroom_control::config::Config;
    use headroom_control::controller::TickSink;
    use headroom_control::decision::{replay_log, LogLine};
    use headroom_control::policy::{self, MachineInfo};
    use headroom_types::observation::Observation;
    use std::time::Duration;
    let toml = format!(
        "{SVC_LC}{}",
        r#"
[lc.load]
source = "memcache-stats"
address = "127.0.0.1:11211"
peak_qps = 100000
[policy]
kind = "hybrid"
"#
    );
    let config = Config::from_toml_str(&toml).unwrap();
    let machine = MachineInfo::with_cpus(2);
    let mut policy = policy::build(&config, &machine);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let mut p = publisher(&path, "hybrid", 500.0, Vec::new());
    let mut disarmed = 0;
    for i in 0..10_000u64 {
        // no latency yet (BE disabled), the idle count flipping 0 <-> 2
        let obs = Observation {
            idle_cpus: Some(if i % 2 == 0 { 0.0 } else { 2.0 }),
            lc_load: Some(0.1),
            lc_load_age_ms: Some(0),
            ..Observation::default()
        };
        let t = Duration::from_micros(125 * i);
        let t = headroom_control::decision::tick_time(t);
        let d = policy.decide(&obs, t);
        assert!(!d.allocation.be_enabled, "{}", d.reason);
        disarmed += usize::from(!policy.idle_crossings_matter());
        p.record(t, &obs, &d);
    }
    p.end_run();
    p.log.as_mut().unwrap().flush();
    assert_eq!(
        disarmed, 10_000,
        "no crossing can change a decision while BE is disabled"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<LogLine> = text
        .lines()
        .map(|l| LogLine::from_json_line(l).unwrap())
        .collect();
    assert!(
        lines.len() <= 10,
        "{} lines, starting {}",
        lines.len(),
        text.lines().take(3).collect::<Vec<_>>().join("\n")
    );
    let decisions: u64 = lines
        .iter()
        .map(|l| match l {
            LogLine::Decision(r) => r.repeat.as_ref().map_or(1, |r| r.count),
            LogLine::Event(_) => 0,
        })
        .sum();
    assert_eq!(decisions, 10_000, "every tick counted");
    assert!(replay_log(&config, &machine, &lines).is_empty());
}

/// A decision bound by another LC service is another decision: it is not folded into the
/// run of the identical ones before it, and each line carries its binding service.
#[test]
fn a_different_binding_lc_is_a_different_decision() {
    use headroom_control::controller::TickSink;
    use headroom_control::decision::{Decision, LogLine};
    use headroom_types::observation::Observation;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let mut p = publisher(&path, "multi", 500.0, Vec::new());
    let decision = |binding: &str| Decision {
        allocation: headroom_types::allocation::Allocation::default(),
        reason: "multi:hold".into(),
        state: serde_json::Value::Null,
        binding_lc: Some(binding.into()),
    };
    let obs = Observation::default();
    for (i, b) in ["a", "a", "a", "b", "b", "a"].iter().enumerate() {
        p.record(Duration::from_millis(i as u64), &obs, &decision(b));
    }
    p.end_run();
    p.log.as_mut().unwrap().flush();
    let text = std::fs::read_to_string(&path).unwrap();
    let bindings: Vec<(Option<String>, u64)> = text
        .lines()
        .map(|l| match LogLine::from_json_line(l).unwrap() {
            LogLine::Decision(r) => (r.binding_lc, r.repeat.map_or(1, |r| r.count)),
            LogLine::Event(_) => panic!("no events here"),
        })
        .collect();
    let count = |b: &str| -> u64 {
        bindings
            .iter()
            .filter(|(x, _)| x.as_deref() == Some(b))
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!((count("a"), count("b")), (4, 2), "{text}");
    // a, a-run, b, b-run... never an "a" folded into a "b" run or back
    let order: Vec<&str> = bindings
        .iter()
        .map(|(b, _)| b.as_deref().unwrap())
        .collect();
    let mut changes = order.windows(2).filter(|w| w[0] != w[1]).count();
    changes += 1;
    assert_eq!(changes, 3, "a → b → a: {order:?}");
}

/// A log on a full disk loses lines (counted) and says so once, not every tick.
#[test]
fn a_full_disk_is_counted_not_fatal() {
    if !std::path::Path::new("/dev/full").exists() {
        return eprintln!("SKIP a_full_disk_is_counted_not_fatal: no /dev/full");
    }
    let mut log = DecisionLog::open(std::path::Path::new("/dev/full"), 1 << 30).unwrap();
    for _ in 0..100 {
        log.write_line(&"y".repeat(70_000));
    }
    assert!(log.lost > 0);
}
