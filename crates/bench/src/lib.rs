//! headroom-bench: the papers' experiments as record → study → format.
//!
//! * **record** drives the `headroom` binary's subcommands as subprocesses (serve, antagonist,
//!   load, agent) and stores every raw result as JSON in the run directory, so an interrupted run
//!   resumes where it stopped ([`store`]);
//! * **study** turns the raw results into medians, spreads, windows and EMU ([`stats`],
//!   [`study`]) — a pure function of the run directory;
//! * **format** renders `report.html` (inline SVG plots), `summary.md`, `summary.json` and one CSV and
//!   JSON per figure ([`format`]).

pub mod capability;
pub mod error;
pub mod experiments;
pub mod fixture;
pub mod record;
pub mod runner;
pub mod stats;
pub mod study;
pub mod tools;
pub mod validity;

pub use error::{BenchError, Result};
// The results store and the renderer live in headroom-report (sim shares them); re-exported so
// `headroom_bench::model::…` and the experiments' `crate::store::…` keep their paths.
pub use headroom_report::{browser, figure, format, model, plot, store};
