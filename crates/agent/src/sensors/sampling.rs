//! Taking one tick's sample: the per-tick idle and LC signals, and every [`SLOW_PERIOD`] the
//! slow sample (LC threads, group usage, PSI, memory).

use super::*;

impl Sensors {
    /// One tick's observation, updated in place (see [`Sensors::last`]): the slow fields are
    /// copied only when the slow sample changed, and the per-CPU idle buffer is reused, so a
    /// steady tick allocates nothing.
    pub fn sample(&mut self, now: Instant) -> &Observation {
        // A tick answering an idle crossing does not take the slow sample (LC threads, /proc
        // and cgroup reads: hundreds of µs on a small VM) before its writes: the periodic tick
        // after it does, unless it is a whole period overdue.
        let crossing = self.idle_events && self.idle_event_count.is_some();
        if now >= self.slow_due && (!crossing || now >= self.slow_due + SLOW_PERIOD) {
            self.slow_due = now + SLOW_PERIOD;
            self.sample_slow(now);
            // keep the idle buffer: it is overwritten below
            let idle_buf = self.current.cpu_idle.take();
            self.current = self.slow.clone();
            self.current.cpu_idle = idle_buf;
        }
        let obs = &mut self.current;
        // The fast fields: what this tick measured, `None` where nothing was (the slow sample
        // never fills them).
        let mut idle_error = None;
        match self.idle.as_mut().map(IdleSource::sample) {
            Some(Ok(per_cpu)) => {
                let buf = obs.cpu_idle.get_or_insert_with(Vec::new);
                buf.clear();
                for &(cpu, frac) in per_cpu {
                    if buf.len() <= cpu {
                        buf.resize(cpu + 1, 0.0);
                    }
                    buf[cpu] = frac;
                }
            }
            Some(Err(e)) => {
                obs.cpu_idle = None;
                idle_error = Some(e);
            }
            None => obs.cpu_idle = None,
        }
        // Event-driven: a tick woken by a crossing sees the count the kernel computed at the
        // crossing — not the count now, which the agent's own wake-up lowers by the CPU it
        // runs on (a rise to the high threshold would read as one CPU short). A periodic tick
        // uses the idle fractions since the last tick, as polling does.
        obs.idle_cpus = if self.idle_events {
            self.idle_event_count.take().map(|c| c.max(0) as f64)
        } else {
            None
        };
        obs.lc_latency_us = None;
        obs.lc_latency_age_ms = None;
        obs.lc_latency_untrusted = None;
        if let Some(cell) = &self.signals.latency {
            if let Some(r) = cell.latest() {
                obs.lc_latency_us = Some(r.value);
                obs.lc_latency_age_ms =
                    Some(now.saturating_duration_since(r.at).as_millis() as u64);
            }
        }
        if let Some(shared) = &self.signals.latency_sources {
            let s = shared.sources();
            obs.lc_latency_kernel_us = s.kernel_us;
            obs.lc_latency_probe_us = s.probe_us;
            obs.lc_latency_source = Some(s.chosen);
            obs.lc_latency_untrusted = s.untrusted;
        }
        obs.lc_qps = None;
        obs.lc_load = None;
        obs.lc_load_age_ms = None;
        if let Some(cell) = &self.signals.qps {
            if let Some(r) = cell.latest() {
                obs.lc_qps = Some(r.value);
                obs.lc_load = self
                    .signals
                    .peak_qps
                    .filter(|p| *p > 0.0)
                    .map(|p| r.value / p);
                obs.lc_load_age_ms = Some(now.saturating_duration_since(r.at).as_millis() as u64);
            }
        }
        if self.list_services || !self.more_lcs.is_empty() {
            // Every service in the config's order; the first from the fields above.
            let mut groups = std::mem::take(&mut obs.lc_groups);
            if let Some(g) = groups.first_mut() {
                let label = self.signals.latency_label.map(str::to_string);
                lc_services::first_service(&self.lc_name, obs, label, g);
            }
            for (i, g) in groups.iter_mut().skip(1).enumerate() {
                // By position, checked by name: a service added or dropped since the last
                // slow sample must not lend its readings to another.
                let s = match self.more_lcs.get(i) {
                    Some(s) if s.name == g.name => Some(s),
                    _ => self.more_lcs.iter().find(|s| s.name == g.name),
                };
                if let Some(s) = s {
                    s.sample_fast(g, now);
                }
            }
            obs.lc_groups = groups;
        }
        if let Some(e) = idle_error {
            self.count_error("cpu_idle", &e);
        }
        &self.current
    }

    fn sample_slow(&mut self, now: Instant) {
        let mut o = Observation::default();
        // LC threads: their CPUs (union of affinities) and run-queue delay. The thread list
        // (a cgroup pid-list read, the dearest read here) is refreshed once a second, or at
        // once while empty; the known threads' affinity and schedstat every slow sample.
        self.slow_count += 1;
        let refresh = self.lc_tids.is_empty() || self.slow_count % THREAD_LIST_EVERY_SLOW == 1;
        let listed = if refresh {
            self.cgroups
                .threads(&self.lc)
                .inspect(|t| self.lc_tids.clone_from(t))
        } else {
            Ok(self.lc_tids.clone())
        };
        match listed {
            Ok(tids) if !tids.is_empty() => {
                let mut cpus: Vec<u32> = Vec::new();
                let (mut wait, mut slices) = (0u64, 0u64);
                let mut seen = BTreeMap::new();
                let mut kept = BTreeMap::new();
                for &tid in &tids {
                    if let Ok(set) = headroom_host::sched::affinity(tid) {
                        cpus.extend(set.iter());
                    }
                    // Readers stay open across samples (one pread each, not an open).
                    let reader = match self.schedstat_readers.remove(&tid) {
                        Some(r) => Some(r),
                        None => self.host.schedstat(tid, tid).ok(),
                    };
                    if let Some(mut r) = reader {
                        if let Ok(s) = r.read() {
                            if let Some((w0, n0)) = self.runq_prev.get(&tid) {
                                wait += s.wait_ns.saturating_sub(*w0);
                                slices += s.timeslices.saturating_sub(*n0);
                            }
                            seen.insert(tid, (s.wait_ns, s.timeslices));
                            kept.insert(tid, r);
                        }
                    }
                }
                self.runq_prev = seen;
                // threads gone since the last sample drop their readers here
                self.schedstat_readers = kept;
                cpus.sort_unstable();
                cpus.dedup();
                o.lc_cpus = (!cpus.is_empty()).then_some(cpus);
                if slices > 0 {
                    o.lc_runq_delay_us = Some(wait as f64 / slices as f64 / 1000.0);
                }
            }
            Ok(_) => {}
            Err(e) => self.count_error("lc_threads", &e),
        }
        // Group CPU usage in CPUs since the last slow sample.
        let lc_ns = self.cgroups.cpu_usage_ns(&self.lc);
        let be_ns: Result<u64, _> = self.be.iter().map(|g| self.cgroups.cpu_usage_ns(g)).sum();
        match (lc_ns, be_ns) {
            (Ok(lc), Ok(be)) => {
                if let Some((t, lc0, be0)) = self.usage_prev {
                    let dt = now.saturating_duration_since(t).as_nanos().max(1) as f64;
                    o.lc_cpu_usage = Some(lc.saturating_sub(lc0) as f64 / dt);
                    o.be_cpu_usage = Some(be.saturating_sub(be0) as f64 / dt);
                }
                self.usage_prev = Some((now, lc, be));
            }
            (Err(e), _) | (_, Err(e)) => self.count_error("cgroup_cpu_usage", &e),
        }
        // PSI's shortest average is over 10 s: once a second is plenty.
        let psi_due = self.slow_count % PSI_EVERY_SLOW == 1;
        if !psi_due {
            o.psi_cpu_some = self.slow.psi_cpu_some;
            o.psi_memory_some = self.slow.psi_memory_some;
            o.psi_memory_full = self.slow.psi_memory_full;
            o.psi_io_some = self.slow.psi_io_some;
        }
        for (res, name) in [
            (PsiResource::Cpu, "psi_cpu"),
            (PsiResource::Memory, "psi_memory"),
            (PsiResource::Io, "psi_io"),
        ]
        .into_iter()
        .filter(|_| psi_due)
        {
            match self.host.psi(res) {
                Ok(p) => match res {
                    PsiResource::Cpu => o.psi_cpu_some = Some(p.some.avg10),
                    PsiResource::Memory => {
                        o.psi_memory_some = Some(p.some.avg10);
                        o.psi_memory_full = p.full.map(|f| f.avg10);
                    }
                    PsiResource::Io => o.psi_io_some = Some(p.some.avg10),
                },
                Err(e) => self.count_error(name, &e),
            }
        }
        if let Some(p) = self.power.as_mut() {
            let lc_cpus = o.lc_cpus.clone().unwrap_or_default();
            let (w, tdp, lc_mhz, be_mhz) = p.sample(now, &lc_cpus, &self.be_cpus);
            o.power_w = w;
            o.tdp_w = tdp;
            o.lc_freq_mhz = lc_mhz;
            o.be_freq_mhz = be_mhz;
        }
        if let Some(e) = self.egress.as_mut() {
            if psi_due {
                e.last_values = e.sample(now);
            }
            o.lc_tx_bytes_per_s = e.last_values.0;
            o.be_tx_bytes_per_s = e.last_values.1;
            o.link_bytes_per_s = Some(e.link_bytes_per_s);
        }
        if let Some(d) = self.dram.as_mut() {
            let (total, be) = d.sample(now);
            o.dram_bw_bytes_per_s = total;
            o.be_dram_bw_bytes_per_s = be;
        }
        match self.host.meminfo() {
            Ok(m) => {
                o.mem_available_bytes = Some(m.available);
                o.mem_total_bytes = Some(m.total);
            }
            Err(e) => self.count_error("meminfo", &e),
        }
        let be_mem: Result<u64, _> = self.be.iter().map(|g| self.cgroups.memory_usage(g)).sum();
        match be_mem {
            Ok(b) => o.be_memory_bytes = Some(b),
            Err(e) => self.count_error("be_memory", &e),
        }
        // The LC groups' charge, page cache included (be-memory never counts it as room).
        let lc_mem: Result<u64, _> = std::iter::once(&self.lc)
            .chain(self.more_lcs.iter().map(|s| &s.group))
            .map(|g| self.cgroups.memory_usage(g))
            .sum();
        match lc_mem {
            Ok(b) => o.lc_memory_bytes = Some(b),
            Err(e) => self.count_error("lc_memory", &e),
        }
        if self.list_services || !self.more_lcs.is_empty() {
            let mut first = headroom_types::observation::LcGroupObservation::default();
            lc_services::first_service(&self.lc_name, &o, None, &mut first);
            let mut groups = vec![first];
            let mut errors = Vec::new();
            for s in &mut self.more_lcs {
                groups.push(s.sample_slow(&self.cgroups, now, refresh, &mut errors));
            }
            for (name, e) in errors {
                self.count_error(name, &e);
            }
            o.lc_groups = groups;
        }
        self.slow = o;
    }
}
