//! CPU lists: the type lives in `headroom-types` (config, Allocation and the host layer share it).

pub use headroom_types::values::{CpuSet, MAX_CPU_ID};
