//! resctrl, RAPL powercap and cpufreq on temp-dir fakes (this machine has none of them).

use crate::support;

use std::collections::BTreeMap;

use headroom_host::power::energy_delta_uj;
use headroom_host::resctrl::{top_ways_mask, validate_cbm, ResctrlGroup, Schemata};
use headroom_types::CpuSet;
use nix::errno::Errno;
use support::Fake;

fn resctrl_fake() -> Fake {
    let fake = Fake::v1();
    for (f, v) in [
        ("cbm_mask", "7ff"),
        ("min_cbm_bits", "1"),
        ("num_closids", "16"),
        ("shareable_bits", "600"),
    ] {
        fake.write(&format!("/sys/fs/resctrl/info/L3/{f}"), &format!("{v}\n"));
    }
    for (f, v) in [
        ("bandwidth_gran", "10"),
        ("min_bandwidth", "10"),
        ("num_closids", "8"),
        ("delay_linear", "1"),
    ] {
        fake.write(&format!("/sys/fs/resctrl/info/MB/{f}"), &format!("{v}\n"));
    }
    fake.write(
        "/sys/fs/resctrl/info/L3_MON/mon_features",
        "llc_occupancy\nmbm_total_bytes\nmbm_local_bytes\n",
    );
    fake.write("/sys/fs/resctrl/info/L3_MON/num_rmids", "176\n");
    fake.write(
        "/sys/fs/resctrl/schemata",
        "L3:0=7ff;1=7ff\nMB:0=100;1=100\n",
    );
    fake.write("/sys/fs/resctrl/tasks", "");
    fake
}

#[test]
fn resctrl_capabilities_are_read_from_info() {
    let fake = resctrl_fake();
    let info = fake.host().resctrl().info().unwrap();
    let l3 = info.l3.unwrap();
    assert_eq!(
        (
            l3.cbm_mask,
            l3.min_cbm_bits,
            l3.num_closids,
            l3.shareable_bits
        ),
        (0x7ff, 1, 16, 0x600)
    );
    assert_eq!(l3.ways(), 11);
    let mb = info.mb.unwrap();
    assert_eq!(
        (
            mb.bandwidth_gran,
            mb.min_bandwidth,
            mb.num_closids,
            mb.delay_linear
        ),
        (10, 10, 8, true)
    );
    let mon = info.mon.unwrap();
    assert_eq!(
        mon.mon_features,
        vec!["llc_occupancy", "mbm_total_bytes", "mbm_local_bytes"]
    );
    assert_eq!(mon.num_rmids, 176);
}

#[test]
fn resctrl_missing_says_why() {
    let fake = Fake::v1();
    let err = fake.host().resctrl().info().unwrap_err().to_string();
    assert!(
        err.contains("not mounted") && err.contains("resctrl"),
        "{err}"
    );
}

#[test]
fn resctrl_group_schemata_tasks_cpus_and_monitoring() {
    let fake = resctrl_fake();
    let r = fake.host().resctrl();
    let be = ResctrlGroup::new("be").unwrap();
    r.create_group(&be).unwrap();
    assert!(fake.path("/sys/fs/resctrl/be").is_dir());
    fake.write("/sys/fs/resctrl/be/schemata", "");
    fake.write("/sys/fs/resctrl/be/tasks", "");
    fake.write("/sys/fs/resctrl/be/cpus_list", "");
    let schemata = Schemata {
        l3: BTreeMap::from([(0, 0x600), (1, 0x600)]),
        mb: BTreeMap::from([(0, 50), (1, 50)]),
    };
    assert_eq!(schemata.to_lines(), vec!["L3:0=600;1=600", "MB:0=50;1=50"]);
    r.set_schemata(&be, &schemata).unwrap();
    // Each resource is its own write (the fake keeps the last one: MB).
    let writes: Vec<String> = fake.kernel.writes().into_iter().map(|(_, v)| v).collect();
    assert!(
        writes.contains(&"L3:0=600;1=600\n".to_owned())
            && writes.contains(&"MB:0=50;1=50\n".to_owned()),
        "{writes:?}"
    );
    let root = r.schemata(&ResctrlGroup::default_group()).unwrap();
    assert_eq!(root.l3[&1], 0x7ff);
    assert_eq!(root.mb[&0], 100);
    r.add_task(&be, 1234).unwrap();
    assert_eq!(r.tasks(&be).unwrap(), vec![1234]);
    r.set_cpus(&be, &CpuSet::from(vec![2, 3])).unwrap();
    assert_eq!(r.cpus(&be).unwrap().to_list(), "2-3");
    for (d, occ, total) in [("00", "1048576", "5000"), ("01", "2048", "Unavailable")] {
        fake.write(
            &format!("/sys/fs/resctrl/be/mon_data/mon_L3_{d}/llc_occupancy"),
            occ,
        );
        fake.write(
            &format!("/sys/fs/resctrl/be/mon_data/mon_L3_{d}/mbm_total_bytes"),
            total,
        );
    }
    let mon = r.mon_data(&be).unwrap();
    assert_eq!(mon.len(), 2);
    assert_eq!(mon[0].llc_occupancy_bytes, Some(1 << 20));
    assert_eq!(mon[0].mbm_total_bytes, Some(5000));
    assert_eq!(mon[1].mbm_total_bytes, None);
    assert_eq!(mon[1].mbm_local_bytes, None);
    std::fs::remove_file(fake.path("/sys/fs/resctrl/be/schemata")).unwrap();
    std::fs::remove_file(fake.path("/sys/fs/resctrl/be/tasks")).unwrap();
    std::fs::remove_file(fake.path("/sys/fs/resctrl/be/cpus_list")).unwrap();
    std::fs::remove_dir_all(fake.path("/sys/fs/resctrl/be/mon_data")).unwrap();
    r.remove_group(&be).unwrap();
    r.remove_group(&be).unwrap();
    assert!(r.remove_group(&ResctrlGroup::default_group()).is_err());
}

#[test]
fn resctrl_write_failures_name_path_and_value() {
    let fake = resctrl_fake();
    let r = fake.host().resctrl();
    let be = ResctrlGroup::new("be").unwrap();
    r.create_group(&be).unwrap();
    fake.write("/sys/fs/resctrl/be/schemata", "");
    fake.kernel.fail("be/schemata", Errno::EINVAL);
    let schemata = Schemata {
        l3: BTreeMap::from([(0, 0x3)]),
        mb: BTreeMap::new(),
    };
    let err = r.set_schemata(&be, &schemata).unwrap_err().to_string();
    assert!(
        err.contains("be/schemata") && err.contains("L3:0=3") && err.contains("EINVAL"),
        "{err}"
    );
    fake.kernel.fail("be/tasks", Errno::ESRCH);
    let err = r.add_task(&be, 99).unwrap_err().to_string();
    assert!(
        err.contains("be/tasks") && err.contains("\"99\"") && err.contains("ESRCH"),
        "{err}"
    );
    // A missing file: ENOENT.
    let err = r.set_cpus(&be, &CpuSet::from(vec![1])).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[test]
fn resctrl_refuses_invalid_masks_and_percentages_before_writing() {
    let fake = resctrl_fake();
    let r = fake.host().resctrl();
    let l3 = r.info().unwrap().l3.unwrap();
    assert!(validate_cbm(0, 0x5, &l3)
        .unwrap_err()
        .to_string()
        .contains("contiguous"));
    assert!(validate_cbm(0, 0x1000, &l3)
        .unwrap_err()
        .to_string()
        .contains("outside"));
    assert!(validate_cbm(0, 0, &l3).is_err());
    validate_cbm(0, 0x7f0, &l3).unwrap();
    assert_eq!(top_ways_mask(&l3, 2), 0x600);
    assert_eq!(top_ways_mask(&l3, 11), 0x7ff);
    let be = ResctrlGroup::new("be").unwrap();
    let writes = fake.kernel.writes().len();
    let bad = Schemata {
        l3: BTreeMap::new(),
        mb: BTreeMap::from([(0, 5)]),
    };
    assert!(r
        .set_schemata(&be, &bad)
        .unwrap_err()
        .to_string()
        .contains("0=5"));
    assert_eq!(fake.kernel.writes().len(), writes);
}

fn rapl_fake() -> Fake {
    let fake = Fake::v1();
    let z = "/sys/class/powercap/intel-rapl:0";
    fake.write(&format!("{z}/name"), "package-0\n");
    fake.write(&format!("{z}/energy_uj"), "1000\n");
    fake.write(&format!("{z}/max_energy_range_uj"), "262143328850\n");
    fake.write(&format!("{z}/constraint_0_name"), "long_term\n");
    fake.write(&format!("{z}/constraint_0_power_limit_uw"), "95000000\n");
    fake.write(&format!("{z}/constraint_0_time_window_us"), "999424\n");
    fake.write(&format!("{z}/constraint_1_name"), "short_term\n");
    fake.write(&format!("{z}/constraint_1_power_limit_uw"), "120000000\n");
    // Real sysfs lists zones as symlinks into /sys/devices/virtual/powercap.
    let real = "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/intel-rapl:0:0";
    fake.write(&format!("{real}/name"), "core\n");
    fake.write(&format!("{real}/energy_uj"), "10\n");
    fake.write(&format!("{real}/max_energy_range_uj"), "262143328850\n");
    std::os::unix::fs::symlink(
        fake.path(real),
        fake.path("/sys/class/powercap/intel-rapl:0:0"),
    )
    .unwrap();
    fake
}

#[test]
fn rapl_zones_energy_wraparound_and_limits() {
    let fake = rapl_fake();
    let rapl = fake.host().rapl();
    let zones = rapl.zones().unwrap();
    assert_eq!(
        zones.iter().map(|z| z.name.as_str()).collect::<Vec<_>>(),
        vec!["package-0", "core"]
    );
    assert_eq!(rapl.energy_uj(&zones[0]).unwrap(), 1000);
    assert_eq!(energy_delta_uj(100, 300, 1000), 200);
    assert_eq!(
        energy_delta_uj(900, 100, 1000),
        200,
        "wraps at max_energy_range_uj"
    );
    let limits = rapl.constraints(&zones[0]).unwrap();
    assert_eq!(limits.len(), 2);
    assert_eq!(
        (
            limits[0].name.as_str(),
            limits[0].power_limit_uw,
            limits[0].time_window_us
        ),
        ("long_term", 95_000_000, Some(999_424))
    );
    rapl.set_power_limit_uw(&zones[0], 0, 80_000_000).unwrap();
    assert_eq!(
        fake.read("/sys/class/powercap/intel-rapl:0/constraint_0_power_limit_uw"),
        "80000000"
    );
    fake.kernel
        .fail("constraint_1_power_limit_uw", Errno::EINVAL);
    let err = rapl
        .set_power_limit_uw(&zones[0], 1, 1)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("constraint_1_power_limit_uw")
            && err.contains("\"1\"")
            && err.contains("EINVAL"),
        "{err}"
    );
    let err = rapl.set_power_limit_uw(&zones[0], 5, 1).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[test]
fn rapl_absent_says_why() {
    let fake = Fake::v1();
    let err = fake.host().rapl().zones().unwrap_err().to_string();
    assert!(err.contains("RAPL") && err.contains("powercap"), "{err}");
}

fn cpufreq_fake() -> Fake {
    let fake = Fake::v1();
    let d = "/sys/devices/system/cpu/cpu1/cpufreq";
    for (f, v) in [
        ("cpuinfo_min_freq", "800000"),
        ("cpuinfo_max_freq", "3000000"),
        ("scaling_max_freq", "3000000"),
        ("scaling_cur_freq", "2400000"),
        (
            "scaling_available_frequencies",
            "3000000 2400000 1600000 800000",
        ),
    ] {
        fake.write(&format!("{d}/{f}"), &format!("{v}\n"));
    }
    fake
}

#[test]
fn cpufreq_reads_and_caps_a_cpu() {
    let fake = cpufreq_fake();
    let f = fake.host().cpufreq();
    assert!(f.available(1));
    assert!(!f.available(0));
    let info = f.info(1).unwrap();
    assert_eq!(
        info.available_khz,
        vec![800_000, 1_600_000, 2_400_000, 3_000_000]
    );
    assert_eq!(
        (
            info.cpuinfo_min_khz,
            info.cpuinfo_max_khz,
            info.scaling_cur_khz
        ),
        (800_000, 3_000_000, Some(2_400_000))
    );
    f.set_max_khz(1, 1_600_000).unwrap();
    assert_eq!(f.max_khz(1).unwrap(), 1_600_000);
    assert_eq!(f.cur_khz(1).unwrap(), 2_400_000);
    let err = f.set_max_khz(1, 5_000_000).unwrap_err().to_string();
    assert!(
        err.contains("5000000 kHz") && err.contains("800000..=3000000"),
        "{err}"
    );
    fake.kernel.fail("scaling_max_freq", Errno::EBUSY);
    let err = f.set_max_khz(1, 2_400_000).unwrap_err().to_string();
    assert!(
        err.contains("cpu1/cpufreq/scaling_max_freq")
            && err.contains("2400000")
            && err.contains("EBUSY"),
        "{err}"
    );
    let err = f.info(0).unwrap_err().to_string();
    assert!(err.contains("cpufreq") && err.contains("cpu0"), "{err}");
}
