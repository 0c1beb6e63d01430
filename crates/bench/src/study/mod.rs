//! The study step: pure functions from the raw results of a run directory to a [`Study`].

use std::collections::BTreeMap;

use crate::stats::Spread;
use headroom_report::model::{LoadMetrics, Point};

mod colocation;
mod figures;
mod run_dir;
mod sweep;
pub use colocation::*;
pub use run_dir::{report, study_dir};
pub use sweep::study_sweep;

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

pub(super) fn tail_fn(percentile: f64) -> impl Fn(&LoadMetrics) -> Option<f64> + Copy {
    move |l: &LoadMetrics| l.percentile_us(percentile)
}

pub(super) fn pct_label(f: f64) -> String {
    format!("{}%", headroom_report::plot::trim_num(f * 100.0))
}
