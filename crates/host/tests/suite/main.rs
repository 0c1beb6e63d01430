//! The host crate's integration tests in one binary (one build and link instead of one per file);
//! each module is one room. Tests that need a process of their own (a counting global allocator, a
//! child re-run by its test name) stay beside this directory.

#[path = "support/real.rs"]
mod real;
mod support;

mod cgroup_knobs;
mod cgroup_structure;
mod cpuset_nest;
mod doctor_fake;
mod doctor_kernel_vs_hardware;
mod doctor_live;
mod freeze_start;
mod group_kill;
mod path_safety;
mod pid_file_p13;
mod real_cgroups;
mod resctrl_power;
mod sched;
mod sensors;
mod tc_fake;
mod tc_netns;
