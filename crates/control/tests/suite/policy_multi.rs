//! `multi`: several `[[lc]]` services. The tightest slack binds hybrid's outer loop (a second
//! service violating cuts BE where `hybrid`, protecting the first, would not); with pinned
//! services a service short of slack takes a CPU from BE first, then from the service with the
//! most slack, and the move is reverted when it brought no gain (PARTIES); a stale service stops
//! BE's growth, then disables BE, and is named; one LC behaves as `hybrid`; the decision log
//! replays exactly.

use std::time::Duration;

use headroom_control::config::Config;
use headroom_control::decision::{self, Decision, DecisionRecord};
use headroom_control::policy::{self, Guarded, Hybrid, MachineInfo, Multi, Policy};
use headroom_types::allocation::Allocation;
use headroom_types::allocation::LcServiceCpus;
use headroom_types::observation::{LcGroupObservation, Observation};
use headroom_types::CpuSet;
use headroom_types::GroupPath;

/// Three services on 8 CPUs: `web` (500 µs), `kv` (300 µs, priority 1), `search` (1000 µs).
fn config(kind: &str, pinned: bool, extra: &str) -> Config {
    let pin = |cpus: &str| {
        if pinned {
            format!("[lc.threads]\npin = true\ncpus = {cpus}\n")
        } else {
            String::new()
        }
    };
    let svc = |name: &str, target: u32, prio: i32, cpus: &str| {
        format!(
            r#"
[[lc]]
name = "{name}"
cgroup = "headroom/{name}"
priority = {prio}
[lc.slo]
target_us = {target}
window_s = 1
[lc.latency]
source = "feed"
[lc.load]
source = "feed"
peak_qps = 10000
{}"#,
            pin(cpus)
        )
    };
    let text = format!(
        "{}{}{}\n[policy]\nkind = \"{kind}\"\n[policy.blind]\ngrow_interval_ms = 0\n{extra}",
        svc("web", 500, 0, "[0, 1]"),
        svc("kv", 300, 1, "[2, 3]"),
        svc("search", 1000, 0, "[4, 5]"),
    );
    Config::from_toml_str(&text).expect("valid config")
}

const TARGETS: [(&str, f64); 3] = [("web", 500.0), ("kv", 300.0), ("search", 1000.0)];

/// Each service at `slacks[i]` (None = no latency), load 0.2 (0.6 together); the top-level fields repeat the
/// first service's, as the agent reports them.
fn obs(slacks: [Option<f64>; 3], idle: f64) -> Observation {
    let groups: Vec<LcGroupObservation> = TARGETS
        .iter()
        .zip(slacks)
        .map(|((name, target), slack)| LcGroupObservation {
            name: name.to_string(),
            latency_us: slack.map(|s| target * (1.0 - s)),
            latency_age_ms: slack.map(|_| 10),
            qps: Some(5000.0),
            load: Some(0.2),
            ..LcGroupObservation::default()
        })
        .collect();
    Observation {
        lc_latency_us: groups[0].latency_us,
        lc_latency_age_ms: groups[0].latency_age_ms,
        lc_load: Some(0.2),
        lc_load_age_ms: Some(10),
        idle_cpus: Some(idle),
        lc_groups: groups,
        ..Observation::default()
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn machine() -> MachineInfo {
    MachineInfo::with_cpus(8)
}

fn sets(d: &Decision) -> Vec<(String, Vec<u32>)> {
    d.allocation
        .lc_services
        .iter()
        .map(|s| (s.name.clone(), s.cpus.iter().collect()))
        .collect()
}

fn set_of<'a>(d: &'a Decision, name: &str) -> &'a CpuSet {
    &d.allocation
        .lc_services
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} in {:?}", sets(d)))
        .cpus
}

#[test]
fn the_tightest_slack_binds_and_priority_breaks_ties() {
    let c = config("multi", false, "");
    let mut m = Multi::new(&c, &machine());
    let d = m.decide(&obs([Some(0.5), Some(0.2), Some(0.4)], 6.0), ms(0));
    assert_eq!(d.binding_lc.as_deref(), Some("kv"), "{}", d.reason);
    let d = m.decide(&obs([Some(0.5), Some(0.6), Some(0.1)], 6.0), ms(1000));
    assert_eq!(d.binding_lc.as_deref(), Some("search"));
    // web and search tie at 0.3: equal priority, the first in the config binds; kv (priority
    // 1) ties with web at 0.2 and wins
    let d = m.decide(&obs([Some(0.3), Some(0.6), Some(0.3)], 6.0), ms(2000));
    assert_eq!(d.binding_lc.as_deref(), Some("web"));
    let d = m.decide(&obs([Some(0.2), Some(0.2), Some(0.6)], 6.0), ms(3000));
    assert_eq!(d.binding_lc.as_deref(), Some("kv"));
    // the binding slack is the outer loop's slack
    let state = &d.state["hybrid"]["top"];
    assert!(
        (state["slack"].as_f64().unwrap() - 0.2).abs() < 1e-9,
        "{state}"
    );
}

#[test]
fn a_second_service_violating_cuts_be_where_hybrid_for_the_first_would_not() {
    let machine = machine();
    let mut multi = policy::build(&config("multi", false, ""), &machine);
    // the single-LC hybrid reads the top-level fields: the first service's
    let mut hybrid = policy::build(&config("hybrid", false, ""), &machine);
    let fine = obs([Some(0.5), Some(0.5), Some(0.5)], 6.0);
    for t in 0..5 {
        let (a, b) = (multi.decide(&fine, ms(t)), hybrid.decide(&fine, ms(t)));
        assert!(a.allocation.be_enabled && b.allocation.be_enabled);
    }
    // kv violates, web is fine
    let kv_violates = obs([Some(0.5), Some(-0.3), Some(0.5)], 6.0);
    let (a, b) = (
        multi.decide(&kv_violates, ms(1000)),
        hybrid.decide(&kv_violates, ms(1000)),
    );
    assert!(!a.allocation.be_enabled, "multi: {}", a.reason);
    assert_eq!(a.binding_lc.as_deref(), Some("kv"));
    assert!(
        a.reason.contains("slo-violation:cooldown:kv") || a.reason.contains("slack<0"),
        "{}",
        a.reason
    );
    assert!(
        b.allocation.be_enabled,
        "hybrid sees only web: {}",
        b.reason
    );
    // the cooldown holds BE off under multi for the next windows, though kv recovered
    let d = multi.decide(&fine, ms(2000));
    assert!(!d.allocation.be_enabled, "{}", d.reason);
}

#[test]
fn a_pinned_service_short_of_slack_takes_from_be_first_then_from_the_slackest() {
    let c = config("multi", true, "");
    let mut m = Multi::new(&c, &machine());
    let d = m.decide(&obs([Some(0.6), Some(0.5), Some(0.3)], 5.0), ms(0));
    assert_eq!(
        sets(&d),
        vec![
            ("web".into(), vec![0, 1]),
            ("kv".into(), vec![2, 3]),
            ("search".into(), vec![4, 5])
        ]
    );
    // BE only on the CPUs no service owns
    let be = d.allocation.be_cpus.clone().unwrap_or_default();
    assert!(be.iter().all(|c| c >= 6), "{be}");
    // kv's slack falls below 5%: one CPU from BE, the lowest BE holds
    let d = m.decide(&obs([Some(0.6), Some(0.02), Some(0.3)], 5.0), ms(1000));
    assert_eq!(d.reason, "multi:cpu-from-be:kv");
    assert_eq!(set_of(&d, "kv"), &CpuSet::from([2, 3, 6]));
    // the next window: kv improved (kept) but still short: BE's last CPU
    let d = m.decide(&obs([Some(0.6), Some(0.03), Some(0.3)], 5.0), ms(2000));
    assert_eq!(d.reason, "multi:cpu-from-be:kv", "{}", d.state);
    assert_eq!(set_of(&d, "kv"), &CpuSet::from([2, 3, 6, 7]));
    assert!(!d.allocation.be_enabled || d.allocation.be_cpus.is_none());
    // BE has nothing left: from the service with the most slack (web, 0.6), its highest CPU
    let d = m.decide(&obs([Some(0.6), Some(0.04), Some(0.3)], 5.0), ms(3000));
    assert_eq!(d.reason, "multi:cpu-from-web:kv");
    assert_eq!(set_of(&d, "web"), &CpuSet::from([0]));
    assert_eq!(set_of(&d, "kv"), &CpuSet::from([1, 2, 3, 6, 7]));
    // web keeps its last CPU (min_service_cpus = 1): search (0.3) gives next
    let d = m.decide(&obs([Some(0.6), Some(0.045), Some(0.3)], 5.0), ms(4000));
    assert_eq!(d.reason, "multi:cpu-from-search:kv");
    assert_eq!(set_of(&d, "search"), &CpuSet::from([4]));
}

#[test]
fn equal_slack_donors_give_lower_priority_first() {
    let c = config("multi", true, "");
    let mut m = Multi::new(&c, &machine());
    // BE's CPUs taken by web first
    let mut t = 0;
    for _ in 0..3 {
        m.decide(&obs([Some(0.0), Some(0.5), Some(0.5)], 2.0), ms(t));
        t += 1000;
        m.decide(&obs([Some(0.01), Some(0.5), Some(0.5)], 2.0), ms(t));
        t += 1000;
    }
    // now search needs one; web and kv have equal slack: web (priority 0) gives, not kv (1)
    let d = m.decide(&obs([Some(0.5), Some(0.5), Some(0.0)], 2.0), ms(t));
    assert_eq!(d.reason, "multi:cpu-from-web:search", "{}", d.state);
}

#[test]
fn a_move_without_gain_is_reverted() {
    let c = config("multi", true, "");
    let mut m = Multi::new(&c, &machine());
    m.decide(&obs([Some(0.6), Some(0.5), Some(0.3)], 5.0), ms(0));
    let d = m.decide(&obs([Some(0.6), Some(0.02), Some(0.3)], 5.0), ms(1000));
    assert_eq!(set_of(&d, "kv"), &CpuSet::from([2, 3, 6]));
    // the next window: kv's slack did not rise: the CPU goes back to BE, and nothing else
    // moves on this step
    let d = m.decide(&obs([Some(0.6), Some(0.01), Some(0.3)], 5.0), ms(2000));
    assert_eq!(d.reason, "multi:no-gain:revert:kv");
    assert_eq!(set_of(&d, "kv"), &CpuSet::from([2, 3]));
    // between arbitrations nothing moves
    let d = m.decide(&obs([Some(0.6), Some(0.01), Some(0.3)], 5.0), ms(2500));
    assert_eq!(set_of(&d, "kv"), &CpuSet::from([2, 3]));
    // a move from a service is reverted to that service
    let c = config("multi", true, "[policy.multi]\nmin_service_cpus = 1\n");
    let mut m = Multi::new(&c, &MachineInfo::with_cpus(6));
    m.decide(&obs([Some(0.6), Some(0.5), Some(0.3)], 2.0), ms(0));
    let d = m.decide(&obs([Some(0.6), Some(0.0), Some(0.3)], 2.0), ms(1000));
    assert_eq!(d.reason, "multi:cpu-from-web:kv");
    let d = m.decide(&obs([Some(0.6), Some(-0.1), Some(0.3)], 2.0), ms(2000));
    assert_eq!(d.reason, "multi:no-gain:revert:kv");
    assert_eq!(set_of(&d, "web"), &CpuSet::from([0, 1]));
    assert_eq!(set_of(&d, "kv"), &CpuSet::from([2, 3]));
}

#[test]
fn a_stale_service_stops_be_growth_then_disables_be_and_is_named() {
    let c = config(
        "multi",
        false,
        "[safety]\nstale_disable_ms = 3000\nviolation_cooldown_s = 0\n",
    );
    let mut p = policy::build(&c, &machine());
    let fine = obs([Some(0.5), Some(0.5), Some(0.5)], 6.0);
    let d = p.decide(&fine, ms(0));
    assert!(d.allocation.be_enabled, "{}", d.reason);
    // search's latency goes missing: the outer loop holds and names it ...
    let mut gone = obs([Some(0.5), Some(0.5), None], 7.0);
    let d = p.decide(&gone, ms(1000));
    assert_eq!(d.binding_lc.as_deref(), Some("search"));
    assert!(
        d.reason.ends_with(":search"),
        "the reason names the service: {}",
        d.reason
    );
    assert!(d.allocation.be_enabled);
    let held = d.allocation.be_cpu_capacity(8);
    // ... BE does not grow though 7 CPUs are idle ...
    for t in (1010..3900).step_by(10) {
        let d = p.decide(&gone, ms(t));
        assert!(
            d.allocation.be_cpu_capacity(8) <= held,
            "t {t}: {}",
            d.reason
        );
    }
    // ... and once it has been stale for stale_disable_ms, BE is disabled, naming it
    let d = p.decide(&gone, ms(4000));
    assert!(!d.allocation.be_enabled);
    assert_eq!(d.reason, "safety:latency-stale:disable:search");
    // a stale (old) latency is the same as a missing one
    gone.lc_groups[2].latency_us = Some(100.0);
    gone.lc_groups[2].latency_age_ms = Some(60_000);
    let d = p.decide(&gone, ms(4100));
    assert!(!d.allocation.be_enabled);
}

#[test]
fn one_lc_behaves_as_hybrid() {
    let single = |kind: &str| {
        Config::from_toml_str(&format!(
            r#"
[lc]
name = "memcached"
cgroup = "headroom/lc"
[lc.slo]
target_us = 500
window_s = 1
[lc.latency]
source = "feed"
[lc.load]
source = "feed"
peak_qps = 100000
[policy]
kind = "{kind}"
[policy.blind]
grow_interval_ms = 0
"#
        ))
        .expect("valid")
    };
    let machine = machine();
    let mut m = policy::build(&single("multi"), &machine);
    let mut h = policy::build(&single("hybrid"), &machine);
    let mut be = 0.0;
    for i in 0..3000u64 {
        let wave = (i as f64 / 53.0).sin();
        let latency = if (900..905).contains(&i) {
            620.0
        } else {
            260.0 + 180.0 * wave
        };
        let o = Observation {
            lc_latency_us: Some(latency),
            lc_latency_age_ms: Some(5),
            lc_load: Some(0.5 + 0.4 * wave),
            lc_load_age_ms: Some(5),
            idle_cpus: Some((8.0 - be - 3.0 * (1.0 + wave)).max(0.0)),
            ..Observation::default()
        };
        let now = ms(i * 20);
        let (a, b) = (m.decide(&o, now), h.decide(&o, now));
        assert_eq!(
            a.allocation, b.allocation,
            "tick {i}: {} vs {}",
            a.reason, b.reason
        );
        assert_eq!(
            a.reason.replacen("multi:", "hybrid:", 1),
            b.reason,
            "tick {i}"
        );
        assert_eq!(a.binding_lc.as_deref(), Some("memcached"));
        be = a.allocation.be_cpu_capacity(8);
    }
}

#[test]
fn multi_decision_log_replays_identically() {
    let c = config("multi", true, "[safety]\nstale_disable_ms = 400\n");
    let machine = machine();
    let mut p = policy::build(&c, &machine);
    let mut records = Vec::new();
    for i in 0..2500u64 {
        let w = (i as f64 / 41.0).sin();
        let kv = if (700..760).contains(&i) {
            Some(-0.05)
        } else {
            Some(0.08 + 0.1 * w)
        };
        let search = if (1500..1600).contains(&i) {
            None
        } else {
            Some(0.4 - 0.3 * w)
        };
        let o = obs([Some(0.5 + 0.2 * w), kv, search], 2.0 + 2.0 * w.abs());
        let now = decision::tick_time(Duration::from_micros(i * 9_100 + 13));
        let d = p.decide(&o, now);
        let rec = DecisionRecord::new(now, 1_700_000_000_000 + i, "multi", &o, &d);
        records.push(DecisionRecord::from_json_line(&rec.to_json_line()).expect("parses"));
    }
    let moves = records
        .iter()
        .filter(|r| r.reason.starts_with("multi:cpu-from"))
        .count();
    assert!(moves > 0, "the script moves CPUs");
    assert!(records.iter().all(|r| r.binding_lc.is_some()));
    let mismatches = decision::replay(&c, &machine, &records);
    assert!(
        mismatches.is_empty(),
        "{} mismatches, first: {:?}",
        mismatches.len(),
        mismatches.first()
    );
    // a forged binding is reported
    let mut forged = records.clone();
    forged[10].binding_lc = Some("nobody".into());
    let mismatches = decision::replay(&c, &machine, &forged);
    assert_eq!(mismatches.len(), 1, "{mismatches:?}");
    assert_eq!(mismatches[0].field, "binding_lc");
}

/// A policy that hands out fixed per-service sets and BE CPUs, to test the wrapper alone.
struct Fixed(Allocation);

impl Policy for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn decide(&mut self, _obs: &Observation, _now: Duration) -> Decision {
        Decision {
            allocation: self.0.clone(),
            reason: "fixed".into(),
            state: serde_json::Value::Null,
            binding_lc: Some("kv".into()),
        }
    }
    fn poll_interval(&self) -> Duration {
        ms(1)
    }
    fn reconfigure(&mut self, _config: &Config) {}
}

#[test]
fn the_safety_wrapper_passes_services_through_and_never_gives_their_cpus_to_be() {
    let c = config("multi", true, "");
    let service = |name: &str, cpus: &[u32]| LcServiceCpus {
        name: name.into(),
        cgroup: GroupPath::new(&format!("headroom/{name}")).expect("valid"),
        cpus: CpuSet::from(cpus),
    };
    let proposal = Allocation {
        // BE asks for kv's CPU 3 and web's configured CPU 1, which no service holds here
        be_cpus: Some(CpuSet::from([1, 3, 6, 7])),
        lc_services: vec![
            service("web", &[0]),
            service("kv", &[2, 3]),
            service("search", &[4, 5]),
            service("ghost", &[6]),
        ],
        ..Allocation::default()
    };
    let mut g = Guarded::wrap(&c, &machine(), Box::new(Fixed(proposal)));
    let d = g.decide(&obs([Some(0.5), Some(0.5), Some(0.5)], 4.0), ms(0));
    assert_eq!(
        d.binding_lc.as_deref(),
        Some("kv"),
        "binding passes through"
    );
    assert_eq!(
        sets(&d),
        vec![
            ("web".into(), vec![0, 1]),
            ("kv".into(), vec![2, 3]),
            ("search".into(), vec![4, 5])
        ],
        "web's configured CPU 1 stays with web; an unknown service is dropped"
    );
    assert_eq!(d.allocation.be_cpus, Some(CpuSet::from([6, 7])));
    let overrides = d.state["safety"]["overrides"].to_string();
    assert!(
        overrides.contains("lc-cpus-to-be:restored:web")
            && overrides.contains("unknown-lc-service"),
        "{overrides}"
    );
}

#[test]
fn services_sharing_cpus_own_none_and_share_them_with_be_as_hybrid_does() {
    // Seen on 16 vCPUs: two unpinned LCs both on the server's CPUs read as owning them, BE got
    // "what no service owns" (nothing) and stayed at 0 CPUs for the whole run, where hybrid
    // ran BE on those CPUs in `cpu.idle`.
    let machine = machine();
    let c = config("multi", false, "be_cpus = [4, 5, 6, 7]\n");
    let mut multi = Multi::new(&c, &machine);
    let mut hybrid = Hybrid::new(
        &config("hybrid", false, "be_cpus = [4, 5, 6, 7]\n"),
        &machine,
    );
    let on_server = |slacks| {
        let mut o = obs(slacks, 3.0);
        for g in &mut o.lc_groups {
            g.cpus = Some(vec![4, 5, 6, 7]);
        }
        o.lc_cpus = Some(vec![4, 5, 6, 7]);
        o.cpu_idle = Some(vec![1.0, 1.0, 1.0, 1.0, 0.8, 0.8, 0.7, 0.7]);
        o
    };
    // kv short of slack (< upsize_slack) but not violating: nothing to move between services
    let fine = on_server([Some(0.5), Some(0.03), Some(0.5)]);
    for t in 0..3 {
        let (m, h) = (
            multi.decide(&fine, ms(t * 1000)),
            hybrid.decide(&fine, ms(t * 1000)),
        );
        assert!(m.allocation.be_enabled, "multi: {} {}", m.reason, m.state);
        assert_eq!(
            m.allocation.be_cpu_idle, h.allocation.be_cpu_idle,
            "{}",
            m.reason
        );
        assert_eq!(m.allocation.be_cpu_idle, Some(true), "{}", m.reason);
        assert_eq!(
            m.allocation.be_cpus,
            Some(CpuSet::from([4, 5, 6, 7])),
            "{}",
            m.reason
        );
        assert!(m.allocation.lc_services.is_empty(), "{:?}", sets(&m));
        assert!(!m.reason.contains("cpu-from"), "{}", m.reason);
        assert_eq!(m.state["shared_cpus"], serde_json::json!([4, 5, 6, 7]));
    }
    // the tightest slack still binds: kv violating disables BE
    let d = multi.decide(&on_server([Some(0.5), Some(-0.2), Some(0.5)]), ms(3000));
    assert!(!d.allocation.be_enabled, "{}", d.reason);
    assert_eq!(d.binding_lc.as_deref(), Some("kv"));
}

#[test]
fn a_new_service_set_relearns_whether_its_services_share_cpus() {
    let machine = machine();
    let mut multi = Multi::new(
        &config("multi", false, "be_cpus = [4, 5, 6, 7]\n"),
        &machine,
    );
    let mut seen = obs([Some(0.5), Some(0.5), Some(0.5)], 3.0);
    for g in &mut seen.lc_groups {
        g.cpus = Some(vec![4, 5, 6, 7]);
    }
    let d = multi.decide(&seen, ms(0));
    assert_eq!(d.state["shared_cpus"], serde_json::json!([4, 5, 6, 7]));
    // Discovery drops `search` and moves the others onto CPUs of their own.
    let two = Config::from_toml_str(&config_text_with_cpus("[4, 5]", "[6]").replace(
        "[policy]\nkind = \"multi\"\n",
        "[policy]\nkind = \"multi\"\n[policy.blind]\nbe_cpus = [4, 5, 6, 7]\n",
    ))
    .expect("valid");
    multi.reconfigure(&two);
    seen.lc_groups.truncate(2);
    let d = multi.decide(&seen, ms(1000));
    assert_eq!(d.state["shared_cpus"], serde_json::json!([]), "{}", d.state);
    assert_eq!(
        sets(&d),
        vec![("web".into(), vec![4, 5]), ("kv".into(), vec![6])]
    );
}

#[test]
fn hybrid_is_unchanged_by_the_services() {
    // the single-LC hybrid on a several-LC config decides on the first service only
    let c = config("hybrid", false, "");
    let mut h = Hybrid::new(&c, &machine());
    let d = h.decide(&obs([Some(0.5), Some(-0.5), None], 6.0), ms(0));
    assert!(d.allocation.be_enabled);
    assert_eq!(d.binding_lc, None);
}

#[test]
fn config_refuses_what_multi_cannot_arbitrate() {
    let e = Config::from_toml_str(&config_text_without_kv_latency()).expect_err("no latency");
    assert!(e.to_string().contains("lc[1].latency"), "{e}");
    // overlapping pins
    let overlapping = config_text_with_cpus("[0, 1]", "[1, 2]");
    let e = Config::from_toml_str(&overlapping).expect_err("CPU 1 twice");
    assert!(
        e.to_string().contains("lc[1].threads.cpus") && e.to_string().contains("one owner"),
        "{e}"
    );
    let e = Config::from_toml_str(&format!(
        "{}\n[policy.multi]\nupsize_slack = 0.2\ndonor_min_slack = 0.1\n",
        config_text_with_cpus("[0]", "[1]")
    ))
    .expect_err("donor below upsize");
    assert!(
        e.to_string().contains("policy.multi.donor_min_slack"),
        "{e}"
    );
}

fn config_text_with_cpus(a: &str, b: &str) -> String {
    let svc = |name: &str, cpus: &str| {
        format!(
            "[[lc]]\nname = \"{name}\"\ncgroup = \"headroom/{name}\"\n[lc.latency]\nsource = \"feed\"\n[lc.load]\nsource = \"feed\"\npeak_qps = 1000\n[lc.threads]\npin = true\ncpus = {cpus}\n"
        )
    };
    format!(
        "{}{}[policy]\nkind = \"multi\"\n",
        svc("web", a),
        svc("kv", b)
    )
}

fn config_text_without_kv_latency() -> String {
    config_text_with_cpus("[0]", "[1]")
        .replacen("[lc.latency]\nsource = \"feed\"\n", "", 2)
        .replacen(
            "[[lc]]\nname = \"web\"\ncgroup = \"headroom/web\"\n",
            "[[lc]]\nname = \"web\"\ncgroup = \"headroom/web\"\n[lc.latency]\nsource = \"feed\"\n",
            1,
        )
}

/// Under `multi` as for one LC: a service's violation by a figure its sensors mark untrusted
/// (a fallback prober's the kernel sensor does not confirm) holds BE but starts no cooldown;
/// a trusted violation of any service starts it, judged by that service's source.
#[test]
fn only_a_trusted_violation_of_a_service_starts_the_cooldown() {
    let c = config("multi", false, "[safety]\nviolation_cooldown_s = 60\n");
    let mut p = policy::build(&c, &machine());
    // BE grows on a quiet host first
    let mut t = 0;
    for _ in 0..50 {
        p.decide(&obs([Some(0.5), Some(0.5), Some(0.5)], 6.0), ms(t));
        t += 100;
    }
    let before = p.decide(&obs([Some(0.5), Some(0.5), Some(0.5)], 6.0), ms(t));
    assert!(before.allocation.be_enabled, "{}", before.reason);
    // kv (target 300 µs) reads 450 µs from a fallback prober the kernel sensor contradicts
    let mut untrusted = obs([Some(0.5), Some(-0.5), Some(0.5)], 6.0);
    untrusted.lc_groups[1].latency_source = Some("probe".into());
    untrusted.lc_groups[1].latency_untrusted = Some("the kernel sensor reads 90 µs".into());
    let d = p.decide(&untrusted, ms(t + 100));
    assert!(
        d.allocation.be_enabled,
        "held, not cooled down: {}",
        d.reason
    );
    assert!(
        d.allocation.be_cpu_capacity(8) <= before.allocation.be_cpu_capacity(8),
        "held, not grown: {}",
        d.reason
    );
    assert!(d.state["safety"]["violation_cooldown_until_ms"].is_null());
    assert_eq!(
        d.state["safety"]["untrusted_violation"],
        "kv: the kernel sensor reads 90 µs"
    );
    // the same figure trusted: the cooldown, judged by kv's source
    let mut trusted = obs([Some(0.5), Some(-0.5), Some(0.5)], 6.0);
    trusted.lc_groups[1].latency_source = Some("kernel".into());
    let d = p.decide(&trusted, ms(t + 200));
    assert!(!d.allocation.be_enabled, "{}", d.reason);
    assert_eq!(d.reason, "safety:slo-violation:cooldown:kv");
    assert_eq!(d.state["safety"]["violation_judged_by"], "kernel");
}
