//! The `record` and `publish` phases on a real host: the decision log (size-capped, rotated
//! once), the Prometheus metrics, the reasons `ctl status` shows, and the run's counters.

use std::collections::VecDeque;
use std::time::Duration;

use crate::publish::metrics::{Metrics, ServiceSlo};
use crate::publish::reaction_log::phase;
use headroom_control::advertise::memory::memory_input;
use headroom_control::advertise::{granted_millicpu, AdvertiseInput, Resource};
use headroom_control::controller::{TickOutcome, TickSink};
use headroom_control::decision::{CtlEvent, Decision, DecisionRecord};
use headroom_types::allocation::Allocation;
use headroom_types::decision::Repeat;
use headroom_types::observation::Observation;

use super::advertise::{log_change, AdvertiseLive};
pub use super::decision_log::DecisionLog;
use super::RunSummary;

/// Reasons kept for `ctl status`.
const REASONS_KEPT: usize = 10;

/// A run of identical decisions is written at its end, or once it is this old (a crash loses
/// at most this much of a run).
const RUN_MAX: Duration = Duration::from_secs(10);

/// A run of identical decisions being gathered: its first record and its last tick.
pub struct Run {
    first: DecisionRecord,
    count: u64,
    last_t: Duration,
    last_unix_ms: u64,
    last_observation: Observation,
}

impl Run {
    fn line(&self) -> String {
        if self.count == 1 {
            return self.first.to_json_line();
        }
        let mut rec = self.first.clone();
        rec.repeat = Some(Repeat {
            count: self.count,
            last_t_ms: self.last_t.as_millis() as u64,
            last_t_unix_ms: self.last_unix_ms,
            last_observation: self.last_observation.clone(),
        });
        rec.to_json_line()
    }
}

/// Windows whose ends (tick time − the latency's age) lie closer than this are one window:
/// the sources publish one a second, the age is read in whole milliseconds.
const SAME_WINDOW: Duration = Duration::from_millis(500);

/// Whether the observation at `now_t` carries a latency window (any service's) the one at
/// `prev_t` did not: a run of identical decisions ends there, so that every window the agent
/// saw is the first observation of a line — the log holds each window's figure, not only the
/// decisions it led to. A window is known by its end, not its figure (two windows can give the
/// same p99) nor its age (a tick a second after each publication sees the same age each time).
fn new_latency_window(
    prev: &Observation,
    prev_t: Duration,
    now: &Observation,
    now_t: Duration,
) -> bool {
    let end =
        |t: Duration, age: Option<u64>| age.map(|a| t.saturating_sub(Duration::from_millis(a)));
    let other = |p: Option<Duration>, n: Option<Duration>| match (p, n) {
        (Some(p), Some(n)) => n.abs_diff(p) >= SAME_WINDOW,
        (None, None) => false,
        _ => true,
    };
    other(
        end(prev_t, prev.lc_latency_age_ms),
        end(now_t, now.lc_latency_age_ms),
    ) || prev.lc_groups.len() != now.lc_groups.len()
        || prev
            .lc_groups
            .iter()
            .zip(&now.lc_groups)
            .any(|(p, n)| other(end(prev_t, p.latency_age_ms), end(now_t, n.latency_age_ms)))
}

/// Whether two ticks fall in the same advertiser bucket (a run of identical decisions ends at
/// a bucket's edge: replay feeds only a run's first and last tick).
fn same_bucket(a: Duration, b: Duration, bucket_ms: u64) -> bool {
    let bucket = bucket_ms.max(1);
    a.as_millis() as u64 / bucket == b.as_millis() as u64 / bucket
}

/// Where the Linux agent's ticks go.
pub struct Publisher {
    pub log: Option<DecisionLog>,
    pub metrics: Metrics,
    pub policy: &'static str,
    pub started_unix_ms: u64,
    pub slo_us: f64,
    /// Every LC service's name and SLO (the per-service metrics).
    pub lcs: Vec<ServiceSlo>,
    pub reasons: VecDeque<(u64, String)>,
    pub last_reason: String,
    pub last_allocation: Option<Allocation>,
    pub last_write_error: Option<String>,
    pub summary: RunSummary,
    /// Something the state file records changed (writes were made).
    pub state_dirty: bool,
    /// Why BE is held off for lack of a trustworthy latency signal (`ctl status`).
    pub be_held_off: Option<String>,
    /// A run of identical decisions not yet written (see [`Publisher::record`]).
    pub pending: Option<Run>,
    /// The last decision written as a line of its own.
    pub last_logged: Option<Decision>,
    /// The service whose slack bound the last decision (`ctl status`).
    pub last_binding_lc: Option<String>,
    /// `[kubernetes] advertise`: the advertiser's input, computed and logged with the decision.
    pub advertise: super::advertise::AdvertiseFeed,
}

impl Publisher {
    /// A publisher at the start of a run of `policy`, writing its decisions to `log` (none:
    /// no decision log); `lcs` are the LC services' SLOs, `slo_us` the first one's.
    pub fn new(
        log: Option<DecisionLog>,
        metrics: Metrics,
        policy: &'static str,
        slo_us: f64,
        lcs: Vec<ServiceSlo>,
        started_unix_ms: u64,
    ) -> Publisher {
        Publisher {
            log,
            metrics,
            policy,
            started_unix_ms,
            slo_us,
            lcs,
            reasons: Default::default(),
            last_reason: String::new(),
            last_allocation: None,
            last_write_error: None,
            summary: Default::default(),
            state_dirty: false,
            be_held_off: None,
            pending: None,
            last_logged: None,
            last_binding_lc: None,
            advertise: Default::default(),
        }
    }

    /// Logs a ctl command that changes the policy's decisions, on the decisions' clock, so
    /// `--replay` applies it between the same two decisions.
    pub fn log_event(&mut self, event: &CtlEvent) {
        self.end_run();
        if let Some(log) = &mut self.log {
            log.write_line(&event.to_json_line());
            log.flush();
        }
    }
}

impl Publisher {
    /// Writes the run being gathered (at a ctl event, on exit).
    pub fn end_run(&mut self) {
        if let (Some(run), Some(log)) = (self.pending.take(), self.log.as_mut()) {
            log.write_line(&run.line());
        }
    }
}

impl TickSink for Publisher {
    /// A decision that differs from the last one logged is written at once; the identical
    /// ones after it (allocation, reason, state) are gathered into one line written when the
    /// run ends (or every [`RUN_MAX`]): a flapping host holding BE off wrote 82 600 holds in 11 s.
    fn record(&mut self, t: Duration, obs: &Observation, decision: &Decision) {
        phase::decided();
        self.advertise.input = self.advertise.ctx.map(|c| AdvertiseInput {
            granted_millicpu: granted_millicpu(&decision.allocation, c.machine_cpus),
            health: super::advertise::health(
                obs,
                self.slo_us,
                &self.lcs,
                c.latency_max_age_ms,
                self.be_held_off.as_deref(),
            ),
            floor_millicpu: c.floor_millicpu,
        });
        self.advertise.memory_input = self
            .advertise
            .ctx
            .map(|c| memory_input(obs, c.floor_memory_bytes));
        self.log_decision(t, obs, decision);
        phase::recorded();
    }

    fn publish(&mut self, t: Duration, obs: &Observation, outcome: &TickOutcome) {
        self.publish_tick(t, obs, outcome);
    }
}

impl Publisher {
    fn log_decision(&mut self, t: Duration, obs: &Observation, decision: &Decision) {
        if self.log.is_none() {
            return;
        }
        let unix_ms = self.started_unix_ms + t.as_millis() as u64;
        let same = self.last_logged.as_ref().is_some_and(|d| {
            d.reason == decision.reason
                && d.allocation == decision.allocation
                && d.state == decision.state
                && d.binding_lc == decision.binding_lc
        });
        if same {
            if let Some(run) = &mut self.pending {
                if t.saturating_sub(Duration::from_millis(run.first.t_ms)) < RUN_MAX
                    && !new_latency_window(&run.last_observation, run.last_t, obs, t)
                    && run.first.advertise == self.advertise.input
                    && self
                        .advertise
                        .ctx
                        .is_none_or(|c| same_bucket(run.last_t, t, c.bucket_ms))
                {
                    run.count += 1;
                    run.last_t = t;
                    run.last_unix_ms = unix_ms;
                    run.last_observation.clone_from(obs);
                    return;
                }
            }
            self.end_run();
            self.pending = Some(Run {
                first: self.new_record(t, unix_ms, obs, decision),
                count: 1,
                last_t: t,
                last_unix_ms: unix_ms,
                last_observation: obs.clone(),
            });
            return;
        }
        self.end_run();
        let rec = self.new_record(t, unix_ms, obs, decision);
        if let Some(log) = &mut self.log {
            log.write_line(&rec.to_json_line());
        }
        self.last_logged = Some(decision.clone());
    }

    fn new_record(
        &self,
        t: Duration,
        unix_ms: u64,
        obs: &Observation,
        decision: &Decision,
    ) -> DecisionRecord {
        let mut rec = DecisionRecord::new(t, unix_ms, self.policy, obs, decision);
        rec.advertise.clone_from(&self.advertise.input);
        rec
    }

    fn publish_tick(&mut self, t: Duration, obs: &Observation, outcome: &TickOutcome) {
        match &outcome.actuation {
            Some(Ok(report)) => {
                if !report.writes.is_empty() {
                    let n = report.writes.len() as u64;
                    self.metrics.writes.inc_by(n);
                    self.summary.writes += n;
                    self.state_dirty = true;
                }
                if !report.drift.is_empty() {
                    self.metrics.drift_repairs.inc_by(report.drift.len() as u64);
                }
                self.last_write_error = None;
            }
            Some(Err(e)) => {
                self.metrics.write_errors.inc();
                self.summary.write_errors += 1;
                let msg = e.to_string();
                if self.last_write_error.as_deref() != Some(msg.as_str()) {
                    tracing::error!(error = %msg, "actuation failed");
                }
                self.last_write_error = Some(msg);
            }
            None => {}
        }
        let decision = &outcome.decision;
        // The allocation's gauges hold the same values while it is unchanged.
        let changed = self.last_allocation.as_ref() != Some(&decision.allocation);
        self.metrics.observe_tick(
            obs,
            &decision.allocation,
            changed,
            self.slo_us,
            &decision.reason,
        );
        self.metrics
            .observe_services(&self.lcs, obs, decision.binding_lc.as_deref());
        if self.last_binding_lc != decision.binding_lc {
            self.last_binding_lc.clone_from(&decision.binding_lc);
        }
        if decision.reason != self.last_reason {
            self.reasons
                .push_back((t.as_millis() as u64, decision.reason.clone()));
            if self.reasons.len() > REASONS_KEPT {
                self.reasons.pop_front();
            }
            self.last_reason = decision.reason.clone();
        }
        if changed {
            self.last_allocation = Some(decision.allocation.clone());
        }
        self.summary.ticks += 1;
    }
}

impl Publisher {
    /// Feeds the input the publisher's record phase computed and logged this tick (none while
    /// the floor is unknown); a change goes to the edge and to the log, right after the tick's
    /// decision line (`--replay` checks it there).
    pub(super) fn step_advertiser(&mut self, live: &mut AdvertiseLive, t_ms: u64) {
        let (Some(input), Some(memory)) = (
            self.advertise.input.take(),
            self.advertise.memory_input.take(),
        ) else {
            return;
        };
        let fed = live.feed(t_ms, &input, &memory);
        let (ad, change) = &fed.cpu;
        if let Some(c) = change {
            log_change(
                Resource::BeCpu,
                c.from_millicpu,
                c.to_millicpu,
                c.reason,
                &c.detail,
            );
            self.log_event(&CtlEvent::Advertise {
                t_ms: c.t_ms,
                from_millicpu: c.from_millicpu,
                to_millicpu: c.to_millicpu,
                reason: c.reason,
                detail: c.detail.clone(),
                floor_millicpu: ad.floor_millicpu,
            });
        }
        let (mem, mem_change) = &fed.memory;
        if let Some(c) = mem_change {
            log_change(Resource::BeMemory, c.from, c.to, c.reason, &c.detail);
            self.log_event(&CtlEvent::AdvertiseMemory {
                t_ms: c.t_ms,
                from_bytes: c.from,
                to_bytes: c.to,
                reason: c.reason,
                detail: c.detail.clone(),
                floor_bytes: mem.floor,
            });
        }
        self.metrics
            .be_cpu_advertised(ad.value_millicpu, ad.reason.as_str());
        self.metrics
            .be_memory_advertised(mem.value, mem.reason.as_str());
    }
}

#[cfg(test)]
pub(super) mod tests {
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
}
