//! The study + format of a finished (or interrupted) run directory.

use std::path::Path;

use crate::error::Result;
use crate::experiments::Experiment;
use crate::study;
use headroom_report::figure::Study;
use headroom_report::format::{self, ReportFiles};
use headroom_report::model::{ColocationRun, Manifest, Point};
use headroom_report::store::{RunDir, BASELINES, POINTS, RUNS};

/// Studies a run directory from its raw results (pure: no subprocess, no clock).
pub fn study_dir(dir: &RunDir) -> Result<(Manifest, Study)> {
    let manifest = dir.read_manifest()?;
    let exp: Experiment = manifest.experiment.parse()?;
    let mut commands = Vec::new();
    // Baselines differ in type (LC, solo BE); all carry their commands.
    for b in dir.all::<serde_json::Value>(BASELINES)? {
        if let Some(c) = b.get("commands").and_then(|c| c.as_array()) {
            commands.extend(c.iter().filter_map(|x| x.as_str().map(String::from)));
        }
    }
    let mut study = match exp {
        Experiment::Colocation => {
            let mut runs: Vec<ColocationRun> = dir.all(RUNS)?;
            // In the order the policies were given (`none` first, as the baseline).
            let order: Vec<String> = manifest
                .params
                .get("series")
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default();
            runs.sort_by_key(|r| {
                order
                    .iter()
                    .position(|p| *p == r.policy)
                    .unwrap_or(usize::MAX)
            });
            for r in &runs {
                commands.extend(r.commands.iter().cloned());
            }
            study::study_colocation(&manifest, &runs)
        }
        _ => {
            let points: Vec<Point> = dir.all(POINTS)?;
            // Every point of a series shares its setup; one point per series shows the load run.
            let mut seen = std::collections::BTreeSet::new();
            for p in &points {
                if seen.insert(p.series.clone()) {
                    commands.extend(p.commands.iter().cloned());
                }
            }
            let order: Vec<String> = manifest
                .params
                .get("series")
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default();
            study::study_sweep(exp, &manifest, &points, &order)
        }
    };
    let mut unique = std::collections::BTreeSet::new();
    study.commands = commands
        .into_iter()
        .filter(|c| unique.insert(c.clone()))
        .collect();
    Ok((manifest, study))
}

/// `headroom report DIR`: re-studies and re-renders a run directory without re-running anything.
pub fn report(dir: &Path) -> Result<ReportFiles> {
    let run_dir = RunDir::open(dir)?;
    let (manifest, study) = study_dir(&run_dir)?;
    Ok(format::write_report(dir, &manifest, &study)?)
}
