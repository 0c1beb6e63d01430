//! One test per cgroup knob and backend, generated: the value lands in the right file in the
//! kernel's syntax and reads back; and each failure (missing file, EINVAL, EBUSY, EACCES, EPERM)
//! comes back as a HostError naming the path, the value and the errno.

use crate::support;

use headroom_host::{Cgroups, CpuQuota, DeviceId, FreezeState, HostError, IoLimits};
use headroom_types::{CpuSet, GroupPath};
use nix::errno::Errno;
use support::Fake;

fn setup(fake: &Fake) -> (Cgroups, GroupPath) {
    let cgroups = fake.host().cgroups().unwrap();
    let group = GroupPath::new("hr/be").unwrap();
    cgroups.create(&group).unwrap();
    (cgroups, group)
}

fn assert_names(err: &HostError, path: &str, value: &str, errno: Errno) {
    let msg = err.to_string();
    assert_eq!(err.errno(), Some(errno), "{msg}");
    assert!(
        msg.contains(path),
        "message {msg:?} should name the path {path}"
    );
    assert!(
        msg.contains(value),
        "message {msg:?} should name the value {value:?}"
    );
    assert!(
        msg.contains(&format!("{errno:?}")),
        "message {msg:?} should name {errno:?}"
    );
}

macro_rules! knob_tests {
    ($( $name:ident {
        fake: $fake:expr,
        file: $file:expr,
        written: $written:expr,
        set: $set:expr,
        read_back: $get:expr,
    } )*) => {$(
        mod $name {
            use super::*;

            fn apply(cg: &Cgroups, g: &GroupPath) -> Result<(), HostError> {
                #[allow(clippy::redundant_closure_call)]
                ($set)(cg, g)
            }

            #[test]
            fn writes_the_native_value_and_reads_it_back() {
                let fake = $fake;
                let (cg, g) = setup(&fake);
                apply(&cg, &g).unwrap();
                assert_eq!(fake.read($file).trim(), $written);
                #[allow(clippy::redundant_closure_call)]
                ($get)(&cg, &g);
            }

            #[test]
            fn missing_file_is_enoent_naming_path_and_value() {
                let fake = $fake;
                let (cg, g) = setup(&fake);
                std::fs::remove_file(fake.path($file)).unwrap();
                let err = apply(&cg, &g).unwrap_err();
                assert!(err.is_not_found());
                assert_names(&err, $file, $written, Errno::ENOENT);
            }

            #[test]
            fn einval_names_path_and_value() {
                let fake = $fake;
                let (cg, g) = setup(&fake);
                fake.kernel.fail($file, Errno::EINVAL);
                assert_names(&apply(&cg, &g).unwrap_err(), $file, $written, Errno::EINVAL);
            }

            #[test]
            fn ebusy_names_path_and_value() {
                let fake = $fake;
                let (cg, g) = setup(&fake);
                fake.kernel.fail($file, Errno::EBUSY);
                assert_names(&apply(&cg, &g).unwrap_err(), $file, $written, Errno::EBUSY);
            }

            #[test]
            fn permission_denied_names_path_and_value() {
                let fake = $fake;
                let (cg, g) = setup(&fake);
                fake.kernel.fail($file, Errno::EACCES);
                let err = apply(&cg, &g).unwrap_err();
                assert!(err.is_permission());
                assert_names(&err, $file, $written, Errno::EACCES);
                fake.kernel.fail($file, Errno::EPERM);
            }

            #[test]
            fn a_directory_where_the_file_should_be_fails_cleanly() {
                let fake = $fake;
                let (cg, g) = setup(&fake);
                let path = fake.path($file);
                std::fs::remove_file(&path).unwrap();
                std::fs::create_dir(&path).unwrap();
                let err = apply(&cg, &g).unwrap_err();
                assert_names(&err, $file, $written, Errno::EISDIR);
            }
        }
    )*};
}

knob_tests! {
    v1_cpu_shares_blagodurov_critical {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/cpu/hr/be/cpu.shares",
        written: "10000",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_weight(g, 10000).map(|n| assert_eq!(n, 10000)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpu_weight(g).unwrap(), 10000),
    }
    v1_cpu_shares_blagodurov_batch_stays_2 {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/cpu/hr/be/cpu.shares",
        written: "2",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_weight(g, 2).map(|n| assert_eq!(n, 2)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpu_weight(g).unwrap(), 2),
    }
    v2_cpu_weight_blagodurov_critical {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/cpu.weight",
        written: "10000",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_weight(g, 10000).map(|n| assert_eq!(n, 10000)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpu_weight(g).unwrap(), 10000),
    }
    v2_cpu_weight_blagodurov_batch_becomes_1 {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/cpu.weight",
        written: "1",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_weight(g, 2).map(|n| assert_eq!(n, 1)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpu_weight(g).unwrap(), 1),
    }
    v1_cpu_idle {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/cpu/hr/be/cpu.idle",
        written: "1",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_idle(g, true),
        read_back: |cg: &Cgroups, g: &GroupPath| assert!(cg.cpu_idle(g).unwrap()),
    }
    v2_cpu_idle {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/cpu.idle",
        written: "1",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_idle(g, true),
        read_back: |cg: &Cgroups, g: &GroupPath| assert!(cg.cpu_idle(g).unwrap()),
    }
    v1_cpu_quota {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/cpu/hr/be/cpu.cfs_quota_us",
        written: "20000",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_quota(g, CpuQuota::percent_of_cpu(20.0)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpu_quota(g).unwrap(), CpuQuota { quota_us: Some(20000), period_us: 100000 }),
    }
    v1_cpu_period {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/cpu/hr/be/cpu.cfs_period_us",
        written: "50000",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_quota(g, CpuQuota { quota_us: None, period_us: 50000 }),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpu_quota(g).unwrap(), CpuQuota { quota_us: None, period_us: 50000 }),
    }
    v2_cpu_max {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/cpu.max",
        written: "20000 100000",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_quota(g, CpuQuota::percent_of_cpu(20.0)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpu_quota(g).unwrap().quota_us, Some(20000)),
    }
    v2_cpu_max_unlimited {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/cpu.max",
        written: "max 100000",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpu_quota(g, CpuQuota::unlimited()),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpu_quota(g).unwrap(), CpuQuota::unlimited()),
    }
    v1_cpuset_cpus {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/cpuset/hr/be/cpuset.cpus",
        written: "1-2",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpuset_cpus(g, &CpuSet::from(vec![1, 2])),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpuset_cpus(g).unwrap().to_vec(), vec![1, 2]),
    }
    v1_cpuset_mems {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/cpuset/hr/be/cpuset.mems",
        written: "0",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpuset_mems(g, &CpuSet::from(vec![0])),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpuset_mems(g).unwrap().to_vec(), vec![0]),
    }
    v2_cpuset_cpus {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/cpuset.cpus",
        written: "3",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_cpuset_cpus(g, &CpuSet::from(vec![3])),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.cpuset_cpus(g).unwrap().to_vec(), vec![3]),
    }
    v1_freeze {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/freezer/hr/be/freezer.state",
        written: "FROZEN",
        set: |cg: &Cgroups, g: &GroupPath| cg.freeze(g),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.freeze_state(g).unwrap(), FreezeState::Frozen),
    }
    v1_thaw {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/freezer/hr/be/freezer.state",
        written: "THAWED",
        set: |cg: &Cgroups, g: &GroupPath| cg.thaw(g),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.freeze_state(g).unwrap(), FreezeState::Thawed),
    }
    v2_freeze {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/cgroup.freeze",
        written: "1",
        set: |cg: &Cgroups, g: &GroupPath| cg.freeze(g),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.freeze_state(g).unwrap(), FreezeState::Frozen),
    }
    v1_memory_max {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/memory/hr/be/memory.limit_in_bytes",
        written: "67108864",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_memory_max(g, Some(64 << 20)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.memory_max(g).unwrap(), Some(64 << 20)),
    }
    v1_memory_max_unlimited {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/memory/hr/be/memory.limit_in_bytes",
        written: "-1",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_memory_max(g, None),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.memory_max(g).unwrap(), None),
    }
    v1_memory_high_is_soft_limit {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/memory/hr/be/memory.soft_limit_in_bytes",
        written: "33554432",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_memory_high(g, Some(32 << 20)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.memory_high(g).unwrap(), Some(32 << 20)),
    }
    v2_memory_max {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/memory.max",
        written: "67108864",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_memory_max(g, Some(64 << 20)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.memory_max(g).unwrap(), Some(64 << 20)),
    }
    v2_memory_high_unlimited {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/memory.high",
        written: "max",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_memory_high(g, None),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.memory_high(g).unwrap(), None),
    }
    v1_blkio_throttle {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/blkio/hr/be/blkio.throttle.read_bps_device",
        written: "8:0 1048576",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_io_limits(g, DeviceId { major: 8, minor: 0 }, IoLimits { read_bps: Some(1 << 20), write_iops: Some(50), ..Default::default() }),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(
            cg.io_limits(g, DeviceId { major: 8, minor: 0 }).unwrap(),
            IoLimits { read_bps: Some(1 << 20), write_iops: Some(50), ..Default::default() }
        ),
    }
    v1_blkio_weight {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/blkio/hr/be/blkio.weight",
        written: "200",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_io_weight(g, 200),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.io_weight(g).unwrap(), 200),
    }
    v2_io_max {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/io.max",
        written: "8:0 rbps=1048576 wbps=max riops=max wiops=100",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_io_limits(g, DeviceId { major: 8, minor: 0 }, IoLimits { read_bps: Some(1 << 20), write_iops: Some(100), ..Default::default() }),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(
            cg.io_limits(g, DeviceId { major: 8, minor: 0 }).unwrap(),
            IoLimits { read_bps: Some(1 << 20), write_iops: Some(100), ..Default::default() }
        ),
    }
    v2_io_weight {
        fake: Fake::v2(),
        file: "/sys/fs/cgroup/hr/be/io.weight",
        written: "default 200",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_io_weight(g, 200),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.io_weight(g).unwrap(), 200),
    }
    v1_net_prio {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/net_prio/hr/be/net_prio.ifpriomap",
        written: "eth0 65568",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_net_prio(g, "eth0", headroom_host::tc::net_cls_classid(1, 0x20)),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.net_prio(g).unwrap(), vec![("eth0".to_owned(), 65568)]),
    }
    v1_net_cls_classid {
        fake: Fake::v1(),
        file: "/sys/fs/cgroup/net_cls/hr/be/net_cls.classid",
        written: "65568",
        set: |cg: &Cgroups, g: &GroupPath| cg.set_net_classid(g, 0x0001_0020),
        read_back: |cg: &Cgroups, g: &GroupPath| assert_eq!(cg.net_classid(g).unwrap(), 0x0001_0020),
    }
}
