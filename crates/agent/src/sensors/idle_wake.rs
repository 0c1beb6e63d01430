//! When the agent's loop wakes: on an idle-count event, on its periodic duty, or (polling) at
//! the policy's interval — pure scheduling, no clock or file read here.
//!
//! Event-driven sensing (PerfIso's blind isolation without the poll): the BPF idle program
//! counts the idle CPUs and writes an event only when the count crosses the policy's
//! thresholds; the loop sleeps in `epoll_wait` with a timeout that is its next periodic duty
//! (the Heracles outer loop and hybrid's latency check at the policy's interval, never more
//! often than [`EVENT_PERIOD`]; slow sensors; control requests), and runs the same
//! `Controller::step` on either. An overrun (events lost) triggers a re-read: the kernel's
//! count is current whatever was lost, and the thresholds' side is re-derived from it.

use std::time::{Duration, Instant};

use headroom_control::config::{Config, PolicyKind};
use headroom_control::policy::IdleCrossings;

/// The shortest periodic duty while sensing by events: a steady host costs one wake-up per
/// this (the slow sensors' period).
pub const EVENT_PERIOD: Duration = Duration::from_millis(100);

/// What a drain of the event ring buffer found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Events read.
    pub events: usize,
    /// Falls below `low` that were the agent's own wake-up ([`is_own_wake`]): read, not
    /// counted in `events`, no tick.
    pub own_wakes: usize,
    /// Kernel timestamp (CLOCK_MONOTONIC ns) of the first event read.
    pub first_ktime_ns: Option<u64>,
    /// ... and of the first fall below the low threshold (LC needs CPUs back).
    pub first_low_ktime_ns: Option<u64>,
    /// Events were lost since the last drain (ring buffer full): re-read everything.
    pub overrun: bool,
}

/// What ended a wait.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Woken {
    /// Events wait in the ring buffer.
    pub event: bool,
    /// A control request waits (the doorbell sharing the epoll set).
    pub request: bool,
}

/// A source of idle-count events (the BPF ring buffer; a scripted fake in tests).
pub trait IdleEventSource {
    /// Sleeps until an event or a control request waits, or `timeout` passes.
    fn wait(&mut self, timeout: Duration) -> Woken;
    /// Reads every waiting event.
    fn drain(&mut self) -> Drained;
}

/// Why the loop runs a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A threshold crossing (or an overrun, which forces a re-read).
    Event,
    /// The periodic duty.
    Periodic,
}

/// The event-driven loop's schedule.
#[derive(Debug, Clone)]
pub struct EventSchedule {
    period: Duration,
    next_periodic: Instant,
    /// Event ticks since the last periodic one (damping, [`MAX_EVENT_TICKS_PER_PERIOD`]).
    event_ticks: u32,
    /// Events left unanswered by the damping.
    pub damped: u64,
}

impl EventSchedule {
    /// Periodic ticks every `poll_interval` of the policy, but no more often than
    /// [`EVENT_PERIOD`]: events replace the fast poll.
    pub fn new(poll_interval: Duration, now: Instant) -> EventSchedule {
        EventSchedule {
            period: poll_interval.max(EVENT_PERIOD),
            next_periodic: now,
            event_ticks: 0,
            damped: 0,
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// Follows a policy whose interval changed (a live `ctl set`): a shorter one takes effect
    /// from `now`, not after the old period has run out.
    pub fn set_interval(&mut self, poll_interval: Duration, now: Instant) {
        let period = poll_interval.max(EVENT_PERIOD);
        if period != self.period {
            self.period = period;
            self.next_periodic = self.next_periodic.min(now + period);
        }
    }

    /// How long to sleep from `now`: until the periodic tick or `other_due` (slow work, the
    /// run's end), whichever is first.
    pub fn timeout(&self, now: Instant, other_due: Instant) -> Duration {
        self.next_periodic
            .min(other_due)
            .saturating_duration_since(now)
    }

    /// After a wait: whether to tick, and why. A tick for an event also counts as the
    /// periodic one when that is due.
    pub fn after_wait(&mut self, now: Instant, drained: &Drained) -> Option<Cause> {
        let periodic = now >= self.next_periodic;
        if periodic {
            self.next_periodic += self.period;
            if self.next_periodic < now {
                self.next_periodic = now + self.period;
            }
        }
        if periodic {
            self.event_ticks = 0;
        }
        if drained.overrun {
            Some(Cause::Event)
        } else if drained.events > 0 && (periodic || self.event_ticks < MAX_EVENT_TICKS_PER_PERIOD)
        {
            self.event_ticks += u32::from(!periodic);
            Some(Cause::Event)
        } else if drained.events > 0 {
            self.damped += drained.events as u64;
            None
        } else if periodic {
            Some(Cause::Periodic)
        } else {
            None
        }
    }

    /// One wait of the loop on `source`: sleeps, drains, decides (a request alone ticks
    /// nothing: the loop answers it and sleeps again).
    pub fn wait_on(
        &mut self,
        source: &mut dyn IdleEventSource,
        now: Instant,
        other_due: Instant,
        clock: impl Fn() -> Instant,
    ) -> (Option<Cause>, Drained, Woken) {
        let woken = source.wait(self.timeout(now, other_due));
        let drained = if woken.event {
            source.drain()
        } else {
            Drained::default()
        };
        let after = clock();
        (self.after_wait(after, &drained), drained, woken)
    }
}

/// The idle-count thresholds `(low, high)` of blind isolation (and hybrid's inner loop) on the
/// integer count of idle CPUs: the policy shrinks BE when `I < B - tolerance` — for an integer
/// count, `I < ceil(B - tolerance)` — and may grow it when
/// `I >= B + step + hysteresis - tolerance`. `None` for policies that do not decide on the
/// idle count (they keep polling). `multi` decides on it through hybrid's inner loop: without
/// thresholds it polled at blind's `poll_ms` (measured: 1 000 ticks a second with BE held off).
///
/// `high` is at least `low + 1` (see the body: the agent's own wake-up moves the count by one).
///
/// `buffer` is the B the policy keeps now ([`headroom_control::policy::Policy::idle_buffer`]: hybrid's
/// outer loop moves it); `None` falls back to the configured `policy.blind.buffer_cores`.
pub fn thresholds(config: &Config, buffer: Option<f64>) -> Option<(i64, i64)> {
    if !matches!(
        config.policy.kind,
        PolicyKind::Blind | PolicyKind::Hybrid | PolicyKind::Multi
    ) {
        return None;
    }
    let b = &config.policy.blind;
    let buffer_cores = buffer.unwrap_or(b.buffer_cores);
    let frac = buffer_cores - buffer_cores.floor();
    // as `Blind::step`: B's fractional part is the step when B is fractional
    let step = if (0.1..b.grow_step_cpus).contains(&frac) {
        frac
    } else {
        b.grow_step_cpus
    };
    let low = (buffer_cores - b.idle_tolerance_cpus).ceil().max(0.0) as i64;
    let high =
        (buffer_cores + step + b.hysteresis_cpus - b.idle_tolerance_cpus - 1e-9).ceil() as i64;
    // At least one CPU apart: the agent's own wake-up on an idle CPU lowers the count by one
    // and its sleep raises it back, so with low == high (a fractional B without hysteresis)
    // every event it answers raises the next one — measured: 49 913 events and 5.1% of a CPU
    // in 5 s of `bench agent`'s churn at B = 0.5. A rise to `low` alone then waits for the
    // periodic tick (grow slowly); falls below `low` still wake at once (shrink fast).
    Some((low, high.max(low + 1)))
}

/// Thresholds no count crosses: the kernel writes no event (BE disabled, the policy paused).
pub const DISARMED: (i64, i64) = (i64::MIN, i64::MAX);

/// [`thresholds`] with each side disarmed where its crossing cannot change the policy's
/// decision ([`headroom_control::policy::Policy::idle_crossings`]): [`DISARMED`] when neither can.
pub fn armed_thresholds(
    config: &Config,
    buffer: Option<f64>,
    crossings: IdleCrossings,
) -> Option<(i64, i64)> {
    thresholds(config, buffer).map(|(low, high)| {
        (
            if crossings.falls { low } else { DISARMED.0 },
            if crossings.rises { high } else { DISARMED.1 },
        )
    })
}

/// Event ticks answered per periodic duty: beyond them a flapping CPU's crossings wait for the
/// periodic tick (at most 200 event ticks a second; a fall is still seen within a period).
pub const MAX_EVENT_TICKS_PER_PERIOD: u32 = 20;

/// A drained fall below `low`, as [`is_own_wake`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fall {
    /// Kernel time of the crossing (CLOCK_MONOTONIC ns).
    pub ktime_ns: u64,
    /// The CPU whose idle exit made it.
    pub cpu: usize,
    /// The watched idle count just after it.
    pub idle_count: i64,
}

/// Whether a fall below `low` was the agent's own wake-up, not work on the host: the CPU that
/// left idle is the one the agent runs on now (`here`), it left idle when the agent's own timer
/// did — between the wait's timeout expiring and the wait's end (`timer`: both ns; empty when
/// something else ended the wait first) — and with that CPU counted as idle the count is not
/// below `low`. Without this, when exactly `low` CPUs are idle every periodic wake-up is a
/// crossing, a tick and a BE shrink that no LC caused (measured: 0.36% of a CPU on an idle
/// host where the periodic duty alone costs 0.15%). A real fall wakes the agent before its
/// timer, and the agent (real-time) may then preempt the LC on the very CPU that fell: the CPU
/// alone cannot tell the two apart, the timer can (measured in the churn run: 9 973 real falls
/// taken for the agent's own with the CPU test alone).
pub fn is_own_wake(fall: Fall, here: Option<usize>, timer: Option<(u64, u64)>, low: i64) -> bool {
    let Some((expired, woke)) = timer else {
        return false;
    };
    here == Some(fall.cpu)
        && (expired..=woke).contains(&fall.ktime_ns)
        && fall.idle_count + 1 >= low
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU flapping 10 000 times a second wakes at most the damping's share of ticks.
    #[test]
    fn a_flapping_cpu_is_damped() {
        let t0 = Instant::now();
        let mut s = EventSchedule::new(Duration::from_millis(1), t0);
        let mut ticks = 0;
        for i in 0..10_000u64 {
            let now = t0 + Duration::from_micros(100 * i);
            let d = Drained {
                events: 1,
                ..Drained::default()
            };
            ticks += usize::from(s.after_wait(now, &d).is_some());
        }
        // 1 s: 10 periods of 100 ms, each its periodic tick plus at most 20 event ticks
        assert!(
            ticks <= 10 * (1 + MAX_EVENT_TICKS_PER_PERIOD as usize) + 1,
            "{ticks}"
        );
        assert!(s.damped > 9_000, "{}", s.damped);
    }
    use std::cell::Cell;
    use std::collections::VecDeque;
    use std::rc::Rc;

    /// A scripted event source on a virtual clock: `wait` advances the clock to the next
    /// scripted event (if it comes before the timeout) or by the whole timeout.
    struct Fake {
        clock: Rc<Cell<Instant>>,
        /// (when, events, overrun)
        script: VecDeque<(Instant, usize, bool)>,
        waits: Vec<Duration>,
    }

    impl IdleEventSource for Fake {
        fn wait(&mut self, timeout: Duration) -> Woken {
            self.waits.push(timeout);
            let now = self.clock.get();
            match self.script.front() {
                Some(&(at, ..)) if at <= now + timeout => {
                    self.clock.set(at.max(now));
                    Woken {
                        event: true,
                        request: false,
                    }
                }
                _ => {
                    self.clock.set(now + timeout);
                    Woken::default()
                }
            }
        }
        fn drain(&mut self) -> Drained {
            let Some((at, events, overrun)) = self.script.pop_front() else {
                return Drained::default();
            };
            Drained {
                events,
                first_ktime_ns: Some(at.elapsed().as_nanos() as u64),
                first_low_ktime_ns: None,
                overrun,
                own_wakes: 0,
            }
        }
    }

    /// Fed by a fake source over one virtual second: the loop ticks once per event, once per
    /// period otherwise, sleeps in between (no poll), and an overrun also ticks.
    #[test]
    fn the_loop_ticks_on_events_and_its_period_only() {
        let t0 = Instant::now();
        let clock = Rc::new(Cell::new(t0));
        let ms = |m: u64| t0 + Duration::from_millis(m);
        let mut fake = Fake {
            clock: clock.clone(),
            script: VecDeque::from([
                (ms(5), 1, false),
                (ms(7), 2, false),
                (ms(250), 0, true), // overrun: events lost, re-read
            ]),
            waits: Vec::new(),
        };
        let mut s = EventSchedule::new(Duration::from_millis(1), t0);
        assert_eq!(s.period(), EVENT_PERIOD, "events replace the 1 ms poll");
        let end = ms(1000);
        let (mut events, mut periodic, mut wakes) = (0, 0, 0);
        while clock.get() < end {
            let c = clock.clone();
            let (cause, ..) = s.wait_on(&mut fake, clock.get(), end, move || c.get());
            wakes += 1;
            match cause {
                Some(Cause::Event) => events += 1,
                Some(Cause::Periodic) => periodic += 1,
                None => {}
            }
        }
        assert_eq!(
            events, 3,
            "one tick per event wake-up, the overrun included"
        );
        // t = 0, 100, ..., 1000 ms (the last wait ends at the run's end, which is also due)
        assert_eq!(periodic, 11);
        assert!(
            wakes <= 14,
            "{wakes} wake-ups: the loop sleeps between duties"
        );
        assert!(fake.waits.iter().all(|w| *w <= EVENT_PERIOD));
        assert!(fake.waits.iter().any(|w| *w >= Duration::from_millis(90)));
    }

    /// A live change of the policy's interval (`ctl set`): a shorter period counts from the
    /// change, not from the end of the old one.
    #[test]
    fn a_shorter_interval_set_live_counts_from_the_change() {
        let t0 = Instant::now();
        let mut s = EventSchedule::new(Duration::from_secs(2), t0);
        assert_eq!(s.after_wait(t0, &Drained::default()), Some(Cause::Periodic));
        let at = t0 + Duration::from_millis(5);
        s.set_interval(Duration::from_millis(1), at);
        assert_eq!(s.period(), EVENT_PERIOD);
        assert_eq!(s.timeout(at, t0 + Duration::from_secs(9)), EVENT_PERIOD);
        s.set_interval(Duration::from_secs(3), at);
        assert_eq!(s.period(), Duration::from_secs(3));
        assert_eq!(
            s.timeout(at, t0 + Duration::from_secs(9)),
            EVENT_PERIOD,
            "a longer one starts after the tick already due"
        );
    }

    /// A slow policy (Heracles' outer loop, 2 s) keeps its own period.
    #[test]
    fn a_slower_policy_keeps_its_period() {
        let t0 = Instant::now();
        let s = EventSchedule::new(Duration::from_secs(2), t0);
        assert_eq!(s.period(), Duration::from_secs(2));
        let mut s2 = s.clone();
        let none = Drained::default();
        assert_eq!(s2.after_wait(t0, &none), Some(Cause::Periodic));
        assert_eq!(s2.after_wait(t0 + Duration::from_secs(1), &none), None);
        assert_eq!(
            s2.timeout(t0 + Duration::from_secs(1), t0 + Duration::from_secs(60)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn thresholds_follow_the_blind_rules_on_an_integer_count() {
        let mut c: Config =
            toml::from_str("[lc]\nname = \"lc\"\ncgroup = \"lc\"\n[policy]\nkind = \"blind\"\n")
                .unwrap();
        // B = 1, tolerance 0.1, step 1: shrink at 0 idle, grow at 2
        assert_eq!(thresholds(&c, None), Some((1, 2)));
        c.policy.blind.buffer_cores = 2.0;
        c.policy.blind.hysteresis_cpus = 1.0;
        assert_eq!(thresholds(&c, None), Some((2, 4)));
        // fractional B: the fraction is the step; grow at 2 idle by the rule, but the band is
        // at least one CPU wide (the agent's own wake-up must not cross both thresholds)
        c.policy.blind.buffer_cores = 1.5;
        c.policy.blind.hysteresis_cpus = 0.0;
        assert_eq!(thresholds(&c, None), Some((2, 3)));
        c.policy.blind.buffer_cores = 0.5;
        assert_eq!(thresholds(&c, None), Some((1, 2)));
        // multi decides on the same count through hybrid's inner loop
        c.policy.kind = PolicyKind::Multi;
        assert_eq!(thresholds(&c, None), Some((1, 2)));
        c.policy.kind = PolicyKind::Heracles;
        assert_eq!(thresholds(&c, None), None);
    }

    /// Each side of the band is armed only where its crossing can change a decision.
    #[test]
    fn a_side_no_crossing_can_use_is_disarmed() {
        let c: Config =
            toml::from_str("[lc]\nname = \"lc\"\ncgroup = \"lc\"\n[policy]\nkind = \"blind\"\n")
                .unwrap();
        let arm = |falls, rises| armed_thresholds(&c, None, IdleCrossings { falls, rises });
        assert_eq!(arm(true, true), Some((1, 2)));
        assert_eq!(arm(true, false), Some((1, i64::MAX)));
        assert_eq!(arm(false, true), Some((i64::MIN, 2)));
        assert_eq!(arm(false, false), Some(DISARMED));
    }

    /// A violation's cooldown holds BE off through the safety rules: no crossing is armed
    /// until it lifts on the periodic tick.
    #[test]
    fn nothing_is_armed_while_a_safety_rule_holds_be_off() {
        use headroom_control::policy::{self, MachineInfo};
        let c = headroom_control::config::Config::from_toml_str(
            "[lc]\nname = \"lc\"\ncgroup = \"lc\"\n[lc.latency]\nsource = \"feed\"\n\
             [policy]\nkind = \"blind\"\n",
        )
        .unwrap();
        let mut p = policy::build(&c, &MachineInfo::with_cpus(8));
        let obs = |latency: Option<f64>| headroom_types::observation::Observation {
            lc_latency_us: latency,
            lc_latency_age_ms: latency.map(|_| 0),
            idle_cpus: Some(4.0),
            ..Default::default()
        };
        let d = p.decide(&obs(Some(10.0)), Duration::from_secs(1));
        assert!(d.allocation.be_enabled, "{}", d.reason);
        assert!(p.idle_crossings().any());
        // a latency far over the SLO: the violation rule freezes BE for the cooldown
        let d = p.decide(&obs(Some(1e6)), Duration::from_secs(2));
        assert!(!d.allocation.be_enabled, "{}", d.reason);
        assert_eq!(p.idle_crossings(), IdleCrossings::NONE, "{}", d.reason);
    }

    /// Hybrid's outer loop widens the buffer after a violation: the thresholds the agent arms
    /// come from the policy's buffer of the moment, not from the config.
    #[test]
    fn thresholds_follow_the_buffer_the_policy_keeps_now() {
        use headroom_control::policy::{self, MachineInfo};
        let c = headroom_control::config::Config::from_toml_str(
            "[lc]\nname = \"lc\"\ncgroup = \"lc\"\n[lc.latency]\nsource = \"feed\"\n\
             [lc.load]\nsource = \"feed\"\npeak_qps = 1000.0\n[policy]\nkind = \"hybrid\"\n",
        )
        .unwrap();
        let mut p = policy::build(&c, &MachineInfo::with_cpus(8));
        let b0 = p.idle_buffer().expect("hybrid keeps a buffer");
        assert_eq!(thresholds(&c, Some(b0)), thresholds(&c, None));
        // an SLO violation: the outer loop disables BE and widens B by one step
        let bad = headroom_types::observation::Observation {
            lc_latency_us: Some(10_000.0),
            lc_latency_age_ms: Some(0),
            lc_load: Some(0.3),
            lc_load_age_ms: Some(0),
            idle_cpus: Some(4.0),
            ..Default::default()
        };
        for i in 0..40u64 {
            p.decide(&bad, std::time::Duration::from_secs(i));
        }
        let b1 = p.idle_buffer().unwrap();
        assert!(b1 > b0, "buffer {b0} -> {b1}");
        let (low0, _) = thresholds(&c, Some(b0)).unwrap();
        let (low1, _) = thresholds(&c, Some(b1)).unwrap();
        assert!(low1 > low0, "low threshold {low0} -> {low1}");
    }

    /// The agent's periodic wake-up on an idle CPU, with exactly `low` CPUs idle, is its own;
    /// the same fall on another CPU, before its timer, or one more CPU short, is not.
    #[test]
    fn only_the_agents_own_wake_up_on_its_own_cpu_is_discounted() {
        let fall = Fall {
            ktime_ns: 1_000,
            cpu: 1,
            idle_count: 0,
        };
        let slept = Some((500, 1_200));
        assert!(is_own_wake(fall, Some(1), slept, 1));
        // the LC took CPU 0 while the agent woke on CPU 1
        assert!(!is_own_wake(Fall { cpu: 0, ..fall }, Some(1), slept, 1));
        // counting the agent's CPU as idle still leaves the count below low: a real fall too
        assert!(!is_own_wake(fall, Some(1), slept, 2));
        // the fall came before the agent's timer expired: it woke the agent, on its CPU
        assert!(!is_own_wake(fall, Some(1), Some((1_100, 1_200)), 1));
        // ... or the wait ended before its timer (the window is empty)
        assert!(!is_own_wake(fall, Some(1), Some((1_100, 1_050)), 1));
        assert!(!is_own_wake(fall, Some(1), None, 1));
        // where the agent runs is unknown: never discounted
        assert!(!is_own_wake(fall, None, slept, 1));
    }
}
