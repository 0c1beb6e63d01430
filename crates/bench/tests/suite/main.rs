//! The bench crate's integration tests in one binary; each module is one room.

mod common;

mod agent_configs;
mod capacity_probe;
mod loadgen_sched;
mod report;
mod resume;
mod study;
mod validity;
