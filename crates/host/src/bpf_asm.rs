//! A small eBPF assembler, the one way the host writes BPF (the egress classifier, the idle
//! program, the latency sensor's programs): named registers, symbolic jump labels, helper
//! calls by name, map fd loads and the atomics — so a program reads top to bottom like the C
//! it replaces and can be changed without counting instructions. [`crate::bpf_sys`] loads what
//! it writes.
//!
//! Encodings come from rbpf's opcode constants ([`rbpf::ebpf`]); rbpf's own instruction
//! builder has no atomics, no map fd loads and no labels. The output is the kernel's
//! `struct bpf_insn` list ([`Insn`]); [`to_bytes`] gives rbpf's interpreter the same bytes,
//! which is how loop-free fragments (the latency program's bucket index) are tested without
//! a kernel.

use std::collections::HashMap;

use rbpf::ebpf;

use crate::bpf_sys::Insn;

/// A register. `R0` holds a helper's result and the program's return value; `R1`-`R5` a
/// helper's arguments (clobbered by the call); `R6`-`R9` survive calls; `FP` is the read-only
/// frame pointer (the stack grows down from it, 512 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reg(u8);

pub const R0: Reg = Reg(0);
pub const R1: Reg = Reg(1);
pub const R2: Reg = Reg(2);
pub const R3: Reg = Reg(3);
pub const R4: Reg = Reg(4);
pub const R5: Reg = Reg(5);
pub const R6: Reg = Reg(6);
pub const R7: Reg = Reg(7);
pub const R8: Reg = Reg(8);
pub const R9: Reg = Reg(9);
pub const FP: Reg = Reg(10);

/// The kernel helpers the host's programs call (`enum bpf_func_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Helper {
    /// `void *bpf_map_lookup_elem(map, key)`: NULL when absent.
    MapLookupElem = 1,
    /// `long bpf_map_update_elem(map, key, value, flags)`: 0, or -errno.
    MapUpdateElem = 2,
    /// `long bpf_map_delete_elem(map, key)`.
    MapDeleteElem = 3,
    /// `u64 bpf_ktime_get_ns()`: CLOCK_MONOTONIC.
    KtimeGetNs = 5,
    /// `long bpf_ringbuf_output(ringbuf, data, size, flags)`.
    RingbufOutput = 130,
}

/// `flags` of `bpf_map_update_elem`: create only (-EEXIST when present).
pub const BPF_NOEXIST: i32 = 1;

/// A memory access width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    U8,
    U16,
    U32,
    U64,
}

impl Size {
    fn bits(self) -> u8 {
        match self {
            Size::U8 => ebpf::BPF_B,
            Size::U16 => ebpf::BPF_H,
            Size::U32 => ebpf::BPF_W,
            Size::U64 => ebpf::BPF_DW,
        }
    }

    /// The width of a field of `bytes` bytes.
    pub fn of_bytes(bytes: usize) -> Option<Size> {
        match bytes {
            1 => Some(Size::U8),
            2 => Some(Size::U16),
            4 => Some(Size::U32),
            8 => Some(Size::U64),
            _ => None,
        }
    }
}

/// A jump condition: unsigned comparisons, `S`-prefixed signed ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    SGt,
    SGe,
    SLt,
    SLe,
}

impl Cond {
    fn op(self) -> u8 {
        match self {
            Cond::Eq => ebpf::BPF_JEQ,
            Cond::Ne => ebpf::BPF_JNE,
            Cond::Gt => ebpf::BPF_JGT,
            Cond::Ge => ebpf::BPF_JGE,
            Cond::Lt => ebpf::BPF_JLT,
            Cond::Le => ebpf::BPF_JLE,
            Cond::SGt => ebpf::BPF_JSGT,
            Cond::SGe => ebpf::BPF_JSGE,
            Cond::SLt => ebpf::BPF_JSLT,
            Cond::SLe => ebpf::BPF_JSLE,
        }
    }
}

/// A 64-bit arithmetic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alu {
    Add,
    Sub,
    Mul,
    Or,
    And,
    Xor,
    Lsh,
    Rsh,
    Mov,
}

impl Alu {
    fn op(self) -> u8 {
        match self {
            Alu::Add => ebpf::BPF_ADD,
            Alu::Sub => ebpf::BPF_SUB,
            Alu::Mul => ebpf::BPF_MUL,
            Alu::Or => ebpf::BPF_OR,
            Alu::And => ebpf::BPF_AND,
            Alu::Xor => ebpf::BPF_XOR,
            Alu::Lsh => ebpf::BPF_LSH,
            Alu::Rsh => ebpf::BPF_RSH,
            Alu::Mov => ebpf::BPF_MOV,
        }
    }
}

const BPF_PSEUDO_MAP_FD: u8 = 1;
/// `BPF_ATOMIC` modes (imm of an `STX | ATOMIC | DW` instruction).
const ATOMIC_ADD: i32 = 0x00;
const ATOMIC_FETCH: i32 = 0x01;
const ATOMIC_CMPXCHG: i32 = 0xf0 | ATOMIC_FETCH;

/// An instruction list with named jump targets, resolved by [`Asm::finish`].
#[derive(Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: HashMap<&'static str, usize>,
    jumps: Vec<(usize, &'static str)>,
}

impl Asm {
    pub fn new() -> Asm {
        Asm::default()
    }

    /// One instruction, encoded as given.
    pub fn raw(&mut self, code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> &mut Self {
        self.insns.push(Insn {
            code,
            regs: (src.0 << 4) | (dst.0 & 0x0f),
            off,
            imm,
        });
        self
    }

    /// Names the next instruction (a jump target).
    pub fn label(&mut self, name: &'static str) -> &mut Self {
        let previous = self.labels.insert(name, self.insns.len());
        assert!(previous.is_none(), "label {name} defined twice");
        self
    }

    /// `dst op= src` (64-bit).
    pub fn alu(&mut self, op: Alu, dst: Reg, src: Reg) -> &mut Self {
        self.raw(ebpf::BPF_ALU64 | ebpf::BPF_X | op.op(), dst, src, 0, 0)
    }

    /// `dst op= imm` (64-bit; imm sign-extended).
    pub fn alu_imm(&mut self, op: Alu, dst: Reg, imm: i32) -> &mut Self {
        self.raw(ebpf::BPF_ALU64 | ebpf::BPF_K | op.op(), dst, R0, 0, imm)
    }

    pub fn mov(&mut self, dst: Reg, src: Reg) -> &mut Self {
        self.alu(Alu::Mov, dst, src)
    }

    pub fn mov_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.alu_imm(Alu::Mov, dst, imm)
    }

    /// `wdst = imm`: the upper 32 bits cleared (not sign-extended).
    pub fn mov32_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.raw(ebpf::MOV32_IMM, dst, R0, 0, imm)
    }

    pub fn add(&mut self, dst: Reg, src: Reg) -> &mut Self {
        self.alu(Alu::Add, dst, src)
    }

    pub fn add_imm(&mut self, dst: Reg, imm: i32) -> &mut Self {
        self.alu_imm(Alu::Add, dst, imm)
    }

    pub fn sub(&mut self, dst: Reg, src: Reg) -> &mut Self {
        self.alu(Alu::Sub, dst, src)
    }

    /// `dst = *(size *)(base + off)`, zero-extended.
    pub fn load(&mut self, size: Size, dst: Reg, base: Reg, off: i16) -> &mut Self {
        self.raw(
            ebpf::BPF_LDX | ebpf::BPF_MEM | size.bits(),
            dst,
            base,
            off,
            0,
        )
    }

    /// `*(size *)(base + off) = src`.
    pub fn store(&mut self, size: Size, base: Reg, off: i16, src: Reg) -> &mut Self {
        self.raw(
            ebpf::BPF_STX | ebpf::BPF_MEM | size.bits(),
            base,
            src,
            off,
            0,
        )
    }

    /// `*(size *)(base + off) = imm`.
    pub fn store_imm(&mut self, size: Size, base: Reg, off: i16, imm: i32) -> &mut Self {
        self.raw(
            ebpf::BPF_ST | ebpf::BPF_MEM | size.bits(),
            base,
            R0,
            off,
            imm,
        )
    }

    /// `dst = map` (a two-slot `ld_imm64` the kernel resolves from the fd).
    pub fn load_map(&mut self, dst: Reg, fd: i32) -> &mut Self {
        self.raw(ebpf::LD_DW_IMM, dst, Reg(BPF_PSEUDO_MAP_FD), 0, fd)
            .raw(0, R0, R0, 0, 0)
    }

    /// `dst = imm` for a full 64-bit constant (two slots).
    pub fn load_imm64(&mut self, dst: Reg, imm: u64) -> &mut Self {
        self.raw(ebpf::LD_DW_IMM, dst, R0, 0, imm as u32 as i32)
            .raw(0, R0, R0, 0, (imm >> 32) as u32 as i32)
    }

    /// `r0 = helper(r1, ..., r5)`; r1-r5 are clobbered.
    pub fn call(&mut self, helper: Helper) -> &mut Self {
        self.raw(ebpf::CALL, R0, R0, 0, helper as i32)
    }

    /// `goto to`.
    pub fn goto(&mut self, to: &'static str) -> &mut Self {
        self.jumps.push((self.insns.len(), to));
        self.raw(ebpf::JA, R0, R0, 0, 0)
    }

    /// `if dst <cond> src goto to`.
    pub fn jump_if(&mut self, cond: Cond, dst: Reg, src: Reg, to: &'static str) -> &mut Self {
        self.jumps.push((self.insns.len(), to));
        self.raw(ebpf::BPF_JMP | ebpf::BPF_X | cond.op(), dst, src, 0, 0)
    }

    /// `if dst <cond> imm goto to`.
    pub fn jump_if_imm(&mut self, cond: Cond, dst: Reg, imm: i32, to: &'static str) -> &mut Self {
        self.jumps.push((self.insns.len(), to));
        self.raw(ebpf::BPF_JMP | ebpf::BPF_K | cond.op(), dst, R0, 0, imm)
    }

    /// `lock *(u64 *)(base + off) += src`.
    pub fn atomic_add(&mut self, base: Reg, off: i16, src: Reg) -> &mut Self {
        self.raw(ebpf::ST_DW_XADD, base, src, off, ATOMIC_ADD)
    }

    /// `src = atomic_fetch_add((u64 *)(base + off), src)`.
    pub fn atomic_fetch_add(&mut self, base: Reg, off: i16, src: Reg) -> &mut Self {
        self.raw(ebpf::ST_DW_XADD, base, src, off, ATOMIC_ADD | ATOMIC_FETCH)
    }

    /// `r0 = cmpxchg((u64 *)(base + off), r0, src)`: stores `src` where the word equals r0;
    /// r0 gets the word as it was.
    pub fn cmpxchg(&mut self, base: Reg, off: i16, src: Reg) -> &mut Self {
        self.raw(ebpf::ST_DW_XADD, base, src, off, ATOMIC_CMPXCHG)
    }

    /// `return r0`.
    pub fn exit(&mut self) -> &mut Self {
        self.raw(ebpf::EXIT, R0, R0, 0, 0)
    }

    /// The instructions, every jump resolved to its label (a programming error panics:
    /// an undefined label, or a target out of a jump's reach).
    pub fn finish(mut self) -> Vec<Insn> {
        for (at, to) in std::mem::take(&mut self.jumps) {
            let target = *self
                .labels
                .get(to)
                .unwrap_or_else(|| panic!("jump to undefined label {to}"));
            let off = target as isize - at as isize - 1;
            self.insns[at].off =
                i16::try_from(off).unwrap_or_else(|_| panic!("jump to {to} out of reach"));
        }
        self.insns
    }
}

/// The program as bytes (what rbpf's interpreter runs).
pub fn to_bytes(insns: &[Insn]) -> Vec<u8> {
    insns
        .iter()
        .flat_map(|i| {
            let mut b = [0u8; 8];
            b[0] = i.code;
            b[1] = i.regs;
            b[2..4].copy_from_slice(&i.off.to_le_bytes());
            b[4..8].copy_from_slice(&i.imm.to_le_bytes());
            b
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forward and a backward-free program: labels resolve to the instruction after them,
    /// and the interpreter runs what the builder wrote.
    #[test]
    fn labels_resolve_and_the_interpreter_agrees() {
        // r0 = r1 > 10 ? 2 * r1 : r1 + 1  (r1 = the memory's first u64)
        let mut a = Asm::new();
        a.load(Size::U64, R2, R1, 0)
            .jump_if_imm(Cond::Gt, R2, 10, "big")
            .mov(R0, R2)
            .add_imm(R0, 1)
            .goto("out")
            .label("big")
            .mov(R0, R2)
            .alu(Alu::Add, R0, R2)
            .label("out")
            .exit();
        let p = a.finish();
        assert_eq!(p[1].off, 3, "to `big`: skip three");
        assert_eq!(p[4].off, 2, "to `out`: skip two");
        let bytes = to_bytes(&p);
        let vm = rbpf::EbpfVmRaw::new(Some(&bytes)).unwrap();
        for (x, want) in [(3u64, 4u64), (10, 11), (11, 22)] {
            let mut mem = x.to_le_bytes();
            assert_eq!(vm.execute_program(&mut mem).unwrap(), want);
        }
    }

    #[test]
    fn map_loads_and_64_bit_constants_take_two_slots() {
        let mut a = Asm::new();
        a.load_map(R1, 7).load_imm64(R2, 0x1_0000_0002).exit();
        let p = a.finish();
        assert_eq!(p.len(), 5);
        assert_eq!((p[0].code, p[0].regs, p[0].imm), (ebpf::LD_DW_IMM, 0x11, 7));
        assert_eq!((p[1].code, p[1].imm), (0, 0));
        assert_eq!((p[2].imm, p[3].imm), (2, 1));
    }

    #[test]
    fn atomics_use_the_fetch_and_cmpxchg_encodings() {
        let mut a = Asm::new();
        a.atomic_add(R6, 8, R1)
            .atomic_fetch_add(R6, 8, R1)
            .cmpxchg(R6, 8, R2);
        let p = a.finish();
        let modes: Vec<(u8, i32)> = p.iter().map(|i| (i.code, i.imm)).collect();
        assert_eq!(
            modes,
            vec![
                (ebpf::ST_DW_XADD, 0x00),
                (ebpf::ST_DW_XADD, 0x01),
                (ebpf::ST_DW_XADD, 0xf1)
            ]
        );
        assert_eq!(p[2].regs, 0x26);
    }

    #[test]
    #[should_panic(expected = "undefined label nowhere")]
    fn an_undefined_label_is_refused() {
        let mut a = Asm::new();
        a.goto("nowhere");
        a.finish();
    }
}
