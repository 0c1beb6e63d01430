//! The freeze on a shrink counts as done once the write has returned (BE is confined: the
//! kernel marked every task and finishes FREEZING → FROZEN on its own); the read-backs verify
//! FROZEN and write it again, reported as drift, when a group stays FREEZING past the grace
//! (a task that cannot reach the refrigerator). Against a fake v1 tree.

use crate::support;

use headroom_control::actuation::{CgroupKnob, Knob};
use headroom_types::allocation::Allocation;
use support::{Fake, Plan};

#[test]
fn a_group_left_freezing_is_frozen_again_after_the_grace_and_reported() {
    let fake = Fake::v1();
    let mut r = Plan::on_hr(&fake);
    let off = Allocation {
        be_enabled: false,
        ..Allocation::default()
    };
    let report = r.apply(&off, true).unwrap();
    assert_eq!(report.writes.len(), 1, "{:?}", report.writes);
    assert_eq!(
        fake.io.take_writes(),
        vec![(
            "freezer/hr/be/freezer.state".to_string(),
            "FROZEN".to_string()
        )]
    );
    // The kernel is still freezing (a task on its way to the refrigerator): within the grace
    // a read-back counts it as frozen and writes nothing.
    fake.set_knob("freezer", "hr/be", "freezer.state", "FREEZING\n");
    let soon = r.apply(&off, true).unwrap();
    assert!(soon.writes.is_empty() && soon.drift.is_empty(), "{soon:?}");
    // Still FREEZING after the grace: not frozen — written again and reported as drift.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let late = r.apply(&off, true).unwrap();
    assert_eq!(late.drift.len(), 1, "{late:?}");
    assert!(matches!(
        late.drift[0].knob,
        Knob::Cgroup {
            knob: CgroupKnob::Frozen,
            ..
        }
    ));
    assert_eq!(
        fake.io.take_writes(),
        vec![(
            "freezer/hr/be/freezer.state".to_string(),
            "FROZEN".to_string()
        )]
    );
    // Once FROZEN, read-backs are quiet again.
    assert!(r.apply(&off, true).unwrap().writes.is_empty());
}

/// FREEZING the agent did not start (found at first sight, or left by a previous agent) is not
/// taken for frozen: the plan freezes it itself.
#[test]
fn freezing_found_at_first_sight_is_frozen_by_the_plan() {
    let fake = Fake::v1();
    let mut r = Plan::on_hr(&fake);
    fake.set_knob("freezer", "hr/be", "freezer.state", "FREEZING\n");
    let off = Allocation {
        be_enabled: false,
        ..Allocation::default()
    };
    let report = r.apply(&off, true).unwrap();
    assert_eq!(report.writes.len(), 1, "{report:?}");
    assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "FROZEN");
}
