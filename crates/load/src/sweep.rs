//! `--scan MIN:MAX:STEP` (one run per QPS step) and `--search P:TARGET_US` (the highest QPS whose
//! P-th percentile of corrected latency stays under the target: a peak run, then bisection).

use crate::error::LoadError;
use crate::options::{LoadOptions, ScanSpec, SearchSpec};
use crate::report::{build_report, LoadReport};
use crate::results::RawResults;
use crate::run_raw;

/// One run of a scan or search.
#[derive(Clone, Debug)]
pub struct SweepRow {
    /// Target QPS of this run (0 for the peak run of a search).
    pub qps: u64,
    /// P-th percentile (corrected, GETs and SETs together) in µs, P = the search's or 99.
    pub percentile_us: f64,
    pub report: LoadReport,
}

/// Most runs a search makes after its peak run.
pub const SEARCH_MAX_STEPS: usize = 10;

/// Merged corrected latency of the reported reads and updates.
fn percentile_of(raw: &RawResults, p: f64) -> f64 {
    let h = raw.reported();
    let mut all = h.read.clone();
    all.merge(&h.update);
    if all.count() == 0 {
        return f64::INFINITY;
    }
    all.percentile_us(p)
}

fn one_run(opts: &LoadOptions, qps: u64, percentile: f64) -> Result<SweepRow, LoadError> {
    let run_opts = LoadOptions {
        qps,
        ..opts.clone()
    };
    let v = run_opts.validate()?;
    let raw = run_raw(&run_opts, &mut |_| {})?;
    Ok(SweepRow {
        qps,
        percentile_us: percentile_of(&raw, percentile),
        report: build_report(&raw, &v.iadist_unit, percentile),
    })
}

/// Options for the runs after the first: keys are loaded once.
fn after_first(opts: &LoadOptions) -> LoadOptions {
    LoadOptions {
        noload: true,
        ..opts.clone()
    }
}

/// Runs each QPS of `spec` for `opts.time_s` (after `opts.warmup_s`), calling `on_row` as rows
/// finish.
pub fn scan(
    opts: &LoadOptions,
    spec: &ScanSpec,
    on_row: &mut dyn FnMut(&SweepRow),
) -> Result<Vec<SweepRow>, LoadError> {
    let mut rows = Vec::new();
    let mut o = opts.clone();
    for q in spec.steps() {
        let row = one_run(&o, q, 99.0)?;
        on_row(&row);
        rows.push(row);
        o = after_first(opts);
    }
    Ok(rows)
}

/// Outcome of a search.
#[derive(Clone, Debug)]
pub struct SearchOutcome {
    pub spec: SearchSpec,
    /// Highest QPS that met the target with a valid rate, if any did.
    pub best: Option<SweepRow>,
    /// Every run made (the peak run first), sorted by QPS: the curve around the answer.
    pub curve: Vec<SweepRow>,
}

/// A run meets the target when its percentile is under it and the client held the rate.
fn meets(row: &SweepRow, spec: &SearchSpec) -> bool {
    let rate_ok = row
        .report
        .result
        .checks
        .iter()
        .find(|c| c.name == "rate")
        .is_none_or(|c| c.ok);
    rate_ok && row.percentile_us <= spec.target_us
}

/// Peak run (`qps = 0`), then bisection between 0 and the peak until the bracket is within 2% of
/// the peak or [`SEARCH_MAX_STEPS`] runs.
pub fn search(
    opts: &LoadOptions,
    spec: &SearchSpec,
    on_row: &mut dyn FnMut(&SweepRow),
) -> Result<SearchOutcome, LoadError> {
    let peak = one_run(opts, 0, spec.percentile)?;
    on_row(&peak);
    let o = after_first(opts);
    let peak_qps = peak.report.result.achieved_qps.floor() as u64;
    let mut curve = vec![peak];
    let (mut lo, mut hi) = (0u64, peak_qps.max(2));
    let mut best: Option<SweepRow> = None;
    let resolution = (peak_qps / 50).max(10);
    for _ in 0..SEARCH_MAX_STEPS {
        if hi - lo <= resolution {
            break;
        }
        let mid = if best.is_none() && lo == 0 && curve.len() == 1 {
            // First probe near the top: the answer is often close to the peak.
            (hi as f64 * 0.9) as u64
        } else {
            lo + (hi - lo) / 2
        };
        let row = one_run(&o, mid.max(1), spec.percentile)?;
        on_row(&row);
        if meets(&row, spec) {
            lo = mid;
            best = Some(row.clone());
        } else {
            hi = mid;
        }
        curve.push(row);
    }
    curve.sort_by_key(|r| r.qps);
    Ok(SearchOutcome {
        spec: *spec,
        best,
        curve,
    })
}
