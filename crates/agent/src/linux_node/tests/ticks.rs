//! The controller's ticks on a Linux node: read-backs keep to a period of tick time, and a
//! tick samples once.

use super::*;

/// Always the same allocation (the controller then writes only on a read-back).
struct Fixed(Allocation);

impl headroom_control::policy::Policy for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn decide(
        &mut self,
        _obs: &headroom_types::observation::Observation,
        _now: std::time::Duration,
    ) -> headroom_control::decision::Decision {
        headroom_control::decision::Decision {
            binding_lc: None,
            allocation: self.0.clone(),
            reason: "fixed".into(),
            state: serde_json::Value::Null,
        }
    }
    fn poll_interval(&self) -> std::time::Duration {
        std::time::Duration::from_millis(1)
    }
    fn reconfigure(&mut self, _config: &headroom_control::config::Config) {}
}

/// Counts the knob reads (and samples) the controller makes through the node.
struct CountingNode {
    inner: LinuxNode,
    reads: usize,
    senses: usize,
}

impl headroom_control::node::Node for CountingNode {
    fn facts(&self) -> &headroom_control::node::NodeFacts {
        self.inner.facts()
    }
    fn sense(&mut self, t: std::time::Duration) -> &headroom_types::observation::Observation {
        self.senses += 1;
        self.inner.sense(t)
    }
    fn observed(&mut self, t: std::time::Duration) -> &headroom_types::observation::Observation {
        self.inner.observed(t)
    }
    fn read(
        &mut self,
        knob: &headroom_control::actuation::knob::Knob,
    ) -> Result<headroom_control::actuation::knob::KnobValue, headroom_control::node::NodeError>
    {
        self.reads += 1;
        self.inner.read(knob)
    }
    fn write(
        &mut self,
        knob: &headroom_control::actuation::knob::Knob,
        from: &headroom_control::actuation::knob::KnobValue,
        to: &headroom_control::actuation::knob::KnobValue,
    ) -> Result<(), headroom_control::node::NodeError> {
        self.inner.write(knob, from, to)
    }
}

/// Ticks that follow events come at any spacing: read-backs keep to a period of tick time,
/// not to a count of ticks (a count of 100 at 1 ms polling meant 10 s between read-backs
/// when the event-driven agent ticked every 100 ms).
#[test]
fn read_backs_follow_the_period_in_tick_time_not_the_tick_count() {
    use headroom_control::controller::{Controller, Discard};
    use std::time::Duration;
    let m = Machine::new(false);
    let (node, act) = m.node();
    let mut node = CountingNode {
        inner: node,
        reads: 0,
        senses: 0,
    };
    let mut c = Controller::new(
        Box::new(Fixed(restricted())),
        Some(act),
        vec![0, 1, 2, 3],
        1000,
    )
    .with_verify_period(Duration::from_millis(100));
    let mut read_back_at = Vec::new();
    // Ticks 150 ms apart: each one is a read-back, though the tick count never reaches 1000.
    for i in 0..5u64 {
        let before = node.reads;
        c.step(&mut node, Duration::from_millis(i * 150), &mut Discard);
        if node.reads > before {
            read_back_at.push(i);
        }
    }
    assert_eq!(read_back_at, vec![0, 1, 2, 3, 4]);
    // Ticks 10 ms apart: one read-back per 100 ms of tick time.
    let mut n = 0;
    for i in 0..30u64 {
        let before = node.reads;
        c.step(
            &mut node,
            Duration::from_millis(1000 + i * 10),
            &mut Discard,
        );
        n += usize::from(node.reads > before);
    }
    assert_eq!(n, 3, "300 ms of 10 ms ticks read back 3 times");
}

/// A tick on a real host samples once: its publish phase shows the observation it decided on
/// (a second sample cost as much as the first, every tick, and took the crossing's idle count).
#[test]
fn a_linux_tick_samples_once() {
    use headroom_control::controller::{Controller, Discard};
    use std::time::Duration;
    let m = Machine::new(false);
    let (node, act) = m.node();
    let mut node = CountingNode {
        inner: node,
        reads: 0,
        senses: 0,
    };
    let mut c = Controller::new(
        Box::new(Fixed(restricted())),
        Some(act),
        vec![0, 1, 2, 3],
        1000,
    );
    for i in 0..5u64 {
        c.step(&mut node, Duration::from_millis(i * 100), &mut Discard);
    }
    assert_eq!(node.senses, 5, "one sample per tick");
}
