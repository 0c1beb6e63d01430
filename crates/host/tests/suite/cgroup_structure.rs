//! Mode detection, group creation/removal/membership and group sensors on fake cgroupfs trees.

use crate::support;

use std::path::Path;

use headroom_host::{
    Backend, CgroupLayout, CgroupMode, Controller, CpuThrottling, LinuxHost, MemoryEvents,
    PsiResource,
};
use headroom_types::GroupPath;
use support::Fake;

#[test]
fn this_hosts_layout_is_hybrid_with_an_unusable_empty_v2() {
    let fake = Fake::v1();
    let layout = fake.host().cgroup_layout().unwrap();
    assert_eq!(layout.mode, CgroupMode::Hybrid);
    assert!(
        !layout.v2_usable(),
        "an empty cgroup2 must not be used for control"
    );
    assert_eq!(layout.v2_controllers, vec!["hugetlb".to_owned()]);
    assert_eq!(
        layout.backend(Controller::Cpu),
        Some(Backend::V1(fake.path("/sys/fs/cgroup/cpu")))
    );
    assert!(layout.v1.contains_key(&Controller::Pids));
    // The named systemd hierarchy is not a controller.
    assert_eq!(layout.v1.len(), 9);
}

#[test]
fn pure_v2_resolves_every_controller_to_the_unified_mount() {
    let fake = Fake::v2();
    let layout = fake.host().cgroup_layout().unwrap();
    assert_eq!(layout.mode, CgroupMode::V2);
    assert!(layout.v2_usable());
    for c in [
        Controller::Cpu,
        Controller::Cpuset,
        Controller::Memory,
        Controller::Io,
        Controller::Freezer,
        Controller::Cpuacct,
    ] {
        assert_eq!(
            layout.backend(c),
            Some(Backend::V2(fake.path("/sys/fs/cgroup"))),
            "{c}"
        );
    }
    assert_eq!(layout.backend(Controller::NetCls), None);
}

#[test]
fn mountinfo_parsing_handles_comounts_escapes_and_no_cgroups() {
    let root = Path::new("/fake");
    let text = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                33 31 0:30 / /mnt/my\\040cgroups rw - cgroup cgroup rw,memory\n";
    let layout = CgroupLayout::from_mountinfo(root, text, None);
    assert_eq!(layout.mode, CgroupMode::V1);
    assert_eq!(layout.v1[&Controller::Cpu], layout.v1[&Controller::Cpuacct]);
    assert_eq!(
        layout.v1[&Controller::Memory],
        Path::new("/fake/mnt/my cgroups")
    );
    let none = CgroupLayout::from_mountinfo(root, "27 1 254:0 / / rw - ext4 /dev/vda rw\n", None);
    assert_eq!(none.mode, CgroupMode::None);
    assert!(none.backend(Controller::Cpu).is_none());
    assert!(none
        .missing_reason(Controller::Cpu)
        .contains("no v1 cpu hierarchy"));
}

#[test]
fn v1_create_makes_the_group_in_every_hierarchy_and_seeds_the_cpuset() {
    let fake = Fake::v1();
    let cg = fake.host().cgroups().unwrap();
    let g = GroupPath::new("hr/be").unwrap();
    assert!(!cg.exists(&g));
    cg.create(&g).unwrap();
    cg.create(&g).unwrap(); // idempotent
    assert!(cg.exists(&g));
    for h in [
        "cpu", "cpuacct", "cpuset", "memory", "blkio", "freezer", "pids", "net_prio", "net_cls",
    ] {
        assert!(
            fake.path(&format!("/sys/fs/cgroup/{h}/hr/be")).is_dir(),
            "{h}"
        );
    }
    assert!(
        !fake.path("/sys/fs/cgroup/unified/hr").exists(),
        "nothing in the empty v2"
    );
    for level in ["hr", "hr/be"] {
        assert_eq!(
            fake.read(&format!("/sys/fs/cgroup/cpuset/{level}/cpuset.cpus"))
                .trim(),
            "0-3"
        );
        assert_eq!(
            fake.read(&format!("/sys/fs/cgroup/cpuset/{level}/cpuset.mems"))
                .trim(),
            "0"
        );
    }
    assert_eq!(
        cg.children(&GroupPath::new("hr").unwrap()).unwrap(),
        vec![g.clone()]
    );
}

#[test]
fn v2_create_delegates_controllers_down_the_lineage() {
    let fake = Fake::v2();
    let cg = fake.host().cgroups().unwrap();
    cg.create(&GroupPath::new("hr/be").unwrap()).unwrap();
    for dir in ["", "/hr"] {
        let enabled = fake.read(&format!("/sys/fs/cgroup{dir}/cgroup.subtree_control"));
        assert_eq!(enabled.trim(), "+cpuset +cpu +io +memory +pids", "{dir}");
    }
    assert_eq!(
        fake.read("/sys/fs/cgroup/hr/be/cgroup.subtree_control")
            .trim(),
        "",
        "the leaf keeps none"
    );
}

/// Someone else disables a controller above a group (tenth hostile pass: `-cpuset` in the
/// parent's `cgroup.subtree_control` took BE's cpuset away): seen, and `create` gives it back.
#[test]
fn v2_a_controller_disabled_above_a_group_is_seen_and_delegated_again() {
    let fake = Fake::v2();
    let cg = fake.host().cgroups().unwrap();
    let be = GroupPath::new("hr/be").unwrap();
    cg.create(&be).unwrap();
    assert!(
        !cg.delegation_lost(&be),
        "every controller delegated after create"
    );
    fake.write(
        "/sys/fs/cgroup/hr/cgroup.subtree_control",
        "cpu io memory pids\n",
    );
    assert!(
        cg.delegation_lost(&be),
        "cpuset taken away from hr's children"
    );
    cg.create(&be).unwrap();
    // (the fake keeps the last write; the kernel adds it to what is enabled)
    assert_eq!(
        fake.read("/sys/fs/cgroup/hr/cgroup.subtree_control").trim(),
        "+cpuset",
        "only the missing controller is enabled again"
    );
    fake.write(
        "/sys/fs/cgroup/hr/cgroup.subtree_control",
        "cpuset cpu io memory pids\n",
    );
    assert!(!cg.delegation_lost(&be), "delegated again");
    // On v1 there is nothing to delegate.
    let v1 = Fake::v1();
    let cg1 = v1.host().cgroups().unwrap();
    cg1.create(&be).unwrap();
    assert!(!cg1.delegation_lost(&be));
}

#[test]
fn move_process_writes_every_hierarchy_and_procs_lists_members() {
    let fake = Fake::v1();
    let cg = fake.host().cgroups().unwrap();
    let g = GroupPath::new("hr/be").unwrap();
    cg.create(&g).unwrap();
    cg.move_process(&g, 4242).unwrap();
    assert_eq!(cg.procs(&g).unwrap(), vec![4242]);
    for h in ["cpu", "memory", "freezer", "net_prio"] {
        assert_eq!(
            fake.read(&format!("/sys/fs/cgroup/{h}/hr/be/cgroup.procs"))
                .trim(),
            "4242",
            "{h}"
        );
    }
    cg.move_thread(&g, 4243).unwrap();
    assert_eq!(cg.threads(&g).unwrap(), vec![4243]);
}

#[test]
fn remove_moves_processes_out_removes_children_first_and_is_idempotent() {
    for fake in [Fake::v1(), Fake::v2()] {
        let cg = fake.host().cgroups().unwrap();
        let parent = GroupPath::new("hr").unwrap();
        let child = GroupPath::new("hr/be/deep").unwrap();
        cg.create(&child).unwrap();
        cg.move_process(&child, 77).unwrap();
        cg.freeze(&child).unwrap();
        cg.remove(&parent).unwrap();
        assert!(!cg.exists(&parent));
        for (backend, dir) in cg.group_dirs(&parent) {
            assert!(!dir.exists(), "{} left", dir.display());
            // The process went to the hierarchy root (the parent of `hr`).
            let root_procs = std::fs::read_to_string(backend.mount().join("cgroup.procs")).unwrap();
            assert!(
                root_procs.lines().any(|l| l == "77"),
                "{}",
                backend.mount().display()
            );
        }
        cg.remove(&parent).unwrap();
    }
}

#[test]
fn the_root_group_cannot_be_created_or_removed() {
    let fake = Fake::v1();
    let cg = fake.host().cgroups().unwrap();
    let calls_before = *fake.kernel.io_calls.lock().unwrap();
    assert!(cg
        .create(&GroupPath::root())
        .unwrap_err()
        .to_string()
        .contains("root group"));
    assert!(cg
        .remove(&GroupPath::root())
        .unwrap_err()
        .to_string()
        .contains("root group"));
    assert_eq!(
        *fake.kernel.io_calls.lock().unwrap(),
        calls_before,
        "refused before any I/O"
    );
}

#[test]
fn a_missing_controller_is_unavailable_with_the_reason() {
    let fake = Fake::v1();
    let text = fake.read("/proc/self/mountinfo");
    let without_memory: String = text
        .lines()
        .filter(|l| !l.contains("memory"))
        .map(|l| format!("{l}\n"))
        .collect();
    fake.write("/proc/self/mountinfo", &without_memory);
    let cg = fake.host().cgroups().unwrap();
    let err = cg
        .set_memory_max(&GroupPath::new("x").unwrap(), Some(1 << 20))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("memory")
            && msg.contains("not available")
            && msg.contains("empty of controllers"),
        "{msg}"
    );
}

#[test]
fn empty_cpusets_and_bad_quotas_are_refused_before_writing() {
    let fake = Fake::v1();
    let cg = fake.host().cgroups().unwrap();
    let g = GroupPath::new("hr/be").unwrap();
    cg.create(&g).unwrap();
    let writes = fake.kernel.writes().len();
    assert!(cg
        .set_cpuset_cpus(&g, &headroom_types::CpuSet::new())
        .is_err());
    let err = cg
        .set_cpu_quota(
            &g,
            headroom_host::CpuQuota {
                quota_us: Some(10),
                period_us: 100_000,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("\"10\""), "{err}");
    assert!(cg.set_cpu_weight(&g, 0).is_err());
    assert_eq!(fake.kernel.writes().len(), writes);
}

#[test]
fn group_sensors_read_v1_files() {
    let fake = Fake::v1();
    let cg = fake.host().cgroups().unwrap();
    let g = GroupPath::new("hr").unwrap();
    cg.create(&g).unwrap();
    assert_eq!(cg.cpu_usage_ns(&g).unwrap(), 987_654_321);
    assert_eq!(
        cg.cpu_throttling(&g).unwrap(),
        CpuThrottling {
            nr_periods: 7,
            nr_throttled: 3,
            throttled_ns: 123_456
        }
    );
    assert_eq!(cg.memory_usage(&g).unwrap(), 4096);
    assert_eq!(
        cg.memory_events(&g).unwrap(),
        MemoryEvents {
            low: None,
            high: None,
            max: 2,
            oom: None,
            oom_kill: 1
        }
    );
    let psi = cg.psi(&g, PsiResource::Cpu).unwrap_err();
    assert!(psi.to_string().contains("cgroup2"), "{psi}");
    fake.write("/sys/fs/cgroup/cpuacct/hr/cpuacct.usage", "garbage\n");
    let err = cg.cpu_usage_ns(&g).unwrap_err().to_string();
    assert!(
        err.contains("cpuacct.usage") && err.contains("garbage"),
        "{err}"
    );
}

#[test]
fn group_sensors_read_v2_files() {
    let fake = Fake::v2();
    let cg = fake.host().cgroups().unwrap();
    let g = GroupPath::new("hr").unwrap();
    cg.create(&g).unwrap();
    assert_eq!(cg.cpu_usage_ns(&g).unwrap(), 1_500_000);
    assert_eq!(
        cg.cpu_throttling(&g).unwrap(),
        CpuThrottling {
            nr_periods: 9,
            nr_throttled: 4,
            throttled_ns: 77_000
        }
    );
    assert_eq!(cg.memory_usage(&g).unwrap(), 8192);
    assert_eq!(cg.memory_events(&g).unwrap().oom_kill, 1);
    assert_eq!(cg.memory_events(&g).unwrap().high, Some(5));
    let psi = cg.psi(&g, PsiResource::Cpu).unwrap();
    assert_eq!(psi.some.avg10, 1.5);
    assert_eq!(psi.some.total_us, 12345);
    assert_eq!(cg.cpuset_effective_cpus(&g).unwrap().to_list(), "0-3");
}

#[test]
fn a_host_without_mountinfo_reports_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let err = LinuxHost::new(dir.path())
        .cgroups()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("proc/self/mountinfo") && err.contains("ENOENT"),
        "{err}"
    );
}

/// A v2 group (or a level above it) that is not a domain is refused by `create`, naming the
/// level and its `cgroup.type`, before anything is made or written: the start failed on the
/// kernel's bare EOPNOTSUPP on `cgroup.subtree_control` (tenth hostile pass, VM try F).
#[test]
fn v2_a_threaded_group_is_refused_by_name_and_nothing_is_made() {
    let fake = Fake::v2();
    let cg = fake.host().cgroups().unwrap();
    let be = GroupPath::new("hr/be").unwrap();
    cg.create(&be).unwrap();
    fake.write("/sys/fs/cgroup/hr/cgroup.type", "domain\n");
    fake.write("/sys/fs/cgroup/hr/be/cgroup.type", "domain\n");
    cg.create(&be).unwrap();
    fake.write("/sys/fs/cgroup/hr/be/cgroup.type", "threaded\n");
    let writes_before = fake.kernel.writes().len();
    let sub = GroupPath::new("hr/be/sub").unwrap();
    let err = cg
        .create(&sub)
        .expect_err("a group inside a threaded one was created")
        .to_string();
    assert!(
        err.contains("threaded cgroups are not supported")
            && err.contains("hr/be has cgroup.type = threaded"),
        "{err}"
    );
    assert!(
        !fake.path("/sys/fs/cgroup/hr/be/sub").exists(),
        "nothing made"
    );
    assert_eq!(fake.kernel.writes().len(), writes_before, "nothing written");
    assert!(cg.create(&be).is_err(), "the threaded group itself too");
    // `domain threaded` (the parent of threaded groups) cannot take memory or io either.
    fake.write("/sys/fs/cgroup/hr/cgroup.type", "domain threaded\n");
    let other = GroupPath::new("hr/other").unwrap();
    let err = cg
        .create(&other)
        .expect_err("a group under a threaded domain")
        .to_string();
    assert!(
        err.contains("hr has cgroup.type = domain threaded"),
        "{err}"
    );
    assert!(
        !fake.path("/sys/fs/cgroup/hr/other").exists(),
        "nothing made"
    );
}
