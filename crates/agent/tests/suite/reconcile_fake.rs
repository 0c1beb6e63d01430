//! The reconciler against a fake cgroup v1 tree: only differences are written, in the safe
//! order; drift made by others is repaired on a verifying pass; a change that fails half-way is
//! rolled back; the originals come back on `restore_original`.

use crate::support;

use headroom_control::actuation::{
    ActuationError, CgroupKnob, Knob, ManagedGroups, RollbackOutcome,
};
use headroom_types::allocation::{Allocation, CpuWeight, LcTreatment};
use headroom_types::CpuSet;
use headroom_types::GroupPath;
use support::{Fake, Plan};

fn files(writes: &[(String, String)]) -> Vec<String> {
    writes.iter().map(|(p, v)| format!("{p}={v}")).collect()
}

#[test]
fn shrink_freezes_first_and_grow_thaws_last() {
    let fake = Fake::v1();
    let mut r = Plan::on_hr(&fake);
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
    let mut r = Plan::on_hr(&fake);
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
    let mut r = Plan::on_hr(&fake);
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
fn a_failed_write_keeps_what_confines_be_and_skips_what_gives() {
    let fake = Fake::v1();
    let mut r = Plan::on_hr(&fake);
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
        lc: LcTreatment {
            cpu_weight: Some(CpuWeight::CRITICAL),
            ..LcTreatment::default()
        },
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
            assert_eq!(f.kept.len(), 3, "{msg}");
            assert_eq!(f.rollback, RollbackOutcome::NothingToUndo, "{msg}");
        }
        other => panic!("unexpected error {other}"),
    }
    assert!(msg.contains("cpu.cfs_quota_us"), "names the path: {msg}");
    assert!(msg.contains("50000"), "names the value: {msg}");
    assert!(msg.contains("kept 3 confining write(s)"), "{msg}");
    // BE keeps the narrower cpuset and the lower weight, and — the quota that was to hold it
    // to half a CPU refused — is frozen (fourth hostile pass); what gives (the LC's weight)
    // waits.
    assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "3");
    assert_eq!(fake.knob("cpu", "hr/be", "cpu.shares"), "2");
    assert_eq!(fake.knob("cpu", "hr/be", "cpu.cfs_quota_us"), "-1");
    assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "FROZEN");
    assert_eq!(fake.knob("cpu", "hr/lc", "cpu.shares"), "1024");
    // The next pass retries only what is missing; once the knob works the change completes.
    fake.io.take_writes();
    assert!(r.apply(&change, false).is_err());
    // (v1 writes the quota as two files: the period goes in before the quota is refused)
    let again: Vec<String> = files(&fake.io.take_writes())
        .into_iter()
        .filter(|w| !w.starts_with("cpu/hr/be/cpu.cfs_period_us"))
        .collect();
    assert!(
        again.is_empty(),
        "nothing kept is rewritten, nothing giving is written: {again:?}"
    );
    fake.io.heal();
    r.apply(&change, false).unwrap();
    assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "3");
    assert_eq!(fake.knob("cpu", "hr/be", "cpu.cfs_quota_us"), "50000");
    assert_eq!(fake.knob("cpu", "hr/lc", "cpu.shares"), "10000");
    assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "THAWED");
}

/// Fourth hostile pass: a narrower cpuset the kernel refuses (v1 EBUSY: a group below BE's,
/// made by BE's own job or by hand, holds the CPUs being taken) left BE running on the wider
/// set — the LC's CPU included — tick after tick, while the policy had shrunk it. A refused
/// write that was to confine BE's CPUs freezes BE instead, until it goes through; a refused
/// memory limit does not (freezing keeps the memory).
#[test]
fn a_refused_cpu_shrink_freezes_be_until_it_goes_through() {
    let fake = Fake::v1();
    let mut r = Plan::on_hr(&fake);
    let wide = Allocation {
        be_cpus: Some(CpuSet::from([0, 1, 2, 3])),
        ..Allocation::default()
    };
    r.apply(&wide, true).unwrap();
    assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "THAWED");
    fake.io.fail("hr/be/cpuset.cpus", libc::EBUSY);
    let narrow = Allocation {
        be_cpus: Some(CpuSet::from([3])),
        ..Allocation::default()
    };
    let err = r.apply(&narrow, true).unwrap_err();
    assert!(err.to_string().contains("cpuset.cpus"), "{err}");
    assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "0-3");
    assert_eq!(
        fake.knob("freezer", "hr/be", "freezer.state"),
        "FROZEN",
        "BE kept the LC's CPUs unfrozen: {err}"
    );
    // Later passes (read-back or not) keep it frozen while the shrink is refused.
    for verify in [false, true, false] {
        assert!(r.apply(&narrow, verify).is_err());
        assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "FROZEN");
    }
    fake.io.heal();
    r.apply(&narrow, false).unwrap();
    assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "3");
    assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "THAWED");
    // A memory limit the kernel refuses (BE uses more) is no reason to freeze BE.
    fake.io.fail("hr/be/memory.limit_in_bytes", libc::EBUSY);
    let capped = Allocation {
        be_memory_limit_bytes: Some(64 << 20),
        ..narrow.clone()
    };
    assert!(r.apply(&capped, true).is_err());
    assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "THAWED");
}

#[test]
fn a_failed_write_undoes_what_gave_before_it() {
    let fake = Fake::v1();
    let mut r = Plan::on_hr(&fake);
    // BE idle on CPUs 1-3; the change clears idle (the kernel wants that before a weight) and
    // narrows the quota, which fails: idle goes back on, the narrower cpuset stays.
    let idle = Allocation {
        be_cpus: Some(CpuSet::from([1, 2, 3])),
        be_cpu_idle: Some(true),
        ..Allocation::default()
    };
    r.apply(&idle, true).unwrap();
    fake.io.fail("hr/be/cpu.cfs_quota_us", libc::EINVAL);
    let change = Allocation {
        be_cpus: Some(CpuSet::from([2, 3])),
        be_cpu_idle: Some(false),
        be_cpu_weight: Some(CpuWeight::BATCH),
        be_quota_pct: Some(50.0),
        be_quota_period_us: Some(100_000),
        ..Allocation::default()
    };
    let err = r.apply(&change, true).unwrap_err();
    let ActuationError::Write(f) = &err else {
        panic!("{err}")
    };
    assert_eq!(f.rollback, RollbackOutcome::RolledBack(1), "{err}");
    assert_eq!(fake.knob("cpu", "hr/be", "cpu.idle"), "1");
    assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "2-3");
}

/// The hostile tester's high defect: a BE memory limit the kernel refuses (EBUSY: BE uses more)
/// rolled the whole plan back, the freeze and the cpuset shrink included, every tick, so a
/// forced disable left BE thawed on the LC's CPUs while status said "enabled false".
#[test]
fn a_failing_memory_limit_never_keeps_be_unconfined() {
    use headroom_control::controller::{Controller, Discard};
    use headroom_control::decision::Decision;
    use headroom_types::observation::Observation;
    use std::time::Duration;

    /// A policy that says what the test tells it (here: BE off on CPU 1, 2 MiB of memory).
    struct Say(Allocation);
    impl headroom_control::policy::Policy for Say {
        fn name(&self) -> &'static str {
            "say"
        }
        fn decide(&mut self, _: &Observation, _: Duration) -> Decision {
            Decision {
                binding_lc: None,
                allocation: self.0.clone(),
                reason: "forced".into(),
                state: serde_json::Value::Null,
            }
        }
        fn poll_interval(&self) -> Duration {
            Duration::from_millis(1)
        }
        fn reconfigure(&mut self, _: &headroom_control::config::Config) {}
    }

    for attempt in 0..20u64 {
        let fake = Fake::v1();
        let plan = Plan::on_hr(&fake);
        fake.io.fail("hr/be/memory.limit_in_bytes", libc::EBUSY);
        // Every other tick the freeze fails too: the cpuset must narrow on its own.
        if attempt % 2 == 1 {
            fake.io.fail("hr/be/freezer.state", libc::EIO);
        }
        let disabled = Allocation {
            be_enabled: false,
            be_cpus: Some(CpuSet::from([1])),
            be_memory_limit_bytes: Some(2 << 20),
            ..Allocation::default()
        };
        let mut c = Controller::new(Box::new(Say(disabled)), Some(plan.act), vec![0, 1], 5);
        let mut node = plan.node;
        let outcome = c.step(&mut node, Duration::from_millis(attempt), &mut Discard);
        let Some(Err(ActuationError::Write(f))) = &outcome.actuation else {
            panic!("the memory write should fail: {:?}", outcome.actuation)
        };
        assert!(f.to_string().contains("memory.limit_in_bytes"), "{f}");
        // Within the tick: BE narrowed to CPU 1 and (where the kernel took it) frozen.
        assert_eq!(
            fake.knob("cpuset", "hr/be", "cpuset.cpus"),
            "1",
            "try {attempt}"
        );
        if attempt % 2 == 0 {
            assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "FROZEN");
        } else {
            assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "THAWED");
            assert!(f.to_string().contains("freezer.state"), "{f}");
        }
        // Later ticks keep it so (nothing rolled back, nothing widened).
        for t in 1..5 {
            c.step(&mut node, Duration::from_millis(100 * t), &mut Discard);
            assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "1");
        }
        // The kill switch reports the writes it made to put the originals back.
        let restored = c
            .actuation_mut()
            .unwrap()
            .restore_original(&mut node)
            .unwrap();
        assert!(
            !restored.writes.is_empty(),
            "try {attempt}: off made no write"
        );
        assert_eq!(fake.knob("cpuset", "hr/be", "cpuset.cpus"), "0-3");
        assert_eq!(fake.knob("freezer", "hr/be", "freezer.state"), "THAWED");
    }
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
    let mut r = Plan::on_hr(&fake);
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
