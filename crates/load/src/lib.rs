//! headroom-load: an open-loop, coordinated-omission-free load generator (a mutilate superset).

pub mod dist;
pub mod protocol;
pub mod stats;
