//! A cgroup interface file, declared once: the controller that owns it and its name on each
//! backend. Every controller file declares its knobs as constants of this type, so a v1/v2
//! spelling lives in exactly one place and a knob one backend lacks is refused by name.

use super::Controller;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnobFile {
    pub controller: Controller,
    /// The v1 file name (`None`: v1 has no such knob).
    pub v1: Option<&'static str>,
    /// The v2 file name (`None`: v2 has no such knob).
    pub v2: Option<&'static str>,
}

impl KnobFile {
    pub const fn both(controller: Controller, v1: &'static str, v2: &'static str) -> Self {
        KnobFile {
            controller,
            v1: Some(v1),
            v2: Some(v2),
        }
    }

    pub const fn v1_only(controller: Controller, v1: &'static str) -> Self {
        KnobFile {
            controller,
            v1: Some(v1),
            v2: None,
        }
    }

    pub const fn v2_only(controller: Controller, v2: &'static str) -> Self {
        KnobFile {
            controller,
            v1: None,
            v2: Some(v2),
        }
    }

    /// The file name on the given backend, if that backend has the knob.
    pub fn name(&self, v2: bool) -> Option<&'static str> {
        if v2 {
            self.v2
        } else {
            self.v1
        }
    }

    /// A name for messages: the v2 spelling where there is one.
    pub fn display_name(&self) -> &'static str {
        self.v2.or(self.v1).unwrap_or("?")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_knob_names_only_the_backends_that_have_it() {
        let shares = KnobFile::both(Controller::Cpu, "cpu.shares", "cpu.weight");
        assert_eq!(shares.name(false), Some("cpu.shares"));
        assert_eq!(shares.name(true), Some("cpu.weight"));
        let rt = KnobFile::v1_only(Controller::Cpu, "cpu.rt_runtime_us");
        assert_eq!(rt.name(true), None);
        assert_eq!(rt.display_name(), "cpu.rt_runtime_us");
        let max = KnobFile::v2_only(Controller::Cpu, "cpu.max");
        assert_eq!(max.name(false), None);
    }
}
