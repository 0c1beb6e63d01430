//! The seam between the agent's control logic and the machine it controls.
//!
//! Everything above this trait — the policies, the safety rules, the one ordered write path
//! ([`crate::actuation`]) and the tick's phases ([`crate::controller`]) — is the same code on a
//! real Linux host (`LinuxNode` in `headroom-agent`) and on a simulated server (`SimHost`
//! in `headroom-sim`). A node knows how to sense and how to read or write one knob; it knows
//! nothing of allocations, order, retries or rollback.

use std::collections::BTreeMap;
use std::time::Duration;

use headroom_types::resources::{L3Info, MbInfo};
use headroom_types::GroupPath;

use crate::actuation::knob::{Knob, KnobValue};
use headroom_types::observation::Observation;

/// A read or write one node could not do, naming what and why.
/// Its text names `what` once: a reason that names it already (the host's "reading X: ENOENT")
/// is said alone (a gone knob read "reading X: X: reading X: ENOENT", hostile pass 13).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", named_once(.what, .reason))]
pub struct NodeError {
    /// The file, command or model part (`/sys/fs/cgroup/cpuset/hr/be/cpuset.cpus`, …).
    pub what: String,
    pub reason: String,
    /// The knob does not exist on this node (a kernel without `cpu.idle`, say): not managed.
    pub not_found: bool,
}

/// `reason` alone when it names `what` already, else `what: reason`.
pub(crate) fn named_once(what: &str, reason: &str) -> String {
    if !what.is_empty() && reason.contains(what) {
        reason.to_string()
    } else {
        format!("{what}: {reason}")
    }
}

impl NodeError {
    pub fn new(what: impl Into<String>, reason: impl Into<String>) -> NodeError {
        NodeError {
            what: what.into(),
            reason: reason.into(),
            not_found: false,
        }
    }
}

/// What a node offers the write path, found once at start: how a CPU weight is spelled, the
/// cache and bandwidth partitioning hardware, the BE CPUs' frequency range, the egress link.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeFacts {
    /// cgroup v2 `cpu.weight` (1..10000) rather than v1 `cpu.shares` for CPU weights.
    pub v2_weights: bool,
    /// L3 cache allocation (resctrl), when driven here.
    pub l3: Option<L3Info>,
    /// Memory bandwidth allocation (resctrl), when driven here.
    pub mb: Option<MbInfo>,
    /// The BE resctrl group was found at start (left by an agent that crashed).
    pub resctrl_leftover: bool,
    /// CPU → (min, max) kHz of `scaling_max_freq`, where frequency caps are driven.
    pub freq_range: Option<BTreeMap<u32, (u64, u64)>>,
    /// The egress link rate in bits/s, where egress is shaped.
    pub egress_link_bits: Option<u64>,
    /// Block-I/O throttles of the BE groups are driven here.
    pub io: bool,
}

/// A machine the agent controls: real (`LinuxNode`) or modelled (`SimHost`).
pub trait Node {
    /// What this node offers the write path.
    fn facts(&self) -> &NodeFacts;

    /// The observation at `t` since the agent started (monotonic; simulated time on a model).
    fn sense(&mut self, t: Duration) -> &Observation;

    /// The observation the tick at `t` publishes, after its writes. The default senses again
    /// (a model re-evaluates and shows its writes' effect); a real host returns the sample the
    /// tick decided on, as a second sample would cost as much as the first and take what only
    /// the first may take once (the idle count of a crossing).
    fn observed(&mut self, t: Duration) -> &Observation {
        self.sense(t)
    }

    /// What the node holds for `knob` now.
    fn read(&mut self, knob: &Knob) -> Result<KnobValue, NodeError>;

    /// Sets one knob (one file, one command, one model parameter). `from` is what the node held
    /// before, as far as the write path knows (a tc tree is built, not changed, from nothing).
    fn write(&mut self, knob: &Knob, from: &KnobValue, to: &KnobValue) -> Result<(), NodeError>;

    /// Kills every process of the BE groups (`be_kill`: on low memory freezing would not free
    /// any); returns how many were signalled.
    fn kill_be(&mut self, _groups: &[GroupPath]) -> usize {
        0
    }

    /// Waits before a failed write is tried again (a busy cgroup settles in well under a ms);
    /// a model need not wait.
    fn retry_pause(&mut self) {}

    /// Describes a knob for logs and errors (the file it lives in, on a real host).
    fn describe(&self, knob: &Knob) -> String {
        knob.to_string()
    }
}
