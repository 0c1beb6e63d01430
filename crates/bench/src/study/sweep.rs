//! Studies of the sweep experiments (every one but colocation): a section of figures, tables
//! and findings per experiment, and a run summary per configuration.

use headroom_types::summary::{RunSummary, Summary};

use super::figures::{all_loads, be_share_figure, latency_figure, metric_series, per_level_table};
use super::{group, pct_label, tail_fn, Level, MetricFn};
use crate::experiments::Experiment;
use crate::stats;
use headroom_report::figure::{Cell, Figure, Shade, Study, Table};
use headroom_report::model::{LoadMetrics, Manifest, Point};

/// What every section reads: the manifest, the points grouped by configuration and load, and
/// the tail's label (`p99`).
struct Sweep<'a> {
    m: &'a Manifest,
    groups: &'a Vec<(String, Vec<Level<'a>>)>,
    pl: String,
}

/// What the sections add to the study.
#[derive(Default)]
struct Sections {
    figures: Vec<Figure>,
    tables: Vec<Table>,
    findings: Vec<String>,
}

/// Studies a sweep experiment (everything but colocation) from its points.
pub fn study_sweep(exp: Experiment, m: &Manifest, points: &[Point], order: &[String]) -> Study {
    let groups = group(points, order);
    let pl = format!("p{}", headroom_report::plot::trim_num(m.percentile));
    let runs: Vec<RunSummary> = groups.iter().map(|(n, l)| sweep_run(m, n, l)).collect();
    let sweep = Sweep {
        m,
        groups: &groups,
        pl: pl.clone(),
    };
    let mut out = Sections::default();
    match exp {
        Experiment::LatencyVsLoad => latency_vs_load(&sweep, &mut out),
        Experiment::Interference => interference(&sweep, &mut out),
        Experiment::Scheduling => scheduling(&sweep, &mut out),
        Experiment::Imbalance => imbalance(&sweep, &mut out),
        Experiment::Isolation => isolation(&sweep, &mut out),
        Experiment::Colocation => {}
    }
    let Sections {
        figures,
        tables,
        mut findings,
    } = out;
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

/// The LC alone: latency against load (Leverich Fig. 2), and a row per step.
fn latency_vs_load(s: &Sweep, out: &mut Sections) {
    let groups = s.groups;
    let slo = Some(s.m.slo_us);
    let Sections {
        figures, tables, ..
    } = out;
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

/// Each antagonist's tail as % of the SLO (Heracles Fig. 1), the highest load meeting the SLO, and the worst antagonist against the LC alone.
fn interference(s: &Sweep, out: &mut Sections) {
    let groups = s.groups;
    let m = s.m;
    let p = s.m.percentile;
    let pl = &s.pl;
    let slo = Some(s.m.slo_us);
    let Sections {
        figures,
        tables,
        findings,
    } = out;
    let loads = all_loads(groups);
    let mut rows = Vec::new();
    let mut worst: Option<(String, f64)> = None;
    let mut max_ok_rows = Vec::new();
    for (name, levels) in groups {
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
        title: "Max LC load meeting the SLO per antagonist (interference-aware provisioning)"
            .into(),
        caption: "The highest measured load level whose median tail stays within the SLO.".into(),
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
        pl,
        &pick,
        tail_fn(p),
        slo,
    ));
    figures.push(latency_figure(
        "interference-all",
        &format!("LC {pl} vs load under each antagonist"),
        "One line per antagonist.",
        pl,
        groups,
        tail_fn(p),
        slo,
    ));
}

/// The kernel's scheduling settings: p95 and p99 against load, and BE's share (Leverich Fig. 5/9).
fn scheduling(s: &Sweep, out: &mut Sections) {
    let groups = s.groups;
    let m = s.m;
    let slo = Some(s.m.slo_us);
    let Sections {
        figures, tables, ..
    } = out;
    figures.push(latency_figure(
        "scheduling-p95",
        "p95 vs load per scheduler setting (Leverich Fig. 5/9)",
        "LC and a BE on the same CPU; one line per kernel scheduling setting.",
        "p95",
        groups,
        |l| l.p95_us,
        None,
    ));
    figures.push(latency_figure(
        "scheduling-p99",
        "p99 vs load per scheduler setting",
        "LC and a BE on the same CPU.",
        "p99",
        groups,
        |l| l.p99_us,
        slo,
    ));
    figures.push(be_share_figure(groups));
    tables.push(per_level_table(
        "scheduling-table",
        "Scheduler settings: LC tail and the BE's CPU share",
        m,
        groups,
    ));
}

/// N+1 server threads on N CPUs: p50 and p95 against load per dispatch mode (Leverich Fig. 3/8).
fn imbalance(s: &Sweep, out: &mut Sections) {
    let groups = s.groups;
    let m = s.m;
    let Sections {
        figures, tables, ..
    } = out;
    figures.push(latency_figure(
        "imbalance-p50",
        "p50 vs load: N+1 server threads on N CPUs (Leverich Fig. 3/8)",
        "static = memcached's round-robin connection assignment; pinned = thread i on CPU i; shared = shared dispatch.",
        "p50",
        groups,
        |l| l.p50_us,
        None,
    ));
    figures.push(latency_figure(
        "imbalance-p95",
        "p95 vs load: N+1 server threads on N CPUs",
        "Thread load imbalance shows as a p95 that rises long before the CPUs saturate.",
        "p95",
        groups,
        |l| l.p95_us,
        None,
    ));
    tables.push(per_level_table(
        "imbalance-table",
        "Dispatch modes: latency per load",
        m,
        groups,
    ));
}

/// A spin BE under each policy: the LC tail against the LC alone, and what BE got (PerfIso Fig. 8).
fn isolation(s: &Sweep, out: &mut Sections) {
    let groups = s.groups;
    let p = s.m.percentile;
    let pl = &s.pl;
    let slo = Some(s.m.slo_us);
    let Sections {
        figures, tables, ..
    } = out;
    figures.push(latency_figure(
        "isolation-p99",
        &format!("LC {pl} with a spin BE under each policy (PerfIso Fig. 8)"),
        "alone = LC without BE.",
        pl,
        groups,
        tail_fn(p),
        slo,
    ));
    figures.push(be_share_figure(groups));
    let alone: Option<&Vec<Level>> = groups.iter().find(|(n, _)| n == "alone").map(|(_, l)| l);
    let mut rows = Vec::new();
    for (name, levels) in groups {
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
