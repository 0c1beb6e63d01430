//! The figures and tables several sweep studies share: a latency-vs-load figure, BE's share,
//! a row per configuration and load.

use super::{pct_label, tail_fn, Level};
use crate::stats::Spread;
use headroom_report::figure::{Cell, Figure, Series, Shade, Table, XY};
use headroom_report::model::{LoadMetrics, Manifest};

pub(super) fn metric_series(
    name: &str,
    color_key: &str,
    levels: &[Level],
    metric: impl Fn(&LoadMetrics) -> Option<f64> + Copy,
) -> Series {
    Series {
        name: name.to_string(),
        color_key: color_key.to_string(),
        dashed: false,
        points: points(levels, |l| l.spread(metric)),
    }
}

/// A point per load level: the median of the repeats, with their range as the error bar.
fn points(levels: &[Level], spread: impl Fn(&Level) -> Option<Spread>) -> Vec<XY> {
    levels
        .iter()
        .filter_map(|l| {
            spread(l).map(|s| XY {
                x: l.load_fraction * 100.0,
                y: s.median,
                lo: Some(s.min),
                hi: Some(s.max),
                valid: l.valid(),
            })
        })
        .collect()
}

/// A latency-vs-load figure with one series per configuration.
pub(super) fn latency_figure(
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

pub(super) fn all_loads(groups: &[(String, Vec<Level>)]) -> Vec<f64> {
    let mut loads: Vec<f64> = groups
        .iter()
        .flat_map(|(_, l)| l.iter().map(|l| l.load_fraction))
        .collect();
    loads.sort_by(f64::total_cmp);
    loads.dedup_by(|a, b| (*a - *b).abs() < 1e-6);
    loads
}

pub(super) fn be_share_figure(groups: &[(String, Vec<Level>)]) -> Figure {
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
                points: points(levels, |l| l.spread_of(|p| p.be_norm)),
            })
            .collect(),
    }
}

pub(super) fn per_level_table(
    id: &str,
    title: &str,
    m: &Manifest,
    groups: &[(String, Vec<Level>)],
) -> Table {
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
