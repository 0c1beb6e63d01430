//! doctor tells the kernel from the hardware: with the kernel's build configuration
//! (`/proc/config.gz` or `/boot/config-<release>` under the fake root) and the CPU flags, each
//! mechanism that is missing says "kernel has CONFIG_X, hardware lacks Y" or "kernel lacks
//! CONFIG_X" — and, with no configuration to read, says that it does not know. One test per
//! mechanism and cause.

use crate::support;

use std::io::Write as _;

use headroom_host::doctor::{probe_with, ProbeOptions};
use headroom_types::doctor::{Availability, Doctor};
use support::Fake;

const FILES_ONLY: ProbeOptions = ProbeOptions {
    sched_syscalls: false,
    tc_netns: false,
    scratch_cgroup: true,
};

const RELEASE: &str = "6.1.0-56-amd64";
/// The flags of qemu's emulated CPU: no RDT (`rdt_a`, `cat_l3`, `mba`, `cqm_llc`).
const FLAGS_NO_RDT: &str = "fpu vme de pse tsc msr pae sse sse2 ht syscall nx lm";
const FLAGS_RDT: &str =
    "fpu vme de pse tsc msr sse sse2 rdt_a cat_l3 cdp_l3 mba cqm_llc cqm_occup_llc";

/// A v2 fake with release `RELEASE`, these CPU flags and no resctrl registered.
fn fake(flags: &str) -> Fake {
    let fake = Fake::v2();
    fake.write("/proc/sys/kernel/osrelease", &format!("{RELEASE}\n"));
    fake.write("/sys/devices/system/cpu/online", "0-1\n");
    fake.write(
        "/proc/cpuinfo",
        &format!("processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"),
    );
    fake.write(
        "/proc/filesystems",
        "nodev\tsysfs\nnodev\tcgroup2\n\text4\n",
    );
    fake
}

fn boot_config(fake: &Fake, lines: &str) {
    fake.write(&format!("/boot/config-{RELEASE}"), lines);
}

fn reason(a: &Availability) -> &str {
    assert!(!a.available, "expected unavailable: {a:?}");
    a.reason.as_deref().unwrap()
}

fn probe(fake: &Fake) -> Doctor {
    probe_with(&fake.host(), FILES_ONLY)
}

#[test]
fn resctrl_kernel_has_it_hardware_lacks_rdt() {
    // The case: Debian's kernel (CONFIG_X86_CPU_RESCTRL=y) on qemu's CPU.
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "CONFIG_X86_CPU_RESCTRL=y\nCONFIG_PSI=y\n");
    let d = probe(&f);
    for (a, what) in [
        (
            &d.mechanisms.resctrl_l3,
            "hardware lacks L3 CAT (no `cat_l3` CPU flag)",
        ),
        (
            &d.mechanisms.resctrl_mba,
            "hardware lacks MBA (no `mba` CPU flag)",
        ),
        (
            &d.sensors.resctrl_mon,
            "hardware lacks cache monitoring (no `cqm_llc` CPU flag)",
        ),
    ] {
        let r = reason(a);
        assert!(
            r.contains("kernel has CONFIG_X86_CPU_RESCTRL=y (/boot/config-6.1.0-56-amd64)"),
            "{r}"
        );
        assert!(r.contains(what), "{r}");
        assert!(!r.contains("kernel lacks"), "{r}");
    }
}

#[test]
fn resctrl_kernel_lacks_it_on_rdt_hardware() {
    let f = fake(FLAGS_RDT);
    boot_config(&f, "# CONFIG_X86_CPU_RESCTRL is not set\n");
    let d = probe(&f);
    let r = reason(&d.mechanisms.resctrl_l3);
    assert!(r.starts_with("kernel lacks CONFIG_X86_CPU_RESCTRL"), "{r}");
    assert!(!r.contains("hardware lacks"), "{r}");
}

#[test]
fn resctrl_kernel_lacks_it_and_hardware_too() {
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "# CONFIG_X86_CPU_RESCTRL is not set\n");
    let r = reason(&probe(&f).mechanisms.resctrl_mba).to_owned();
    assert!(r.starts_with("kernel lacks CONFIG_X86_CPU_RESCTRL"), "{r}");
    assert!(
        r.contains("hardware lacks MBA (no `mba` CPU flag) too"),
        "{r}"
    );
}

#[test]
fn resctrl_config_read_from_proc_config_gz() {
    let f = fake(FLAGS_NO_RDT);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b"CONFIG_X86_CPU_RESCTRL=y\n").unwrap();
    std::fs::write(f.path("/proc/config.gz"), gz.finish().unwrap()).unwrap();
    // /proc/config.gz wins over a /boot file that says otherwise.
    boot_config(&f, "# CONFIG_X86_CPU_RESCTRL is not set\n");
    let r = reason(&probe(&f).mechanisms.resctrl_l3).to_owned();
    assert!(
        r.contains("kernel has CONFIG_X86_CPU_RESCTRL=y (/proc/config.gz)"),
        "{r}"
    );
    assert!(r.contains("hardware lacks L3 CAT"), "{r}");
}

#[test]
fn resctrl_without_a_kernel_config_says_it_does_not_know() {
    let f = fake(FLAGS_NO_RDT);
    let r = reason(&probe(&f).mechanisms.resctrl_l3).to_owned();
    assert!(r.contains("hardware lacks L3 CAT"), "{r}");
    assert!(
        r.contains("unknown whether the kernel has CONFIG_X86_CPU_RESCTRL"),
        "{r}"
    );
    assert!(
        r.contains("/proc/config.gz") && r.contains("/boot/config-6.1.0-56-amd64"),
        "names the paths tried: {r}"
    );
    assert!(!r.contains("kernel lacks"), "{r}");
}

#[test]
fn resctrl_registered_but_unmounted_is_neither_kernel_nor_hardware() {
    let f = fake(FLAGS_RDT);
    f.write("/proc/filesystems", "nodev\tsysfs\nnodev\tresctrl\n");
    boot_config(&f, "CONFIG_X86_CPU_RESCTRL=y\n");
    let r = reason(&probe(&f).mechanisms.resctrl_l3).to_owned();
    assert!(r.starts_with("resctrl not mounted"), "{r}");
}

#[test]
fn rapl_kernel_has_it_hardware_lacks_it() {
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "CONFIG_POWERCAP=y\nCONFIG_INTEL_RAPL=m\n");
    std::fs::create_dir_all(f.path("/sys/class/powercap")).unwrap();
    std::fs::create_dir_all(f.path("/sys/module/intel_rapl_msr")).unwrap();
    let r = reason(&probe(&f).mechanisms.rapl).to_owned();
    assert!(r.starts_with("kernel has CONFIG_INTEL_RAPL=m"), "{r}");
    assert!(r.contains("hardware lacks RAPL"), "{r}");
}

#[test]
fn rapl_module_built_but_not_loaded_is_named() {
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "CONFIG_POWERCAP=y\nCONFIG_INTEL_RAPL=m\n");
    std::fs::create_dir_all(f.path("/sys/class/powercap")).unwrap();
    let r = reason(&probe(&f).mechanisms.rapl).to_owned();
    assert!(r.contains("intel_rapl_msr is not loaded"), "{r}");
}

#[test]
fn rapl_kernel_lacks_powercap() {
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "# CONFIG_POWERCAP is not set\n");
    let r = reason(&probe(&f).mechanisms.rapl).to_owned();
    assert!(r.starts_with("kernel lacks CONFIG_POWERCAP"), "{r}");
    assert!(!r.contains("hardware"), "{r}");
}

#[test]
fn cpufreq_kernel_has_it_hardware_lacks_a_driver() {
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "CONFIG_CPU_FREQ=y\n");
    std::fs::create_dir_all(f.path("/sys/devices/system/cpu/cpufreq")).unwrap();
    let r = reason(&probe(&f).mechanisms.cpufreq).to_owned();
    assert!(r.starts_with("kernel has CONFIG_CPU_FREQ=y"), "{r}");
    assert!(r.contains("hardware lacks frequency control"), "{r}");
}

#[test]
fn cpufreq_kernel_lacks_it() {
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "# CONFIG_CPU_FREQ is not set\n");
    let r = reason(&probe(&f).mechanisms.cpufreq).to_owned();
    assert!(r.starts_with("kernel lacks CONFIG_CPU_FREQ"), "{r}");
    assert!(!r.contains("hardware"), "{r}");
}

#[test]
fn psi_kernel_lacks_it() {
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "# CONFIG_PSI is not set\n");
    let r = reason(&probe(&f).sensors.psi).to_owned();
    assert!(r.starts_with("kernel lacks CONFIG_PSI"), "{r}");
}

#[test]
fn psi_kernel_has_it_but_it_is_off_by_default() {
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "CONFIG_PSI=y\nCONFIG_PSI_DEFAULT_DISABLED=y\n");
    f.write(
        "/proc/cmdline",
        "BOOT_IMAGE=/vmlinuz root=/dev/vda1 ro quiet\n",
    );
    let r = reason(&probe(&f).sensors.psi).to_owned();
    assert!(r.starts_with("kernel has CONFIG_PSI=y"), "{r}");
    assert!(
        r.contains("(CONFIG_PSI_DEFAULT_DISABLED=y): add psi=1"),
        "{r}"
    );
    assert!(!r.contains("kernel lacks"), "{r}");
}

#[test]
fn psi_kernel_has_it_but_the_command_line_turns_it_off() {
    let f = fake(FLAGS_NO_RDT);
    boot_config(&f, "CONFIG_PSI=y\n");
    f.write("/proc/cmdline", "root=/dev/vda1 psi=0 quiet\n");
    let r = reason(&probe(&f).sensors.psi).to_owned();
    assert!(r.starts_with("kernel has CONFIG_PSI=y"), "{r}");
    assert!(
        r.contains("turned off by psi=0 on the kernel command line"),
        "{r}"
    );
}

#[test]
fn a_cgroup_knob_missing_names_the_kernel_option() {
    let fake = Fake::v2();
    fake.write("/proc/sys/kernel/osrelease", &format!("{RELEASE}\n"));
    boot_config(
        &fake,
        "# CONFIG_CFS_BANDWIDTH is not set\nCONFIG_FAIR_GROUP_SCHED=y\n",
    );
    let mut kernel = std::sync::Arc::try_unwrap(fake.kernel).unwrap();
    for t in kernel.templates.iter_mut() {
        t.files.retain(|(f, _)| f != "cpu.max");
    }
    let fake = Fake {
        dir: fake.dir,
        kernel: std::sync::Arc::new(kernel),
    };
    let d = probe(&fake);
    let r = reason(&d.mechanisms.cpu_quota).to_owned();
    assert!(r.contains("cpu.max missing in a new group"), "{r}");
    assert!(r.contains("kernel lacks CONFIG_CFS_BANDWIDTH"), "{r}");
    assert!(d.mechanisms.cpu_weight.available);
}
