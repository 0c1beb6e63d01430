//! The headroom binary's integration tests in one binary (one build and link instead of one per
//! file); each module is one room. Beside this directory, with a process of their own: the demo and
//! the VM stage (minutes each, measuring), the antagonists (they load every CPU) and the many-core
//! check.

mod support;

mod agent_advertise;
mod agent_e2e;
mod agent_faults;
mod agent_kube_kill9;
mod agent_kube_live;
mod agent_log_pipe;
mod agent_multi_lc;
mod bench_advertise;
mod bench_agent_stop;
mod bench_flags;
mod dashboard;
mod docs_links;
mod doctor_cli;
mod kube_discover_cli;
mod kube_hostile_pass_11;
mod kube_lows;
mod kube_lows2;
mod load_cli;
mod lows_16_17;
mod package_deb;
mod plan_cli;
mod report_cli;
mod serve_cli;
mod sim_cli;
