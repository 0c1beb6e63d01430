//! What one plan did: the writes made, and why a plan stopped (a failed read or write, what
//! was kept and what was undone).

use std::fmt;

use serde::Serialize;

use super::knob::{Knob, KnobValue};
use super::target::TargetError;
use crate::node::NodeError;

/// A write that was made (or found: drift).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Write {
    pub knob: Knob,
    pub from: Option<KnobValue>,
    pub to: KnobValue,
}

/// The outcome of one successful plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    /// Writes in the order they were made.
    pub writes: Vec<Write>,
    /// Knobs found changed by someone else (and rewritten).
    pub drift: Vec<Write>,
    /// Write attempts that failed but succeeded on a retry.
    pub retries: u32,
}

/// Why a plan was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum ActuationError {
    #[error("{0}")]
    Write(Box<WriteFailure>),
    /// A value could not be read (nothing was written). Its text names `what` once.
    #[error("{}", read_text(.what, .source))]
    Read {
        what: String,
        #[source]
        source: NodeError,
    },
    /// The allocation asks for something this node cannot take (nothing was written).
    #[error(transparent)]
    Target(#[from] TargetError),
    /// Some originals could not be put back (each named); the others were.
    #[error("restoring originals: {}", .0.join("; "))]
    Restore(Vec<String>),
}

/// "reading `what`: why", naming `what` once: a source that names it already (the host's
/// "reading X: ENOENT") is not prefixed with it again.
fn read_text(what: &str, source: &NodeError) -> String {
    let text = source.to_string();
    if what.is_empty() || !text.contains(what) {
        format!("reading {what}: {text}")
    } else if text.starts_with("reading ") {
        text
    } else {
        format!("reading {text}")
    }
}

/// A write that kept failing, and what happened to the writes made before it.
#[derive(Debug, thiserror::Error)]
#[error("setting {what} to {value} failed after {attempts} attempts: {source}; {}; {rollback}{}",
    kept_text(.kept), also_text(.also_failed))]
pub struct WriteFailure {
    pub knob: Knob,
    /// The file or command (`/sys/fs/cgroup/cpuset/hr/be/cpuset.cpus`, `tc HTB on dev eth0`).
    pub what: String,
    pub value: KnobValue,
    pub attempts: u32,
    #[source]
    pub source: NodeError,
    pub rollback: RollbackOutcome,
    /// Writes that confine BE, made (before or after the failure) and kept.
    pub kept: Vec<Write>,
    /// Other confining writes that failed too (each named with its error).
    pub also_failed: Vec<String>,
}

fn kept_text(kept: &[Write]) -> String {
    if kept.is_empty() {
        return "no confining write kept".to_string();
    }
    let named: Vec<String> = kept
        .iter()
        .map(|w| format!("{} = {}", w.knob, w.to))
        .collect();
    format!(
        "kept {} confining write(s): {}",
        kept.len(),
        named.join(", ")
    )
}

fn also_text(also: &[String]) -> String {
    if also.is_empty() {
        String::new()
    } else {
        format!("; also failed: {}", also.join("; "))
    }
}

/// How a rollback went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollbackOutcome {
    /// Nothing had been written yet.
    NothingToUndo,
    /// Every earlier write was undone.
    RolledBack(usize),
    /// Some undo writes failed too (named).
    Incomplete(Vec<String>),
}

impl fmt::Display for RollbackOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RollbackOutcome::NothingToUndo => f.write_str("nothing had been written"),
            RollbackOutcome::RolledBack(n) => write!(f, "rolled back {n} earlier write(s)"),
            RollbackOutcome::Incomplete(e) => write!(f, "rollback INCOMPLETE: {}", e.join("; ")),
        }
    }
}
