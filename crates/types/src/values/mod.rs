//! Values validated when they are built: a cgroup path that cannot climb out of the cgroup root,
//! a CPU set in the kernel's list syntax, a block device number, a user by uid or login name.
//! Config, Allocation, the host layer and the state file all hold these types, so a value that
//! was accepted once is valid
//! everywhere it travels (`./x` is refused when the config is read, not when the agent starts).

mod cpu_set;
mod device_id;
mod group;
mod group_path;
mod user;

pub use cpu_set::{CpuSet, MAX_CPU_ID};
pub use device_id::DeviceId;
pub use group::GroupSpec;
pub use group_path::GroupPath;
pub use user::{UserSpec, MAX_USER_NAME};

/// A value refused at construction: what it was meant to be, the value, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct ValueError {
    pub what: &'static str,
    pub value: String,
    pub reason: String,
}

impl ValueError {
    pub fn new(what: &'static str, value: impl Into<String>, reason: impl Into<String>) -> Self {
        ValueError {
            what,
            value: value.into(),
            reason: reason.into(),
        }
    }
}
