//! The control loop: event-driven (asleep in `epoll_wait` until an idle-count crossing or the
//! periodic duty) where the BPF idle program runs, polling at the policy's interval otherwise;
//! one tick, and the slow work (supervision, LC threads, BE tasks, state file) between ticks.

use super::*;
use crate::publish::reaction_log::phase;

impl Agent {
    /// Runs until a stop signal (or `run_for`), then performs the exit action. Woken by the
    /// BPF idle program's threshold crossings where it works (see [`crate::sensors::idle_wake`]),
    /// polling at the policy's interval otherwise.
    pub fn run(mut self) -> Result<RunSummary, AgentError> {
        let interval = self.poll_interval();
        // (a run too long to add is refused at start; unbounded here rather than a panic)
        let deadline = self
            .options
            .run_for
            .and_then(|d| Instant::now().checked_add(d));
        // 1 µs of slack so 1 ms sleeps end close to their deadline; a refusal (none is known)
        // only makes ticks later.
        if let Err(e) = headroom_host::sched::set_timer_slack_ns(1000) {
            tracing::warn!(error = %e, "timer slack left at its default");
        }
        raise_control_loop_priority(self.config.safety.agent_fifo_priority);
        let mut reactions = ReactionLog::from_env();
        if self.start_idle_sensing(&reactions) {
            self.run_on_events(interval, deadline, &mut reactions);
        } else {
            self.run_polling(interval, deadline, &mut reactions);
        }
        if let Some(s) = self.node.sensors() {
            if let Some(c) = s.idle_event_counters() {
                reactions.record_counters(c.events, c.suppressed, c.overruns, s.own_wakes());
            }
        }
        reactions.flush();
        self.shutdown()
    }

    /// Event-driven where configured and possible; says which and why (log, `ctl status`).
    fn start_idle_sensing(&mut self, reactions: &ReactionLog) -> bool {
        let want = self.config.sensors.idle_sensing;
        let thresholds =
            idle_wake::thresholds(&self.config, self.controller.policy().idle_buffer());
        let policy = self.config.policy.kind.as_str();
        let Some(sensors) = self.node.sensors_mut() else {
            return false;
        };
        let reason = match (want, thresholds) {
            (IdleSensing::Poll, Some((low, high))) => {
                if reactions.enabled() {
                    // still timestamp the crossings, for the benchmark's side-by-side figures
                    let _ = sensors.arm_idle_thresholds(low, high);
                }
                "sensors.idle_sensing = \"poll\"".to_owned()
            }
            (IdleSensing::Poll, None) => "sensors.idle_sensing = \"poll\"".to_owned(),
            (IdleSensing::Events, None) => {
                format!("policy {policy} does not decide on the idle-CPU count")
            }
            (IdleSensing::Events, Some((low, high))) => {
                match sensors.enable_idle_events(low, high) {
                    Ok(()) => {
                        tracing::info!(low, high, "idle sensing: events (BPF ring buffer)");
                        self.controller
                            .set_verify_period(super::EVENT_VERIFY_PERIOD);
                        if let Some(r) = &self.requests {
                            // without it a request waits for the periodic duty (100 ms)
                            if let Err(e) = sensors.watch_in_idle_wait(r.wake_fd()) {
                                tracing::warn!(error = %e, "ctl requests wait for the periodic duty");
                            }
                        }
                        return true;
                    }
                    Err(why) => why.to_string(),
                }
            }
        };
        if want == IdleSensing::Events && thresholds.is_some() {
            tracing::warn!(reason = %reason, "idle sensing falls back to polling");
        } else {
            tracing::info!(reason = %reason, "idle sensing: polling");
        }
        sensors.set_idle_polling(&reason);
        false
    }

    /// The policy's interval now (a live `ctl set` of the policy or its interval changes it:
    /// the fourth hostile pass found a `set policy.kind=blind` acknowledged and then run at
    /// the static policy's one tick a second).
    fn poll_interval(&mut self) -> Duration {
        let interval = self
            .controller
            .policy()
            .poll_interval()
            .max(Duration::from_micros(100));
        self.tick_interval = Some(interval);
        interval
    }

    /// The polling loop: a tick every `interval` (followed when a request changes it).
    fn run_polling(
        &mut self,
        mut interval: Duration,
        deadline: Option<Instant>,
        reactions: &mut ReactionLog,
    ) {
        let mut next = Instant::now();
        let mut slow_due = Instant::now();
        loop {
            if self.signals.as_ref().is_some_and(Signals::stop_requested) {
                break;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            if now < next {
                // Asleep until the next tick, or a ctl request (its doorbell): a request is
                // answered at once, not at the next tick (a policy polling every second would
                // hold `ctl off` that long).
                if self.wait_for_request((next - now).min(Duration::from_millis(100)))
                    && self.handle_requests(true)
                {
                    interval = self.poll_interval();
                    next = next.min(Instant::now() + interval);
                }
                continue;
            }
            next += interval;
            if next < now {
                next = now + interval;
            }
            let crossed = match self.node.sensors_mut() {
                Some(s) if reactions.enabled() => s.drain().first_low_ktime_ns,
                _ => None,
            };
            let awake = monotonic_ns();
            phase::start();
            if self.tick(now) {
                if let Some(k) = crossed {
                    reactions.record("poll", k, awake, &phase::tick_done());
                }
            }
            if now >= slow_due {
                slow_due = now + SLOW_PERIOD;
                self.slow_work(now);
            }
            if self.handle_requests(false) {
                interval = self.poll_interval();
                next = next.min(Instant::now() + interval);
            }
        }
    }

    /// Sleeps up to `timeout`, woken early by a queued ctl request; whether one rang.
    fn wait_for_request(&self, timeout: Duration) -> bool {
        let Some(requests) = &self.requests else {
            std::thread::sleep(timeout);
            return false;
        };
        use headroom_host::poll::{wait, Wait, Want};
        let mut bell = [Wait::new(requests.wake_fd(), Want::Read)];
        // Whole ms, at least one, as the loop's ticks are.
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as u64;
        wait(&mut bell, Duration::from_millis(ms)).unwrap_or(0) > 0 && bell[0].readable()
    }

    /// The event-driven loop: asleep in `epoll_wait` until a crossing or the next periodic
    /// duty (the policy's interval, at least [`idle_wake::EVENT_PERIOD`]; slow work).
    fn run_on_events(
        &mut self,
        interval: Duration,
        deadline: Option<Instant>,
        reactions: &mut ReactionLog,
    ) {
        let start = Instant::now();
        let mut schedule = EventSchedule::new(interval, start);
        self.tick_interval = Some(schedule.period());
        // Slow work keeps the periodic tick's cadence (both 100 ms from the same start), so a
        // steady host wakes once per period, not twice.
        let mut slow_due = start;
        tracing::info!(
            period_ms = schedule.period().as_millis() as u64,
            "event-driven loop"
        );
        loop {
            if self.signals.as_ref().is_some_and(Signals::stop_requested) {
                break;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            let other_due = deadline.map_or(slow_due, |d| d.min(slow_due));
            let Some(source) = self.node.sensors_mut().and_then(|s| s.idle_event_source()) else {
                // never a silent stop of sensing
                tracing::error!("idle events unavailable; polling from now on");
                let interval = self.poll_interval();
                return self.run_polling(interval, deadline, reactions);
            };
            let (cause, drained, woken) = schedule.wait_on(source, now, other_due, Instant::now);
            let awake = monotonic_ns();
            phase::start();
            let now = Instant::now();
            let wakes = &mut self.publisher.summary.wakes;
            match woken {
                Woken { event: true, .. } => wakes.event += 1,
                Woken { request: true, .. } => wakes.request += 1,
                _ => wakes.timeout += 1,
            }
            if let Some(cause) = cause {
                if drained.overrun {
                    tracing::warn!("idle events lost (ring buffer full): re-read the idle count");
                }
                if self.tick(now) && cause == Cause::Event {
                    if let Some(k) = drained.first_low_ktime_ns {
                        reactions.record("events", k, awake, &phase::tick_done());
                    }
                }
            }
            if now >= slow_due {
                slow_due += SLOW_PERIOD;
                if slow_due <= now {
                    slow_due = now + SLOW_PERIOD;
                }
                self.slow_work(now);
            }
            // The doorbell is read (cleared) only when it woke the loop: a request queued while
            // the loop was busy is answered now and its ring wakes the next wait once more.
            if self.handle_requests(woken.request) {
                schedule.set_interval(self.poll_interval(), Instant::now());
                self.tick_interval = Some(schedule.period());
            }
        }
    }

    /// One tick; true when it wrote a knob.
    fn tick(&mut self, now: Instant) -> bool {
        let t = tick_time(now.saturating_duration_since(self.started));
        self.advertise_prepare();
        let outcome = self.controller.step(&mut self.node, t, &mut self.publisher);
        // The policy's buffer moves (hybrid's outer loop, a `ctl set`): the kernel's
        // thresholds follow it (a map write only when they change).
        let policy = self.controller.policy();
        if let (Some((low, high)), Some(s)) = (
            idle_wake::armed_thresholds(
                &self.config,
                policy.idle_buffer(),
                policy.idle_crossings(),
            ),
            self.node.sensors_mut(),
        ) {
            s.set_idle_thresholds(low, high);
        }
        self.advertise_tick(t.as_millis() as u64);
        self.publisher
            .metrics
            .loop_seconds
            .observe(now.elapsed().as_secs_f64());
        matches!(&outcome.actuation, Some(Ok(r)) if !r.writes.is_empty())
    }

    fn slow_work(&mut self, now: Instant) {
        self.take_discovery();
        self.follow_moving_targets(now);
        let killing = self
            .publisher
            .last_allocation
            .as_ref()
            .is_some_and(|a| a.be_kill);
        let cg = self.node.cgroups().clone();
        if !killing {
            for s in &mut self.supervised {
                let before = s.restarts;
                s.check(&cg, now);
                if s.restarts > before {
                    self.publisher.metrics.be_restarts.inc();
                    self.publisher.state_dirty = true;
                }
            }
        }
        if let (Some(a), true) = (
            self.publisher.last_allocation.clone(),
            self.controller.is_actuating(),
        ) {
            if self.lc_threads.apply(&cg, &self.groups.lc, &a.lc) > 0 {
                self.publisher.state_dirty = true;
            }
            // The other `[[lc]]` services: each its own `[lc.threads]` (the policy's
            // treatment is the first service's).
            for lc in self.config.lcs.iter().skip(1) {
                let t = service_treatment(lc, &self.machine.cpus);
                if self.lc_threads.apply(&cg, &lc.cgroup, &t) > 0 {
                    self.publisher.state_dirty = true;
                }
            }
            let be_cpus = a
                .be_cpus
                .as_ref()
                .map_or_else(|| self.machine.cpus.clone(), |c| c.to_vec());
            if let Some(s) = self.node.sensors_mut() {
                s.set_be_cpus(&be_cpus);
            }
            // BE's thread list only matters to resctrl (reading it costs an open, a read and
            // a close every pass)
            let resctrl = self
                .node
                .active()
                .iter()
                .any(|m| matches!(m, Mechanism::ResctrlL3 | Mechanism::ResctrlMba));
            if resctrl {
                let tids: Vec<i32> = self
                    .groups
                    .be
                    .iter()
                    .flat_map(|g| cg.threads(g).unwrap_or_default())
                    .collect();
                if let Err(e) = self.node.assign_be_tasks(&tids) {
                    tracing::warn!(error = %e, "moving BE threads into their resctrl group");
                }
            }
        }
        if let Some(log) = &mut self.publisher.log {
            log.flush();
        }
        if let Some(s) = self.node.sensors() {
            for (name, n) in s.errors() {
                self.publisher.metrics.sensor_errors_total(name, *n);
            }
        }
        for (name, cell) in &self.signal_cells {
            self.publisher
                .metrics
                .sensor_errors_total(name, cell.errors());
        }
        self.say_why_be_is_held_off();
        let state_due = self
            .state_written
            .is_none_or(|t| now.saturating_duration_since(t) >= STATE_PERIOD);
        // A state file deleted under the agent is written again (a kill -9 after would
        // otherwise leave the next start blind: no originals, no groups, no BE pids).
        if state_due
            && !self.publisher.state_dirty
            && self
                .state_checked
                .is_none_or(|t| now.saturating_duration_since(t) >= STATE_PERIOD)
        {
            self.state_checked = Some(now);
            let path = std::path::Path::new(&self.config.safety.state_file);
            if !self.options.dry_run && self.state_written.is_some() && !path.exists() {
                tracing::warn!(state = %path.display(), "the state file was removed while the agent runs: writing it again");
                self.publisher.state_dirty = true;
            }
        }
        if self.publisher.state_dirty && state_due {
            if let Err(e) = self.write_state() {
                tracing::error!(error = %e, "writing the state file");
            }
        }
    }
}

impl Agent {
    /// "No silent zero": BE off with no fresh latency → the reason, in `ctl status` and
    /// `headroom_be_held_off_reason`.
    fn say_why_be_is_held_off(&mut self) {
        let be_enabled = self
            .publisher
            .last_allocation
            .as_ref()
            .is_none_or(|a| a.be_enabled);
        let max_age = self.config.safety.latency_max_age_ms;
        let fresh = self
            .node
            .sensors()
            .and_then(|s| s.last().lc_latency_age_ms)
            .is_some_and(|age| age <= max_age);
        let cell = self
            .signal_cells
            .iter()
            .find(|(n, _)| n == "latency")
            .map(|(_, c)| c);
        let reason = cell.and_then(|cell| {
            let unseen_for = cell
                .latest()
                .map_or_else(|| self.started.elapsed(), |r| r.at.elapsed());
            let says =
                held_off::SourceSays {
                    refusal: cell.refusal(),
                    last_error: cell.last_error(),
                    send_lag_us: cell.send_lag_us(),
                    is_probe: self.config.lc().latency.as_ref().is_some_and(|l| {
                        l.source == headroom_control::config::LatencySource::Probe
                    }),
                };
            held_off::held_off(be_enabled, fresh, unseen_for, &says)
        });
        // Discovery holds BE before the first pod list and while no pod is an LC: that is the
        // reason then, whatever the (holder's) latency source says.
        let statics = self.config.static_lcs().len();
        let reason = self
            .kube
            .as_ref()
            .and_then(|k| k.holding(statics))
            .or(reason);
        self.publisher
            .metrics
            .be_held_off_reason(reason.as_ref().map(|(l, _)| *l), &held_off::REASONS);
        self.publisher.be_held_off = reason.map(|(_, line)| line);
    }
}

/// The thread treatment a service's own `[lc.threads]` asks for (as the safety rules give the
/// first service's: pinned onto its `cpus`, every CPU where it names none).
pub(super) fn service_treatment(
    lc: &headroom_control::config::LcConfig,
    machine_cpus: &[u32],
) -> headroom_types::allocation::LcTreatment {
    let t = &lc.threads;
    headroom_types::allocation::LcTreatment {
        pin_cpus: t.pin.then(|| {
            if t.cpus.is_empty() {
                headroom_types::CpuSet::from(machine_cpus)
            } else {
                t.cpus.clone()
            }
        }),
        slice_us: t.slice_us,
        fifo_priority: t.fifo_priority,
        cpu_weight: None,
    }
}

/// Puts the calling (control loop) thread above every CFS thread, so a BE or LC thread filling
/// every CPU cannot delay the tick that shrinks BE; nice -20 where FIFO is refused.
fn raise_control_loop_priority(fifo_priority: u8) {
    use headroom_host::sched::{set_sched_reset_on_fork, SchedPolicy};
    if fifo_priority == 0 {
        return;
    }
    // Reset on fork: BE and LC commands the supervisor launches must not inherit SCHED_FIFO.
    match set_sched_reset_on_fork(
        0,
        SchedPolicy::Fifo {
            priority: u32::from(fifo_priority),
        },
    ) {
        Ok(()) => tracing::info!(priority = fifo_priority, "control loop runs SCHED_FIFO"),
        Err(fifo) => match set_sched_reset_on_fork(
            0,
            SchedPolicy::Other {
                nice: -20,
                slice_ns: None,
            },
        ) {
            Ok(()) => {
                tracing::warn!(error = %fifo, "SCHED_FIFO refused; control loop runs at nice -20")
            }
            Err(nice) => {
                tracing::warn!(fifo = %fifo, nice = %nice, "control loop keeps its scheduling")
            }
        },
    }
}
