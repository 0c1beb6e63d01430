//! headroom-load: an open-loop, coordinated-omission-free load generator (a mutilate superset).
//!
//! Drive it with [`LoadOptions`] and [`run`] (or [`run_report`] for the full result JSON), or
//! [`sweep::scan`] / [`sweep::search`]; [`agent`] holds the distributed mode.

pub mod dist;
pub mod protocol;
pub mod stats;

pub mod agent;
pub mod args;
pub mod checks;
pub mod clock;
pub mod engine;
pub mod error;
pub mod feed;
pub mod hdrlog;
mod interval_merge;
pub mod keys;
pub mod options;
pub mod preload;
pub mod readiness;
pub mod report;
pub mod results;
pub mod runner;
pub mod sched;
pub mod sizing;
pub mod sweep;
pub mod testkit;

pub use args::{LoadArgs, Sweep};
pub use error::LoadError;
pub use keys::Popularity;
pub use options::{LoadOptions, ProtocolKind, ScanSpec, SearchSpec};
pub use preload::{preload, PreloadStats};
pub use report::LoadReport;
pub use results::Interval;
pub use results::RawResults;

use crate::options::Validated;
use headroom_types::load_result::LoadResult;

/// Runs the load (with its agents when `opts.agents` is not empty) and merges the raw results.
pub fn run_raw(
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&Interval),
) -> Result<RawResults, LoadError> {
    let v = opts.validate()?;
    run_validated(opts, &v, progress)
}

/// [`run_raw`] on options already validated into `v`.
fn run_validated(
    opts: &LoadOptions,
    v: &Validated,
    progress: &mut dyn FnMut(&Interval),
) -> Result<RawResults, LoadError> {
    if opts.agents.is_empty() {
        runner::run_local_validated(opts, v, progress)
    } else {
        agent::run_distributed(opts, progress)
    }
}

/// Runs the load and returns the full result (contract keys plus headroom's extras), checks done
/// against the 99th percentile.
pub fn run_report(
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&Interval),
) -> Result<LoadReport, LoadError> {
    // validated once (the server names resolved once): the run uses what was checked
    let v = opts.validate()?;
    let raw = run_validated(opts, &v, progress)?;
    Ok(report::build_report(&raw, &v.iadist_unit, 99.0))
}

/// Runs the load and returns the result (docs/architecture.md "The JSON contracts"). `progress` sees one merged interval per second.
pub fn run(
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&Interval),
) -> Result<LoadResult, LoadError> {
    run_report(opts, progress).map(|r| r.result)
}

/// A seeded or random small RNG; `salt` separates streams drawn from one seed.
pub(crate) fn seeded_rng(seed: Option<u64>, salt: u64) -> rand::rngs::SmallRng {
    use rand::SeedableRng;
    match seed {
        Some(s) => rand::rngs::SmallRng::seed_from_u64(s ^ salt),
        None => rand::rngs::SmallRng::from_os_rng(),
    }
}
