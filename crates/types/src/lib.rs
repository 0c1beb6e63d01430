//! Plain types shared across the headroom crates: the contracts of docs/architecture.md.
//!
//! Each module belongs to the crate that produces the data; consumers only read it.

pub mod advertise;
pub mod allocation;
pub mod control;
pub mod decision;
pub mod discovery;
pub mod doctor;
pub mod load_result;
pub mod mechanism;
pub mod observation;
pub mod other_writers;
pub mod resources;
pub mod summary;
pub mod values;

pub use values::{CpuSet, DeviceId, GroupPath, GroupSpec, UserSpec, ValueError};
