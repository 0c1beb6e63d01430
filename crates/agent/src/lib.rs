//! headroom-agent: the colocation controller (sensors → Observation → Policy → Allocation →
//! Reconciler → Host).

pub mod actuation;
pub mod allocation;
pub mod config;
pub mod controller;
pub mod decision;
pub mod observation;
pub mod policy;

pub mod control;
pub mod feed;
pub mod idle_wake;
pub mod lc_signal;
pub mod lc_threads;
pub mod metrics;
pub mod node;
pub mod probe;
pub mod reaction_log;
pub mod runtime;
pub mod scrape;
pub mod sensors;
pub mod state;
pub mod supervisor;
