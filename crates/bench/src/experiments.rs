//! The experiments by name, and the study + format of a finished (or interrupted) run directory.

use std::path::Path;

use crate::error::{BenchError, Result};
use crate::figure::Study;
use crate::format::{self, ReportFiles};
use crate::model::{ColocationRun, Manifest, Point};
use crate::store::{RunDir, POINTS, RUNS};
use crate::study;

/// The papers' experiments `headroom bench NAME` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Experiment {
    LatencyVsLoad,
    Interference,
    Scheduling,
    Imbalance,
    Isolation,
    Colocation,
}

impl Experiment {
    pub const ALL: [Experiment; 6] = [
        Experiment::LatencyVsLoad,
        Experiment::Interference,
        Experiment::Scheduling,
        Experiment::Imbalance,
        Experiment::Isolation,
        Experiment::Colocation,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Experiment::LatencyVsLoad => "latency-vs-load",
            Experiment::Interference => "interference",
            Experiment::Scheduling => "scheduling",
            Experiment::Imbalance => "imbalance",
            Experiment::Isolation => "isolation",
            Experiment::Colocation => "colocation",
        }
    }
}

impl std::str::FromStr for Experiment {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Experiment> {
        Experiment::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| {
                BenchError::Input(format!(
                    "unknown experiment {s:?}: expected one of {}",
                    Experiment::ALL.map(|e| e.name()).join(", ")
                ))
            })
    }
}

/// Studies a run directory from its raw results (pure: no subprocess, no clock).
pub fn study_dir(dir: &RunDir) -> Result<(Manifest, Study)> {
    let manifest = dir.read_manifest()?;
    let exp: Experiment = manifest.experiment.parse()?;
    let study = match exp {
        Experiment::Colocation => {
            let runs: Vec<ColocationRun> = dir.all(RUNS)?;
            study::study_colocation(&manifest, &runs)
        }
        _ => {
            let points: Vec<Point> = dir.all(POINTS)?;
            let order: Vec<String> = manifest
                .params
                .get("series")
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default();
            study::study_sweep(exp, &manifest, &points, &order)
        }
    };
    Ok((manifest, study))
}

/// `headroom report DIR`: re-studies and re-renders a run directory without re-running anything.
pub fn report(dir: &Path) -> Result<ReportFiles> {
    let run_dir = RunDir::open(dir)?;
    let (manifest, study) = study_dir(&run_dir)?;
    format::write_report(dir, &manifest, &study)
}
