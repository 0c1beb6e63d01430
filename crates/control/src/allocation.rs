//! What BE may use: a policy's output (the contract lives in `headroom-types`).

pub use headroom_types::allocation::*;
pub use headroom_types::values::{CpuSet, DeviceId, GroupPath};
