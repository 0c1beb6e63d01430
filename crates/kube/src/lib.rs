//! Live discovery of a Kubernetes node's latency-critical pods.
//!
//! Every Running pod of the node annotated `headroom.io/slo-p99-us` (optionally
//! `headroom.io/latency-port`, `headroom.io/priority`) is an LC service from the moment it runs
//! until it goes, its cgroup derived from its QoS class and UID in the node's kubelet layout
//! (cgroupfs or systemd driver). The pure rooms ([`layout`], [`pod`], [`state`]) hold every
//! rule; [`watch`] is the I/O: a kube-rs watcher with a `spec.nodeName` field selector feeding
//! them, publishing [`headroom_types::discovery::LcSet`]s. With `[kubernetes] advertise`,
//! [`publish`] keeps the node's `headroom.io/be-cpu` and `headroom.io/be-memory` at the agent's
//! values and [`floor`] sums what the node's bound pods requested of each. See
//! docs/kubernetes.md.

pub mod api_bounds;
pub mod exec_command;
pub mod file_trust;
pub mod floor;
pub mod kubeconfig_file;
pub mod layout;
pub mod pod;
pub mod publish;
#[cfg(feature = "stand-in")]
pub mod stand_in;
pub mod state;
pub mod watch;

pub use floor::{BoundPod, Floor, BE_CPU, BE_MEMORY};
pub use layout::{detect, group_exists, resolve, KubeletLayout};
pub use pod::{PodFacts, Verdict, LATENCY_PORT, PRIORITY, SLO_P99_US};
pub use publish::{PublishOptions, PublishState, Publisher, Wanted};
pub use state::{Discoverer, PodEvent};
pub use watch::{client, run, Discovery, DiscoveryOptions, EventSink, KubeError};
