//! `headroom doctor`: which mechanisms and sensors this kernel and hardware offer, and why not.
//!
//! Probes are real where that is safe: a scratch cgroup `headroom-doctor-<pid>` is created, each
//! knob is read and written back with its own value, and the group is removed; `sched_setattr`
//! re-applies the caller's own attributes; HTB and the cgroup classifier are installed on the
//! loopback device of a scratch network namespace that is deleted afterwards. Nothing is left
//! behind.

mod kernel_config;
mod platform;
mod rt;

use std::path::Path;
use std::process::Command;

use headroom_types::doctor::{Availability, Doctor, Mechanisms, Sensors, TopologyInfo};

use crate::cgroup::{Backend, Cgroups, Controller};
use crate::host::LinuxHost;
use crate::sensors::PsiResource;
use headroom_types::values::GroupPath;

pub use kernel_config::{KernelConfig, NoKernelConfig, Setting};

/// Which probes may touch the live system (syscalls on the calling thread, network namespaces);
/// file-system probes always stay below the host root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOptions {
    /// Probe `sched_setattr` on the calling thread (re-applying its own attributes).
    pub sched_syscalls: bool,
    /// Probe HTB and the cgroup classifier in a scratch network namespace (needs `ip`, `tc`).
    pub tc_netns: bool,
    /// Create and remove a scratch cgroup to prove the knobs writable.
    pub scratch_cgroup: bool,
}

impl ProbeOptions {
    /// Everything for the real root `/`; file-system probes only for any other root (fakes).
    pub fn for_root(root: &Path) -> Self {
        let live = root == Path::new("/");
        ProbeOptions {
            sched_syscalls: live,
            tc_netns: live,
            scratch_cgroup: true,
        }
    }
}

/// Probes the host below `root` (see [`ProbeOptions::for_root`]).
pub fn probe(root: &Path) -> Doctor {
    probe_with(&LinuxHost::new(root), ProbeOptions::for_root(root))
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Probes with explicit options.
pub fn probe_with(host: &LinuxHost, options: ProbeOptions) -> Doctor {
    let root_user = is_root();
    let topology = host.topology().ok();
    let cgroups = host.cgroups();
    let cgroup_mode = cgroups
        .as_ref()
        .map_or("none".to_owned(), |c| c.mode().as_str().to_owned());
    let config = platform::load_config(host);
    let cg = match &cgroups {
        Ok(c) => CgroupProbe::run(c, options.scratch_cgroup, root_user, &config),
        Err(e) => CgroupProbe::failed(&format!("cannot read the cgroup mounts: {e}")),
    };
    let (resctrl_l3, resctrl_mba, resctrl_mon) = platform::probe_resctrl(host, &config);
    let cpus = topology.as_ref().map_or(0, |t| t.cpus_online.len());
    let tc = probe_tc(options.tc_netns, root_user);
    Doctor {
        kernel: host
            .kernel_release()
            .unwrap_or_else(|_| "unknown".to_owned()),
        cgroup_mode,
        root: root_user,
        cpus,
        smt: topology.as_ref().is_some_and(|t| t.smt()),
        llc_bytes: topology.as_ref().and_then(|t| t.llc_bytes),
        numa_nodes: topology.as_ref().map_or(1, |t| t.numa_nodes),
        mechanisms: Mechanisms {
            cpuset: cg.cpuset,
            cpu_weight: cg.cpu_weight,
            cpu_idle: cg.cpu_idle,
            cpu_quota: cg.cpu_quota,
            freeze: cg.freeze,
            memory: cg.memory,
            io: cg.io,
            sched_attr: probe_sched_attr(host, options.sched_syscalls),
            resctrl_l3,
            resctrl_mba,
            rapl: platform::probe_rapl(host, root_user, &config),
            cpufreq: platform::probe_cpufreq(host, root_user, &config),
            tc_htb: tc.htb.clone(),
            net_cls: Some(classifier(host, &cg.net_cls, "net_cls", &tc.cls_cgroup)),
            net_prio: Some(classifier(host, &cg.net_prio, "net_prio", &tc.htb)),
            cgroup_bpf: Some(probe_cgroup_bpf(
                host,
                options.sched_syscalls,
                root_user,
                &tc.htb,
            )),
            pids: Some(cg.pids),
        },
        sensors: Sensors {
            proc_stat: match host.proc_stat().and_then(|mut r| r.read().map(|c| c.len())) {
                Ok(n) => Availability::yes(format!("/proc/stat ({n} CPUs)")),
                Err(e) => Availability::no(e.to_string()),
            },
            schedstat: probe_schedstat(host, &config),
            psi: match host.psi(PsiResource::Cpu) {
                Ok(_) => Availability::yes("/proc/pressure/{cpu,memory,io}"),
                Err(e) if e.is_not_found() => platform::psi_missing(host, &config, false),
                Err(e) if e.errno() == Some(nix::errno::Errno::EOPNOTSUPP) => {
                    platform::psi_missing(host, &config, true)
                }
                Err(e) => Availability::no(e.to_string()),
            },
            resctrl_mon,
            cgroup_psi: Some(cg.cgroup_psi),
            meminfo: Some(match host.meminfo() {
                Ok(m) => Availability::yes(format!(
                    "/proc/meminfo (MemAvailable {} MiB)",
                    m.available >> 20
                )),
                Err(e) => Availability::no(e.to_string()),
            }),
            cgroup_cpu_usage: Some(cg.cpu_usage),
            idle_events: Some(probe_idle_events(root_user, options.sched_syscalls)),
            sched_fifo: Some(rt::probe_sched_fifo(options.sched_syscalls)),
            lc_latency_kernel: Some(probe_latency_kernel(root_user, options.sched_syscalls)),
        },
        topology: topology.map(|t| TopologyInfo {
            cpus_online: t.cpus_online.to_list(),
            smt_siblings: t.smt_siblings.iter().map(|s| s.to_list()).collect(),
        }),
    }
}

struct CgroupProbe {
    cpuset: Availability,
    cpu_weight: Availability,
    cpu_idle: Availability,
    cpu_quota: Availability,
    freeze: Availability,
    memory: Availability,
    io: Availability,
    net_cls: Availability,
    net_prio: Availability,
    cgroup_psi: Availability,
    cpu_usage: Availability,
    pids: Availability,
}

impl CgroupProbe {
    fn failed(reason: &str) -> Self {
        let no = || Availability::no(reason);
        CgroupProbe {
            cpuset: no(),
            cpu_weight: no(),
            cpu_idle: no(),
            cpu_quota: no(),
            freeze: no(),
            memory: no(),
            io: no(),
            net_cls: no(),
            net_prio: no(),
            cgroup_psi: no(),
            cpu_usage: no(),
            pids: no(),
        }
    }

    fn run(cgroups: &Cgroups, scratch: bool, root_user: bool, config: &platform::Config) -> Self {
        // Unique per probe: agents may probe from several threads of one process.
        static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scratch_group =
            GroupPath::new(&format!("headroom-doctor-{}-{n}", std::process::id())).ok();
        let mut created = None;
        let mut create_error = None;
        if scratch {
            if let Some(g) = &scratch_group {
                match cgroups.create(g) {
                    Ok(()) => created = Some(g.clone()),
                    Err(e) => {
                        let _ = cgroups.remove(g);
                        create_error = Some(if e.is_permission() {
                            format!("not root: cannot create cgroups ({e})")
                        } else {
                            format!("cannot create a scratch cgroup: {e}")
                        });
                    }
                }
            }
        }
        let group = created.clone().unwrap_or_else(GroupPath::root);
        // One knob: the controller's backend must exist, its file must exist in the scratch
        // group, and writing its own value back must succeed.
        let knob = |controller: Controller, v1: &str, v2: &str, write_back: bool| -> Availability {
            let backend = match cgroups.backend(controller) {
                Ok(b) => b,
                Err(_) => {
                    let missing = cgroups.layout().missing_reason(controller);
                    return match platform::knob_option(v2).or(platform::knob_option(v1)) {
                        Some(option) if matches!(config, Ok(c) if c.setting(option) == Setting::Off) => {
                            Availability::no(format!(
                                "{missing}; {}",
                                platform::knob_missing_note(config, v2)
                            ))
                        }
                        _ => Availability::no(missing),
                    };
                }
            };
            let (file, version) = match backend {
                Backend::V1(_) => (v1, "v1"),
                Backend::V2(_) => (v2, "v2"),
            };
            let via = format!("{version} {file}");
            if let Some(reason) = &create_error {
                return Availability::no(reason.clone());
            }
            if created.is_none() {
                return if root_user {
                    Availability::yes(format!("{via} (not write-probed)"))
                } else {
                    Availability::no("not root: writing cgroupfs needs root or a delegated subtree")
                };
            }
            let path = group.dir_in(backend.mount()).join(file);
            if !path.exists() {
                let note = platform::knob_missing_note(config, file);
                return Availability::no(if note.is_empty() {
                    format!("kernel lacks it: {} missing in a new group", path.display())
                } else {
                    format!("{} missing in a new group: {note}", path.display())
                });
            }
            if write_back {
                let result = std::fs::read_to_string(&path).and_then(|v| {
                    let first = v.lines().next().unwrap_or("").to_owned();
                    std::fs::write(&path, first)
                });
                if let Err(e) = result {
                    return Availability::no(format!(
                        "writing {} back failed: {e}",
                        path.display()
                    ));
                }
            }
            Availability::yes(via)
        };
        let out = CgroupProbe {
            cpuset: knob(Controller::Cpuset, "cpuset.cpus", "cpuset.cpus", true),
            cpu_weight: knob(Controller::Cpu, "cpu.shares", "cpu.weight", true),
            cpu_idle: knob(Controller::Cpu, "cpu.idle", "cpu.idle", true),
            cpu_quota: knob(Controller::Cpu, "cpu.cfs_quota_us", "cpu.max", true),
            freeze: knob(Controller::Freezer, "freezer.state", "cgroup.freeze", false),
            memory: knob(
                Controller::Memory,
                "memory.limit_in_bytes",
                "memory.max",
                true,
            ),
            io: knob(
                Controller::Io,
                "blkio.throttle.read_bps_device",
                "io.max",
                false,
            ),
            net_cls: knob(Controller::NetCls, "net_cls.classid", "-", true),
            net_prio: knob(Controller::NetPrio, "net_prio.ifpriomap", "-", false),
            cgroup_psi: if cgroups.layout().v2_usable() {
                knob(Controller::Cpu, "cpu.pressure", "cpu.pressure", false)
            } else {
                Availability::no("per-group PSI needs cgroup v2 with controllers; groups are controlled through v1 here")
            },
            cpu_usage: knob(Controller::Cpuacct, "cpuacct.usage", "cpu.stat", false),
            // Without it a BE's process count is not bounded (safety.be_pids_max).
            pids: knob(Controller::Pids, "pids.max", "pids.max", true),
        };
        if let Some(g) = created {
            if let Err(e) = cgroups.remove(&g) {
                tracing::warn!("doctor: removing scratch cgroup {g}: {e}");
            }
        }
        out
    }
}

fn probe_sched_attr(host: &LinuxHost, live: bool) -> Availability {
    let slice_note = match kernel_at_least(host, 6, 12) {
        Some(true) => "sched_setattr (SCHED_OTHER nice + EEVDF slice, SCHED_IDLE, FIFO/RR)",
        Some(false) => "sched_setattr (no EEVDF slice request before kernel 6.12)",
        None => "sched_setattr",
    };
    if !live {
        return Availability::yes(format!("{slice_note} (not probed)"));
    }
    let attr = match crate::sched::sched(0) {
        Ok(a) => a,
        Err(e) => return Availability::no(format!("kernel lacks it: {e}")),
    };
    match attr.policy() {
        Some(policy) => match crate::sched::set_sched(0, policy) {
            Ok(()) => Availability::yes(slice_note),
            Err(e) if e.is_permission() => Availability::no(format!("not permitted: {e}")),
            Err(e) => Availability::no(e.to_string()),
        },
        None => Availability::yes(format!("{slice_note} (read-only probe)")),
    }
}

/// `Some(true)` when the kernel release is at least `major.minor`.
fn kernel_at_least(host: &LinuxHost, major: u32, minor: u32) -> Option<bool> {
    let release = host.kernel_release().ok()?;
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let ma: u32 = parts.next()?.parse().ok()?;
    let mi: u32 = parts.next()?.parse().ok()?;
    Some((ma, mi) >= (major, minor))
}

fn probe_schedstat(host: &LinuxHost, config: &platform::Config) -> Availability {
    let pid = std::process::id() as i32;
    let tid = nix::unistd::gettid().as_raw();
    let path = host.path(&format!("/proc/{pid}/task/{tid}/schedstat"));
    if !path.exists() {
        let self_path = host.path("/proc/self/schedstat");
        if !self_path.exists() {
            return platform::schedstat_missing(config);
        }
    }
    Availability::yes("/proc/<pid>/task/<tid>/schedstat")
}

/// A probing command that did not succeed: what ran and its first line of stderr (a tool that
/// lacks a subcommand prints its whole usage after it).
#[derive(Debug, thiserror::Error)]
enum ProbeCommandError {
    #[error("`{command}` failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("cannot run {program}: {source}")]
    NotRun {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

/// Runs a probing command.
fn run(program: &str, args: &[&str]) -> Result<(), ProbeCommandError> {
    match Command::new(program).args(args).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(ProbeCommandError::Failed {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
        }),
        Err(source) => Err(ProbeCommandError::NotRun {
            program: program.to_string(),
            source,
        }),
    }
}

struct TcProbe {
    htb: Availability,
    /// The tc `cgroup` classifier (cls_cgroup).
    cls_cgroup: Availability,
}

fn probe_tc(live: bool, root_user: bool) -> TcProbe {
    if !root_user {
        let no = || Availability::no("not root: tc needs CAP_NET_ADMIN");
        return TcProbe {
            htb: no(),
            cls_cgroup: no(),
        };
    }
    if !live {
        let unprobed = || Availability::yes("tc (not probed)");
        return TcProbe {
            htb: unprobed(),
            cls_cgroup: unprobed(),
        };
    }
    let ns = format!("headroom-doctor-{}", std::process::id());
    if let Err(e) = run("ip", &["netns", "add", &ns]) {
        let no = || Availability::no(format!("cannot probe in a scratch network namespace: {e}"));
        return TcProbe {
            htb: no(),
            cls_cgroup: no(),
        };
    }
    let htb = match run(
        "tc",
        &[
            "-n", &ns, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10",
        ],
    ) {
        Ok(()) => Availability::yes("tc htb (root qdisc, LC class, BE class with a run-time ceil)"),
        Err(e) => Availability::no(format!("kernel lacks HTB (sch_htb): {e}")),
    };
    let cls_cgroup = if htb.available {
        match run(
            "tc",
            &[
                "-n", &ns, "filter", "add", "dev", "lo", "parent", "1:", "protocol", "all", "prio",
                "10", "handle", "1:", "cgroup",
            ],
        ) {
            Ok(()) => Availability::yes("tc cgroup filter"),
            Err(_) => Availability::no(
                "kernel lacks the tc cgroup classifier (cls_cgroup: `TC classifier not found`)",
            ),
        }
    } else {
        Availability::no("no HTB to attach a filter to")
    };
    let _ = run("ip", &["netns", "del", &ns]);
    TcProbe { htb, cls_cgroup }
}

/// A cgroup-based egress classifier needs its v1 controller (mounted, or mountable because the
/// kernel has it unbound) and its tc part.
fn classifier(
    host: &LinuxHost,
    controller: &Availability,
    name: &str,
    tc_part: &Availability,
) -> Availability {
    if !tc_part.available {
        return Availability::no(tc_part.reason.clone().unwrap_or_default());
    }
    if controller.available {
        return Availability::yes(format!(
            "{} + {}",
            controller.via.clone().unwrap_or_default(),
            tc_part.via.clone().unwrap_or_default()
        ));
    }
    match host.kernel_cgroup_controllers() {
        Ok(map) => match map.get(name) {
            Some((_, true)) => Availability::yes(format!(
                "v1 {name} (kernel has it, not mounted: LinuxHost::mount_v1_controller mounts it at /sys/fs/cgroup/{name}) + {}",
                tc_part.via.clone().unwrap_or_default()
            )),
            Some((_, false)) => Availability::no(format!("{name} disabled on the kernel command line")),
            None => Availability::no(format!("kernel lacks the {name} cgroup controller")),
        },
        Err(e) => Availability::no(e.to_string()),
    }
}

/// Event-driven idle sensing needs the idle program to load (root, BPF atomics and ring
/// buffer: Linux 5.12+); the agent polls otherwise.
fn probe_idle_events(root_user: bool, live: bool) -> Availability {
    let via = "BPF ring buffer events from power:cpu_idle on idle-count crossings";
    if !root_user {
        return Availability::no("not root: loading BPF programs needs CAP_BPF (the agent polls)");
    }
    if !live {
        return Availability::yes(format!("{via} (not probed)"));
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match crate::idle_bpf::IdleProgram::load(cpus, &[]) {
        Ok(_) => Availability::yes(via),
        Err(e) => Availability::no(format!("the agent polls: {e}")),
    }
}

/// The passive latency sensor needs root, tracefs, its three tracepoints and BPF atomics;
/// live, it is loaded, attached and detached again (the exact check the agent makes).
fn probe_latency_kernel(root_user: bool, live: bool) -> Availability {
    let via = "BPF on tcp:tcp_probe -> sock:sock_send_length (the LC's own requests)";
    if !root_user {
        return Availability::no(
            "not root: loading BPF programs needs CAP_BPF and CAP_PERFMON (the prober is the fallback)",
        );
    }
    if !live {
        return Availability::yes(format!("{via} (not probed)"));
    }
    match crate::latency_bpf::unavailable_reason() {
        None => Availability::yes(via),
        Some(why) => Availability::no(format!("{why} (the prober is the fallback)")),
    }
}

/// The cgroup BPF egress classifier needs a cgroup2 mount, BPF (root) and HTB.
fn probe_cgroup_bpf(
    host: &LinuxHost,
    live: bool,
    root_user: bool,
    htb: &Availability,
) -> Availability {
    if !htb.available {
        return Availability::no(htb.reason.clone().unwrap_or_default());
    }
    let v2 = match host.cgroup_layout() {
        Ok(layout) => layout.v2,
        Err(e) => return Availability::no(e.to_string()),
    };
    let Some(v2) = v2 else {
        return Availability::no("no cgroup2 mount to attach cgroup BPF programs to");
    };
    if !root_user {
        return Availability::no("not root: loading BPF programs needs CAP_BPF");
    }
    let via = format!(
        "cgroup_skb egress program on {} sets skb->priority = HTB class",
        v2.display()
    );
    if !live {
        return Availability::yes(format!("{via} (not probed)"));
    }
    match crate::bpf::load_egress_priority_program(crate::tc::HtbConfig::new(1, 1).be_classid()) {
        Ok(_fd) => Availability::yes(via),
        Err(e) => Availability::no(format!(
            "kernel refused the cgroup_skb program (CONFIG_CGROUP_BPF?): {e}"
        )),
    }
}
