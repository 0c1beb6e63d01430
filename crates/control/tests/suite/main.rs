//! The control crate's integration tests, one binary: each file below is one room of tests.

mod config_support;

mod be_pids;
mod config_all_at_once;
mod config_errors;
mod config_kernel_latency;
mod config_parse;
mod config_paths;
mod config_several_lcs;
mod interval_floor;
mod knob_error_text;
mod live_numbers;
mod policy_blind;
mod policy_heracles;
mod policy_hybrid;
mod policy_multi;
mod policy_replay;
mod policy_safety;
mod policy_sim;
mod policy_static;
mod policy_weights;
