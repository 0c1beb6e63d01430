//! `doctor::probe_with` on fake trees: the knob probes use a real scratch group (created and
//! removed), report the interface that serves each mechanism, and explain what is missing.

use crate::support;

use headroom_host::doctor::{probe_with, ProbeOptions};
use nix::errno::Errno;
use support::Fake;

const FILES_ONLY: ProbeOptions = ProbeOptions {
    sched_syscalls: false,
    tc_netns: false,
    scratch_cgroup: true,
};

fn leftovers(fake: &Fake, mount: &str) -> Vec<String> {
    std::fs::read_dir(fake.path(mount))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("headroom-doctor-"))
        .collect()
}

#[test]
fn pure_v2_fake_reports_v2_knobs_and_per_group_psi() {
    let fake = Fake::v2();
    fake.write("/proc/sys/kernel/osrelease", "6.18.0\n");
    fake.write("/sys/devices/system/cpu/online", "0-3\n");
    let d = probe_with(&fake.host(), FILES_ONLY);
    assert_eq!(d.cgroup_mode, "v2");
    assert_eq!(d.kernel, "6.18.0");
    assert_eq!(d.cpus, 4);
    let m = &d.mechanisms;
    for (name, a, via) in [
        ("cpu_weight", &m.cpu_weight, "v2 cpu.weight"),
        ("cpu_idle", &m.cpu_idle, "v2 cpu.idle"),
        ("cpu_quota", &m.cpu_quota, "v2 cpu.max"),
        ("cpuset", &m.cpuset, "v2 cpuset.cpus"),
        ("freeze", &m.freeze, "v2 cgroup.freeze"),
        ("memory", &m.memory, "v2 memory.max"),
        ("io", &m.io, "v2 io.max"),
    ] {
        assert!(a.available, "{name}: {a:?}");
        assert_eq!(a.via.as_deref(), Some(via), "{name}");
    }
    assert!(d.sensors.cgroup_psi.as_ref().unwrap().available);
    assert!(!m.rapl.available && !m.cpufreq.available && !m.resctrl_l3.available);
    assert!(leftovers(&fake, "/sys/fs/cgroup").is_empty());
}

#[test]
fn hybrid_fake_uses_v1_and_says_why_v2_is_not_used() {
    let fake = Fake::v1();
    fake.write("/sys/devices/system/cpu/online", "0-1\n");
    let d = probe_with(&fake.host(), FILES_ONLY);
    assert_eq!(d.cgroup_mode, "hybrid");
    assert_eq!(
        d.mechanisms.cpu_weight.via.as_deref(),
        Some("v1 cpu.shares")
    );
    assert_eq!(
        d.mechanisms.cpu_quota.via.as_deref(),
        Some("v1 cpu.cfs_quota_us")
    );
    let psi = d.sensors.cgroup_psi.as_ref().unwrap();
    assert!(
        !psi.available && psi.reason.as_ref().unwrap().contains("v2"),
        "{psi:?}"
    );
    for h in ["cpu", "cpuset", "memory", "freezer"] {
        assert!(
            leftovers(&fake, &format!("/sys/fs/cgroup/{h}")).is_empty(),
            "{h}"
        );
    }
}

#[test]
fn a_knob_missing_from_new_groups_is_reported_as_a_kernel_gap() {
    let fake = Fake::v1();
    // A kernel without cpu.idle: new groups lack the file.
    let mut kernel = std::sync::Arc::try_unwrap(fake.kernel).unwrap();
    for t in kernel.templates.iter_mut() {
        t.files.retain(|(f, _)| f != "cpu.idle");
    }
    let fake = Fake {
        dir: fake.dir,
        kernel: std::sync::Arc::new(kernel),
    };
    let d = probe_with(&fake.host(), FILES_ONLY);
    let idle = &d.mechanisms.cpu_idle;
    assert!(!idle.available);
    assert!(
        idle.reason.as_ref().unwrap().contains("cpu.idle"),
        "{idle:?}"
    );
    assert!(d.mechanisms.cpu_weight.available);
}

#[test]
fn a_refused_scratch_group_marks_cgroup_mechanisms_unavailable_with_the_error() {
    let fake = Fake::v1();
    fake.kernel.fail(
        &format!("headroom-doctor-{}", std::process::id()),
        Errno::EACCES,
    );
    let d = probe_with(&fake.host(), FILES_ONLY);
    let cpuset = &d.mechanisms.cpuset;
    assert!(!cpuset.available);
    let reason = cpuset.reason.as_ref().unwrap();
    assert!(
        reason.contains("not root") || reason.contains("EACCES"),
        "{reason}"
    );
}
