//! The sim crate's integration tests in one binary; each module is one room.

#[path = "../../../agent/tests/suite/support/mod.rs"]
mod support;

mod agent_config;
mod calibration_roundtrip;
mod knob_responses;
mod queue_closed_forms;
mod seam_equivalence;
