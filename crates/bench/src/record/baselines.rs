//! LC alone (capacity, SLO, peak) and BE alone: the baselines every experiment measures first,
//! stored so a resumed run does not measure them again.

use std::net::SocketAddr;

use super::capacity_search::{
    capacity_search, held_by_majority_of_known, held_every_time_known, highest_confirmed, Outcome,
    CONFIRM_STEPS, PEAK_RUNS,
};
use super::noise_floor::{NoiseFloor, LOW_LOAD_QPS};
use super::{default_serve, Session};
use crate::error::{BenchError, Result};
use crate::runner::{self, read_progress, BeSpec};
use crate::stats;
use crate::validity::{self, LoadShape, Measured, RateVerdict};
use headroom_report::model::{LcBaseline, LoadMetrics, Probe, SoloBaseline};
use headroom_report::store::BASELINES;

/// A probe's progress line: what it achieved, and for an invalid one which check failed.
fn probe_line(qps: f64, shape: &LoadShape, m: &LoadMetrics) -> String {
    format!(
        "  probe {:>8.0} QPS: achieved {:>8.0}, p99 {} µs ({}){}",
        qps,
        m.achieved_qps,
        m.percentile_us(99.0)
            .map_or("–".into(), |v| format!("{v:.0}")),
        shape.describe(),
        if m.valid {
            String::new()
        } else {
            format!("  INVALID: {}", validity::short_reason(m))
        }
    )
}

impl Session<'_> {
    /// LC alone: capacity, the SLO, and the peak QPS meeting the SLO (stored; resumed when present).
    pub fn lc_baseline(&mut self) -> Result<LcBaseline> {
        if let Some(b) = self.dir.load::<LcBaseline>(BASELINES, "lc")? {
            self.resumed += 1;
            self.apply_baseline(&b)?;
            return Ok(b);
        }
        (self.progress)("LC alone: finding capacity, SLO and peak ...");
        let (mut serve, addr) = self.runner.start_serve(&default_serve())?;
        let mut b = LcBaseline {
            commands: vec![serve.command.clone()],
            ..Default::default()
        };
        b.commands.push(self.runner.preload(addr)?);
        let result = self.find_peak(addr, &mut b);
        serve.stop();
        result?;
        self.dir.save(BASELINES, "lc", &b)?;
        self.apply_baseline(&b)?;
        Ok(b)
    }

    pub(super) fn apply_baseline(&mut self, b: &LcBaseline) -> Result<()> {
        self.manifest.slo_us = b.slo_us;
        self.manifest.slo_source = b.slo_source.clone();
        self.manifest.peak_qps = Some(b.peak_qps);
        self.manifest.peak_source = b.peak_source.clone();
        self.save_manifest()
    }

    /// One measurement at `qps` for `purpose`: run, and while its self-checks fail, run again
    /// with the configuration they call for ([`validity::measure_valid`]). Every run is kept in
    /// the baseline; the valid one is marked used, and its configuration kept for later runs.
    pub(super) fn probe(
        &mut self,
        addr: SocketAddr,
        qps: f64,
        purpose: &str,
        b: &mut LcBaseline,
    ) -> Result<Measured> {
        let seconds = self.opts.probe_s();
        self.probe_for(addr, qps, seconds, purpose, b)
    }

    /// [`Self::probe`] with runs of `seconds`.
    fn probe_for(
        &mut self,
        addr: SocketAddr,
        qps: f64,
        seconds: f64,
        purpose: &str,
        b: &mut LcBaseline,
    ) -> Result<Measured> {
        let json = self.dir.scratch_path("probe.json")?;
        let runner = self.runner.clone();
        let shape = runner.shape_for(qps, seconds);
        let progress = &mut self.progress;
        let mut commands = Vec::new();
        let measured = validity::measure_valid(shape, runner.placement.loadgen_threads(), |s| {
            let (m, _, cmd) = runner.run_load_shaped(addr, qps, s, &json, None)?;
            progress(&probe_line(qps, s, &m));
            commands.push(cmd);
            Ok(m)
        })?;
        for cmd in commands {
            if b.commands.len() < 6 {
                b.commands.push(cmd);
            }
        }
        let used = measured.used_index();
        for (i, a) in measured.attempts.iter().enumerate() {
            b.probes.push(Probe {
                target_qps: qps,
                valid: a.metrics.valid,
                used: used == Some(i),
                purpose: purpose.into(),
                config: a.shape.describe(),
                correction: a.change.clone(),
                metrics: a.metrics.clone(),
            });
        }
        if let Some(v) = measured.valid() {
            self.runner.adopt(&v.shape);
        }
        Ok(measured)
    }

    /// The tails of `want` measurements at `qps` whose self-checks all passed (at most 2 × `want`
    /// tried), for the low-load anchor and the SLO. A measurement that passed only on the
    /// "independence alone failed after a longer run" rule ([`validity::Measured::valid`]) is kept
    /// for the record but not used (`"used": false`): the capacity and the SLO come from valid
    /// runs only. None valid: the error that stops the bench, with the fix.
    fn valid_tails(
        &mut self,
        addr: SocketAddr,
        qps: f64,
        purpose: &str,
        want: usize,
        b: &mut LcBaseline,
    ) -> Result<Vec<f64>> {
        let p = self.opts.percentile;
        let mut tails = Vec::new();
        let mut last = None;
        for _ in 0..want * 2 {
            let start = b.probes.len();
            let m = self.probe(addr, qps, purpose, b)?;
            match m.valid() {
                Some(a) if a.metrics.valid => tails.extend(a.metrics.percentile_us(p)),
                _ => b.probes[start..].iter_mut().for_each(|pr| pr.used = false),
            }
            last = Some(m);
            if tails.len() >= want {
                break;
            }
        }
        match last {
            // Nothing is derived from runs that failed their checks: the figure is unknown
            // here, and the message says why and what would make it known.
            Some(m) if tails.is_empty() => Err(BenchError::Unavailable(format!(
                "LC alone at {qps:.0} QPS ({purpose}): unknown here, nothing was derived from these runs: {}. This host's noise keeps the load generator's self-checks from trusting a p{p} at this rate, so it cannot show a colocation difference; run on a quieter machine, give the load generator CPUs of its own (--loadgen-cpus), or give --peak-qps and --slo-us",
                m.stop("the runs", self.runner.placement.loadgen.len())
            ))),
            _ => Ok(tails),
        }
    }

    /// Whether the LC alone holds `qps` with its tail within `bound_us`, from valid probes: one
    /// that holds decides; one that does not is repeated, and the rate holds if 2 of 3 do (a
    /// single probe hit by a host hiccup, p99 3.8 ms at 20k QPS between 160 µs probes at 17.5k
    /// and 19.4k, otherwise stopped a capacity search at a quarter of the LC's capacity).
    /// A rate no corrected run measures validly is beyond the LC when the failure is the LC's
    /// (sends waited for the depth cap, the tail drifted: [`validity::server_limited`]); one the
    /// instrument could not measure validly, rerun as long as its checks asked
    /// ([`validity::MAX_RERUN_S`]), is *unknown here* with the reason — never "not held": the
    /// host's noise says nothing about the LC. The low-load tail and the SLO's probes must be
    /// valid ([`Self::valid_tails`]).
    pub(super) fn holds_at(
        &mut self,
        addr: SocketAddr,
        qps: f64,
        bound_us: f64,
        purpose: &str,
        b: &mut LcBaseline,
    ) -> Result<Outcome> {
        let p = self.opts.percentile;
        let mut beyond = false;
        held_by_majority_of_known(|| {
            if beyond {
                return Ok(Outcome::NotHeld);
            }
            let m = self.probe(addr, qps, purpose, b)?;
            let what = format!("LC alone at {qps:.0} QPS ({purpose})");
            let cpus = self.runner.placement.loadgen.len();
            let verdict = match validity::judge(&m, qps, p, bound_us, &what, cpus) {
                Ok(v) => v,
                Err(e @ crate::BenchError::Invalid { .. }) => {
                    let why = validity::short_reason(&m.last().metrics);
                    (self.progress)(&format!(
                        "  {qps:.0} QPS: unknown here (no valid run after {}: {why}); not used",
                        tried_runs(&m)
                    ));
                    tracing::info!(error = %e, "a probe the instrument could not measure validly");
                    return Ok(Outcome::Unknown(format!(
                        "{qps:.0} QPS could not be measured validly here ({}: {why})",
                        tried_runs(&m)
                    )));
                }
                Err(e) => return Err(e),
            };
            match verdict {
                RateVerdict::Held => Ok(Outcome::Held),
                RateVerdict::NotHeld => Ok(Outcome::NotHeld),
                RateVerdict::Beyond => {
                    (self.progress)(&format!(
                        "  {qps:.0} QPS: beyond the LC alone (no valid run: {}); not used",
                        validity::short_reason(&m.last().metrics)
                    ));
                    beyond = true;
                    Ok(Outcome::NotHeld)
                }
            }
        })
    }

    /// Whether one measurement of `seconds` at `qps` holds the rate with the tail within
    /// `bound_us`. A rate the instrument cannot measure validly for that long (rerun as long as
    /// its checks asked) is unknown here, with the reason.
    fn holds_for(
        &mut self,
        addr: SocketAddr,
        qps: f64,
        bound_us: f64,
        seconds: f64,
        purpose: &str,
        b: &mut LcBaseline,
    ) -> Result<Outcome> {
        let p = self.opts.percentile;
        let m = self.probe_for(addr, qps, seconds, purpose, b)?;
        let what = format!("LC alone at {qps:.0} QPS ({purpose})");
        let cpus = self.runner.placement.loadgen.len();
        let held = match validity::judge(&m, qps, p, bound_us, &what, cpus) {
            Ok(RateVerdict::Held) => return Ok(Outcome::Held),
            Ok(RateVerdict::NotHeld) => m.valid().map_or_else(
                || "no valid run".to_string(),
                |a| {
                    format!(
                        "p{} {} µs, achieved {:.0} QPS",
                        headroom_report::plot::trim_num(p),
                        a.metrics
                            .percentile_us(p)
                            .map_or("–".into(), |v| format!("{v:.0}")),
                        a.metrics.achieved_qps
                    )
                },
            ),
            Ok(RateVerdict::Beyond) => format!(
                "no valid run, the LC's: {}",
                validity::short_reason(&m.last().metrics)
            ),
            Err(crate::BenchError::Invalid { .. }) => {
                let why = validity::short_reason(&m.last().metrics);
                (self.progress)(&format!(
                    "  {qps:.0} QPS for {seconds:.0} s: unknown here (no valid run after {}: {why})",
                    tried_runs(&m)
                ));
                return Ok(Outcome::Unknown(format!(
                    "{qps:.0} QPS for {seconds:.0} s could not be measured validly here ({}: {why})",
                    tried_runs(&m)
                )));
            }
            Err(e) => return Err(e),
        };
        (self.progress)(&format!(
            "  {qps:.0} QPS not held for {seconds:.0} s within {bound_us:.0} µs ({held})"
        ));
        Ok(Outcome::NotHeld)
    }

    /// The highest of `qps`, 7/8 of it, … ([`CONFIRM_STEPS`] at most) that the LC alone holds
    /// for `seconds`, the length of the experiment's own runs. A search of 1-2 s probes is
    /// fooled near saturation: a queue that grows slowly, or a load generator that falls behind
    /// in bursts, does not show in a second (on the 2-vCPU VM a 1 s probe held 250k QPS at p99
    /// 852 µs; 2-5 s runs at 187k-219k read 30-39 ms, and the colocation's 10 s windows at 87%
    /// of the peak found from those probes read 34 ms with BE off).
    /// `runs`: how many runs in a row each rate must hold (the peak's: [`PEAK_RUNS`]).
    /// A rate whose runs stay refused is unknown here: the step-down stops there and keeps it
    /// (the host's noise is no reason to shrink it), with the reason in the second value.
    fn confirmed(
        &mut self,
        addr: SocketAddr,
        qps: f64,
        bound_us: f64,
        purpose: &str,
        runs: usize,
        b: &mut LcBaseline,
    ) -> Result<(f64, Option<String>)> {
        let seconds = self.confirm_s();
        let mut lowest = qps;
        let held = highest_confirmed(qps, CONFIRM_STEPS, |q| {
            lowest = q;
            held_every_time_known(runs, || {
                self.holds_for(addr, q, bound_us, seconds, purpose, b)
            })
        })?;
        match held {
            Some((q, Outcome::Unknown(why))) => {
                (self.progress)(&format!(
                    "  {purpose}: {q:.0} QPS kept, not confirmed: {why}"
                ));
                Ok((q, Some(why)))
            }
            Some((q, _)) => Ok((q, None)),
            None => Err(BenchError::Unavailable(format!(
                "the LC alone held no rate from {qps:.0} down to {lowest:.0} QPS for {seconds:.0} s within {bound_us:.0} µs ({purpose}): see the probes in {}; give --peak-qps and --slo-us, or more --server-cpus",
                self.dir.root().display()
            ))),
        }
    }

    /// The length of a confirmation run: the experiment's own run length, within the probes'.
    fn confirm_s(&self) -> f64 {
        self.opts
            .duration_s
            .clamp(self.opts.probe_s(), validity::MAX_PROBE_S)
    }

    pub(super) fn find_peak(&mut self, addr: SocketAddr, b: &mut LcBaseline) -> Result<()> {
        let p = self.opts.percentile;
        // The low-load tail anchors the capacity knee: the median of 3 probes, so one probe
        // hit by other work on the machine does not move the knee tenfold.
        // With --peak-qps and --slo-us given nothing below needs it: a host too noisy to
        // measure it is then said, not a stop.
        let given = self.opts.peak_qps.is_some() && self.opts.slo_us.is_some();
        let low_tails = match self.valid_tails(addr, LOW_LOAD_QPS, "low load", 3, b) {
            Ok(t) => t,
            Err(BenchError::Unavailable(why)) if given => {
                (self.progress)(&format!("  {why}"));
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        b.low_load_p99_us = stats::median(&low_tails);
        let low_tail = b.low_load_p99_us.unwrap_or(100.0);
        // The host's own noise first: the client's wake-up lateness and the LC's stalls at a
        // low rate, where the LC has no queue. Nothing below it can be told apart from noise.
        let noise = NoiseFloor::from_probes(&b.probes);
        (self.progress)(&noise.line());
        let mut cannot: Vec<String> = noise.cannot_show().into_iter().collect();
        // Capacity: the highest rate the LC sustains (rate self-check passes) before its tail
        // leaves the flat part of the curve (10x the low-load tail, at least 1 ms), measured by
        // a load generator with CPU to spare. A saturated client still reaches its rate, but its
        // tail is its own queue: on a 2-CPU VM the search otherwise found "capacity" 260k QPS
        // with send lag p99 0.8 ms, and LC alone then broke the SLO at 69% of that peak.
        let knee = (10.0 * low_tail).max(1000.0);
        let mut unknown_notes: Vec<String> = Vec::new();
        let capacity = if let Some(peak) = self.opts.peak_qps {
            peak
        } else {
            let search = capacity_search(10_000.0, 9, 4, |q| {
                self.holds_at(addr, q, knee, "capacity", b)
            })?;
            if search.qps <= 0.0 {
                return Err(BenchError::Unavailable(match &search.unknown {
                    Some((_, why)) => format!(
                        "LC alone: capacity unknown here: {why}. This host cannot show a colocation difference: its own noise ({}) keeps the load generator's self-checks from trusting a p{p} at the rates the search needs. Run on a quieter machine, give the load generator CPUs of its own (--loadgen-cpus), or give --peak-qps and --slo-us; the probes are in {}",
                        noise.summary(),
                        self.dir.root().display()
                    ),
                    None => format!(
                        "the LC alone could not sustain 10000 QPS within p{p} ≤ {knee:.0} µs with the load generator unsaturated: see the probes in {}",
                        self.dir.root().display()
                    ),
                }));
            }
            if let Some((q, why)) = &search.unknown {
                let note = format!(
                    "capacity at least {:.0} QPS: unknown here from {q:.0} QPS ({why})",
                    search.qps
                );
                (self.progress)(&format!("  {note}"));
                unknown_notes.push(note);
            }
            let (c, unknown) =
                self.confirmed(addr, search.qps, knee, "capacity confirmation", 1, b)?;
            unknown_notes
                .extend(unknown.map(|w| format!("capacity confirmation unknown here ({w})")));
            c
        };
        b.capacity_qps = capacity;
        // SLO: given, or 5x the LC-alone tail at 50% of capacity (median of 3 probes).
        if let Some(slo) = self.opts.slo_us {
            b.slo_us = slo;
            b.slo_source = "set with --slo-us".into();
        } else {
            let tails = self.valid_tails(addr, capacity * 0.5, "slo", 3, b)?;
            let med = stats::median(&tails).unwrap_or(low_tail);
            let from_lc = (5.0 * med).round();
            let floor = noise.floor_us().map(f64::round);
            match floor {
                Some(f) if f > from_lc => {
                    b.slo_us = f;
                    b.slo_source = format!(
                        "the host's noise floor ({}), above 5 × the LC-alone p{} at 50% of capacity ({med:.0} µs → {from_lc:.0} µs)",
                        noise.summary(),
                        headroom_report::plot::trim_num(p)
                    );
                    if f >= knee {
                        cannot.push(format!(
                            "the LC's own stalls at {LOW_LOAD_QPS:.0} QPS (p99.9 {:.0} µs) reach its saturation knee ({knee:.0} µs): BE's effect cannot be told from the host's noise",
                            noise.p999_us.unwrap_or(f64::NAN)
                        ));
                    }
                }
                _ => {
                    b.slo_us = from_lc;
                    b.slo_source = format!(
                        "5 × the LC-alone p{} at 50% of capacity ({med:.0} µs), above the host's noise floor ({})",
                        headroom_report::plot::trim_num(p),
                        noise.summary()
                    );
                }
            }
        }
        // Peak: the highest rate ≤ capacity at which the LC alone meets the SLO.
        if let Some(peak) = self.opts.peak_qps {
            b.peak_qps = peak;
            b.peak_source = "set with --peak-qps".into();
        } else {
            let slo = b.slo_us;
            let peak = match self.holds_at(addr, capacity, slo, "peak", b)? {
                Outcome::Held => capacity,
                Outcome::Unknown(why) => {
                    // Unknown at capacity: kept, not shrunk for the host's noise; the
                    // confirmation below decides.
                    unknown_notes.push(format!("peak at capacity unknown here ({why})"));
                    capacity
                }
                Outcome::NotHeld => {
                    let (mut lo, mut hi) = (capacity * 0.5, capacity);
                    for _ in 0..4 {
                        let mid = (lo + hi) / 2.0;
                        match self.holds_at(addr, mid, slo, "peak", b)? {
                            Outcome::Held => lo = mid,
                            Outcome::NotHeld => hi = mid,
                            Outcome::Unknown(why) => {
                                unknown_notes.push(format!(
                                    "peak at least {lo:.0} QPS, unknown here from {mid:.0} QPS ({why})"
                                ));
                                break;
                            }
                        }
                    }
                    lo
                }
            };
            let (peak, unknown) =
                self.confirmed(addr, peak, slo, "peak confirmation", PEAK_RUNS, b)?;
            unknown_notes.extend(unknown.map(|w| format!("peak confirmation unknown here ({w})")));
            b.peak_qps = peak.round();
            b.peak_source = format!(
                "highest rate with LC alone meeting the SLO in {PEAK_RUNS} runs of {:.0} s in a row (capacity {capacity:.0} QPS: rate sustained with p{} ≤ {knee:.0} µs and the load generator below {:.0}% CPU, for {:.0} s){}",
                self.confirm_s(),
                headroom_report::plot::trim_num(p),
                headroom_load::checks::CPU_SATURATED * 100.0,
                self.confirm_s(),
                if unknown_notes.is_empty() {
                    String::new()
                } else {
                    format!("; {}", unknown_notes.join("; "))
                }
            );
        }
        for why in &cannot {
            (self.progress)(&format!("  this host cannot show a difference here: {why}"));
        }
        (self.progress)(&format!(
            "LC alone: capacity {:.0} QPS, SLO p{} ≤ {:.0} µs, peak {:.0} QPS",
            b.capacity_qps,
            headroom_report::plot::trim_num(p),
            b.slo_us,
            b.peak_qps
        ));
        Ok(())
    }

    /// A BE workload alone on the server CPUs: its ops/s, the EMU denominator.
    pub fn solo(&mut self, be: &BeSpec) -> Result<SoloBaseline> {
        let id = format!("solo-{}-{}t", be.label(), be.threads);
        self.solo_as(be, &id)
    }

    /// [`Session::solo`] stored under `id`.
    pub fn solo_as(&mut self, be: &BeSpec, id: &str) -> Result<SoloBaseline> {
        let id = id.to_string();
        // Long enough for several progress lines; no longer than a point or a window needs.
        let seconds = self.opts.duration_s.clamp(3.0, 10.0);
        let dir = self.dir.clone();
        let runner = self.runner.clone();
        let (b, resumed) = dir.get_or_record(BASELINES, &id, || {
            let progress = dir.scratch_path(&format!("{id}.progress.jsonl"))?;
            let _ = std::fs::remove_file(&progress);
            let mut p = runner.start_antagonist(be, &progress)?;
            let ran = runner::run_for(&mut p, seconds);
            p.stop();
            ran?;
            let samples = read_progress(&progress);
            let rate = samples
                .first()
                .zip(samples.last())
                .and_then(|(a, z)| stats::counter_rate(&samples, a.0, z.0));
            let per_cpu = crate::runner::progress_cpu_span(&progress).and_then(|(a, z)| {
                let cpu = z.1 - a.1;
                (cpu > 0.05).then(|| (z.0 - a.0) / cpu)
            });
            match rate {
                Some(r) if r > 0.0 => Ok(SoloBaseline {
                    kind: be.label(),
                    ops_per_s: per_cpu.map_or(r, |p| (p * be.threads.max(1) as f64).max(r)),
                    measured_ops_per_s: r,
                    ops_per_cpu_s: per_cpu,
                    seconds,
                    commands: vec![p.command.clone()],
                }),
                _ => Err(BenchError::Unavailable(format!(
                    "`{}` wrote no usable progress to {} in {seconds} s",
                    p.command,
                    progress.display()
                ))),
            }
        })?;
        if resumed && !self.baselines_recorded.contains(&id) {
            self.resumed += 1;
        }
        if !resumed {
            self.baselines_recorded.insert(id);
            (self.progress)(&format!(
                "BE {} alone: {:.0} ops/s",
                be.label(),
                b.ops_per_s
            ));
        }
        Ok(b)
    }
}

/// "3 runs (8 s, 16 s, 32 s)": what a measurement tried before it was refused.
fn tried_runs(m: &validity::Measured) -> String {
    let secs: Vec<String> = m
        .attempts
        .iter()
        .map(|a| format!("{:.0} s", a.shape.seconds))
        .collect();
    format!(
        "{} run{} ({})",
        m.attempts.len(),
        if m.attempts.len() == 1 { "" } else { "s" },
        secs.join(", ")
    )
}
