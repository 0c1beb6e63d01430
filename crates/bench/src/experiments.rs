//! The papers' experiments by name.

use crate::error::{BenchError, Result};

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
