//! headroom-report: where results live and how they are shown, shared by `headroom bench` and
//! `headroom sim`.
//!
//! * [`store`]: a run directory of resumable JSON records (manifest, points, runs, baselines),
//!   written atomically; [`model`] is the records' types;
//! * [`figure`]: what a study produced (figures, tables), independent of how it is drawn;
//! * [`plot`] draws a figure as SVG; [`format`] writes `report.html` (inline SVG), `summary.md`,
//!   `summary.json` and one CSV and JSON per figure; [`browser`] checks a report in headless
//!   Chromium.

pub mod browser;
pub mod error;
pub mod figure;
pub mod format;
pub mod model;
pub mod plot;
pub mod store;

pub use error::{ReportError, Result};
