//! `doctor::probe("/")` on the real machine: every contract key (docs/architecture.md) is present, the probe leaves no
//! scratch cgroup or network namespace behind, and its findings agree with the layout.

use std::path::Path;

use headroom_host::{doctor, LinuxHost};

const MECHANISMS: [&str; 13] = [
    "cpuset",
    "cpu_weight",
    "cpu_idle",
    "cpu_quota",
    "freeze",
    "memory",
    "io",
    "sched_attr",
    "resctrl_l3",
    "resctrl_mba",
    "rapl",
    "cpufreq",
    "tc_htb",
];
const SENSORS: [&str; 4] = ["proc_stat", "schedstat", "psi", "resctrl_mon"];

#[test]
fn probe_of_the_real_host_has_every_contract_key_and_leaves_nothing_behind() {
    let report = doctor::probe(Path::new("/"));
    let json = serde_json::to_value(&report).unwrap();
    eprintln!("{}", serde_json::to_string_pretty(&json).unwrap());
    for key in [
        "kernel",
        "cgroup_mode",
        "root",
        "cpus",
        "smt",
        "llc_bytes",
        "numa_nodes",
    ] {
        assert!(json.get(key).is_some(), "missing key {key}");
    }
    for key in MECHANISMS {
        let m = &json["mechanisms"][key];
        assert!(m["available"].is_boolean(), "mechanism {key}: {m}");
        if m["available"] == false {
            assert!(
                m["reason"].as_str().is_some_and(|r| !r.is_empty()),
                "{key} lacks a reason"
            );
        }
    }
    for key in SENSORS {
        let s = &json["sensors"][key];
        assert!(s["available"].is_boolean(), "sensor {key}: {s}");
    }
    assert!(report.cpus >= 1);
    assert!(report.sensors.proc_stat.available);

    let host = LinuxHost::system();
    if let Ok(cgroups) = host.cgroups() {
        assert_eq!(report.cgroup_mode, cgroups.mode().as_str());
        let prefix = format!("headroom-doctor-{}", std::process::id());
        for mount in cgroups
            .layout()
            .v1
            .values()
            .chain(cgroups.layout().v2.iter())
        {
            for entry in std::fs::read_dir(mount).unwrap() {
                let name = entry.unwrap().file_name().to_string_lossy().into_owned();
                assert!(
                    !name.starts_with(&prefix),
                    "doctor left {name} in {}",
                    mount.display()
                );
            }
        }
    }
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output();
    if let Ok(out) = netns {
        let list = String::from_utf8_lossy(&out.stdout);
        assert!(
            !list.contains(&format!("headroom-doctor-{}", std::process::id())),
            "doctor left a netns: {list}"
        );
    }
}
