//! headroom-control: the agent's control logic, pure — config and its validation, the policies,
//! decisions, the controller's tick, the [`node::Node`] seam and the one ordered write plan
//! ([`actuation`]). It reads no file and no clock and depends on no I/O crate, so the compiler
//! keeps it pure; `headroom-agent` drives it on Linux, `headroom-sim` on modelled servers.

pub mod actuation;
pub mod advertise;
pub mod config;
pub mod controller;
pub mod decision;
pub mod discovered;
pub mod node;
pub mod policy;
