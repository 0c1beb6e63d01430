//! The probes where a missing mechanism can be the kernel's fault or the hardware's (resctrl,
//! RAPL, cpufreq, PSI, schedstat): the kernel's build configuration (`kernel_config`) and the
//! CPU flags tell which, and the reason says so — "kernel has CONFIG_X, hardware lacks Y",
//! "kernel lacks CONFIG_X" — or, where the configuration cannot be read, says that it is
//! unknown rather than guessing.

use headroom_types::doctor::Availability;

use super::kernel_config::{KernelConfig, NoKernelConfig, Setting};
use crate::host::LinuxHost;

/// What doctor knows of the kernel's build: its configuration, or why it is unknown.
pub(super) type Config = Result<KernelConfig, NoKernelConfig>;

pub(super) fn load_config(host: &LinuxHost) -> Config {
    let release = host.kernel_release().ok();
    KernelConfig::load(|p| host.path(p), release.as_deref())
}

/// "kernel has CONFIG_X=y" / "kernel lacks CONFIG_X" / "unknown whether the kernel has
/// CONFIG_X (kernel config not readable: …)", with where the configuration was read.
fn kernel_part(config: &Config, option: &str) -> (Option<bool>, String) {
    match config {
        Ok(c) => match c.setting(option) {
            Setting::BuiltIn | Setting::Module => (
                Some(true),
                format!(
                    "kernel has {} ({})",
                    c.describe(option),
                    c.source().display()
                ),
            ),
            Setting::Off => (
                Some(false),
                format!("kernel lacks {option} ({})", c.source().display()),
            ),
        },
        Err(e) => (
            None,
            format!("unknown whether the kernel has {option}: {e}"),
        ),
    }
}

fn cpu_flags(host: &LinuxHost) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(host.path("/proc/cpuinfo")).ok()?;
    let line = text.lines().find(|l| l.starts_with("flags"))?;
    Some(
        line.split(':')
            .nth(1)?
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

const RESCTRL: &str = "CONFIG_X86_CPU_RESCTRL";

pub(super) fn probe_resctrl(
    host: &LinuxHost,
    config: &Config,
) -> (Availability, Availability, Availability) {
    let resctrl = host.resctrl();
    match resctrl.info() {
        Ok(info) => {
            let l3 = match &info.l3 {
                Some(l3) => Availability::yes(format!(
                    "resctrl L3 ({} ways, {} CLOSIDs)",
                    l3.ways(),
                    l3.num_closids
                )),
                None => Availability::no("hardware lacks L3 CAT (no info/L3 in resctrl)"),
            };
            let mb = match &info.mb {
                Some(mb) => Availability::yes(format!(
                    "resctrl MB (min {}%, step {}%)",
                    mb.min_bandwidth, mb.bandwidth_gran
                )),
                None => Availability::no("hardware lacks MBA (no info/MB in resctrl)"),
            };
            let mon = match &info.mon {
                Some(m) => {
                    Availability::yes(format!("resctrl mon_data ({})", m.mon_features.join(" ")))
                }
                None => Availability::no("hardware lacks L3 monitoring (no info/L3_MON)"),
            };
            (l3, mb, mon)
        }
        Err(_) => {
            let fs = std::fs::read_to_string(host.path("/proc/filesystems")).unwrap_or_default();
            let registered = fs
                .lines()
                .any(|l| l.split_whitespace().last() == Some("resctrl"));
            let flags = cpu_flags(host);
            let reason = |flag: &str, what: &str| -> String {
                resctrl_reason(registered, config, flags.as_deref(), flag, what)
            };
            (
                Availability::no(reason("cat_l3", "L3 CAT")),
                Availability::no(reason("mba", "MBA")),
                Availability::no(reason("cqm_llc", "cache monitoring")),
            )
        }
    }
}

/// Why resctrl does not serve `what` when `/sys/fs/resctrl` has no info directory. The kernel
/// registers the resctrl file system only when the CPU has RDT (`rdt_a`), so "not in
/// /proc/filesystems" alone does not mean the kernel lacks it.
fn resctrl_reason(
    registered: bool,
    config: &Config,
    flags: Option<&[String]>,
    flag: &str,
    what: &str,
) -> String {
    let has = |f: &str| flags.map(|v| v.iter().any(|x| x == f));
    let hardware = match has(flag) {
        Some(false) => Some(format!("hardware lacks {what} (no `{flag}` CPU flag)")),
        Some(true) => None,
        None => Some("CPU flags unknown (no flags line in /proc/cpuinfo)".to_owned()),
    };
    if registered {
        return match has(flag) {
            Some(false) => hardware.unwrap_or_default(),
            _ => "resctrl not mounted (mount -t resctrl resctrl /sys/fs/resctrl)".to_owned(),
        };
    }
    let (kernel_has, kernel) = kernel_part(config, RESCTRL);
    match (kernel_has, hardware) {
        (Some(true), Some(hw)) => format!(
            "{kernel}, {hw}: the kernel registers no resctrl file system without RDT"
        ),
        (Some(true), None) => format!(
            "{kernel} and the CPU has `{flag}`, but resctrl is not in /proc/filesystems (RDT turned off with rdt= on the kernel command line?)"
        ),
        (Some(false), Some(hw)) => format!("{kernel}; {hw} too"),
        (Some(false), None) => kernel,
        (None, Some(hw)) => format!("resctrl not in /proc/filesystems: {hw}; {kernel}"),
        (None, None) => format!(
            "resctrl not in /proc/filesystems although the CPU has `{flag}`: the kernel lacks {RESCTRL} (or RDT is turned off on its command line)"
        ),
    }
}

pub(super) fn probe_rapl(host: &LinuxHost, root_user: bool, config: &Config) -> Availability {
    let rapl = host.rapl();
    match rapl.zones() {
        Ok(zones) => {
            let first = &zones[0];
            match rapl.energy_uj(first) {
                Ok(_) => Availability::yes(format!(
                    "powercap {} ({} zones)",
                    zones
                        .iter()
                        .map(|z| z.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    zones.len()
                )),
                Err(e) if e.is_permission() && !root_user => {
                    Availability::no(format!("not root: energy_uj is root-only ({e})"))
                }
                Err(e) => Availability::no(e.to_string()),
            }
        }
        Err(_) => {
            let (powercap, powercap_text) = kernel_part(config, "CONFIG_POWERCAP");
            let (rapl_cfg, rapl_text) = kernel_part(config, "CONFIG_INTEL_RAPL");
            if powercap == Some(false) || rapl_cfg == Some(false) {
                let lacking = if powercap == Some(false) {
                    powercap_text
                } else {
                    rapl_text
                };
                return Availability::no(lacking);
            }
            let loaded = host.path("/sys/module/intel_rapl_msr").is_dir()
                || host.path("/sys/module/intel_rapl_common").is_dir();
            let module =
                matches!(config, Ok(c) if c.setting("CONFIG_INTEL_RAPL") == Setting::Module);
            match (rapl_cfg, module, loaded) {
                (Some(true), true, false) => Availability::no(format!(
                    "{rapl_text}, but intel_rapl_msr is not loaded (modprobe intel_rapl_msr; it refuses to load where the hardware has no RAPL)"
                )),
                (Some(true), _, _) => Availability::no(format!(
                    "{rapl_text}, hardware lacks RAPL (no intel-rapl zone under /sys/class/powercap; common in VMs)"
                )),
                _ => Availability::no(format!(
                    "no intel-rapl zone under /sys/class/powercap: {rapl_text}"
                )),
            }
        }
    }
}

pub(super) fn probe_cpufreq(host: &LinuxHost, root_user: bool, config: &Config) -> Availability {
    let cpufreq = host.cpufreq();
    let cpu = host
        .topology()
        .ok()
        .and_then(|t| t.cpus_online.iter().next())
        .unwrap_or(0);
    match cpufreq.info(cpu as usize) {
        Ok(info) if root_user => Availability::yes(format!(
            "cpufreq scaling_max_freq ({}..{} MHz)",
            info.cpuinfo_min_khz / 1000,
            info.cpuinfo_max_khz / 1000
        )),
        Ok(_) => Availability::no("not root: scaling_max_freq is root-writable only"),
        Err(_) => {
            let (has, kernel) = kernel_part(config, "CONFIG_CPU_FREQ");
            match has {
                Some(false) => Availability::no(kernel),
                Some(true) => Availability::no(format!(
                    "{kernel}, hardware lacks frequency control: no scaling driver bound for CPU {cpu} (common in VMs)"
                )),
                None => Availability::no(format!(
                    "no cpufreq policy for CPU {cpu} (no scaling driver bound); {kernel}"
                )),
            }
        }
    }
}

/// `/proc/pressure` is there unless the kernel lacks PSI or it is turned off at boot: by `psi=0`
/// on the command line, or by CONFIG_PSI_DEFAULT_DISABLED without `psi=1`. Both are read, not
/// assumed.
pub(super) fn psi_missing(host: &LinuxHost, config: &Config, not_supported: bool) -> Availability {
    let (has, kernel) = kernel_part(config, "CONFIG_PSI");
    if has == Some(false) {
        return Availability::no(format!("{kernel}: no /proc/pressure"));
    }
    let cmdline = std::fs::read_to_string(host.path("/proc/cmdline")).ok();
    let arg = |a: &str| {
        cmdline
            .as_deref()
            .map(|c| c.split_whitespace().any(|w| w == a))
    };
    let default_off =
        matches!(config, Ok(c) if c.setting("CONFIG_PSI_DEFAULT_DISABLED") != Setting::Off);
    let cause = if arg("psi=0") == Some(true) {
        "turned off by psi=0 on the kernel command line".to_owned()
    } else if default_off && arg("psi=1") != Some(true) {
        "off by default (CONFIG_PSI_DEFAULT_DISABLED=y): add psi=1 to the kernel command line"
            .to_owned()
    } else if not_supported {
        "turned off at boot (add psi=1 to the kernel command line)".to_owned()
    } else {
        "/proc/pressure is missing".to_owned()
    };
    Availability::no(format!("{kernel}, but PSI is {cause}"))
}

pub(super) fn schedstat_missing(config: &Config) -> Availability {
    let (_, kernel) = kernel_part(config, "CONFIG_SCHED_INFO");
    Availability::no(format!("no /proc/<pid>/schedstat: {kernel}"))
}

/// The option behind a cgroup knob file, named when a new group lacks it.
pub(super) fn knob_option(file: &str) -> Option<&'static str> {
    Some(match file {
        "cpuset.cpus" => "CONFIG_CPUSETS",
        "cpu.shares" | "cpu.weight" | "cpu.idle" => "CONFIG_FAIR_GROUP_SCHED",
        "cpu.cfs_quota_us" | "cpu.max" => "CONFIG_CFS_BANDWIDTH",
        "freezer.state" => "CONFIG_CGROUP_FREEZER",
        "memory.limit_in_bytes" | "memory.max" => "CONFIG_MEMCG",
        "blkio.throttle.read_bps_device" | "io.max" => "CONFIG_BLK_DEV_THROTTLING",
        "net_cls.classid" => "CONFIG_CGROUP_NET_CLASSID",
        "net_prio.ifpriomap" => "CONFIG_CGROUP_NET_PRIO",
        "cpu.pressure" => "CONFIG_PSI",
        "cpuacct.usage" => "CONFIG_CGROUP_CPUACCT",
        _ => return None,
    })
}

/// "kernel lacks CONFIG_X" / "kernel has CONFIG_X=y" for a knob file missing from a new group.
pub(super) fn knob_missing_note(config: &Config, file: &str) -> String {
    match knob_option(file) {
        Some(option) => kernel_part(config, option).1,
        None => String::new(),
    }
}
