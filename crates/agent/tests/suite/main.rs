//! The agent crate's integration tests in one binary (one build and link instead of one per file);
//! each module is one room. hostile_pass_14.rs stays beside this directory: its umask test changes
//! a process-wide setting.

#[path = "../live/mod.rs"]
mod live;
mod servers;
mod support;

mod be_command_dies;
mod be_user;
mod config_file;
mod ctl_set_checks;
mod ctl_wake;
mod freeze_verify;
mod hostile_pass_10;
mod hostile_pass_10_kube;
mod hostile_pass_10_lows;
mod hostile_pass_13;
mod hostile_pass_15;
mod hostile_pass_4;
mod hostile_pass_5;
mod hostile_pass_6;
mod hostile_pass_7;
mod hostile_pass_8;
mod hostile_pass_8_kube;
mod hostile_pass_9;
mod hostile_pass_9_lows;
mod lc_rt_budget;
mod lock_files;
mod lows_12_13;
mod lows_14_15;
mod moving_targets;
mod multi_events;
mod one_agent_per_group;
mod policy_cost;
mod prober;
mod reconcile_fake;
mod reconcile_real;
mod runtime_parts;
mod slow_clients;
mod state_file_faults;
