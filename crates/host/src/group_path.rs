//! Cgroup paths: the type lives in `headroom-types` (config, Allocation, the state file and the
//! host layer share it), validated on construction so nothing outside the cgroup roots can ever
//! be written (docs/architecture.md, safety rule 5).

pub use headroom_types::values::GroupPath;
