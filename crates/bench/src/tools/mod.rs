//! The tools' own benchmarks (`headroom bench loadgen|host|agent|prober|multi-lc|advertise`): what the load
//! generator, the host layer's sensors, the agent and its prober cost and how precisely they
//! measure. Unlike the experiments they time the crates' code in this process or the `headroom`
//! binary's subcommands directly, and print their figures (and write them as JSON with `--out`).

#[cfg(feature = "kube")]
pub mod advertise;
pub mod agent;
pub mod error;
pub mod flag_values;
pub mod host;
pub mod loadgen;
mod memcached;
pub mod multi_lc;
pub mod prober;

pub use error::{Result, ToolError};
