//! LC alone (capacity, SLO, peak) and BE alone: the baselines every experiment measures first,
//! stored so a resumed run does not measure them again.

use std::net::SocketAddr;

use super::{default_serve, Session};
use crate::error::{BenchError, Result};
use crate::model::{LcBaseline, LoadMetrics, Probe, SoloBaseline};
use crate::runner::{self, read_progress, BeSpec};
use crate::stats;
use crate::store::BASELINES;
use crate::validity::{self, LoadShape, Measured, RateVerdict};

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
        let json = self.dir.scratch_path("probe.json")?;
        let runner = self.runner.clone();
        let shape = runner.shape_for(qps, self.opts.probe_s());
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

    /// A measurement that must be valid (the low-load tail, the SLO's probes): its metrics, or
    /// the error that stops the bench.
    fn valid_probe(
        &mut self,
        addr: SocketAddr,
        qps: f64,
        purpose: &str,
        b: &mut LcBaseline,
    ) -> Result<LoadMetrics> {
        let m = self.probe(addr, qps, purpose, b)?;
        match m.valid() {
            Some(a) => Ok(a.metrics.clone()),
            None => Err(m.stop(
                &format!("LC alone at {qps:.0} QPS ({purpose})"),
                self.runner.placement.loadgen.len(),
            )),
        }
    }

    /// Whether the LC alone holds `qps` with its tail within `bound_us`, from valid probes: one
    /// that holds decides; one that does not is repeated, and the rate holds if 2 of 3 do (a
    /// single probe hit by a host hiccup, p99 3.8 ms at 20k QPS between 160 µs probes at 17.5k
    /// and 19.4k, otherwise stopped a capacity search at a quarter of the LC's capacity).
    /// A rate no corrected run measures validly is beyond the LC when the failure is the LC's
    /// (sends waited for the depth cap, the tail drifted: [`validity::server_limited`]); one the
    /// instrument could not offer validly is not held (the capacity is what was measured validly
    /// below it). The low-load tail and the SLO's probes must be valid ([`Self::valid_probe`]).
    pub(super) fn holds_at(
        &mut self,
        addr: SocketAddr,
        qps: f64,
        bound_us: f64,
        purpose: &str,
        b: &mut LcBaseline,
    ) -> Result<bool> {
        let p = self.opts.percentile;
        let mut beyond = false;
        let held = held_by_majority(|| {
            if beyond {
                return Ok(false);
            }
            let m = self.probe(addr, qps, purpose, b)?;
            let what = format!("LC alone at {qps:.0} QPS ({purpose})");
            let cpus = self.runner.placement.loadgen.len();
            let verdict = match validity::judge(&m, qps, p, bound_us, &what, cpus) {
                Ok(v) => v,
                // The instrument could not offer this rate validly on its CPUs (after its
                // corrections): the rate is not held — the capacity is the highest rate measured
                // validly, said here — rather than a stop of the whole search.
                Err(e @ crate::BenchError::Invalid { .. }) => {
                    (self.progress)(&format!(
                        "  {qps:.0} QPS: not measurable validly here ({}); counted as not held, not used",
                        validity::short_reason(&m.last().metrics)
                    ));
                    tracing::info!(error = %e, "capacity probe beyond the instrument");
                    beyond = true;
                    return Ok(false);
                }
                Err(e) => return Err(e),
            };
            match verdict {
                RateVerdict::Held => Ok(true),
                RateVerdict::NotHeld => Ok(false),
                RateVerdict::Beyond => {
                    (self.progress)(&format!(
                        "  {qps:.0} QPS: beyond the LC alone (no valid run: {}); not used",
                        validity::short_reason(&m.last().metrics)
                    ));
                    beyond = true;
                    Ok(false)
                }
            }
        })?;
        Ok(held)
    }

    pub(super) fn find_peak(&mut self, addr: SocketAddr, b: &mut LcBaseline) -> Result<()> {
        let p = self.opts.percentile;
        // The low-load tail anchors the capacity knee: the median of 3 probes, so one probe
        // hit by other work on the machine does not move the knee tenfold.
        let mut low_tails = Vec::new();
        for _ in 0..3 {
            let low = self.valid_probe(addr, 2000.0, "low load", b)?;
            low_tails.extend(low.percentile_us(p));
        }
        b.low_load_p99_us = stats::median(&low_tails);
        let low_tail = b.low_load_p99_us.unwrap_or(100.0);
        // Capacity: the highest rate the LC sustains (rate self-check passes) before its tail
        // leaves the flat part of the curve (10x the low-load tail, at least 1 ms), measured by
        // a load generator with CPU to spare. A saturated client still reaches its rate, but its
        // tail is its own queue: on a 2-CPU VM the search otherwise found "capacity" 260k QPS
        // with send lag p99 0.8 ms, and LC alone then broke the SLO at 69% of that peak.
        let knee = (10.0 * low_tail).max(1000.0);
        let capacity = if let Some(peak) = self.opts.peak_qps {
            peak
        } else {
            let ok = capacity_search(10_000.0, 9, 4, |q| {
                self.holds_at(addr, q, knee, "capacity", b)
            })?;
            if ok <= 0.0 {
                return Err(BenchError::Unavailable(format!(
                    "the LC alone could not sustain 10000 QPS within p{p} ≤ {knee:.0} µs with the load generator unsaturated: see the probes in {}",
                    self.dir.root().display()
                )));
            }
            ok
        };
        b.capacity_qps = capacity;
        // SLO: given, or 5x the LC-alone tail at 50% of capacity (median of 3 probes).
        if let Some(slo) = self.opts.slo_us {
            b.slo_us = slo;
            b.slo_source = "set with --slo-us".into();
        } else {
            let mut tails = Vec::new();
            for _ in 0..3 {
                let m = self.valid_probe(addr, capacity * 0.5, "slo", b)?;
                tails.extend(m.percentile_us(p));
            }
            let med = stats::median(&tails).unwrap_or(low_tail);
            b.slo_us = (5.0 * med).round();
            b.slo_source = format!(
                "5 × the LC-alone p{} at 50% of capacity ({med:.0} µs)",
                crate::plot::trim_num(p)
            );
        }
        // Peak: the highest rate ≤ capacity at which the LC alone meets the SLO.
        if let Some(peak) = self.opts.peak_qps {
            b.peak_qps = peak;
            b.peak_source = "set with --peak-qps".into();
        } else {
            let slo = b.slo_us;
            let peak = if self.holds_at(addr, capacity, slo, "peak", b)? {
                capacity
            } else {
                let (mut lo, mut hi) = (capacity * 0.5, capacity);
                for _ in 0..4 {
                    let mid = (lo + hi) / 2.0;
                    if self.holds_at(addr, mid, slo, "peak", b)? {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                lo
            };
            b.peak_qps = peak.round();
            b.peak_source = format!(
                "highest rate with LC alone meeting the SLO (capacity {capacity:.0} QPS: rate sustained with p{} ≤ {knee:.0} µs and the load generator below {:.0}% CPU)",
                crate::plot::trim_num(p),
                headroom_load::checks::CPU_SATURATED * 100.0
            );
        }
        (self.progress)(&format!(
            "LC alone: capacity {:.0} QPS, SLO p{} ≤ {:.0} µs, peak {:.0} QPS",
            b.capacity_qps,
            crate::plot::trim_num(p),
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

/// Runs `try_once` until the outcome is decided: a first success decides; after a failure, the
/// answer is whether 2 of 3 tries succeed (stopping as soon as that is settled).
pub fn held_by_majority(mut try_once: impl FnMut() -> Result<bool>) -> Result<bool> {
    let mut held = 0;
    for tried in 1..=3 {
        if try_once()? {
            held += 1;
        }
        if (tried == 1 && held == 1) || held >= 2 {
            return Ok(true);
        }
        if held + (3 - tried) < 2 {
            return Ok(false);
        }
    }
    Ok(false)
}

/// The highest rate that `holds`: doubling from `start` (at most `doublings` steps) until one
/// does not hold, then `bisections` halvings between the last that held and the first that did
/// not. 0 when `start` does not hold.
pub(crate) fn capacity_search<E>(
    start: f64,
    doublings: usize,
    bisections: usize,
    mut holds: impl FnMut(f64) -> Result<bool, E>,
) -> Result<f64, E> {
    let (mut ok, mut bad) = (0.0, None);
    let mut q = start;
    for _ in 0..doublings {
        if holds(q)? {
            ok = q;
            q *= 2.0;
        } else {
            bad = Some(q);
            break;
        }
    }
    if let Some(mut hi) = bad {
        let mut lo: f64 = ok;
        for _ in 0..bisections {
            let mid = (lo + hi) / 2.0;
            if holds(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        ok = lo;
    }
    Ok(ok)
}

#[cfg(test)]
mod capacity_search_tests {
    use super::capacity_search;

    #[test]
    fn doubles_then_bisects_to_the_highest_rate_that_holds() {
        let mut asked = Vec::new();
        let cap = capacity_search(10_000.0, 9, 4, |q| {
            asked.push(q);
            Ok::<_, ()>(q <= 50_000.0)
        })
        .unwrap();
        // 10k, 20k, 40k hold, 80k not; then 60k no, 50k yes, 55k no, 52.5k no
        assert_eq!(asked, [10e3, 20e3, 40e3, 80e3, 60e3, 50e3, 55e3, 52.5e3]);
        assert_eq!(cap, 50_000.0);
        assert_eq!(
            capacity_search(10_000.0, 9, 4, |_| Ok::<_, ()>(false)),
            Ok(0.0)
        );
        assert_eq!(
            capacity_search(10_000.0, 2, 4, |_| Ok::<_, ()>(true)),
            Ok(20_000.0)
        );
        assert_eq!(
            capacity_search(1.0, 9, 4, |_| Err("probe failed")),
            Err("probe failed")
        );
    }
}
