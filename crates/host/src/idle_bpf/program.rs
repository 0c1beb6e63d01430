//! The idle program (one `power:cpu_idle` tracepoint program), built with the host's assembler.
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
//! Written with the host's assembler ([`crate::bpf_asm`]): named registers, jump targets by
//! name — the listing reads top to bottom like the C it replaces.

use crate::bpf_asm::{Asm, Cond, Helper, Size, FP, R0, R1, R2, R3, R4, R6, R7, R8, R9};
use crate::bpf_sys::Insn;

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

/// The program for the given maps.
pub(crate) fn program(maps: MapFds) -> Vec<Insn> {
    use Size::{U32, U64};
    // r6: ctx, then this CPU's slot, then the control block; r7: state, then the count's
    // delta; r8: cpu; r9: now.
    let mut a = Asm::new();
    a.mov(R6, R1)
        .load(U64, R7, R6, 0) // state
        .load(U64, R8, R6, 8) // cpu_id
        .call(Helper::KtimeGetNs)
        .mov(R9, R0)
        // slot = slots[cpu]
        .store(U32, FP, -4, R8)
        .mov(R2, FP)
        .add_imm(R2, -4)
        .load_map(R1, maps.slots)
        .call(Helper::MapLookupElem)
        .jump_if_imm(Cond::Eq, R0, 0, "out")
        .mov(R6, R0)
        .mov32_imm(R2, -1) // w2 = PWR_EVENT_EXIT, zero-extended like `state`
        .jump_if(Cond::Eq, R7, R2, "leave");
    // entering idle (unless already in it)
    a.load(U64, R1, R6, slot::IN_IDLE)
        .jump_if_imm(Cond::Ne, R1, 0, "out")
        .store(U64, R6, slot::ENTERED_NS, R9)
        .store_imm(U64, R6, slot::IN_IDLE, 1)
        .mov_imm(R7, 1)
        .goto("count");
    // leaving idle (unless its entry was before the attach): idle_ns += now - entered_ns
    a.label("leave")
        .load(U64, R1, R6, slot::IN_IDLE)
        .jump_if_imm(Cond::Eq, R1, 0, "out")
        .load(U64, R2, R6, slot::ENTERED_NS)
        .mov(R3, R9)
        .sub(R3, R2)
        .load(U64, R1, R6, slot::IDLE_NS)
        .add(R1, R3)
        .store(U64, R6, slot::IDLE_NS, R1)
        .store_imm(U64, R6, slot::IN_IDLE, 0)
        .mov_imm(R7, -1);
    // the watched CPUs' idle count
    a.label("count")
        .load(U64, R1, R6, slot::WATCHED)
        .jump_if_imm(Cond::Eq, R1, 0, "out")
        .store_imm(U32, FP, -4, 0)
        .mov(R2, FP)
        .add_imm(R2, -4)
        .load_map(R1, maps.control)
        .call(Helper::MapLookupElem)
        .jump_if_imm(Cond::Eq, R0, 0, "out")
        .mov(R6, R0)
        .mov(R1, R7)
        .atomic_fetch_add(R6, control::IDLE_COUNT, R1)
        .add(R1, R7) // r1 = the count after this event
        .load(U64, R3, R6, control::ENABLED)
        .jump_if_imm(Cond::Eq, R3, 0, "out")
        .load(U64, R2, R6, control::BELOW)
        .jump_if_imm(Cond::Ne, R2, 0, "below");
    // above: fall below when count < low
    a.load(U64, R3, R6, control::LOW)
        .jump_if(Cond::SGe, R1, R3, "out")
        .mov_imm(R0, 0)
        .mov_imm(R2, 1)
        .cmpxchg(R6, control::BELOW, R2)
        .jump_if_imm(Cond::Ne, R0, 0, "out") // another CPU flipped it first
        .mov_imm(R2, DIRECTION_LOW as i32)
        .goto("emit");
    // below: rise when count >= high; a crossing of `low` short of `high` is suppressed
    a.label("below")
        .load(U64, R3, R6, control::HIGH)
        .jump_if(Cond::SGe, R1, R3, "rise")
        .load(U64, R3, R6, control::LOW)
        .jump_if_imm(Cond::SLt, R7, 0, "fell")
        .jump_if(Cond::Ne, R1, R3, "out") // rose to exactly `low`?
        .goto("suppressed")
        .label("fell")
        .add_imm(R3, -1)
        .jump_if(Cond::Ne, R1, R3, "out") // fell to exactly `low - 1`?
        .label("suppressed")
        .mov_imm(R2, 1)
        .atomic_add(R6, control::SUPPRESSED, R2)
        .goto("out")
        .label("rise")
        .mov_imm(R0, 1)
        .mov_imm(R2, 0)
        .cmpxchg(R6, control::BELOW, R2)
        .jump_if_imm(Cond::Ne, R0, 1, "out")
        .mov_imm(R2, DIRECTION_HIGH as i32);
    // emit { now, count, cpu, direction } (r1 = count, r2 = direction)
    a.label("emit")
        .store(U64, FP, -32, R9)
        .store(U64, FP, -24, R1)
        .store(U32, FP, -16, R8)
        .store(U32, FP, -12, R2)
        .load_map(R1, maps.ring)
        .mov(R2, FP)
        .add_imm(R2, -32)
        .mov_imm(R3, EVENT_SIZE as i32)
        .mov_imm(R4, 0)
        .call(Helper::RingbufOutput)
        .mov_imm(R2, 1)
        .jump_if_imm(Cond::SGe, R0, 0, "sent")
        .atomic_add(R6, control::OVERRUNS, R2)
        .goto("out")
        .label("sent")
        .atomic_add(R6, control::EVENTS, R2)
        .label("out")
        .mov_imm(R0, 0)
        .exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rbpf::ebpf;

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
                assert_eq!(i.regs >> 4, 1, "BPF_PSEUDO_MAP_FD");
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
