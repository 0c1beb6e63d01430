//! The agent's integration tests, one binary: each file below is one room of tests.
//!
//! Tests from different files run side by side in this one process, so what a test holds that is
//! the process's, not its own, is shared with care: the `sleep` markers of `live::marked` are
//! unique in the process; the tests whose LC is this process itself, and those whose agent makes
//! the one `[kubernetes]` discovery holder group, take a lock in `live` for their whole run.
//! Two files stay their own binaries beside this one: `hostile_pass_14` sets the process's umask
//! to 0 (every file another test wrote meanwhile would be made writable by others), and
//! `hostile_pass_10_kube` counts this process's sensor threads (every other agent's would count).

mod live;
mod servers;
mod support;

mod adopted_output;
mod be_command_changed;
mod be_command_dies;
mod be_pids;
mod be_user;
mod config_file;
mod ctl_set_checks;
mod ctl_wake;
mod freeze_verify;
mod hostile_pass_10;
mod hostile_pass_10_lows;
mod hostile_pass_13;
mod hostile_pass_15;
mod hostile_pass_18;
mod hostile_pass_22;
mod hostile_pass_23;
mod hostile_pass_24;
mod hostile_pass_25;
mod hostile_pass_27;
mod hostile_pass_28;
mod hostile_pass_30;
mod hostile_pass_33;
mod hostile_pass_35;
mod hostile_pass_36;
mod hostile_pass_37;
mod hostile_pass_39;
mod hostile_pass_4;
mod hostile_pass_5;
mod hostile_pass_6;
mod hostile_pass_7;
mod hostile_pass_8;
mod hostile_pass_8_kube;
mod hostile_pass_9;
mod hostile_pass_9_lows;
mod lc_origins_reused;
mod lc_output;
mod lc_rt_budget;
mod lock_files;
mod lows_12_13;
mod lows_14_15;
mod lows_16_17;
mod lows_24_25;
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
mod targets_28;
mod thread_ids;
