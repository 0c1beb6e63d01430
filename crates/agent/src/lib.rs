//! headroom-agent: the colocation controller (sensors → Observation → Policy → Allocation →
//! Reconciler → Host).

pub mod actuation;
pub mod allocation;
pub mod config;
pub mod controller;
pub mod decision;
pub mod discovered;
pub mod observation;
pub mod policy;

pub mod node;
pub mod publish;
pub mod runtime;
pub mod sensors;
pub mod state;
pub mod supervisor;

// The paths other crates and tests import from (before the sensors/ and publish/ rooms).
pub use publish::{control, metrics, reaction_log};
pub use sensors::{feed, idle_wake, lc_signal, lc_threads, probe, scrape};
