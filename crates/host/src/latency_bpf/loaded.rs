//! The sensor's maps and programs in the kernel, and their attachment to the tracepoints
//! through `perf_event_open` (the kernel detaches a program when its perf event's fd closes).

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use crate::bpf_sys::{
    create_keyed_map, load_program, map_delete, map_lookup, map_next_key, map_update, object_id,
    owned, syscall_error, test_run, Insn, ProgramToLoad, BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_HASH,
    BPF_PROG_TYPE_RAW_TRACEPOINT, BPF_PROG_TYPE_TRACEPOINT,
};
use crate::error::{HostError, Result};

use super::histogram::LatencySnapshot;
use super::program::{self, stats, Layout, MapFds};
use super::tracefs;

const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// `_IO('$', 0)`, `_IOW('$', 8, u32)`.
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// Ports the sensor watches at most.
pub const MAX_PORTS: usize = headroom_types::resources::MAX_LATENCY_PORTS;
/// LC sockets tracked at once (an entry per open connection that has sent a request).
pub const MAX_SOCKETS: u32 = 16_384;

/// `struct perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER0`, 64 bytes).
#[repr(C)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// The maps and the three programs, loaded but not attached.
#[derive(Debug)]
pub struct LatencyPrograms {
    // Field order is drop order: programs before the maps they use.
    arrival: OwnedFd,
    reply: OwnedFd,
    close: OwnedFd,
    ports: OwnedFd,
    pending: OwnedFd,
    stats: OwnedFd,
}

impl LatencyPrograms {
    /// Creates the maps and loads the programs as tracepoint programs reading `layout`.
    pub fn load(layout: Layout, max_sockets: u32) -> Result<LatencyPrograms> {
        Self::load_as(layout, max_sockets, BPF_PROG_TYPE_TRACEPOINT)
    }

    /// The same programs as raw-tracepoint programs reading [`Layout::TEST`], which
    /// `BPF_PROG_TEST_RUN` can run on made-up events (it cannot run tracepoint programs).
    pub fn load_for_test(max_sockets: u32) -> Result<LatencyPrograms> {
        Self::load_as(Layout::TEST, max_sockets, BPF_PROG_TYPE_RAW_TRACEPOINT)
    }

    fn load_as(layout: Layout, max_sockets: u32, prog_type: u32) -> Result<LatencyPrograms> {
        let ports = create_keyed_map(
            BPF_MAP_TYPE_HASH,
            4,
            4,
            MAX_PORTS as u32,
            0,
            b"hr_lat_ports",
        )?;
        let pending = create_keyed_map(
            BPF_MAP_TYPE_HASH,
            8,
            program::pending::SIZE as u32,
            max_sockets,
            0,
            b"hr_lat_pending",
        )?;
        let stats = create_keyed_map(
            BPF_MAP_TYPE_ARRAY,
            4,
            stats::SIZE as u32,
            1,
            0,
            b"hr_lat_stats",
        )?;
        let maps = MapFds {
            ports: ports.as_raw_fd(),
            pending: pending.as_raw_fd(),
            stats: stats.as_raw_fd(),
        };
        let load = |name: &'static str, insns: &[Insn], hook: &str| {
            load_program(ProgramToLoad {
                prog_type,
                expected_attach_type: 0,
                name,
                license: "Dual MIT/GPL",
                insns,
                target: "latency sensor program",
                value: format!("{name} for {hook}, layout {layout:?}"),
            })
        };
        Ok(LatencyPrograms {
            arrival: load(
                "hr_lat_arrival",
                &program::arrival(layout, maps),
                "tcp:tcp_probe",
            )?,
            reply: load(
                "hr_lat_reply",
                &program::reply(layout, maps),
                "sock:sock_send_length",
            )?,
            close: load(
                "hr_lat_close",
                &program::close(layout, maps),
                "sock:inet_sock_set_state",
            )?,
            ports,
            pending,
            stats,
        })
    }

    /// Watches exactly `ports` (the LC's local ports).
    pub fn set_ports(&self, ports: &[u16]) -> Result<()> {
        if ports.len() > MAX_PORTS {
            return Err(HostError::Invalid {
                what: "latency sensor ports",
                value: format!("{ports:?}"),
                reason: format!("at most {MAX_PORTS}"),
            });
        }
        // remove what is no longer wanted, then add (a port both before and after stays)
        let mut old = Vec::new();
        let mut next = 0u32;
        while old.len() <= MAX_PORTS && map_next_key(&self.ports, old.last(), &mut next) {
            old.push(next);
        }
        for p in old.iter().filter(|p| !ports.contains(&(**p as u16))) {
            map_delete(&self.ports, p);
        }
        for &p in ports {
            map_update(&self.ports, &u32::from(p), &1u32, 0).map_err(|source| {
                HostError::Syscall {
                    call: "bpf(BPF_MAP_UPDATE_ELEM)",
                    target: "latency sensor ports map".to_owned(),
                    value: format!("port {p}"),
                    source,
                }
            })?;
        }
        Ok(())
    }

    /// The cumulative counters and histogram.
    pub fn snapshot(&self) -> Result<LatencySnapshot> {
        let mut entry = vec![0u8; stats::SIZE];
        if !map_lookup(&self.stats, &0u32, entry.as_mut_slice()) {
            return Err(syscall_error(
                "bpf(BPF_MAP_LOOKUP_ELEM)",
                "latency sensor stats map",
                "key 0".into(),
            ));
        }
        Ok(LatencySnapshot::decode(&entry))
    }

    /// The arrival time pending on `sock` (0: known, nothing pending; `None`: unknown).
    pub fn pending(&self, sock: u64) -> Option<u64> {
        self.pending_entry(sock).map(|e| e[0])
    }

    /// The request queued behind a reply not yet seen on `sock` (0: none; `None`: unknown).
    pub fn queued(&self, sock: u64) -> Option<u64> {
        self.pending_entry(sock).map(|e| e[2])
    }

    /// `sock`'s entry: arrival, its `snd_nxt`, the queued arrival, its `snd_nxt`.
    fn pending_entry(&self, sock: u64) -> Option<[u64; 4]> {
        const _: () = assert!(program::pending::SIZE == 32);
        let mut v = [0u64; 4];
        map_lookup(&self.pending, &sock, &mut v).then_some(v)
    }

    /// Kernel ids of the programs and the maps (what `bpftool` lists).
    pub fn ids(&self) -> Result<(Vec<u32>, Vec<u32>)> {
        let id = |fd: &&OwnedFd| object_id(fd, "latency sensor");
        Ok((
            [&self.arrival, &self.reply, &self.close]
                .iter()
                .map(id)
                .collect::<Result<_>>()?,
            [&self.ports, &self.pending, &self.stats]
                .iter()
                .map(id)
                .collect::<Result<_>>()?,
        ))
    }

    fn test_run(&self, prog: &OwnedFd, ctx: &[u64; 12]) -> Result<()> {
        test_run(prog, ctx, ("latency sensor program", format!("{ctx:?}")))
    }

    /// Runs the arrival program on a made-up `tcp_probe` (a [`Self::load_for_test`] load) of
    /// a socket that has sent nothing (`snd_nxt` 0).
    pub fn test_arrival(&self, sport: u16, data_len: u16, sock: u64) -> Result<()> {
        self.test_arrival_after_sending(sport, data_len, sock, 0)
    }

    /// Runs the arrival program on a made-up `tcp_probe` of a socket whose `snd_nxt` is
    /// `snd_nxt`.
    pub fn test_arrival_after_sending(
        &self,
        sport: u16,
        data_len: u16,
        sock: u64,
        snd_nxt: u32,
    ) -> Result<()> {
        let l = Layout::TEST;
        let mut ctx = [0u64; 12];
        ctx[l.probe_sport as usize / 8] |= u64::from(sport) << (8 * (l.probe_sport % 8));
        ctx[l.probe_data_len as usize / 8] |= u64::from(data_len) << (8 * (l.probe_data_len % 8));
        ctx[l.probe_skaddr as usize / 8] = sock;
        ctx[l.probe_snd_nxt as usize / 8] |= u64::from(snd_nxt) << (8 * (l.probe_snd_nxt % 8));
        self.test_run(&self.arrival, &ctx)
    }

    /// Runs the reply program on a made-up `sock_send_length`.
    pub fn test_reply(&self, sock: u64, ret: i32) -> Result<()> {
        let l = Layout::TEST;
        let mut ctx = [0u64; 12];
        ctx[l.send_sk as usize / 8] = sock;
        ctx[l.send_ret as usize / 8] = u64::from(ret as u32);
        self.test_run(&self.reply, &ctx)
    }

    /// Runs the close program on a made-up `inet_sock_set_state` to `newstate`.
    pub fn test_state(&self, sock: u64, newstate: i32) -> Result<()> {
        let l = Layout::TEST;
        let mut ctx = [0u64; 12];
        ctx[l.state_skaddr as usize / 8] = sock;
        ctx[l.state_newstate as usize / 8] = u64::from(newstate as u32);
        self.test_run(&self.close, &ctx)
    }
}

/// The programs attached to their tracepoints: timing the LC's requests on its ports until
/// dropped (or the process dies: the perf events' fds close and the kernel detaches).
#[derive(Debug)]
pub struct LatencySensor {
    // Field order is drop order: the attachments first.
    _links: Vec<OwnedFd>,
    programs: LatencyPrograms,
    ports: Vec<u16>,
}

impl LatencySensor {
    /// Loads and attaches the sensor for `ports`. Any failure leaves nothing attached or
    /// loaded (what was made so far is closed) and names the step and the hook.
    pub fn attach(ports: &[u16]) -> Result<LatencySensor> {
        let events = tracefs::events_dir_or_mount()?;
        Self::attach_at(&events, ports)
    }

    /// As [`Self::attach`], with tracefs's `events/` directory given.
    pub fn attach_at(events: &Path, ports: &[u16]) -> Result<LatencySensor> {
        let ids = tracefs::HOOKS
            .iter()
            .map(|(sys, ev, _)| tracefs::tracepoint_id(events, sys, ev))
            .collect::<Result<Vec<u64>>>()?;
        let layout = tracefs::layout(events)?;
        let programs = LatencyPrograms::load(layout, MAX_SOCKETS)?;
        programs.set_ports(ports)?;
        let mut links = Vec::new();
        for ((prog, id), (sys, ev, _)) in [&programs.arrival, &programs.reply, &programs.close]
            .into_iter()
            .zip(ids)
            .zip(tracefs::HOOKS)
        {
            links.push(attach_tracepoint(prog, id, &format!("{sys}:{ev}"))?);
        }
        Ok(LatencySensor {
            _links: links,
            programs,
            ports: ports.to_vec(),
        })
    }

    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// Watches `ports` from now on.
    pub fn set_ports(&mut self, ports: &[u16]) -> Result<()> {
        self.programs.set_ports(ports)?;
        self.ports = ports.to_vec();
        Ok(())
    }

    /// The cumulative counters and histogram; a window is the difference of two.
    pub fn snapshot(&self) -> Result<LatencySnapshot> {
        self.programs.snapshot()
    }

    /// Kernel ids of the programs and the maps.
    pub fn ids(&self) -> Result<(Vec<u32>, Vec<u32>)> {
        self.programs.ids()
    }
}

/// Opens a perf event on tracepoint `id` and runs `prog` on it; the fd is the attachment.
fn attach_tracepoint(prog: &OwnedFd, id: u64, name: &str) -> Result<OwnedFd> {
    let mut attr = PerfEventAttr {
        type_: PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: id,
        sample_period: 1,
        sample_type: 0,
        read_format: 0,
        flags: 0,
        wakeup_events: 1,
        bp_type: 0,
        config1: 0,
    };
    // SAFETY: attr is a zero-padded perf_event_attr of the size it states; pid -1 with cpu 0
    // is a tracepoint event for every task (a BPF program on it runs on every CPU).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &mut attr as *mut PerfEventAttr,
            -1i32,
            0i32,
            -1i32,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(syscall_error(
            "perf_event_open",
            name,
            format!("tracepoint id {id}"),
        ));
    }
    let event = owned(fd);
    // SAFETY: ioctls on the perf event fd we own, with an int argument.
    if unsafe {
        libc::ioctl(
            event.as_raw_fd(),
            PERF_EVENT_IOC_SET_BPF as _,
            prog.as_raw_fd(),
        )
    } < 0
    {
        return Err(syscall_error(
            "ioctl(PERF_EVENT_IOC_SET_BPF)",
            name,
            format!("tracepoint id {id}"),
        ));
    }
    // SAFETY: as above.
    if unsafe { libc::ioctl(event.as_raw_fd(), PERF_EVENT_IOC_ENABLE as _, 0) } < 0 {
        return Err(syscall_error(
            "ioctl(PERF_EVENT_IOC_ENABLE)",
            name,
            format!("tracepoint id {id}"),
        ));
    }
    Ok(event)
}
