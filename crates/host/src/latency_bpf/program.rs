//! The latency sensor's three programs, written with the host's assembler ([`crate::bpf_asm`]).
//!
//! - **arrival** (`tcp:tcp_probe`, every segment processed by `tcp_rcv_established`): a segment
//!   with data (`data_len > 0`) on a socket whose local port (`sport`) is in the `ports` map
//!   is counted as a segment; when the socket has no request pending, its arrival time starts
//!   one (`pending[skaddr] = {now, snd_nxt}`, set with a compare-and-swap from 0, or created
//!   with `BPF_NOEXIST`; a full map counts a drop). Segments arriving while a request is
//!   pending and the socket has sent nothing since (`snd_nxt` unchanged: the rest of a large
//!   request, or pipelined requests) start nothing: a burst before one reply is one timed
//!   request, from its first byte. A segment arriving while a request is pending but after
//!   the socket *has* sent (`snd_nxt` moved) is the next request: the reply went out and its
//!   `sendmsg` has not returned yet — the segment was held in the socket's backlog while the
//!   sender owned the lock and is processed at its `release_sock`, before the reply event
//!   fires. It is queued (`pending.next`) and becomes the pending request when that reply
//!   event takes the current one.
//! - **reply** (`sock:sock_send_length`, every `sendmsg` that returned `ret > 0` bytes): on a
//!   socket with a pending request, takes the arrival time (compare-and-swap to the queued
//!   arrival, or 0, so the socket stays known), and adds `now − arrival` to the histogram; a
//!   send on a known socket with nothing pending is counted as unmatched (a reply written in
//!   several sends, or data the LC sends unasked).
//! - **close** (`sock:inet_sock_set_state` to `TCP_CLOSE`): forgets the socket (its address
//!   may be reused by another socket), counting a request still pending as abandoned.
//!
//! Field offsets come from the tracepoints' `format` files ([`Layout`]), read at load time.
//! The histogram is log-linear: 16 linear sub-buckets per power of two of nanoseconds (a
//! bucket is at most 1/16 = 6.25% wide, its midpoint within 3.2% of any value in it), the
//! index computed with a branch-per-bit `floor(log2)` (no loops).

use crate::bpf_asm::{
    Alu, Asm, Cond, Helper, Size, BPF_NOEXIST, FP, R0, R1, R2, R3, R4, R6, R7, R8, R9,
};
use crate::bpf_sys::Insn;

/// Byte offsets of the counters at the start of the stats map's one entry; the histogram's
/// buckets follow at [`stats::BUCKETS`].
pub mod stats {
    /// Timed requests started (an arrival with nothing pending on its socket).
    pub const REQUESTS: i16 = 0;
    /// Segments with data on the LC's ports (requests and their continuations).
    pub const SEGMENTS: i16 = 8;
    /// Requests timed (a reply matched an arrival): the histogram's sample count.
    pub const REPLIES: i16 = 16;
    /// Sends on an LC socket with no request pending.
    pub const UNMATCHED: i16 = 24;
    /// Arrivals not timed because the pending map was full.
    pub const MAP_FULL: i16 = 32;
    /// Sockets closed with a request pending (never answered).
    pub const ABANDONED: i16 = 40;
    /// Sum of the timed latencies, ns.
    pub const SUM_NS: i16 = 48;
    /// The first bucket (u64 counts).
    pub const BUCKETS: i16 = 64;
    /// Bytes of the entry.
    pub const SIZE: usize = BUCKETS as usize + super::NBUCKETS * 8;
}

/// Linear sub-buckets per power of two (2^4).
pub const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Values at or above 2^MAX_LOG2 ns (~18 min) land in the last bucket.
pub const MAX_LOG2: u32 = 40;
/// Buckets: values below 16 one each, then 16 per power of two up to 2^MAX_LOG2.
pub const NBUCKETS: usize = ((MAX_LOG2 - SUB_BITS + 1) * SUB as u32) as usize;

/// The bucket of `ns` (what the program computes).
pub fn bucket_of(ns: u64) -> usize {
    let v = ns.min((1u64 << MAX_LOG2) - 1);
    if v < SUB {
        return v as usize;
    }
    let k = 63 - v.leading_zeros();
    let sub = (v >> (k - SUB_BITS)) & (SUB - 1);
    ((k - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// The smallest value in bucket `i`, ns.
pub fn bucket_low(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB {
        return i;
    }
    let k = i / SUB + u64::from(SUB_BITS) - 1;
    let sub = i % SUB;
    (SUB + sub) << (k - u64::from(SUB_BITS))
}

/// The width of bucket `i`, ns.
pub fn bucket_width(i: usize) -> u64 {
    if (i as u64) < SUB {
        1
    } else {
        1 << (i as u64 / SUB - 1)
    }
}

/// Where the programs read their tracepoints' fields (byte offsets in the trace record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// `tcp:tcp_probe`: `sport` (u16, the socket's local port, host order), `data_len` (u16),
    /// `skaddr` (pointer), `snd_nxt` (u32: the next sequence number the socket will send).
    pub probe_sport: i16,
    pub probe_data_len: i16,
    pub probe_skaddr: i16,
    pub probe_snd_nxt: i16,
    /// `sock:sock_send_length`: `sk` (pointer), `ret` (int: bytes sent or -errno).
    pub send_sk: i16,
    pub send_ret: i16,
    /// `sock:inet_sock_set_state`: `skaddr` (pointer), `newstate` (int).
    pub state_skaddr: i16,
    pub state_newstate: i16,
}

impl Layout {
    /// The layout the behaviour tests feed through `BPF_PROG_TEST_RUN` (a raw-tracepoint
    /// context holds at most 12 u64 arguments, so the real offsets, up to 128, do not fit).
    pub const TEST: Layout = Layout {
        probe_sport: 0,
        probe_data_len: 2,
        probe_skaddr: 8,
        probe_snd_nxt: 48,
        send_sk: 16,
        send_ret: 24,
        state_skaddr: 32,
        state_newstate: 40,
    };
}

/// The map fds the programs refer to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MapFds {
    pub ports: i32,
    pub pending: i32,
    pub stats: i32,
}

/// `TCP_CLOSE` in `enum tcp_state`.
const TCP_CLOSE: i32 = 7;
const EEXIST: i32 = 17;

/// Stack slots (below the frame pointer).
const KEY_PORT: i16 = -4;
const KEY_ZERO: i16 = -8;
const KEY_SOCK: i16 = -16;
/// A new socket's [`pending`] entry is built here.
const VALUE: i16 = -16 - pending::SIZE as i16;

/// Byte offsets in a socket's entry of the pending map.
pub mod pending {
    /// The pending request's first arrival, ns (0: nothing pending).
    pub const ARRIVAL: i16 = 0;
    /// The socket's `snd_nxt` when that request arrived: when it has moved, the socket sent.
    pub const SND_NXT: i16 = 8;
    /// The next request's first arrival, queued behind a reply not yet seen (0: none).
    pub const NEXT: i16 = 16;
    /// `snd_nxt` when the queued request arrived.
    pub const NEXT_SND_NXT: i16 = 24;
    /// Bytes of the entry.
    pub const SIZE: usize = 32;
}

/// `dst = &stats[0]`, or `goto out` where the lookup fails (it never does for an array).
fn stats_entry(a: &mut Asm, maps: MapFds, dst: crate::bpf_asm::Reg) {
    a.store_imm(Size::U32, FP, KEY_ZERO, 0)
        .mov(R2, FP)
        .add_imm(R2, KEY_ZERO as i32)
        .load_map(R1, maps.stats)
        .call(Helper::MapLookupElem)
        .jump_if_imm(Cond::Eq, R0, 0, "out")
        .mov(dst, R0);
}

/// `*(u64 *)(base + off) += 1`, atomically.
fn count(a: &mut Asm, base: crate::bpf_asm::Reg, off: i16) {
    a.mov_imm(R1, 1).atomic_add(base, off, R1);
}

fn out(a: &mut Asm) {
    a.label("out").mov_imm(R0, 0).exit();
}

/// The arrival program (`tcp:tcp_probe`).
pub(crate) fn arrival(l: Layout, maps: MapFds) -> Vec<Insn> {
    // r6: ctx; r7: skaddr, then the entry; r8: stats; r9: now
    let mut a = Asm::new();
    a.mov(R6, R1)
        .load(Size::U16, R1, R6, l.probe_data_len)
        .jump_if_imm(Cond::Eq, R1, 0, "out") // an ACK: no data
        .load(Size::U16, R1, R6, l.probe_sport)
        .store(Size::U32, FP, KEY_PORT, R1)
        .mov(R2, FP)
        .add_imm(R2, KEY_PORT as i32)
        .load_map(R1, maps.ports)
        .call(Helper::MapLookupElem)
        .jump_if_imm(Cond::Eq, R0, 0, "out") // not the LC's port
        .load(Size::U64, R7, R6, l.probe_skaddr)
        .store(Size::U64, FP, KEY_SOCK, R7);
    stats_entry(&mut a, maps, R8);
    count(&mut a, R8, stats::SEGMENTS);
    a.call(Helper::KtimeGetNs)
        .mov(R9, R0)
        .mov(R2, FP)
        .add_imm(R2, KEY_SOCK as i32)
        .load_map(R1, maps.pending)
        .call(Helper::MapLookupElem)
        .jump_if_imm(Cond::Eq, R0, 0, "new");
    // a known socket: start a request unless one is pending (0 -> now)
    a.mov(R7, R0)
        .mov_imm(R0, 0)
        .cmpxchg(R7, pending::ARRIVAL, R9)
        .jump_if_imm(Cond::Ne, R0, 0, "pending")
        .load(Size::U32, R1, R6, l.probe_snd_nxt)
        .store(Size::U64, R7, pending::SND_NXT, R1)
        .goto("started");
    // one is pending: the same burst, unless the socket has sent since it arrived
    a.label("pending")
        .load(Size::U32, R1, R6, l.probe_snd_nxt)
        .load(Size::U64, R2, R7, pending::SND_NXT)
        .jump_if(Cond::Eq, R1, R2, "out")
        .store(Size::U64, R7, pending::NEXT_SND_NXT, R1)
        .mov_imm(R0, 0)
        .cmpxchg(R7, pending::NEXT, R9)
        .jump_if_imm(Cond::Ne, R0, 0, "out") // already queued: part of that burst
        .goto("started");
    // a new socket: pending[skaddr] = {now, snd_nxt}, unless another CPU created it first
    a.label("new")
        .store(Size::U64, FP, VALUE + pending::ARRIVAL, R9)
        .load(Size::U32, R1, R6, l.probe_snd_nxt)
        .store(Size::U64, FP, VALUE + pending::SND_NXT, R1)
        .store_imm(Size::U64, FP, VALUE + pending::NEXT, 0)
        .store_imm(Size::U64, FP, VALUE + pending::NEXT_SND_NXT, 0)
        .load_map(R1, maps.pending)
        .mov(R2, FP)
        .add_imm(R2, KEY_SOCK as i32)
        .mov(R3, FP)
        .add_imm(R3, VALUE as i32)
        .mov_imm(R4, BPF_NOEXIST)
        .call(Helper::MapUpdateElem)
        .jump_if_imm(Cond::Eq, R0, 0, "started")
        .jump_if_imm(Cond::Eq, R0, -EEXIST, "out");
    count(&mut a, R8, stats::MAP_FULL);
    a.goto("out").label("started");
    count(&mut a, R8, stats::REQUESTS);
    out(&mut a);
    a.finish()
}

/// `r2 = bucket_of(r0)` with no loop: clamp, then `k = floor(log2 v)` one bit-group at a time
/// (32, 16, 8, 4, 2, 1), then the sub-bucket. Clobbers r0, r3, r4.
pub(crate) fn bucket_index(a: &mut Asm) {
    const STEPS: [(i32, &str); 6] = [
        (32, "log2_32"),
        (16, "log2_16"),
        (8, "log2_8"),
        (4, "log2_4"),
        (2, "log2_2"),
        (1, "log2_1"),
    ];
    a.load_imm64(R3, (1u64 << MAX_LOG2) - 1)
        .jump_if(Cond::Le, R0, R3, "in_range")
        .mov(R0, R3)
        .label("in_range")
        .mov(R2, R0)
        .jump_if_imm(Cond::Lt, R0, SUB as i32, "bucketed") // below 16: one bucket each
        // r3 = k = floor(log2 v), r4 = v shifted down as bits are found
        .mov_imm(R3, 0)
        .mov(R4, R0);
    for (bits, skip) in STEPS {
        a.mov(R2, R4)
            .alu_imm(Alu::Rsh, R2, bits)
            .jump_if_imm(Cond::Eq, R2, 0, skip)
            .mov(R4, R2)
            .add_imm(R3, bits)
            .label(skip);
    }
    // sub = (v >> (k - 4)) & 15; index = (k - 3) * 16 + sub
    a.mov(R2, R3)
        .add_imm(R2, -(SUB_BITS as i32))
        .alu(Alu::Rsh, R0, R2)
        .alu_imm(Alu::And, R0, (SUB - 1) as i32)
        .mov(R2, R3)
        .add_imm(R2, -(SUB_BITS as i32) + 1)
        .alu_imm(Alu::Lsh, R2, SUB_BITS as i32)
        .add(R2, R0)
        // the verifier needs the bound spelled out
        .jump_if_imm(Cond::Le, R2, NBUCKETS as i32 - 1, "bucketed")
        .mov_imm(R2, NBUCKETS as i32 - 1)
        .label("bucketed");
}

/// The reply program (`sock:sock_send_length`).
pub(crate) fn reply(l: Layout, maps: MapFds) -> Vec<Insn> {
    // r6: ctx, then the pending entry; r7: arrival; r8: stats; r9: the queued arrival
    let mut a = Asm::new();
    a.mov(R6, R1)
        .load(Size::U32, R1, R6, l.send_ret)
        .jump_if_imm(Cond::Eq, R1, 0, "out")
        .load_imm64(R2, 0x7fff_ffff)
        .jump_if(Cond::Gt, R1, R2, "out") // ret < 0: an error, nothing sent
        .load(Size::U64, R1, R6, l.send_sk)
        .store(Size::U64, FP, KEY_SOCK, R1)
        .mov(R2, FP)
        .add_imm(R2, KEY_SOCK as i32)
        .load_map(R1, maps.pending)
        .call(Helper::MapLookupElem)
        .jump_if_imm(Cond::Eq, R0, 0, "out") // not an LC socket
        .mov(R6, R0);
    stats_entry(&mut a, maps, R8);
    // take the arrival (arrival -> the queued one, or 0): only one send answers a request
    a.load(Size::U64, R7, R6, pending::ARRIVAL)
        .jump_if_imm(Cond::Eq, R7, 0, "unmatched")
        .load(Size::U64, R9, R6, pending::NEXT)
        .mov(R0, R7)
        .cmpxchg(R6, pending::ARRIVAL, R9)
        .jump_if(Cond::Ne, R0, R7, "unmatched")
        .jump_if_imm(Cond::Eq, R9, 0, "now")
        // the queued request is now the pending one
        .load(Size::U64, R1, R6, pending::NEXT_SND_NXT)
        .store(Size::U64, R6, pending::SND_NXT, R1)
        .mov(R0, R9)
        .mov_imm(R1, 0)
        .cmpxchg(R6, pending::NEXT, R1)
        .label("now")
        .call(Helper::KtimeGetNs)
        .sub(R0, R7)
        .jump_if_imm(Cond::SGe, R0, 0, "timed")
        .mov_imm(R0, 0)
        .label("timed")
        .atomic_add(R8, stats::SUM_NS, R0);
    bucket_index(&mut a);
    a.alu_imm(Alu::Lsh, R2, 3)
        .mov(R1, R8)
        .add(R1, R2)
        .mov_imm(R3, 1)
        .atomic_add(R1, stats::BUCKETS, R3);
    count(&mut a, R8, stats::REPLIES);
    a.goto("out").label("unmatched");
    count(&mut a, R8, stats::UNMATCHED);
    out(&mut a);
    a.finish()
}

/// The close program (`sock:inet_sock_set_state`).
pub(crate) fn close(l: Layout, maps: MapFds) -> Vec<Insn> {
    // r6: ctx; r7: the pending arrival; r8: stats; r9: the queued arrival
    let mut a = Asm::new();
    a.mov(R6, R1)
        .load(Size::U32, R1, R6, l.state_newstate)
        .jump_if_imm(Cond::Ne, R1, TCP_CLOSE, "out")
        .load(Size::U64, R1, R6, l.state_skaddr)
        .store(Size::U64, FP, KEY_SOCK, R1)
        .mov(R2, FP)
        .add_imm(R2, KEY_SOCK as i32)
        .load_map(R1, maps.pending)
        .call(Helper::MapLookupElem)
        .jump_if_imm(Cond::Eq, R0, 0, "out") // not an LC socket
        .load(Size::U64, R7, R0, pending::ARRIVAL)
        .load(Size::U64, R9, R0, pending::NEXT)
        .mov(R2, FP)
        .add_imm(R2, KEY_SOCK as i32)
        .load_map(R1, maps.pending)
        .call(Helper::MapDeleteElem)
        .jump_if_imm(Cond::Eq, R7, 0, "out");
    stats_entry(&mut a, maps, R8);
    count(&mut a, R8, stats::ABANDONED);
    a.jump_if_imm(Cond::Eq, R9, 0, "out");
    count(&mut a, R8, stats::ABANDONED);
    out(&mut a);
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf_asm::to_bytes;
    use rbpf::ebpf;

    const MAPS: MapFds = MapFds {
        ports: 3,
        pending: 4,
        stats: 5,
    };

    /// The bucket index fragment, run in rbpf's interpreter on the value in memory, agrees
    /// with [`bucket_of`] everywhere that matters: every value below 4096, both sides of every
    /// power of two, and the clamp.
    #[test]
    fn the_programs_bucket_index_matches_the_reference() {
        let mut a = Asm::new();
        a.load(Size::U64, R0, R1, 0);
        bucket_index(&mut a);
        a.mov(R0, R2).exit();
        let bytes = to_bytes(&a.finish());
        let vm = rbpf::EbpfVmRaw::new(Some(&bytes)).unwrap();
        let mut values: Vec<u64> = (0..4096).collect();
        for k in 4..64 {
            let p = 1u64 << k;
            values.extend([p - 1, p, p + 1, p + p / 3]);
        }
        values.push(u64::MAX);
        for v in values {
            let mut mem = v.to_le_bytes();
            let got = vm.execute_program(&mut mem).unwrap();
            assert_eq!(got as usize, bucket_of(v), "value {v}");
        }
    }

    #[test]
    fn buckets_are_contiguous_and_at_most_a_sixteenth_wide() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(15), 15);
        assert_eq!(bucket_of(16), 16);
        assert_eq!(bucket_of(u64::MAX), NBUCKETS - 1);
        for i in 0..NBUCKETS {
            let low = bucket_low(i);
            assert_eq!(bucket_of(low), i, "bucket {i} low {low}");
            if i + 1 < NBUCKETS {
                assert_eq!(low + bucket_width(i), bucket_low(i + 1), "bucket {i}");
            }
            if low >= SUB {
                assert!(bucket_width(i) * SUB <= low, "bucket {i} too wide");
            }
        }
    }

    /// Every jump of each program lands forward, inside it; each ends `r0 = 0; exit`.
    #[test]
    fn jumps_land_inside_and_every_program_returns_zero() {
        for p in [
            arrival(Layout::TEST, MAPS),
            reply(Layout::TEST, MAPS),
            close(Layout::TEST, MAPS),
        ] {
            let exit = p.len() - 1;
            assert_eq!(p[exit].code, ebpf::EXIT);
            assert_eq!((p[exit - 1].code, p[exit - 1].imm), (ebpf::MOV64_IMM, 0));
            for (at, i) in p.iter().enumerate() {
                if i.code & 0x07 == ebpf::BPF_JMP && i.code != ebpf::CALL && i.code != ebpf::EXIT {
                    let target = at as isize + 1 + i.off as isize;
                    assert!(
                        target > at as isize && target < p.len() as isize,
                        "jump at {at}"
                    );
                }
            }
        }
    }

    /// The fields are read where the layout says, at their width.
    #[test]
    fn fields_are_read_at_the_layouts_offsets() {
        let l = Layout {
            probe_sport: 64,
            probe_data_len: 76,
            probe_skaddr: 128,
            probe_snd_nxt: 80,
            send_sk: 8,
            send_ret: 20,
            state_skaddr: 8,
            state_newstate: 20,
        };
        let ctx_loads = |p: &[Insn]| -> Vec<(u8, i16)> {
            p.iter()
                .filter(|i| i.code & 0x07 == ebpf::BPF_LDX && i.regs >> 4 == 6)
                .map(|i| (i.code, i.off))
                .take(4)
                .collect()
        };
        assert_eq!(
            ctx_loads(&arrival(l, MAPS)),
            vec![
                (ebpf::LD_H_REG, 76),
                (ebpf::LD_H_REG, 64),
                (ebpf::LD_DW_REG, 128),
                (ebpf::LD_W_REG, 80)
            ]
        );
        assert_eq!(
            ctx_loads(&reply(l, MAPS))[..2],
            [(ebpf::LD_W_REG, 20), (ebpf::LD_DW_REG, 8)]
        );
        assert_eq!(
            ctx_loads(&close(l, MAPS))[..2],
            [(ebpf::LD_W_REG, 20), (ebpf::LD_DW_REG, 8)]
        );
    }
}
