//! The study step: pure functions from the raw results of a run directory to a [`Study`].

use std::collections::BTreeMap;

use headroom_types::summary::{RunSummary, Summary};

use crate::experiments::Experiment;
use crate::stats::{self, Spread};
use headroom_report::figure::{Cell, Figure, Series, Shade, Study, Table, XY};
use headroom_report::model::{LoadMetrics, Manifest, Point};

mod colocation;
mod run_dir;
pub use colocation::*;
pub use run_dir::{report, study_dir};

/// Extracts one figure from a load result.
type MetricFn = fn(&LoadMetrics) -> Option<f64>;

/// The points of one configuration at one load level (all repeats).
#[derive(Debug, Clone)]
pub struct Level<'a> {
    pub load_fraction: f64,
    pub points: Vec<&'a Point>,
}

impl Level<'_> {
    /// The repeats the figures count: those whose load-generator self-checks passed, or every
    /// repeat when none did. A repeat whose instrument fell behind its schedule (a noisy minute
    /// on a shared host) did not measure the configured load, and must not pull the median.
    pub fn counted(&self) -> Vec<&Point> {
        let ok = |p: &&&Point| p.load.as_ref().is_some_and(|l| l.valid);
        if self.points.iter().any(|p| ok(&p)) {
            self.points.iter().filter(ok).copied().collect()
        } else {
            self.points.clone()
        }
    }

    /// Median and spread of a load metric over the counted repeats that measured it.
    pub fn spread(&self, metric: impl Fn(&LoadMetrics) -> Option<f64>) -> Option<Spread> {
        let v: Vec<f64> = self
            .counted()
            .into_iter()
            .filter_map(|p| p.load.as_ref().and_then(&metric))
            .collect();
        Spread::of(&v)
    }

    /// Median and spread of a point field over the counted repeats that have it.
    pub fn spread_of(&self, field: impl Fn(&Point) -> Option<f64>) -> Option<Spread> {
        let v: Vec<f64> = self.counted().into_iter().filter_map(field).collect();
        Spread::of(&v)
    }

    /// "yes" when every repeat passed its self-checks, "NO" when none did, else "k/n".
    pub fn checks_label(&self) -> String {
        let ok = self
            .points
            .iter()
            .filter(|p| p.load.as_ref().is_some_and(|l| l.valid))
            .count();
        match ok {
            0 => "NO".into(),
            n if n == self.points.len() => "yes".into(),
            n => format!("{n}/{}", self.points.len()),
        }
    }

    /// True when every repeat has a load result whose self-checks passed.
    pub fn valid(&self) -> bool {
        self.points
            .iter()
            .all(|p| p.load.as_ref().is_some_and(|l| l.valid))
    }
}

/// Points grouped by series (in first-seen order of `order`, then alphabetically) and load level.
pub fn group<'a>(points: &'a [Point], order: &[String]) -> Vec<(String, Vec<Level<'a>>)> {
    let mut by_series: BTreeMap<String, BTreeMap<i64, Vec<&Point>>> = BTreeMap::new();
    for p in points {
        // Load levels are grouped at 0.1% resolution so float noise never splits a level.
        let key = (p.load_fraction * 1000.0).round() as i64;
        by_series
            .entry(p.series.clone())
            .or_default()
            .entry(key)
            .or_default()
            .push(p);
    }
    let mut names: Vec<String> = order
        .iter()
        .filter(|n| by_series.contains_key(*n))
        .cloned()
        .collect();
    for n in by_series.keys() {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    names
        .into_iter()
        .map(|n| {
            let levels = by_series
                .remove(&n)
                .unwrap_or_default()
                .into_iter()
                .map(|(k, pts)| Level {
                    load_fraction: k as f64 / 1000.0,
                    points: pts,
                })
                .collect();
            (n, levels)
        })
        .collect()
}

fn metric_series(
    name: &str,
    color_key: &str,
    levels: &[Level],
    metric: impl Fn(&LoadMetrics) -> Option<f64> + Copy,
) -> Series {
    Series {
        name: name.to_string(),
        color_key: color_key.to_string(),
        dashed: false,
        points: levels
            .iter()
            .filter_map(|l| {
                l.spread(metric).map(|s| XY {
                    x: l.load_fraction * 100.0,
                    y: s.median,
                    lo: Some(s.min),
                    hi: Some(s.max),
                    valid: l.valid(),
                })
            })
            .collect(),
    }
}

fn tail_fn(percentile: f64) -> impl Fn(&LoadMetrics) -> Option<f64> + Copy {
    move |l: &LoadMetrics| l.percentile_us(percentile)
}

/// A latency-vs-load figure with one series per configuration.
fn latency_figure(
    id: &str,
    title: &str,
    caption: &str,
    label: &str,
    groups: &[(String, Vec<Level>)],
    metric: impl Fn(&LoadMetrics) -> Option<f64> + Copy,
    slo: Option<f64>,
) -> Figure {
    Figure {
        id: id.into(),
        title: title.into(),
        caption: caption.into(),
        x_label: "LC load (% of peak QPS)".into(),
        y_label: format!("{label} latency (µs, log scale)"),
        log_y: true,
        slo,
        series: groups
            .iter()
            .map(|(name, levels)| metric_series(name, name, levels, metric))
            .collect(),
    }
}

/// Summary of one configuration of a sweep: a level violates when its median tail exceeds the SLO.
fn sweep_run(m: &Manifest, name: &str, levels: &[Level]) -> RunSummary {
    let tail = tail_fn(m.percentile);
    let tails: Vec<Option<f64>> = levels
        .iter()
        .map(|l| l.spread(tail).map(|s| s.median))
        .collect();
    let be = levels
        .iter()
        .flat_map(|l| l.points.iter())
        .map(|p| p.be.clone())
        .next()
        .unwrap_or_else(|| "none".into());
    let be_norms: Vec<f64> = levels
        .iter()
        .filter_map(|l| l.spread_of(|p| p.be_norm).map(|s| s.median))
        .collect();
    let emus: Vec<f64> = levels
        .iter()
        .filter_map(|l| {
            let lc = l.spread(|x| achieved_fraction(m, x))?.median;
            let be_frac = if be == "none" {
                Some(0.0)
            } else {
                l.spread_of(|p| p.be_norm).map(|s| s.median)
            }?;
            Some(stats::emu(lc, be_frac))
        })
        .collect();
    RunSummary {
        policy: name.to_string(),
        be,
        slo_violations: stats::slo_violations(&tails, m.slo_us),
        windows: levels.len() as u64,
        emu_mean: stats::mean(&emus),
        emu_min: stats::min(&emus),
        lc_p99_us_max: stats::max(&tails.iter().flatten().copied().collect::<Vec<_>>()),
        be_throughput_norm: stats::median(&be_norms),
        valid_windows: None,
        slo_violations_valid: None,
    }
}

fn achieved_fraction(m: &Manifest, l: &LoadMetrics) -> Option<f64> {
    let peak = m.peak_qps.filter(|p| *p > 0.0)?;
    Some(l.achieved_qps / peak)
}

fn pct_label(f: f64) -> String {
    format!("{}%", headroom_report::plot::trim_num(f * 100.0))
}

/// Studies a sweep experiment (everything but colocation) from its points.
pub fn study_sweep(exp: Experiment, m: &Manifest, points: &[Point], order: &[String]) -> Study {
    let groups = group(points, order);
    let slo = Some(m.slo_us);
    let p = m.percentile;
    let pl = format!("p{}", headroom_report::plot::trim_num(p));
    let mut figures = Vec::new();
    let mut tables = Vec::new();
    let mut findings = Vec::new();
    let runs: Vec<RunSummary> = groups.iter().map(|(n, l)| sweep_run(m, n, l)).collect();

    match exp {
        Experiment::LatencyVsLoad => {
            let levels: Vec<Level> = groups.iter().flat_map(|(_, l)| l.clone()).collect();
            let metrics: [(&str, MetricFn); 4] = [
                ("avg", |l| l.avg_us),
                ("p50", |l| l.p50_us),
                ("p95", |l| l.p95_us),
                ("p99", |l| l.p99_us),
            ];
            figures.push(Figure {
                id: "latency-vs-load".into(),
                title: "LC alone: latency vs load (Leverich Fig. 2 baseline)".into(),
                caption: "headroom serve alone on its CPUs, open-loop load from headroom load; median of the repeats per step.".into(),
                x_label: "LC load (% of peak QPS)".into(),
                y_label: "latency (µs, log scale)".into(),
                log_y: true,
                slo,
                series: metrics
                    .iter()
                    .map(|(name, f)| metric_series(name, name, &levels, *f))
                    .collect(),
            });
            let mut rows = Vec::new();
            for l in &levels {
                let qps = l.spread(|x| Some(x.achieved_qps));
                let mut row = vec![
                    Cell::text(pct_label(l.load_fraction)),
                    Cell::num(qps.map(|s| s.median), 0),
                ];
                for (_, f) in &metrics {
                    row.push(Cell::num(l.spread(*f).map(|s| s.median), 1));
                }
                row.push(Cell::num(l.spread(|x| x.p99_us).map(|s| s.spread_pct()), 1));
                row.push(Cell::num(
                    l.spread(|x| x.send_lag_p99_us).map(|s| s.median),
                    1,
                ));
                row.push(Cell::text(l.checks_label()));
                rows.push(row);
            }
            tables.push(Table {
                id: "latency-vs-load-table".into(),
                title: "Latency per load step".into(),
                caption: "Medians over repeats; spread = half the min–max range of p99 in % of its median; send lag = the load generator's p99 lateness versus its schedule (small = it kept up). Medians count the repeats whose load-generator self-checks passed (every repeat where none did); self-checks ok = all, none (NO) or how many of the repeats passed.".into(),
                columns: vec![
                    "load".into(),
                    "achieved QPS".into(),
                    "avg µs".into(),
                    "p50 µs".into(),
                    "p95 µs".into(),
                    "p99 µs".into(),
                    "p99 spread ±%".into(),
                    "send lag p99 µs".into(),
                    "self-checks ok".into(),
                ],
                rows,
            });
        }
        Experiment::Interference => {
            let loads = all_loads(&groups);
            let mut rows = Vec::new();
            let mut worst: Option<(String, f64)> = None;
            let mut max_ok_rows = Vec::new();
            for (name, levels) in &groups {
                let mut row = vec![Cell::text(name.clone())];
                let mut sum = 0.0;
                let mut max_ok: Option<f64> = None;
                for lf in &loads {
                    let lvl = levels.iter().find(|l| (l.load_fraction - lf).abs() < 1e-6);
                    let pct = lvl
                        .and_then(|l| l.spread(tail_fn(p)))
                        .map(|s| s.median / m.slo_us * 100.0);
                    match pct {
                        Some(v) => {
                            sum += v.min(1000.0);
                            if v <= 100.0 {
                                max_ok = Some(max_ok.map_or(*lf, |o: f64| o.max(*lf)));
                            }
                            let mut c = Cell::num(Some(v), 0).shaded(Shade::of_slo_pct(v));
                            c.text.push('%');
                            if lvl.is_some_and(|l| !l.valid()) {
                                c.text.push('*');
                            }
                            row.push(c);
                        }
                        None => row.push(Cell::text("–")),
                    }
                }
                if name != "alone" && worst.as_ref().is_none_or(|(_, w)| sum > *w) {
                    worst = Some((name.clone(), sum));
                }
                rows.push(row);
                max_ok_rows.push(vec![
                    Cell::text(name.clone()),
                    Cell::text(max_ok.map_or("none of the loads".into(), pct_label)),
                ]);
            }
            let mut columns = vec!["antagonist".to_string()];
            columns.extend(loads.iter().map(|l| format!("{} load", pct_label(*l))));
            tables.push(Table {
                id: "interference-heatmap".into(),
                title: format!("Interference: LC {pl} as % of the SLO (Heracles Fig. 1)"),
                caption: "Green ≤ 100% of the SLO, yellow 100–120%, red > 120%. * = the load generator's self-checks failed in a repeat.".into(),
                columns,
                rows,
            });
            tables.push(Table {
                id: "interference-provisioning".into(),
                title:
                    "Max LC load meeting the SLO per antagonist (interference-aware provisioning)"
                        .into(),
                caption: "The highest measured load level whose median tail stays within the SLO."
                    .into(),
                columns: vec!["antagonist".into(), "max load meeting the SLO".into()],
                rows: max_ok_rows,
            });
            let mut pick: Vec<(String, Vec<Level>)> = groups
                .iter()
                .filter(|(n, _)| n == "alone" || worst.as_ref().is_some_and(|(w, _)| w == n))
                .cloned()
                .collect();
            pick.sort_by_key(|(n, _)| n != "alone");
            if let Some((w, _)) = &worst {
                findings.push(format!("Worst antagonist for the LC tail here: {w}."));
            }
            figures.push(latency_figure(
                "interference-worst",
                &format!("LC {pl} vs load: alone and with the worst antagonist (Leverich Fig. 2)"),
                "The antagonist shares the LC's CPUs under plain OS scheduling.",
                &pl,
                &pick,
                tail_fn(p),
                slo,
            ));
            figures.push(latency_figure(
                "interference-all",
                &format!("LC {pl} vs load under each antagonist"),
                "One line per antagonist.",
                &pl,
                &groups,
                tail_fn(p),
                slo,
            ));
        }
        Experiment::Scheduling => {
            figures.push(latency_figure(
                "scheduling-p95",
                "p95 vs load per scheduler setting (Leverich Fig. 5/9)",
                "LC and a BE on the same CPU; one line per kernel scheduling setting.",
                "p95",
                &groups,
                |l| l.p95_us,
                None,
            ));
            figures.push(latency_figure(
                "scheduling-p99",
                "p99 vs load per scheduler setting",
                "LC and a BE on the same CPU.",
                "p99",
                &groups,
                |l| l.p99_us,
                slo,
            ));
            figures.push(be_share_figure(&groups));
            tables.push(per_level_table(
                "scheduling-table",
                "Scheduler settings: LC tail and the BE's CPU share",
                m,
                &groups,
            ));
        }
        Experiment::Imbalance => {
            figures.push(latency_figure(
                "imbalance-p50",
                "p50 vs load: N+1 server threads on N CPUs (Leverich Fig. 3/8)",
                "static = memcached's round-robin connection assignment; pinned = thread i on CPU i; shared = shared dispatch.",
                "p50",
                &groups,
                |l| l.p50_us,
                None,
            ));
            figures.push(latency_figure(
                "imbalance-p95",
                "p95 vs load: N+1 server threads on N CPUs",
                "Thread load imbalance shows as a p95 that rises long before the CPUs saturate.",
                "p95",
                &groups,
                |l| l.p95_us,
                None,
            ));
            tables.push(per_level_table(
                "imbalance-table",
                "Dispatch modes: latency per load",
                m,
                &groups,
            ));
        }
        Experiment::Isolation => {
            figures.push(latency_figure(
                "isolation-p99",
                &format!("LC {pl} with a spin BE under each policy (PerfIso Fig. 8)"),
                "alone = LC without BE.",
                &pl,
                &groups,
                tail_fn(p),
                slo,
            ));
            figures.push(be_share_figure(&groups));
            let alone: Option<&Vec<Level>> =
                groups.iter().find(|(n, _)| n == "alone").map(|(_, l)| l);
            let mut rows = Vec::new();
            for (name, levels) in &groups {
                for l in levels {
                    let tail = l.spread(tail_fn(p)).map(|s| s.median);
                    let alone_tail = alone
                        .and_then(|a| {
                            a.iter()
                                .find(|x| (x.load_fraction - l.load_fraction).abs() < 1e-6)
                        })
                        .and_then(|a| a.spread(tail_fn(p)))
                        .map(|s| s.median);
                    let vs = match (tail, alone_tail) {
                        (Some(t), Some(a)) if a > 0.0 => Some(t / a * 100.0),
                        _ => None,
                    };
                    let vs_cell = match vs {
                        Some(v) => {
                            let shade = if v <= 110.0 {
                                Shade::Ok
                            } else if v <= 130.0 {
                                Shade::Warn
                            } else {
                                Shade::Bad
                            };
                            let mut c = Cell::num(Some(v), 0).shaded(shade);
                            c.text.push('%');
                            c
                        }
                        None => Cell::text("–"),
                    };
                    rows.push(vec![
                        Cell::text(name.clone()),
                        Cell::text(pct_label(l.load_fraction)),
                        Cell::num(tail, 0),
                        vs_cell,
                        Cell::num(l.spread_of(|p| p.be_norm).map(|s| s.median), 2),
                        Cell::num(l.spread_of(|p| p.idle_cpu_pct).map(|s| s.median), 1),
                        Cell::num(l.spread_of(|p| p.steal_pct).map(|s| s.max), 1),
                        Cell::text(l.checks_label()),
                    ]);
                }
            }
            tables.push(Table {
                id: "isolation-table".into(),
                title: "Isolation: LC tail vs alone, BE throughput, idle CPU".into(),
                caption: "BE throughput normalized to the BE running alone on the same CPUs; idle = idle share of the LC+BE CPUs; steal = the most CPU time the hypervisor took from this machine during a counted repeat. Green: within 10% of LC alone. Medians count the repeats whose load-generator self-checks passed (every repeat where none did); self-checks ok = all, none (NO) or how many of the repeats passed.".into(),
                columns: vec![
                    "policy".into(),
                    "load".into(),
                    format!("{pl} µs"),
                    format!("{pl} vs alone"),
                    "BE throughput (norm.)".into(),
                    "idle CPU %".into(),
                    "steal % (max)".into(),
                    "self-checks ok".into(),
                ],
                rows,
            });
        }
        Experiment::Colocation => {}
    }
    for r in &runs {
        findings.push(format!(
            "{}: {} of {} load levels over the SLO; worst median {pl} {}.",
            r.policy,
            r.slo_violations,
            r.windows,
            r.lc_p99_us_max
                .map_or("not measured".into(), |v| format!("{v:.0} µs"))
        ));
    }
    let invalid = points
        .iter()
        .filter(|p| !p.load.as_ref().is_some_and(|l| l.valid))
        .count();
    if invalid > 0 {
        findings.push(format!(
            "{invalid} of {} runs failed the load generator's self-checks or did not complete (hollow markers, * in tables).",
            points.len()
        ));
    }
    Study {
        summary: Summary {
            experiment: exp.name().to_string(),
            slo_us: m.slo_us,
            percentile: m.percentile,
            runs,
        },
        figures,
        tables,
        findings,
        commands: Vec::new(),
    }
}

fn all_loads(groups: &[(String, Vec<Level>)]) -> Vec<f64> {
    let mut loads: Vec<f64> = groups
        .iter()
        .flat_map(|(_, l)| l.iter().map(|l| l.load_fraction))
        .collect();
    loads.sort_by(f64::total_cmp);
    loads.dedup_by(|a, b| (*a - *b).abs() < 1e-6);
    loads
}

fn be_share_figure(groups: &[(String, Vec<Level>)]) -> Figure {
    Figure {
        id: "be-throughput".into(),
        title: "BE throughput vs LC load".into(),
        caption: "BE operations/s normalized to the BE alone on the same CPUs (1.0 = all the CPU it would get alone).".into(),
        x_label: "LC load (% of peak QPS)".into(),
        y_label: "BE throughput (fraction of solo)".into(),
        log_y: false,
        slo: None,
        series: groups
            .iter()
            .filter(|(_, levels)| levels.iter().any(|l| l.spread_of(|p| p.be_norm).is_some()))
            .map(|(name, levels)| Series {
                name: name.clone(),
                color_key: name.clone(),
                dashed: false,
                points: levels
                    .iter()
                    .filter_map(|l| {
                        l.spread_of(|p| p.be_norm).map(|s| XY {
                            x: l.load_fraction * 100.0,
                            y: s.median,
                            lo: Some(s.min),
                            hi: Some(s.max),
                            valid: l.valid(),
                        })
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn per_level_table(id: &str, title: &str, m: &Manifest, groups: &[(String, Vec<Level>)]) -> Table {
    let mut rows = Vec::new();
    for (name, levels) in groups {
        for l in levels {
            let tail = l.spread(tail_fn(m.percentile));
            rows.push(vec![
                Cell::text(name.clone()),
                Cell::text(pct_label(l.load_fraction)),
                Cell::num(l.spread(|x| x.p50_us).map(|s| s.median), 1),
                Cell::num(l.spread(|x| x.p95_us).map(|s| s.median), 1),
                {
                    let v = tail.map(|s| s.median);
                    let c = Cell::num(v, 1);
                    match v {
                        Some(v) => c.shaded(Shade::of_slo_pct(v / m.slo_us * 100.0)),
                        None => c,
                    }
                },
                Cell::num(tail.map(|s| s.spread_pct()), 1),
                Cell::num(l.spread_of(|p| p.be_norm).map(|s| s.median), 2),
                Cell::num(l.spread(|x| x.send_lag_p99_us).map(|s| s.median), 1),
                Cell::text(l.checks_label()),
            ]);
        }
    }
    let pl = format!("p{}", headroom_report::plot::trim_num(m.percentile));
    Table {
        id: id.into(),
        title: title.into(),
        caption: format!("Medians over repeats. {pl} coloured against the SLO like Heracles Fig. 1. BE share = BE throughput over its solo throughput on the same CPUs. Medians count the repeats whose load-generator self-checks passed (every repeat where none did); self-checks ok = all, none (NO) or how many of the repeats passed."),
        columns: vec![
            "configuration".into(),
            "load".into(),
            "p50 µs".into(),
            "p95 µs".into(),
            format!("{pl} µs"),
            format!("{pl} spread ±%"),
            "BE share".into(),
            "send lag p99 µs".into(),
            "self-checks ok".into(),
        ],
        rows,
    }
}
