//! An in-memory node for the actuation's tests: knob values in a map, every accepted write
//! recorded, and writes to the knobs in `refuse` refused (the tests' own helpers are in their
//! files).

use std::collections::BTreeMap;
use std::time::Duration;

use headroom_types::observation::Observation;

use super::{Knob, KnobValue};
use crate::node::{Node, NodeError, NodeFacts};

#[derive(Default)]
pub(super) struct MemNode {
    pub facts: NodeFacts,
    pub obs: Observation,
    pub values: BTreeMap<Knob, KnobValue>,
    /// Accepted writes, in order: (knob, value).
    pub writes: Vec<(Knob, KnobValue)>,
    /// Knobs whose writes the node refuses.
    pub refuse: Vec<Knob>,
}

impl Node for MemNode {
    fn facts(&self) -> &NodeFacts {
        &self.facts
    }
    fn sense(&mut self, _: Duration) -> &Observation {
        &self.obs
    }
    fn read(&mut self, knob: &Knob) -> Result<KnobValue, NodeError> {
        self.values.get(knob).cloned().ok_or(NodeError {
            what: knob.to_string(),
            reason: "not here".into(),
            not_found: true,
        })
    }
    fn write(&mut self, knob: &Knob, _: &KnobValue, to: &KnobValue) -> Result<(), NodeError> {
        if self.refuse.contains(knob) {
            return Err(NodeError::new(knob.to_string(), "refused"));
        }
        self.values.insert(knob.clone(), to.clone());
        self.writes.push((knob.clone(), to.clone()));
        Ok(())
    }
}
