//! What the agent publishes: the control socket, the Prometheus metrics and the reaction log.

pub mod control;
pub mod deadline;
pub mod metrics;
pub mod reaction_log;
pub mod scrape_server;
