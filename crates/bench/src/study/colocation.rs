//! The colocation study: per-window tails and EMU, violations and what caused them, and the
//! report's figures and tables for each policy's run.

use super::pct_label;

use headroom_types::summary::{RunSummary, Summary};

use crate::experiments::Experiment;
use crate::stats::{self};
use headroom_report::figure::{Cell, Figure, Series, Shade, Study, Table, XY};
use headroom_report::model::{ColocationRun, Manifest};

/// Per-window tail latency of a colocation run (`None` when the window has no measurement).
pub fn window_tails(run: &ColocationRun, percentile: f64) -> Vec<Option<f64>> {
    run.windows
        .iter()
        .map(|w| w.load.as_ref().and_then(|l| l.percentile_us(percentile)))
        .collect()
}

/// Per-window EMU of a colocation run (`None` when the BE throughput is unknown).
pub fn window_emus(run: &ColocationRun) -> Vec<Option<f64>> {
    run.windows
        .iter()
        .map(|w| w.be_fraction.map(|b| stats::emu(w.lc_load_fraction, b)))
        .collect()
}

/// The summary line of one colocation run.
pub fn colocation_run_summary(run: &ColocationRun, m: &Manifest) -> RunSummary {
    let tails = window_tails(run, m.percentile);
    let emus: Vec<f64> = window_emus(run).into_iter().flatten().collect();
    let be: Vec<f64> = run.windows.iter().filter_map(|w| w.be_fraction).collect();
    let valid_tails: Vec<Option<f64>> = run
        .windows
        .iter()
        .zip(&tails)
        .filter(|(w, _)| w.load.as_ref().is_some_and(|l| l.valid))
        .map(|(_, t)| *t)
        .collect();
    RunSummary {
        policy: run.policy.clone(),
        be: run.be.clone(),
        slo_violations: stats::slo_violations(&tails, m.slo_us),
        windows: run.windows.len() as u64,
        emu_mean: stats::mean(&emus),
        emu_min: stats::min(&emus),
        lc_p99_us_max: stats::max(&tails.iter().flatten().copied().collect::<Vec<_>>()),
        be_throughput_norm: stats::mean(&be),
        valid_windows: Some(valid_tails.len() as u64),
        slo_violations_valid: Some(stats::slo_violations(&valid_tails, m.slo_us)),
    }
}

/// BE throughput (fraction of solo) below which a window counts as "BE not running".
pub const BE_IDLE_FRACTION: f64 = 0.01;

/// What the SLO-violating windows of a colocation run had in common: how many had the BE doing
/// (almost) no work — the LC missed its SLO on its own there, not because of BE —, in how many
/// the load generator sent later than the SLO (a stall of client, LC or VM long enough to hold
/// requests past their send time; latency is timed from the scheduled send, so it counts against
/// the LC), and the most CPU time the hypervisor took during one of them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ViolationAttribution {
    pub violating: usize,
    /// Violating windows whose BE throughput was below [`BE_IDLE_FRACTION`] of solo.
    pub with_be_idle: usize,
    /// Violating windows whose load-generator send lag p99 alone exceeded the SLO.
    pub with_client_late: usize,
    /// Highest steal (% of CPU time) in a violating window.
    pub max_steal_pct: Option<f64>,
}

/// Attributes the SLO-violating windows of `run` (a window without a measurement violates).
pub fn violation_attribution(
    run: &ColocationRun,
    slo_us: f64,
    percentile: f64,
) -> ViolationAttribution {
    let mut a = ViolationAttribution::default();
    for w in &run.windows {
        let tail = w.load.as_ref().and_then(|l| l.percentile_us(percentile));
        if tail.is_some_and(|t| t <= slo_us) {
            continue;
        }
        a.violating += 1;
        if w.be_fraction.is_some_and(|b| b < BE_IDLE_FRACTION) {
            a.with_be_idle += 1;
        }
        if w.load
            .as_ref()
            .and_then(|l| l.send_lag_p99_us)
            .is_some_and(|lag| lag > slo_us)
        {
            a.with_client_late += 1;
        }
        if let Some(st) = w.steal_pct {
            a.max_steal_pct = Some(a.max_steal_pct.map_or(st, |m: f64| m.max(st)));
        }
    }
    a
}

/// Studies a colocation run directory: timelines per policy and the summary.
pub fn study_colocation(m: &Manifest, runs: &[ColocationRun]) -> Study {
    let pl = format!("p{}", headroom_report::plot::trim_num(m.percentile));
    let minutes = |run: &ColocationRun, w: &headroom_report::model::Window| -> f64 {
        let t0 = run.windows.first().map_or(0, |w| w.start_unix_ms);
        (w.end_unix_ms.saturating_sub(t0)) as f64 / 60_000.0
    };
    let label = |run: &ColocationRun| {
        if run.dry_run {
            format!("{} (dry-run)", run.policy)
        } else {
            run.policy.clone()
        }
    };
    let timeline =
        |id: &str,
         title: String,
         caption: &str,
         y_label: &str,
         log_y: bool,
         slo: Option<f64>,
         f: &dyn Fn(&headroom_report::model::Window) -> Option<f64>| Figure {
            id: id.into(),
            title,
            caption: caption.into(),
            x_label: "time (minutes)".into(),
            y_label: y_label.into(),
            log_y,
            slo,
            series: runs
                .iter()
                .map(|run| Series {
                    name: format!("{} + {}", label(run), run.be),
                    color_key: run.policy.clone(),
                    dashed: false,
                    points: run
                        .windows
                        .iter()
                        .filter_map(|w| {
                            f(w).map(|y| XY {
                                x: minutes(run, w),
                                y,
                                lo: None,
                                hi: None,
                                valid: w.load.as_ref().is_some_and(|l| l.valid),
                            })
                        })
                        .collect(),
                })
                .collect(),
        };
    let p = m.percentile;
    let figures = vec![
        timeline(
            "colocation-latency",
            format!("LC {pl} per window vs the SLO (Heracles Fig. 4/8)"),
            "One point per window; the dashed line is the SLO.",
            &format!("{pl} latency (µs, log scale)"),
            true,
            Some(m.slo_us),
            &|w| w.load.as_ref().and_then(|l| l.percentile_us(p)),
        ),
        timeline(
            "colocation-load",
            "LC load over the diurnal trace".into(),
            "Achieved LC QPS as % of the peak.",
            "LC load (% of peak QPS)",
            false,
            None,
            &|w| Some(w.lc_load_fraction * 100.0),
        ),
        timeline(
            "colocation-be-cpus",
            "CPUs the agent gave BE".into(),
            "Time-averaged size of the BE cpuset from the agent's decision log (0 = BE disabled); without an agent BE may use every LC+BE CPU.",
            "BE CPUs",
            false,
            None,
            &|w| w.agent.as_ref().and_then(|a| a.be_cpus_mean),
        ),
        timeline(
            "colocation-be-throughput",
            "BE throughput".into(),
            "BE operations/s normalized to the BE alone on the same CPUs.",
            "BE throughput (fraction of solo)",
            false,
            None,
            &|w| w.be_fraction,
        ),
        timeline(
            "colocation-emu",
            "Effective machine utilization (Heracles Fig. 5/8)".into(),
            "EMU = LC load fraction + BE throughput fraction.",
            "EMU (fraction)",
            false,
            None,
            &|w| w.be_fraction.map(|b| stats::emu(w.lc_load_fraction, b)),
        ),
    ];
    let summaries: Vec<RunSummary> = runs.iter().map(|r| colocation_run_summary(r, m)).collect();
    let mut rows = Vec::new();
    for run in runs {
        for w in &run.windows {
            let tail = w.load.as_ref().and_then(|l| l.percentile_us(p));
            rows.push(vec![
                Cell::text(label(run)),
                Cell::text(w.index.to_string()),
                Cell::text(pct_label(w.target_fraction)),
                Cell::text(pct_label(w.lc_load_fraction)),
                match tail {
                    Some(t) => {
                        Cell::num(Some(t), 0).shaded(Shade::of_slo_pct(t / m.slo_us * 100.0))
                    }
                    None => Cell::text("–").shaded(Shade::Bad),
                },
                Cell::num(w.agent.as_ref().and_then(|a| a.be_cpus_mean), 2),
                Cell::num(w.agent.as_ref().and_then(|a| a.be_cpu_weight), 0),
                Cell::num(w.agent.as_ref().and_then(|a| a.be_quota_pct), 0),
                Cell::num(w.be_fraction, 2),
                Cell::num(w.be_fraction.map(|b| stats::emu(w.lc_load_fraction, b)), 2),
                Cell::num(w.steal_pct, 1),
                Cell::text(
                    w.agent
                        .as_ref()
                        .and_then(|a| a.last_reason.clone())
                        .unwrap_or_default(),
                ),
            ]);
        }
    }
    let tables = vec![Table {
        id: "colocation-windows".into(),
        title: format!("Per-window timeline ({} s windows)", window_seconds(runs)),
        caption: format!("{pl} coloured against the SLO like Heracles Fig. 1; BE CPUs/weight/quota from the agent's decision log; steal = CPU time the hypervisor took from this machine during the window."),
        columns: vec![
            "policy".into(),
            "window".into(),
            "target load".into(),
            "achieved load".into(),
            format!("{pl} µs"),
            "BE CPUs".into(),
            "BE weight".into(),
            "BE quota %".into(),
            "BE throughput".into(),
            "EMU".into(),
            "steal %".into(),
            "agent reason".into(),
        ],
        rows,
    }];
    let mut findings = Vec::new();
    for (run, s) in runs.iter().zip(&summaries) {
        findings.push(format!(
            "{} with {} BE: {} of {} windows violated the SLO{}; EMU mean {}, min {}; worst {pl} {}.{}",
            label(run),
            s.be,
            s.slo_violations,
            s.windows,
            match (s.valid_windows, s.slo_violations_valid) {
                (Some(v), Some(n)) if v < s.windows => format!(
                    " ({n} of the {v} whose load runs passed their self-checks; the other {} are figures the load generator could not vouch for)",
                    s.windows - v
                ),
                _ => String::new(),
            },
            s.emu_mean.map_or("–".into(), |v| format!("{:.0}%", v * 100.0)),
            s.emu_min.map_or("–".into(), |v| format!("{:.0}%", v * 100.0)),
            s.lc_p99_us_max.map_or("–".into(), |v| format!("{v:.0} µs")),
            if run.dry_run {
                " The agent ran with --dry-run: it logged decisions but changed nothing, so BE ran unrestricted."
            } else {
                ""
            }
        ));
        let a = violation_attribution(run, m.slo_us, p);
        let steal = a.max_steal_pct.map_or(String::new(), |st| {
            format!("; the most the hypervisor took in a violating window was {st:.1}% of CPU time")
        });
        if a.with_be_idle > 0 {
            findings.push(format!(
                "{}: in {} of its {} violating windows the BE did under {:.0}% of its solo work (frozen or disabled): the LC missed its SLO there with no BE running{}.",
                label(run),
                a.with_be_idle,
                a.violating,
                BE_IDLE_FRACTION * 100.0,
                if a.with_client_late > 0 { "" } else { &steal }
            ));
        }
        if a.with_client_late > 0 {
            findings.push(format!(
                "{}: in {} of its {} violating windows the load generator sent late by more than the SLO (send lag p99 > {:.0} µs): a stall of the client, of the LC or of the whole VM held requests past their send time (every connection at its depth cap); latency is timed from the scheduled send, so that stall counts against the LC{}.",
                label(run),
                a.with_client_late,
                a.violating,
                m.slo_us,
                steal
            ));
        }
    }
    Study {
        summary: Summary {
            experiment: Experiment::Colocation.name().to_string(),
            slo_us: m.slo_us,
            percentile: m.percentile,
            runs: summaries,
        },
        figures,
        tables,
        findings,
        commands: Vec::new(),
    }
}

fn window_seconds(runs: &[ColocationRun]) -> String {
    runs.iter()
        .flat_map(|r| r.windows.first())
        .map(|w| headroom_report::plot::trim_num((w.end_unix_ms - w.start_unix_ms) as f64 / 1000.0))
        .next()
        .unwrap_or_else(|| "–".into())
}
