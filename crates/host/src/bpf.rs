//! Egress classification by cgroup with cgroup BPF: a four-instruction
//! `BPF_PROG_TYPE_CGROUP_SKB` program, attached to a cgroup v2 directory at
//! `BPF_CGROUP_INET_EGRESS`, sets `skb->priority` of every packet its sockets send. When that
//! priority is an HTB class id (`1:20` = 0x0001_0020) HTB puts the packet in that class without any
//! tc filter. It needs only a cgroup2 mount (even one without controllers, as on hybrid hosts),
//! works in every network namespace, and does not depend on `cls_cgroup` or `net_prio`.
//!
//! The program is written with the host's assembler ([`crate::bpf_asm`], as the idle and
//! latency programs are; the tests run it in rbpf's interpreter), loaded and attached through
//! [`crate::bpf_sys`], by a `bpf_link` (`BPF_LINK_CREATE`): the kernel detaches it when the
//! last fd of the link closes — when the agent exits or is killed — so a SIGKILLed agent leaves
//! nothing attached and restarts never stack programs.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::bpf_asm::{Asm, Size, R0, R1, R2};
use crate::bpf_sys::{
    attached_count, link_create, load_program, Insn, ProgramToLoad, BPF_CGROUP_INET_EGRESS,
    BPF_PROG_TYPE_CGROUP_SKB,
};
use crate::error::{HostError, IoOp, Result};

/// `offsetof(struct __sk_buff, priority)`.
const SK_BUFF_PRIORITY: i16 = 32;

/// The program: `skb->priority = priority; return 1` (let the packet pass).
pub fn egress_priority_program(priority: u32) -> Vec<Insn> {
    let mut a = Asm::new();
    a.mov32_imm(R2, priority as i32) // w2 = priority
        .store(Size::U32, R1, SK_BUFF_PRIORITY, R2) // ((struct __sk_buff *)r1)->priority = w2
        .mov_imm(R0, 1)
        .exit();
    a.finish()
}

/// Loads the priority-setting program; returns its fd.
pub fn load_egress_priority_program(priority: u32) -> Result<OwnedFd> {
    load_program(ProgramToLoad {
        prog_type: BPF_PROG_TYPE_CGROUP_SKB,
        expected_attach_type: BPF_CGROUP_INET_EGRESS,
        name: "hr_egr_prio",
        license: "GPL",
        insns: &egress_priority_program(priority),
        target: "cgroup_skb egress program",
        value: format!("priority {priority:#x}"),
    })
}

/// A program attached to a cgroup through a link: detached when this is dropped, and by the
/// kernel when the process dies.
#[derive(Debug)]
pub struct EgressPriority {
    link: OwnedFd,
    _program: OwnedFd,
    cgroup_dir: PathBuf,
    priority: u32,
}

impl EgressPriority {
    /// Attaches to `cgroup_dir` (a cgroup v2 directory): packets of sockets created by its
    /// members get `skb->priority = priority` (use `HtbConfig::be_classid()`, e.g. 0x0001_0020
    /// for HTB 1:20).
    pub fn attach(cgroup_dir: &Path, priority: u32) -> Result<Self> {
        let cgroup =
            File::open(cgroup_dir).map_err(|e| HostError::io(IoOp::Open, cgroup_dir, None, e))?;
        let program = load_egress_priority_program(priority)?;
        let link = link_create(&program, &cgroup, BPF_CGROUP_INET_EGRESS).map_err(|source| {
            HostError::Syscall {
                call: "bpf(BPF_LINK_CREATE)",
                target: cgroup_dir.display().to_string(),
                value: format!("egress priority {priority:#x}"),
                source,
            }
        })?;
        Ok(EgressPriority {
            link,
            _program: program,
            cgroup_dir: cgroup_dir.to_path_buf(),
            priority,
        })
    }

    pub fn cgroup_dir(&self) -> &Path {
        &self.cgroup_dir
    }

    pub fn priority(&self) -> u32 {
        self.priority
    }

    /// The link's fd (`/proc/<pid>/fdinfo` shows its `link_id` and `prog_id`).
    pub fn link_fd(&self) -> i32 {
        self.link.as_raw_fd()
    }

    /// Detaches now (closing the link; also done on drop and by the kernel at exit).
    pub fn detach(self) -> Result<()> {
        drop(self);
        Ok(())
    }
}

/// How many programs are attached at `BPF_CGROUP_INET_EGRESS` of the cgroup v2 directory
/// `cgroup_dir` (what `bpftool cgroup show` lists), by any means.
pub fn attached_egress_programs(cgroup_dir: &Path) -> Result<u32> {
    let cgroup =
        File::open(cgroup_dir).map_err(|e| HostError::io(IoOp::Open, cgroup_dir, None, e))?;
    attached_count(&cgroup, BPF_CGROUP_INET_EGRESS).map_err(|source| HostError::Syscall {
        call: "bpf(BPF_PROG_QUERY)",
        target: cgroup_dir.display().to_string(),
        value: "cgroup_inet_egress".into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The assembler writes the four instructions the kernel verified before (the same bytes
    /// rbpf's builder wrote).
    #[test]
    fn the_builder_emits_the_verified_instructions() {
        let p = egress_priority_program(0x0001_0020);
        assert_eq!(p.len(), 4);
        assert_eq!((p[0].code, p[0].regs, p[0].imm), (0xb4, 0x02, 0x0001_0020));
        assert_eq!(
            (p[1].code, p[1].regs, p[1].off),
            (0x63, 0x21, SK_BUFF_PRIORITY)
        );
        assert_eq!((p[2].code, p[2].regs, p[2].imm), (0xb7, 0x00, 1));
        assert_eq!(p[3].code, 0x95);
    }

    /// Behaviour in rbpf's interpreter: the priority lands at `__sk_buff.priority` and
    /// nothing else of the buffer changes; the packet passes (1).
    #[test]
    fn in_the_vm_the_program_sets_the_priority_and_passes_the_packet() {
        let bytes = crate::bpf_asm::to_bytes(&egress_priority_program(0x0001_0020));
        let vm = rbpf::EbpfVmRaw::new(Some(&bytes)).unwrap();
        let mut skb = [0xaau8; 64];
        let ret = vm.execute_program(&mut skb).unwrap();
        assert_eq!(ret, 1);
        let off = SK_BUFF_PRIORITY as usize;
        assert_eq!(
            u32::from_le_bytes(skb[off..off + 4].try_into().unwrap()),
            0x0001_0020
        );
        assert!(skb[..off].iter().chain(&skb[off + 4..]).all(|&b| b == 0xaa));
    }
}
