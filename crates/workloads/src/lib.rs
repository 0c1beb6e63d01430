//! headroom-workloads: the latency-critical service (`headroom serve`, memcached-compatible) and
//! the interference suite (`headroom antagonist`) that experiments, tests and the demo run.

pub mod antagonist;
pub mod serve;
pub mod signal;
pub mod topology;
