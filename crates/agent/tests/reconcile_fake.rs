//! The reconciler against a fake cgroup v1 tree: only differences are written, in the safe
//! order; drift made by others is repaired on a verifying pass; a change that fails half-way is
//! rolled back; the originals come back on `restore_original`.

mod support;

use headroom_agent::actuation::{ActuationError, CgroupKnob, Knob, ManagedGroups, RollbackOutcome};
use headroom_agent::allocation::CpuSet;
use headroom_agent::allocation::{Allocation, CpuWeight, LcTreatment};
use headroom_host::GroupPath;
use support::{Fake, Plan};

fn setup(fake: &Fake) -> Plan {
    let cgroups = fake.host().cgroups().unwrap();
    let lc = GroupPath::new("hr/lc").unwrap();
    let be = GroupPath::new("hr/be").unwrap();
    cgroups.create(&lc).unwrap();
    cgroups.create(&be).unwrap();
    fake.io.take_writes();
    Plan::attach(&fake.host(), ManagedGroups { lc, be: vec![be] })
}

fn files(writes: &[(String, String)]) -> Vec<String> {
    writes.iter().map(|(p, v)| format!("{p}={v}")).collect()
}

#[test]
fn shrink_freezes_first_and_grow_thaws_last() {
    let fake = Fake::v1();
    let mut r = setup(&fake);
    let shrink = Allocation {
        be_enabled: false,
        be_cpus: Some(CpuSet::from([3])),
        ..Allocation::default()
    };
    let report = r.apply(&shrink, true).unwrap();
    assert_eq!(report.writes.len(), 2);
    assert_eq!(
        files(&fake.io.take_writes()),
        vec![
            "freezer/hr/be/freezer.state=FROZEN",
            "cpuset/hr/be/cpuset.cpus=3"
        ]
    );
    let grow = Allocation {
        be_enabled: true,
        be_cpus: Some(CpuSet::from([1, 2, 3])),
        be_quota_pct: Some(150.0),
        be_quota_period_us: Some(100_000),
        ..Allocation::default()
    };
    r.apply(&grow, true).unwrap();
    // The quota (a new limit: BE loses) comes first, then the wider cpuset, thawing last.
    assert_eq!(
        files(&fake.io.take_writes()),
        vec![
            "cpu/hr/be/cpu.cfs_period_us=100000",
            "cpu/hr/be/cpu.cfs_quota_us=150000",
            "cpuset/hr/be/cpuset.cpus=1-3",
            "freezer/hr/be/freezer.state=THAWED",
        ]
    );
    // Nothing differs: nothing is written.
    let report = r.apply(&grow, true).unwrap();
    assert!(report.writes.is_empty());
    assert!(fake.io.take_writes().is_empty());
}

#[test]
fn be_is_shrunk_before_the_lc_gains() {
    let fake = Fake::v1();
    let mut r = setup(&fake);
    let a = Allocation {
        be_cpus: Some(CpuSet::from([2, 3])),
        be_cpu_weight: Some(CpuWeight::BATCH),
        lc: LcTreatment {
            cpu_weight: Some(CpuWeight::CRITICAL),
            ..LcTreatment::default()
        },
        ..Allocation::default()
    };
    r.apply(&a, false).unwrap();
    assert_eq!(
        files(&fake.io.take_writes()),
        vec![
            "cpuset/hr/be/cpuset.cpus=2-3",
            "cpu/hr/be/cpu.shares=2",
            "cpu/hr/lc/cpu.shares=10000",
        ]
    );
}

#[test]
fn drift_is_repaired_on_a_verifying_pass() {
    let fake = Fake::v1();
    let mut r = setup(&fake);
    let a = Allocation {
        be_cpus: Some(CpuSet::from([2, 3])),
        ..Allocation::default()
    };
    r.apply(&a, true).unwrap();
    fake.io.take_writes();
    // Someone widens the BE cpuset behind the agent's back.
    fake.set_knob("cpuset", "hr/be", "cpuset.cpus", "0-3\n");
    let quick = r.apply(&a, false).unwrap();
    assert!(
        quick.writes.is_empty(),
        "a non-verifying pass trusts what it applied"
    );
    let verified = r.apply(&a, true).unwrap();
    assert_eq!(verified.drift.len(), 1);
    assert!(matches!(
        verified.drift[0].knob,
        Knob::Cgroup {
            knob: CgroupKnob::CpusetCpus,
            ..
        }
    ));
    assert_eq!(
        files(&fake.io.take_writes()),
        vec!["cpuset/hr/be/cpuset.cpus=2-3"]
    );
    assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "2-3");
}

#[test]
fn a_half_failed_change_is_rolled_back() {
    let fake = Fake::v1();
    let mut r = setup(&fake);
    let safe = Allocation {
        be_cpus: Some(CpuSet::from([1, 2, 3])),
        ..Allocation::default()
    };
    r.apply(&safe, true).unwrap();
    fake.io.take_writes();
    // The quota knob refuses every write (EACCES), after the cpuset and shares were written.
    fake.io.fail("hr/be/cpu.cfs_quota_us", libc::EACCES);
    let change = Allocation {
        be_cpus: Some(CpuSet::from([3])),
        be_cpu_weight: Some(CpuWeight::BATCH),
        be_quota_pct: Some(50.0),
        be_quota_period_us: Some(100_000),
        ..Allocation::default()
    };
    let err = r.apply(&change, true).unwrap_err();
    let msg = err.to_string();
    match &err {
        ActuationError::Write(f) => {
            assert!(matches!(
                f.knob,
                Knob::Cgroup {
                    knob: CgroupKnob::CpuQuota,
                    ..
                }
            ));
            assert_eq!(f.attempts, 3);
            assert_eq!(f.rollback, RollbackOutcome::RolledBack(2), "{msg}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(msg.contains("cpu.cfs_quota_us"), "names the path: {msg}");
    assert!(msg.contains("50000"), "names the value: {msg}");
    // Back to the previous consistent allocation, not half of the new one.
    assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "1-3");
    assert_eq!(fake.knob("cpu", "hr/be", "cpu.shares"), "1024");
    assert_eq!(fake.knob("cpu", "hr/be", "cpu.cfs_quota_us"), "-1");
    // Once the knob works again the change goes through.
    fake.io.heal();
    r.apply(&change, false).unwrap();
    assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "3");
    assert_eq!(fake.knob("cpu", "hr/be", "cpu.cfs_quota_us"), "50000");
}

#[test]
fn restore_original_brings_back_what_was_there() {
    let fake = Fake::v1();
    fake.io.take_writes();
    let cgroups = fake.host().cgroups().unwrap();
    let lc = GroupPath::new("hr/lc").unwrap();
    let be = GroupPath::new("hr/be").unwrap();
    cgroups.create(&lc).unwrap();
    cgroups.create(&be).unwrap();
    fake.set_knob("cpu", "hr/be", "cpu.shares", "512\n");
    let mut r = Plan::attach(&fake.host(), ManagedGroups { lc, be: vec![be] });
    r.apply(
        &Allocation {
            be_enabled: false,
            be_cpus: Some(CpuSet::from([3])),
            be_cpu_weight: Some(CpuWeight::BATCH),
            ..Allocation::default()
        },
        true,
    )
    .unwrap();
    assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "FROZEN");
    r.restore_original().unwrap();
    assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "0-3");
    assert_eq!(fake.knob("cpu", "hr/be", "cpu.shares"), "512");
    assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "THAWED");
}

#[test]
fn idle_is_cleared_before_a_weight_write_and_set_after_it() {
    let fake = Fake::v1();
    let mut r = setup(&fake);
    let idle = Allocation {
        be_enabled: true,
        be_cpu_idle: Some(true),
        ..Allocation::default()
    };
    r.apply(&idle, true).unwrap();
    assert_eq!(files(&fake.io.take_writes()), vec!["cpu/hr/be/cpu.idle=1"]);
    // Back to a weighted BE: the kernel refuses cpu.shares on an idle group, so idle goes first.
    let weighted = Allocation {
        be_enabled: true,
        be_cpu_idle: Some(false),
        be_cpu_weight: Some(CpuWeight {
            shares: 2048,
            weight: 200,
        }),
        ..Allocation::default()
    };
    r.apply(&weighted, true).unwrap();
    assert_eq!(
        files(&fake.io.take_writes()),
        vec!["cpu/hr/be/cpu.idle=0", "cpu/hr/be/cpu.shares=2048"]
    );
    // A weight together with idle on: an idle group's weight belongs to the kernel (it reads
    // back as the minimum and refuses writes), so only idle is written.
    let both = Allocation {
        be_enabled: true,
        be_cpu_idle: Some(true),
        be_cpu_weight: Some(CpuWeight {
            shares: 4096,
            weight: 400,
        }),
        ..Allocation::default()
    };
    r.apply(&both, true).unwrap();
    assert_eq!(files(&fake.io.take_writes()), vec!["cpu/hr/be/cpu.idle=1"]);
    // The kernel now shows the idle weight; a verifying pass must not "repair" it (on the real
    // kernel that write fails with EINVAL on every pass).
    fake.set_knob("cpu", "hr/be", "cpu.shares", "3");
    let report = r.apply(&both, true).unwrap();
    assert!(report.writes.is_empty(), "{:?}", report.writes);
    assert!(report.drift.is_empty(), "{:?}", report.drift);
    // Clearing idle resets the kernel's weight to the default; the wanted one is written after.
    fake.set_knob("cpu", "hr/be", "cpu.shares", "1024");
    r.apply(&weighted, false).unwrap();
    assert_eq!(
        files(&fake.io.take_writes()),
        vec!["cpu/hr/be/cpu.idle=0", "cpu/hr/be/cpu.shares=2048"]
    );
}
