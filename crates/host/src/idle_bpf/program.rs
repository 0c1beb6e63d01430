//! The idle program, written out with rbpf's opcode names and symbolic labels.
//!
//! On every `power:cpu_idle` event (`args = { state, cpu_id }`, `state = PWR_EVENT_EXIT`
//! (`u32` -1) on leaving idle) it
//! 1. keeps this CPU's slot `{ idle_ns, entered_ns, in_idle, watched }` (cumulative idle time
//!    and whether the CPU is idle now; an entry while already idle or an exit whose entry was
//!    not seen changes nothing);
//! 2. when the CPU is watched, adds ±1 to the control block's idle count with an atomic
//!    fetch-add (CPUs enter and leave idle concurrently);
//! 3. compares the new count with the thresholds (hysteresis: `low <= high`): above → below when
//!    `count < low`, below → above when `count >= high`. The side flips with a compare-and-swap,
//!    so a crossing raised by two CPUs at once is reported once. Only a flip writes an event
//!    `{ ktime ns, count, cpu, direction }` to the ring buffer; a crossing of `low` that the
//!    hysteresis held back is counted as suppressed, and an event the ring buffer had no room
//!    for is counted as an overrun.
//!
//! rbpf's instruction builder has no atomics, no 64-bit immediate loads of map fds and no
//! labels, so the program is assembled here from rbpf's opcode constants ([`rbpf::ebpf`]) with
//! jump targets resolved by name — the listing reads top to bottom like the C it replaces.

use std::collections::HashMap;

use rbpf::ebpf;

use crate::bpf::Insn;

pub(super) const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
pub(super) const HELPER_KTIME_GET_NS: i32 = 5;
pub(super) const HELPER_RINGBUF_OUTPUT: i32 = 130;
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// `BPF_ATOMIC` modes (imm of an `STX | ATOMIC | DW` instruction).
const ATOMIC_ADD: i32 = 0x00;
const ATOMIC_FETCH: i32 = 0x01;
const ATOMIC_CMPXCHG: i32 = 0xf0 | ATOMIC_FETCH;

/// Byte offsets in a CPU's slot (array index = CPU).
pub mod slot {
    pub const IDLE_NS: i16 = 0;
    pub const ENTERED_NS: i16 = 8;
    pub const IN_IDLE: i16 = 16;
    pub const WATCHED: i16 = 24;
    pub const SIZE: usize = 32;
}

/// Byte offsets in the control block (the one entry of the control map). The agent writes
/// `low`, `high` and `enabled`; the program writes the rest.
pub mod control {
    /// Idle CPUs among the watched ones now (i64, atomic).
    pub const IDLE_COUNT: i16 = 0;
    /// Below → event when `count < low`.
    pub const LOW: i16 = 8;
    /// Below → above (event) when `count >= high`.
    pub const HIGH: i16 = 16;
    /// 1 while the count is on the low side.
    pub const BELOW: i16 = 24;
    /// Events written to the ring buffer.
    pub const EVENTS: i16 = 32;
    /// Crossings of `low` that the hysteresis held back (no event).
    pub const SUPPRESSED: i16 = 40;
    /// Events the ring buffer had no room for (the reader must re-read the count).
    pub const OVERRUNS: i16 = 48;
    /// 0: count, but raise no events (thresholds not set yet).
    pub const ENABLED: i16 = 56;
    pub const SIZE: usize = 64;
}

/// `direction` of an event.
pub const DIRECTION_LOW: u32 = 1;
pub const DIRECTION_HIGH: u32 = 2;
/// Bytes of one event: `{ u64 ktime_ns, i64 count, u32 cpu, u32 direction }`.
pub const EVENT_SIZE: usize = 24;

/// The map fds the program refers to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MapFds {
    pub slots: i32,
    pub control: i32,
    pub ring: i32,
}

/// An instruction list with named jump targets.
#[derive(Default)]
struct Asm {
    insns: Vec<Insn>,
    labels: HashMap<&'static str, usize>,
    jumps: Vec<(usize, &'static str)>,
}

impl Asm {
    fn raw(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) -> &mut Self {
        self.insns.push(Insn {
            code,
            regs: (src << 4) | (dst & 0x0f),
            off,
            imm,
        });
        self
    }
    fn label(&mut self, name: &'static str) -> &mut Self {
        let previous = self.labels.insert(name, self.insns.len());
        assert!(previous.is_none(), "label {name} defined twice");
        self
    }
    fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: &'static str) -> &mut Self {
        self.jumps.push((self.insns.len(), to));
        self.raw(code, dst, src, 0, imm)
    }
    fn mov(&mut self, dst: u8, src: u8) -> &mut Self {
        self.raw(ebpf::MOV64_REG, dst, src, 0, 0)
    }
    fn mov_imm(&mut self, dst: u8, imm: i32) -> &mut Self {
        self.raw(ebpf::MOV64_IMM, dst, 0, 0, imm)
    }
    fn add_imm(&mut self, dst: u8, imm: i32) -> &mut Self {
        self.raw(ebpf::ADD64_IMM, dst, 0, 0, imm)
    }
    fn load(&mut self, dst: u8, base: u8, off: i16) -> &mut Self {
        self.raw(ebpf::LD_DW_REG, dst, base, off, 0)
    }
    fn store(&mut self, base: u8, off: i16, src: u8) -> &mut Self {
        self.raw(ebpf::ST_DW_REG, base, src, off, 0)
    }
    fn store32(&mut self, base: u8, off: i16, src: u8) -> &mut Self {
        self.raw(ebpf::ST_W_REG, base, src, off, 0)
    }
    fn store_imm(&mut self, base: u8, off: i16, imm: i32) -> &mut Self {
        self.raw(ebpf::ST_DW_IMM, base, 0, off, imm)
    }
    /// `dst = map` (a two-slot `ld_imm64` the kernel resolves from the fd).
    fn load_map(&mut self, dst: u8, fd: i32) -> &mut Self {
        self.raw(ebpf::LD_DW_IMM, dst, BPF_PSEUDO_MAP_FD, 0, fd)
            .raw(0, 0, 0, 0, 0)
    }
    fn call(&mut self, helper: i32) -> &mut Self {
        self.raw(ebpf::CALL, 0, 0, 0, helper)
    }
    /// `lock *(u64 *)(base + off) += src`.
    fn atomic_add(&mut self, base: u8, off: i16, src: u8) -> &mut Self {
        self.raw(ebpf::ST_DW_XADD, base, src, off, ATOMIC_ADD)
    }
    /// `src = atomic_fetch_add((u64 *)(base + off), src)`.
    fn atomic_fetch_add(&mut self, base: u8, off: i16, src: u8) -> &mut Self {
        self.raw(ebpf::ST_DW_XADD, base, src, off, ATOMIC_ADD | ATOMIC_FETCH)
    }
    /// `r0 = cmpxchg((u64 *)(base + off), r0, src)`.
    fn cmpxchg(&mut self, base: u8, off: i16, src: u8) -> &mut Self {
        self.raw(ebpf::ST_DW_XADD, base, src, off, ATOMIC_CMPXCHG)
    }
    fn finish(mut self) -> Vec<Insn> {
        for (at, to) in std::mem::take(&mut self.jumps) {
            let target = *self
                .labels
                .get(to)
                .unwrap_or_else(|| panic!("jump to undefined label {to}"));
            self.insns[at].off = (target as isize - at as isize - 1) as i16;
        }
        self.insns
    }
}

/// The program for the given maps.
pub(crate) fn program(maps: MapFds) -> Vec<Insn> {
    use ebpf::{JA, JEQ_IMM, JEQ_REG, JNE_IMM, JNE_REG, JSGE_IMM, JSGE_REG, JSLT_IMM};
    // r6: ctx, then this CPU's slot, then the control block; r7: state, then the count's
    // delta; r8: cpu; r9: now.
    let mut a = Asm::default();
    a.mov(6, 1)
        .load(7, 6, 0) // state
        .load(8, 6, 8) // cpu_id
        .call(HELPER_KTIME_GET_NS)
        .mov(9, 0)
        // slot = slots[cpu]
        .store32(10, -4, 8)
        .mov(2, 10)
        .add_imm(2, -4)
        .load_map(1, maps.slots)
        .call(HELPER_MAP_LOOKUP_ELEM)
        .jump(JEQ_IMM, 0, 0, 0, "out")
        .mov(6, 0)
        .raw(ebpf::MOV32_IMM, 2, 0, 0, -1) // w2 = PWR_EVENT_EXIT, zero-extended like `state`
        .jump(JEQ_REG, 7, 2, 0, "leave");
    // entering idle (unless already in it)
    a.load(1, 6, slot::IN_IDLE)
        .jump(JNE_IMM, 1, 0, 0, "out")
        .store(6, slot::ENTERED_NS, 9)
        .store_imm(6, slot::IN_IDLE, 1)
        .mov_imm(7, 1)
        .jump(JA, 0, 0, 0, "count");
    // leaving idle (unless its entry was before the attach): idle_ns += now - entered_ns
    a.label("leave")
        .load(1, 6, slot::IN_IDLE)
        .jump(JEQ_IMM, 1, 0, 0, "out")
        .load(2, 6, slot::ENTERED_NS)
        .mov(3, 9)
        .raw(ebpf::SUB64_REG, 3, 2, 0, 0)
        .load(1, 6, slot::IDLE_NS)
        .raw(ebpf::ADD64_REG, 1, 3, 0, 0)
        .store(6, slot::IDLE_NS, 1)
        .store_imm(6, slot::IN_IDLE, 0)
        .mov_imm(7, -1);
    // the watched CPUs' idle count
    a.label("count")
        .load(1, 6, slot::WATCHED)
        .jump(JEQ_IMM, 1, 0, 0, "out")
        .raw(ebpf::ST_W_IMM, 10, 0, -4, 0)
        .mov(2, 10)
        .add_imm(2, -4)
        .load_map(1, maps.control)
        .call(HELPER_MAP_LOOKUP_ELEM)
        .jump(JEQ_IMM, 0, 0, 0, "out")
        .mov(6, 0)
        .mov(1, 7)
        .atomic_fetch_add(6, control::IDLE_COUNT, 1)
        .raw(ebpf::ADD64_REG, 1, 7, 0, 0) // r1 = the count after this event
        .load(3, 6, control::ENABLED)
        .jump(JEQ_IMM, 3, 0, 0, "out")
        .load(2, 6, control::BELOW)
        .jump(JNE_IMM, 2, 0, 0, "below");
    // above: fall below when count < low
    a.load(3, 6, control::LOW)
        .jump(JSGE_REG, 1, 3, 0, "out")
        .mov_imm(0, 0)
        .mov_imm(2, 1)
        .cmpxchg(6, control::BELOW, 2)
        .jump(JNE_IMM, 0, 0, 0, "out") // another CPU flipped it first
        .mov_imm(2, DIRECTION_LOW as i32)
        .jump(JA, 0, 0, 0, "emit");
    // below: rise when count >= high; a crossing of `low` short of `high` is suppressed
    a.label("below")
        .load(3, 6, control::HIGH)
        .jump(JSGE_REG, 1, 3, 0, "rise")
        .load(3, 6, control::LOW)
        .jump(JSLT_IMM, 7, 0, 0, "fell")
        .jump(JNE_REG, 1, 3, 0, "out") // rose to exactly `low`?
        .jump(JA, 0, 0, 0, "suppressed")
        .label("fell")
        .add_imm(3, -1)
        .jump(JNE_REG, 1, 3, 0, "out") // fell to exactly `low - 1`?
        .label("suppressed")
        .mov_imm(2, 1)
        .atomic_add(6, control::SUPPRESSED, 2)
        .jump(JA, 0, 0, 0, "out")
        .label("rise")
        .mov_imm(0, 1)
        .mov_imm(2, 0)
        .cmpxchg(6, control::BELOW, 2)
        .jump(JNE_IMM, 0, 0, 1, "out")
        .mov_imm(2, DIRECTION_HIGH as i32);
    // emit { now, count, cpu, direction } (r1 = count, r2 = direction)
    a.label("emit")
        .store(10, -32, 9)
        .store(10, -24, 1)
        .store32(10, -16, 8)
        .store32(10, -12, 2)
        .load_map(1, maps.ring)
        .mov(2, 10)
        .add_imm(2, -32)
        .mov_imm(3, EVENT_SIZE as i32)
        .mov_imm(4, 0)
        .call(HELPER_RINGBUF_OUTPUT)
        .mov_imm(2, 1)
        .jump(JSGE_IMM, 0, 0, 0, "sent")
        .atomic_add(6, control::OVERRUNS, 2)
        .jump(JA, 0, 0, 0, "out")
        .label("sent")
        .atomic_add(6, control::EVENTS, 2)
        .label("out")
        .mov_imm(0, 0)
        .raw(ebpf::EXIT, 0, 0, 0, 0);
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: MapFds = MapFds {
        slots: 3,
        control: 4,
        ring: 5,
    };

    /// Every jump lands inside the program, on the instruction its label names.
    #[test]
    fn jumps_land_on_their_labels() {
        let p = program(MAPS);
        let exit = p.len() - 1;
        assert_eq!(p[exit].code, ebpf::EXIT);
        assert_eq!((p[exit - 1].code, p[exit - 1].imm), (ebpf::MOV64_IMM, 0));
        for (at, i) in p.iter().enumerate() {
            if i.code & 0x07 == ebpf::BPF_JMP && i.code != ebpf::CALL && i.code != ebpf::EXIT {
                let target = at as isize + 1 + i.off as isize;
                assert!(
                    (0..p.len() as isize).contains(&target) && target > at as isize,
                    "jump at {at} to {target}: out of the program or backwards"
                );
            }
        }
        // the first lookup's failure goes to `out` (r0 = 0; exit)
        let first_jeq = p.iter().position(|i| i.code == ebpf::JEQ_IMM).unwrap();
        assert_eq!(
            first_jeq as isize + 1 + p[first_jeq].off as isize,
            exit as isize - 1
        );
    }

    /// Each map is loaded through a pseudo-map-fd `ld_imm64` with an empty second slot.
    #[test]
    fn maps_are_referenced_by_fd() {
        let p = program(MAPS);
        let loads: Vec<(usize, i32)> = p
            .iter()
            .enumerate()
            .filter(|(_, i)| i.code == ebpf::LD_DW_IMM)
            .map(|(n, i)| {
                assert_eq!(i.regs >> 4, BPF_PSEUDO_MAP_FD);
                assert_eq!(
                    p[n + 1],
                    Insn {
                        code: 0,
                        regs: 0,
                        off: 0,
                        imm: 0
                    }
                );
                (n, i.imm)
            })
            .collect();
        let fds: Vec<i32> = loads.iter().map(|(_, fd)| *fd).collect();
        assert_eq!(fds, vec![3, 4, 5]);
    }

    #[test]
    fn atomics_use_the_fetch_and_cmpxchg_encodings() {
        let p = program(MAPS);
        let atomics: Vec<i32> = p
            .iter()
            .filter(|i| i.code == ebpf::ST_DW_XADD)
            .map(|i| i.imm)
            .collect();
        // fetch-add of the count, two compare-and-swaps of the side, three counters
        assert_eq!(atomics.iter().filter(|&&m| m == 0x01).count(), 1);
        assert_eq!(atomics.iter().filter(|&&m| m == 0xf1).count(), 2);
        assert_eq!(atomics.iter().filter(|&&m| m == 0x00).count(), 3);
    }
}
