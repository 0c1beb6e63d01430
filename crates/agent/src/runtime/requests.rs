//! Control requests (`headroom ctl`), answered by the loop between ticks so a command never
//! races a reconciliation, and the status it reports.

use super::*;

impl Agent {
    /// Answers every queued request; `rung`: the doorbell woke the loop (clear it first).
    /// Whether one was answered.
    pub(super) fn handle_requests(&mut self, rung: bool) -> bool {
        let Some(requests) = &self.requests else {
            return false;
        };
        let mut answered = false;
        for (req, reply) in requests.take(rung) {
            let response = self.answer(req);
            let _ = reply.send(response);
            answered = true;
        }
        answered
    }

    pub(super) fn t_ms(&self) -> u64 {
        tick_time(self.started.elapsed()).as_millis() as u64
    }

    fn answer(&mut self, req: Request) -> Response {
        match req {
            Request::Status => {
                let mut status = self.status();
                status.actuators.be_held = self.be_held_now();
                Response {
                    ok: true,
                    message: "ok".into(),
                    status: Some(Box::new(status)),
                }
            }
            Request::Pause => {
                let t_ms = self.t_ms();
                self.publisher.log_event(&CtlEvent::Pause { t_ms });
                self.controller.policy_mut().pause();
                self.publisher.metrics.paused.set(1.0);
                Response::ok("paused: holding the current allocation (safety rules still apply)")
            }
            Request::Resume => {
                let t_ms = self.t_ms();
                self.publisher.log_event(&CtlEvent::Resume { t_ms });
                self.controller.policy_mut().resume();
                self.publisher.metrics.paused.set(0.0);
                if !self.controller.is_actuating() && !self.options.dry_run {
                    self.controller.set_actuating(true);
                    self.publisher.metrics.actuating.set(1.0);
                    return Response::ok("resumed: actuating again");
                }
                Response::ok("resumed")
            }
            Request::Off => {
                let t_ms = self.t_ms();
                self.publisher.log_event(&CtlEvent::Off { t_ms });
                self.controller.set_actuating(false);
                self.publisher.metrics.actuating.set(0.0);
                self.lc_threads.restore(Some(self.node.cgroups()));
                match self.restore_originals() {
                    Ok(n) => Response::ok(format!(
                        "off: original settings restored ({n} writes); not actuating until `ctl resume`"
                    )),
                    Err(e) => {
                        Response::error(format!("off: actuation stopped, but restoring failed: {e}"))
                    }
                }
            }
            Request::Set { key, value } => {
                let mut updated = self.config.clone();
                // The same checks as at start, the machine's and the disks' included.
                if let Err(e) = updated
                    .set(&key, &value)
                    .and_then(|()| updated.validate_on(&self.machine.cpus))
                    .and_then(|()| super::on_host::check_io_devices(&self.options.root, &updated))
                    .and_then(|()| self.check_memory_limit(&updated))
                {
                    return Response::error(e.to_string());
                }
                let pids_warning = self.pids_limit_warning(&updated);
                match self.controller.policy_mut().set_param(&key, &value) {
                    Ok(()) => {
                        let t_ms = self.t_ms();
                        self.publisher.log_event(&CtlEvent::Set {
                            t_ms,
                            key: key.clone(),
                            value: value.clone(),
                        });
                        self.config = updated;
                        // The SLOs the metrics and status compare against follow a live change.
                        self.publisher.slo_us = self.config.lc().slo.target_us;
                        for (s, lc) in self.publisher.lcs.iter_mut().zip(&self.config.lcs) {
                            s.slo_us = lc.slo.target_us;
                        }
                        // A set is not written back (docs/policies.md): say so where it is made.
                        let said =
                            format!("{key} = {value} (for this run; the config file is unchanged)");
                        match pids_warning {
                            Some(w) => {
                                tracing::warn!("{w}");
                                Response::ok(format!("{said}; WARNING: {w}"))
                            }
                            None => Response::ok(said),
                        }
                    }
                    Err(e) => Response::error(e.to_string()),
                }
            }
        }
    }

    /// Refuses a new `safety.be_memory_limit_bytes` below what a BE group uses now: the start's
    /// rule ([`super::on_host::check_memory_limit`]), for a value that changed.
    fn check_memory_limit(&self, updated: &Config) -> Result<(), ConfigError> {
        let limit = updated.safety.be_memory_limit_bytes;
        if limit == self.config.safety.be_memory_limit_bytes {
            return Ok(());
        }
        super::on_host::check_memory_limit(self.node.cgroups(), &self.groups.be, limit)
    }

    /// The warning a new `safety.be_pids_max` below the tasks a BE group holds now gets
    /// ([`super::on_host::pids_limit_warning`]), for a value that changed.
    fn pids_limit_warning(&self, updated: &Config) -> Option<String> {
        let limit = updated.safety.be_pids_max;
        if limit == self.config.safety.be_pids_max {
            return None;
        }
        super::on_host::pids_limit_warning(self.node.cgroups(), &self.groups.be, limit)
    }

    /// Puts every original back (the kill switch, `on_exit = "restore"`); returns the writes.
    pub(super) fn restore_originals(&mut self) -> Result<usize, ActuationError> {
        let Some(act) = self.controller.actuation_mut() else {
            return Ok(0);
        };
        let report = act.restore_original(&mut self.node);
        self.controller.forget_applied();
        self.publisher.state_dirty = true;
        report.map(|r| r.writes.len())
    }

    /// Service `i` as `ctl status` shows it: from `obs.lc_groups` among several services,
    /// from the top-level fields with one.
    fn lc_status(
        &self,
        i: usize,
        lc: &headroom_control::config::LcConfig,
        obs: &headroom_types::observation::Observation,
    ) -> LcStatus {
        let slo = &lc.slo;
        let mut s = LcStatus {
            name: lc.name.clone(),
            priority: lc.priority,
            group: lc.cgroup.to_string(),
            slo_us: slo.target_us,
            percentile: slo.percentile,
            ..LcStatus::default()
        };
        // Among several services (or discovered ones) each by its name in `lc_groups`.
        let listed = obs.lc_groups.iter().find(|g| g.name == lc.name);
        match listed.filter(|_| self.config.lcs.len() > 1 || self.kube.is_some()) {
            Some(g) => {
                s.latency_us = g.latency_us;
                s.latency_age_ms = g.latency_age_ms;
                s.qps = g.qps;
                s.load = g.load;
                s.cpus.clone_from(&g.cpus);
                s.latency_source.clone_from(&g.latency_source);
            }
            None if i == 0 => {
                s.latency_us = obs.lc_latency_us;
                s.latency_age_ms = obs.lc_latency_age_ms;
                s.qps = obs.lc_qps;
                s.load = obs.lc_load;
                s.cpus.clone_from(&obs.lc_cpus);
                s.latency_source = obs.lc_latency_us.and_then(|_| {
                    obs.lc_latency_source.clone().or_else(|| {
                        lc.latency.as_ref().map(|l| {
                            serde_json::to_value(l.source)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default()
                        })
                    })
                });
            }
            None => {}
        }
        s.slack = s
            .latency_us
            .filter(|_| slo.target_us > 0.0)
            .map(|l| (slo.target_us - l) / slo.target_us);
        if i == 0 {
            s.latency_sources = self.node.sensors().and_then(|x| x.latency_sources());
        }
        s
    }

    /// What the kernel holds for each BE knob the write path manages, read now (a status is
    /// rare): the values last read went on showing `cpus 1` for a `cpuset.cpus` a controller
    /// disabled above BE had taken away (tenth hostile pass, cgroup v2). A file that is gone
    /// says so.
    fn be_held_now(&mut self) -> BTreeMap<String, String> {
        let knobs: Vec<headroom_control::actuation::Knob> = self
            .controller
            .actuation()
            .map(|a| {
                a.current()
                    .keys()
                    .filter(|k| {
                        matches!(k, headroom_control::actuation::Knob::Cgroup { group, .. }
                            if self.groups.be.contains(group))
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        knobs
            .iter()
            .map(|k| {
                let held = match headroom_control::node::Node::read(&mut self.node, k) {
                    Ok(v) => v.to_string(),
                    Err(e) if e.not_found => {
                        "gone (controller disabled above, or the group removed)".to_string()
                    }
                    Err(e) => format!("unreadable ({})", e.reason),
                };
                (headroom_control::node::Node::describe(&self.node, k), held)
            })
            .collect()
    }

    fn status(&self) -> AgentStatus {
        let blank = headroom_types::observation::Observation::default();
        let obs = self.node.sensors().map_or(&blank, |s| s.last());
        let p = &self.publisher;
        AgentStatus {
            policy: self.config.policy.kind.as_str().to_string(),
            pid: std::process::id(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            dry_run: self.options.dry_run,
            actuating: self.controller.is_actuating(),
            paused: self.controller.policy().is_paused(),
            ticks: p.summary.ticks,
            writes: p.summary.writes,
            write_errors: p.summary.write_errors,
            last_write_error: p.last_write_error.clone(),
            lc: self.lc_status(0, self.config.lc(), obs),
            lcs: self
                .config
                .lcs
                .iter()
                .chain(self.kube.iter().flat_map(|k| k.services()))
                .enumerate()
                .map(|(i, lc)| self.lc_status(i, lc, obs))
                .collect(),
            kubernetes: self.kube.as_ref().map(|k| k.set().clone()),
            advertise: self.advertise.as_ref().map(|a| a.status()),
            lock: self.group_lock.as_ref().map(|l| l.holder().clone()),
            tick_interval_ms: self.tick_interval.map(|d| d.as_secs_f64() * 1000.0),
            state_write_error: self.state_write_error.clone(),
            start_actions: self.start_actions.clone(),
            threads_held: Some(self.threads.len() as u64),
            state_set_aside: self
                .state_set_aside
                .as_ref()
                .map(|p| p.display().to_string()),
            binding_lc: p.last_binding_lc.clone(),
            idle_cpus: obs.idle_cpu_count(0.5),
            be_groups: self.groups.be.iter().map(|g| g.to_string()).collect(),
            be_commands: self
                .supervised
                .iter()
                .map(|s| BeCommandStatus {
                    name: s.name.clone(),
                    pid: s.pid(),
                    restarts: s.restarts,
                    last_exit: s.last_exit.clone(),
                })
                .collect(),
            allocation: p.last_allocation.clone(),
            last_reasons: p
                .reasons
                .iter()
                .rev()
                .map(|(t, r)| ReasonAt {
                    t_ms: *t,
                    reason: r.clone(),
                })
                .collect(),
            targets_followed: self
                .targets_followed
                .iter()
                .rev()
                .map(|(t, r)| ReasonAt {
                    t_ms: *t,
                    reason: r.clone(),
                })
                .collect(),
            sensor_errors: self
                .node
                .sensors()
                .map(|s| {
                    s.errors()
                        .iter()
                        .map(|(k, v)| (k.to_string(), *v))
                        .collect()
                })
                .unwrap_or_default(),
            machine_cpus: self.machine.cpus.clone(),
            actuators: ActuatorsStatus {
                active: self.node.active().iter().map(|s| s.to_string()).collect(),
                disabled: self
                    .node
                    .disabled()
                    .iter()
                    .map(|(n, r)| DisabledActuator {
                        actuator: n.to_string(),
                        reason: r.clone(),
                    })
                    .collect(),
                applied: self
                    .controller
                    .actuation()
                    .map(|a| {
                        a.current()
                            .iter()
                            .filter(|(k, _)| {
                                !matches!(k, headroom_control::actuation::Knob::Cgroup { .. })
                            })
                            .map(|(k, v)| {
                                (
                                    headroom_control::node::Node::describe(&self.node, k),
                                    v.to_string(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                // read from the kernel when the status is answered (`be_held_now`)
                be_held: Default::default(),
            },
            idle_sensor: self
                .node
                .sensors()
                .and_then(|s| s.idle_source())
                .unwrap_or("none")
                .to_string(),
            idle_sensing: self
                .node
                .sensors()
                .map_or("poll: no sensors", |s| s.idle_sensing())
                .to_string(),
            decision_log_lost_lines: p.log.as_ref().map(|l| l.lost),
            be_held_off: p.be_held_off.clone(),
            latency_source: self
                .signal_cells
                .iter()
                .find(|(n, _)| n == "latency")
                .map(|(_, c)| c.detail())
                .filter(|d| !d.is_empty()),
        }
    }
}
