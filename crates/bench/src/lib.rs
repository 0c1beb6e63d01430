//! headroom-bench: the papers' experiments as record → study → format.
//!
//! * **record** drives the `headroom` binary's subcommands as subprocesses (serve, antagonist,
//!   load, agent) and stores every raw result as JSON in the run directory, so an interrupted run
//!   resumes where it stopped (`headroom_report::store`);
//! * **study** turns the raw results into medians, spreads, windows and EMU ([`stats`],
//!   [`study`]) — a pure function of the run directory;
//! * **format** renders `report.html` (inline SVG plots), `summary.md`, `summary.json` and one CSV and
//!   JSON per figure (`headroom_report::format`).

pub mod capability;
pub mod error;
pub mod experiments;
pub mod fixture;
pub mod record;
pub mod runner;
pub mod stats;
pub mod stop_on_signal;
pub mod study;
pub mod tools;
pub mod validity;

pub use error::{BenchError, Result};
