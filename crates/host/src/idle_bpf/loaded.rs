//! The loaded idle program and its maps (per-CPU slots, the control block, the ring buffer),
//! not yet attached: thresholds and counters are read and written through the mappings.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::bpf_sys::{
    create_map, load_program, object_id, test_run, ProgramToLoad, BPF_F_MMAPABLE,
    BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_RINGBUF, BPF_PROG_TYPE_RAW_TRACEPOINT,
};
use crate::error::{HostError, Result};

use super::program::{self, control, slot};
use super::ring::{Mapping, RingReader};

/// Ring buffer bytes: 2730 events of 32 bytes (header included).
const RING_BYTES: usize = 64 * 1024;

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

/// Counters the program keeps in its control block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounters {
    /// Events written to the ring buffer.
    pub events: u64,
    /// Crossings of the low threshold the hysteresis held back.
    pub suppressed: u64,
    /// Events lost because the ring buffer was full.
    pub overruns: u64,
}

/// The loaded program and its maps, not yet attached (tests run it with `BPF_PROG_TEST_RUN`).
#[derive(Debug)]
pub struct IdleProgram {
    // Field order is drop order: the program before the mappings and maps it uses.
    pub(super) program: OwnedFd,
    pub(super) ring: RingReader,
    slots: Mapping,
    control: Mapping,
    _ring_map: OwnedFd,
    _slots_map: OwnedFd,
    _control_map: OwnedFd,
    pub(super) possible: usize,
}

impl IdleProgram {
    /// Creates the maps, marks `watched` CPUs, and loads the program.
    pub fn load(possible: usize, watched: &[usize]) -> Result<IdleProgram> {
        let page = page_size();
        let slots_map = create_map(
            BPF_MAP_TYPE_ARRAY,
            slot::SIZE as u32,
            possible as u32,
            BPF_F_MMAPABLE,
            b"hr_idle_slots",
        )?;
        let control_map = create_map(
            BPF_MAP_TYPE_ARRAY,
            control::SIZE as u32,
            1,
            BPF_F_MMAPABLE,
            b"hr_idle_ctl",
        )?;
        let ring_map = create_map(
            BPF_MAP_TYPE_RINGBUF,
            0,
            RING_BYTES as u32,
            0,
            b"hr_idle_ring",
        )?;
        let map_err = |what: &'static str, len: usize| {
            move |e: io::Error| HostError::Syscall {
                call: "mmap",
                target: what.to_owned(),
                value: format!("{len} bytes"),
                source: e,
            }
        };
        let slots_len = (possible * slot::SIZE).div_ceil(page) * page;
        let slots = Mapping::new(&slots_map, slots_len, 0, true)
            .map_err(map_err("per-CPU idle map", slots_len))?;
        let control =
            Mapping::new(&control_map, page, 0, true).map_err(map_err("idle control map", page))?;
        let ring = RingReader::new(&ring_map, RING_BYTES, page)
            .map_err(map_err("idle event ring buffer", RING_BYTES))?;
        for &cpu in watched.iter().filter(|&&c| c < possible) {
            // SAFETY: cpu < possible: the slot is inside the mapping; 8-byte aligned.
            unsafe {
                std::ptr::write_volatile(
                    slots.ptr.add(cpu * slot::SIZE + slot::WATCHED as usize) as *mut u64,
                    1,
                )
            };
        }

        let insns = program::program(program::MapFds {
            slots: slots_map.as_raw_fd(),
            control: control_map.as_raw_fd(),
            ring: ring_map.as_raw_fd(),
        });
        let program = load_program(ProgramToLoad {
            prog_type: BPF_PROG_TYPE_RAW_TRACEPOINT,
            expected_attach_type: 0,
            name: "hr_idle",
            license: "Dual MIT/GPL",
            insns: &insns,
            target: "raw_tracepoint idle program",
            value: "the idle-count program".to_owned(),
        })?;
        Ok(IdleProgram {
            program,
            ring,
            slots,
            control,
            _ring_map: ring_map,
            _slots_map: slots_map,
            _control_map: control_map,
            possible,
        })
    }

    /// Runs the program once in the kernel as if `cpu` had entered (`state` = its C-state) or
    /// left (`state = u32::MAX`) idle: the behaviour test of the real bytecode.
    pub fn test_run(&self, state: u32, cpu: u32) -> Result<()> {
        test_run(
            &self.program,
            &[u64::from(state), u64::from(cpu)],
            (
                "raw_tracepoint idle program",
                format!("state {state}, cpu {cpu}"),
            ),
        )
    }

    /// The kernel's id of the program (what `bpftool prog` lists).
    pub fn program_id(&self) -> Result<u32> {
        object_id(&self.program, "idle program")
    }

    fn slot_word(&self, cpu: usize, off: i16) -> u64 {
        // SAFETY: callers pass cpu < possible: inside the mapping, 8-byte aligned; volatile
        // because the kernel writes it concurrently.
        unsafe {
            std::ptr::read_volatile(
                self.slots.ptr.add(cpu * slot::SIZE + off as usize) as *const u64
            )
        }
    }

    fn control_word(&self, off: i16) -> u64 {
        // SAFETY: off < control::SIZE ≤ one page: inside the mapping, 8-byte aligned.
        unsafe { std::ptr::read_volatile(self.control.ptr.add(off as usize) as *const u64) }
    }

    fn set_control_word(&self, off: i16, value: u64) {
        // SAFETY: as in control_word; the program reads these words, never a torn u64.
        unsafe { std::ptr::write_volatile(self.control.ptr.add(off as usize) as *mut u64, value) }
    }

    /// The watched CPUs idle now, as the program counts them.
    pub fn idle_count(&self) -> i64 {
        self.control_word(control::IDLE_COUNT) as i64
    }

    /// The idle count with the calling thread's CPU counted as idle (the caller is what keeps
    /// it busy).
    pub fn idle_count_but_caller(&self) -> i64 {
        let mine =
            crate::sched::current_cpu().is_some_and(|c| self.is_watched(c) && !self.is_idle(c));
        self.idle_count() + i64::from(mine)
    }

    /// Whether `cpu` is idle now (as far as the program has seen).
    pub fn is_idle(&self, cpu: usize) -> bool {
        cpu < self.possible && self.slot_word(cpu, slot::IN_IDLE) != 0
    }

    /// Whether `cpu` is one of the CPUs whose idle count the program keeps.
    pub fn is_watched(&self, cpu: usize) -> bool {
        cpu < self.possible && self.slot_word(cpu, slot::WATCHED) != 0
    }

    /// Puts the thresholds' side back above after a fall the reader found to be its own
    /// wake-up (see the agent's sensors), so the next real fall is an event again; returns the
    /// count read just after (the caller's CPU counted idle), which the caller must check: a
    /// real fall that happened in between raised no event (the side was below then).
    pub fn rearm_above(&self) -> i64 {
        self.set_control_word(control::BELOW, 0);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.idle_count_but_caller()
    }

    /// Marks the count as below (the caller handles the fall itself).
    pub fn mark_below(&self) {
        self.set_control_word(control::BELOW, 1);
    }

    /// Sets the thresholds: an event when the count falls below `low`, and (after that) when
    /// it rises to `high` (`high > low` is the hysteresis). The side is set from the count
    /// now, so the next event is a real crossing — with the caller's own CPU counted as idle:
    /// the caller is the agent, about to sleep. (Counted busy, the agent's presence at start
    /// put the side below where exactly `low` CPUs were idle, and the LC's next fall was then
    /// held back as a flap until the periodic tick: measured, 846 crossings suppressed and no
    /// event in 6 s with one CPU of two busy.)
    pub fn set_thresholds(&self, low: i64, high: i64) {
        let high = high.max(low);
        self.set_control_word(control::LOW, low as u64);
        self.set_control_word(control::HIGH, high as u64);
        let below = self.idle_count_but_caller() < low;
        self.set_control_word(control::BELOW, u64::from(below));
        self.set_control_word(control::ENABLED, 1);
    }

    /// `(low, high)` as last set (`None` before [`IdleProgram::set_thresholds`]).
    pub fn thresholds(&self) -> Option<(i64, i64)> {
        (self.control_word(control::ENABLED) != 0).then(|| {
            (
                self.control_word(control::LOW) as i64,
                self.control_word(control::HIGH) as i64,
            )
        })
    }

    /// Whether the count is on the low side now (as the program last decided).
    pub fn below(&self) -> bool {
        self.control_word(control::BELOW) != 0
    }

    pub fn counters(&self) -> EventCounters {
        EventCounters {
            events: self.control_word(control::EVENTS),
            suppressed: self.control_word(control::SUPPRESSED),
            overruns: self.control_word(control::OVERRUNS),
        }
    }

    /// The ring buffer's reader.
    pub fn ring(&mut self) -> &mut RingReader {
        &mut self.ring
    }

    /// Cumulative idle ns of `cpu` up to `now_ns`, the ongoing idle period included.
    pub(super) fn idle_ns(&self, cpu: usize, now_ns: u64) -> u64 {
        let slot = [
            self.slot_word(cpu, slot::IDLE_NS),
            self.slot_word(cpu, slot::ENTERED_NS),
            self.slot_word(cpu, slot::IN_IDLE),
        ];
        slot_idle_ns(&slot, now_ns)
    }
}

/// Idle ns of one slot `{ idle_ns, entered_ns, in_idle }` as of `now_ns`.
pub(super) fn slot_idle_ns(slot: &[u64], now_ns: u64) -> u64 {
    let (idle, entered, in_idle) = (slot[0], slot[1], slot[2]);
    if in_idle != 0 {
        idle + now_ns.saturating_sub(entered)
    } else {
        idle
    }
}
