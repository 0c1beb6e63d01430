//! The load crate's integration tests in one binary; each module is one room. stamps.rs stays
//! beside this directory: it sets process-wide environment variables.

#[path = "../support/mod.rs"]
mod support;

mod agents;
mod core_bench;
mod core_contract;
mod core_memcached;
mod engine;
mod engines;
mod memcached;
mod mm1;
mod parity;
mod sizing;
