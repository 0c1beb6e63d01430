//! headroom-sim: `SimHost`, a modelled server the real policies run against in simulated time;
//! fleets of them (`headroom sim fleet`); calibration from bench results and validation against
//! real runs (`headroom sim calibrate | validate`); and Leverich & Kozyrakis' TCO model
//! (`headroom plan`).

pub mod calibrate;
mod closed_loop;
pub mod cluster;
pub mod cluster_costs;
pub mod cluster_jobs;
pub mod des;
pub mod error;
pub mod fleet;
pub mod host;
pub mod model;
pub mod multi;
pub mod node;
pub mod queue;
pub mod report;
pub mod run;
pub mod setup;
pub mod tco;
pub mod trace;
pub mod validate;

pub use error::SimError;
