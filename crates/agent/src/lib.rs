//! headroom-agent: the colocation controller (sensors → Observation → Policy → Allocation →
//! Reconciler → Host).

pub mod allocation;
pub mod config;
pub mod decision;
pub mod observation;
pub mod policy;
