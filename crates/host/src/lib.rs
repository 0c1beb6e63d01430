//! headroom-host: the only layer that touches the kernel. Every path is taken below a root
//! directory (`/` in production, a temp dir in tests), so each interface is tested against fakes
//! and again on the real kernel.
//!
//! # API overview
//!
//! ```text
//! LinuxHost::new(root) / ::system() / ::with_io(root, Arc<dyn KnobIo>)
//!   .cgroups() -> Cgroups            cgroup v1 / v2 / hybrid, detected from <root>/proc/self/mountinfo
//!   .cgroup_layout() -> CgroupLayout  mode, v1 mount per Controller, v2 mount + controllers
//!   .resctrl() -> Resctrl             info(), create_group, set_schemata, add_task, set_cpus, mon_data
//!   .rapl() -> Rapl                   zones(), energy_uj (+ power::energy_delta_uj for wrap), constraints
//!   .cpufreq() -> CpuFreq             info(cpu), set_max_khz, max_khz, cur_khz
//!   .topology() -> Topology           cpus_online, smt_siblings, numa_nodes, llc_bytes
//!   .proc_stat() / .idle_sampler()    allocation-free /proc/stat readers (per-CPU busy/idle)
//!   .schedstat(pid, tid)              run-queue delay reader
//!   .psi(PsiResource) .meminfo() .net_dev(dev) .threads(pid) .kernel_release()
//!   .kernel_cgroup_controllers() / .mount_v1_controller(c) / .unmount_v1_controller(c)
//!
//! GroupPath::new("headroom/be")?      validated: relative, no `..`, no empty parts
//! Cgroups (one logical path -> every v1 hierarchy, or the v2 directory):
//!   create / remove (children first, procs moved out) / exists / children
//!   move_process(g, pid) (all threads) / move_thread(g, tid) / procs / threads
//!   set_cpuset_cpus / cpuset_cpus / cpuset_effective_cpus / set_cpuset_mems / cpuset_mems
//!   set_cpu_weight(g, w) -> native written (v1 cpu.shares = w; v2 cpu.weight: 10000:2 -> 10000:1)
//!   cpu_weight / native_cpu_weight / set_cpu_idle / cpu_idle / set_cpu_quota(CpuQuota) / cpu_quota
//!   freeze / thaw (wait until settled) / freeze_state
//!   set_memory_max / memory_max / set_memory_high / memory_high / memory_usage / memory_events
//!   set_pids_max / pids_max / pids_current (the pids controller; sysctl::pid_max is the host's)
//!   set_io_limits(g, DeviceId, IoLimits) / io_limits / set_io_weight / io_weight
//!   set_net_classid / net_classid (v1 net_cls) / set_net_prio / net_prio (v1 net_prio)
//!   cpu_usage_ns / cpu_throttling / psi (v2) / ensure_v2_group (for cgroup BPF on hybrid hosts)
//! sched::{set_sched(tid, SchedPolicy), sched(tid) -> SchedAttr, set_affinity, affinity, threads, last_cpu}
//! tc::{Egress<R: TcRunner>, SystemTc, RecordingTc, HtbConfig, TcClassStats, net_cls_classid}
//!   BE classified by cgroup via bpf::EgressPriority::attach(v2 dir, classid) (any netns, needs a
//!   cgroup2 mount), Cgroups::set_net_prio (init-netns devices) or Egress::add_net_cls_filter
//! resctrl::{Resctrl, ResctrlGroup, Schemata, validate_cbm, top_ways_mask}
//! power::{Rapl, RaplZone, energy_delta_uj, CpuFreq}
//! sensors::{PolledFile, ProcStatReader, CpuIdleSampler, SchedstatReader, parse_psi, MemInfo}
//! latency_bpf::LatencySensor::attach(ports) -> snapshot() (the LC's request latency, passively)
//! bpf_asm::Asm (writes every BPF program) / bpf_sys (every bpf(2) call, program_loaded, map_exists)
//! net::timestamps::{enable_timestamping, read_errqueue, recv_stamped, rx_stamp, KernelStamp}
//!   a socket's kernel TX/RX software stamps (the load generator's and the prober's latencies)
//! net::link_speed_mbit(root, dev) / sysctl::{read, io_uring_disabled}(root) / pids::cgroup_text
//! poll::{wait(&mut [Wait], timeout), Doorbell}   ppoll (ns timeouts) and an eventfd to end it
//! timer::{Timer (timerfd, absolute CLOCK_MONOTONIC), sleep_until(ns)}
//! spawn::StartIn::parent().in_group(dir).without(cap).on_cpu(c).at_nice(n).apply(&mut cmd)
//!   a child in cgroups, pinned, no shell / spawn::Gated::fork(argv): placed before it execs
//! doctor::probe(root) -> headroom_types::doctor::Doctor; doctor::probe_with(&host, ProbeOptions)
//! HostError: every error names the path / target, the value and the errno.
//! ```

pub mod accounts;
pub mod bpf;
pub mod bpf_asm;
pub mod bpf_sys;
pub mod cgroup;
pub mod doctor;
pub mod error;
pub mod host;
pub mod idle_bpf;
pub mod knob_io;
pub mod latency_bpf;
pub mod net;
pub mod pids;
pub mod poll;
pub mod power;
pub mod process;
pub mod resctrl;
pub mod rt_budget;
pub mod sched;
pub mod sensors;
pub mod spawn;
pub mod sysctl;
pub mod tc;
pub mod timer;
pub mod topology;

pub use cgroup::{
    Backend, CgroupLayout, CgroupMode, Cgroups, Controller, CpuQuota, CpuThrottling, DeviceId,
    FreezeState, FreezerKeyHold, IoLimits, MemoryEvents, FREEZER_KEY_PREFIX,
};
pub use error::{HostError, IoOp};
pub use host::LinuxHost;
pub use knob_io::{CachedIo, KnobIo, RealIo};
pub use sched::{SchedAttr, SchedPolicy};
pub use sensors::{
    CpuIdleSampler, CpuTimes, MemInfo, NetDevStats, ProcStatReader, Psi, PsiLine, PsiResource,
    ThreadSchedstat,
};
pub use topology::Topology;
