//! The kube crate's integration tests in one binary; each module is one room. hostile_pass_10.rs
//! stays beside this directory: it installs a process-wide tracing subscriber.

#[path = "support/as_root.rs"]
mod as_root;
#[path = "support/client_start.rs"]
mod client_start;
#[path = "support/list.rs"]
mod list;

mod advertise;
mod apiserver;
mod hostile_pass_11;
mod hostile_pass_16;
mod hostile_pass_17;
mod hostile_pass_8;
mod kube_lows;
mod kube_lows2;
mod kubeconfig_file;
mod kubelet_cgroups;
mod list_bounds;
mod lows_16_17;
mod watch_event_strings;
