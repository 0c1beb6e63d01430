//! headroom-agent: the colocation controller on Linux — sensors, the Linux node behind the
//! `Node` seam, the runtime loop, the BE supervisor and what it publishes. The control logic it
//! runs (config, policies, the controller, the write plan) is `headroom-control`.

pub mod config_file;
pub mod group_lock;
mod interpreter;
mod lc_record;
pub mod linux_node;
mod made_dirs;
pub mod publish;
pub mod run_as;
pub mod runtime;
pub mod sensors;
pub mod socket_file;
pub mod state;
mod state_lock;
pub mod supervisor;
pub mod trusted_dir;
