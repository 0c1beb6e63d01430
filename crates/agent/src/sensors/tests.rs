//! The sensors against a fake /proc and cgroup tree.

use super::*;
use std::path::Path;
use std::time::Duration;

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// Package power is the energy counter's rate (across a wrap), TDP the long-term limit,
/// and the frequencies the mean of the CPUs' current ones.
#[test]
fn power_sensor_reads_rapl_and_cpufreq() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let z = "/sys/class/powercap/intel-rapl:0";
    write(root, &format!("{z}/name"), "package-0\n");
    write(root, &format!("{z}/max_energy_range_uj"), "10000000\n");
    write(root, &format!("{z}/energy_uj"), "9000000\n");
    write(root, &format!("{z}/constraint_0_name"), "long_term\n");
    write(
        root,
        &format!("{z}/constraint_0_power_limit_uw"),
        "95000000\n",
    );
    for (cpu, khz) in [(0, "2000000"), (1, "3000000")] {
        write(
            root,
            &format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq"),
            khz,
        );
    }
    let host = LinuxHost::new(root);
    let mut p = PowerSensor::open(&host).expect("a package zone");
    let t0 = Instant::now();
    let first = p.sample(t0, &[0], &[1]);
    assert_eq!(first, (None, Some(95.0), Some(2000.0), Some(3000.0)));
    // 2 J later, across the counter's wrap at 10 J: 9 J → 1 J
    write(root, &format!("{z}/energy_uj"), "1000000\n");
    let (w, tdp, ..) = p.sample(t0 + Duration::from_millis(100), &[0], &[1]);
    assert!((w.unwrap() - 20.0).abs() < 1e-6, "{w:?}");
    assert_eq!(tdp, Some(95.0));
    // no package zone: no sensor
    let bare = tempfile::tempdir().unwrap();
    assert!(PowerSensor::open(&LinuxHost::new(bare.path())).is_none());
}

/// DRAM bandwidth: the rate of MBM byte counters of the default and BE groups.
#[test]
fn dram_sensor_sums_mbm_over_domains_and_groups() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let set = |group: &str, d: u32, bytes: u64| {
        write(
            root,
            &format!("/sys/fs/resctrl/{group}mon_data/mon_L3_0{d}/mbm_total_bytes"),
            &format!("{bytes}\n"),
        )
    };
    set("", 0, 1_000);
    set("", 1, 2_000);
    set("headroom-be/", 0, 500);
    let host = LinuxHost::new(root);
    let mut d = DramSensor::open(&host).expect("MBM present");
    let t0 = Instant::now();
    assert_eq!(d.sample(t0), (None, None));
    set("", 0, 1_000 + 4_000_000);
    set("headroom-be/", 0, 500 + 1_000_000);
    let (total, be) = d.sample(t0 + Duration::from_millis(500));
    assert_eq!(be, Some(2_000_000.0));
    assert_eq!(total, Some(10_000_000.0));
    let bare = tempfile::tempdir().unwrap();
    assert!(DramSensor::open(&LinuxHost::new(bare.path())).is_none());
}

/// A stopped service's ended threads leave the list; running ones stay (before, every handle
/// stayed until exit).
#[test]
fn join_ended_keeps_only_running_threads() {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut threads: Vec<std::thread::JoinHandle<()>> =
        (0..50).map(|_| std::thread::spawn(|| {})).collect();
    let flag = stop.clone();
    threads.push(std::thread::spawn(move || {
        // bounded: 60 s at most (a hang detector), ended by the test
        for _ in 0..6000 {
            if flag.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }));
    // the 50 short threads end soon; bounded wait for them
    for _ in 0..6000 {
        if threads[..50].iter().all(|t| t.is_finished()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    join_ended(&mut threads);
    assert_eq!(threads.len(), 1, "only the running thread is kept");
    assert!(!threads[0].is_finished());
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    wake_and_join(threads);
}
