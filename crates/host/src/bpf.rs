//! Egress classification by cgroup with cgroup BPF: a four-instruction
//! `BPF_PROG_TYPE_CGROUP_SKB` program, attached to a cgroup v2 directory at
//! `BPF_CGROUP_INET_EGRESS`, sets `skb->priority` of every packet its sockets send. When that
//! priority is an HTB class id (`1:20` = 0x0001_0020) HTB puts the packet in that class without any
//! tc filter. It needs only a cgroup2 mount (even one without controllers, as on hybrid hosts),
//! works in every network namespace, and does not depend on `cls_cgroup` or `net_prio`.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::error::{HostError, IoOp, Result};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
const BPF_CGROUP_INET_EGRESS: u32 = 1;
const BPF_F_ALLOW_MULTI: u32 = 1 << 1;
/// `offsetof(struct __sk_buff, priority)`.
const SK_BUFF_PRIORITY: i16 = 32;

/// `struct bpf_insn`: opcode, dst (low nibble) and src (high nibble) registers, offset, immediate.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Insn {
    pub(crate) code: u8,
    pub(crate) regs: u8,
    pub(crate) off: i16,
    pub(crate) imm: i32,
}

/// The `BPF_PROG_LOAD` part of `union bpf_attr`, zero-padded (the kernel checks the tail).
#[repr(C)]
pub(crate) struct ProgLoadAttr {
    pub(crate) prog_type: u32,
    pub(crate) insn_cnt: u32,
    pub(crate) insns: u64,
    pub(crate) license: u64,
    pub(crate) log_level: u32,
    pub(crate) log_size: u32,
    pub(crate) log_buf: u64,
    pub(crate) kern_version: u32,
    pub(crate) prog_flags: u32,
    pub(crate) prog_name: [u8; 16],
    pub(crate) prog_ifindex: u32,
    pub(crate) expected_attach_type: u32,
    pub(crate) _tail: [u64; 8],
}

/// The `BPF_PROG_ATTACH` / `BPF_PROG_DETACH` part of `union bpf_attr`.
#[repr(C)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    _tail: [u32; 11],
}

fn program(priority: u32) -> [Insn; 4] {
    [
        // w2 = priority
        Insn {
            code: 0xb4,
            regs: 0x02,
            off: 0,
            imm: priority as i32,
        },
        // *(u32 *)(r1 + priority) = w2
        Insn {
            code: 0x63,
            regs: 0x21,
            off: SK_BUFF_PRIORITY,
            imm: 0,
        },
        // r0 = 1 (let the packet pass)
        Insn {
            code: 0xb7,
            regs: 0x00,
            off: 0,
            imm: 1,
        },
        // exit
        Insn {
            code: 0x95,
            regs: 0x00,
            off: 0,
            imm: 0,
        },
    ]
}

pub(crate) fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> libc::c_long {
    // SAFETY: attr is a properly initialised, zero-padded bpf_attr variant of the size passed;
    // the kernel reads (and for PROG_LOAD may write the log) only within it and the buffers it
    // points to, which outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T,
            std::mem::size_of::<T>() as u32,
        )
    }
}

/// Loads the priority-setting program; returns its fd.
pub fn load_egress_priority_program(priority: u32) -> Result<OwnedFd> {
    let insns = program(priority);
    let license = CString::new("GPL").unwrap_or_default();
    let mut log = vec![0u8; 4096];
    let mut name = [0u8; 16];
    name[..11].copy_from_slice(b"hr_egr_prio");
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_SKB,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
        prog_ifindex: 0,
        expected_attach_type: BPF_CGROUP_INET_EGRESS,
        _tail: [0; 8],
    };
    let fd = bpf(BPF_PROG_LOAD, &mut attr);
    if fd < 0 {
        let source = io::Error::last_os_error();
        let verifier =
            String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
                .into_owned();
        return Err(HostError::Syscall {
            call: "bpf(BPF_PROG_LOAD)",
            target: "cgroup_skb egress program".to_owned(),
            value: format!(
                "priority {priority:#x}{}",
                if verifier.is_empty() {
                    String::new()
                } else {
                    format!("; verifier: {verifier}")
                }
            ),
            source,
        });
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A program attached to a cgroup; detached on drop.
#[derive(Debug)]
pub struct EgressPriority {
    program: OwnedFd,
    cgroup: File,
    cgroup_dir: PathBuf,
    priority: u32,
}

impl EgressPriority {
    /// Attaches to `cgroup_dir` (a cgroup v2 directory): packets of sockets created by its
    /// members get `skb->priority = priority` (use `HtbConfig::be_classid()`, e.g. 0x0001_0020 for HTB 1:20).
    pub fn attach(cgroup_dir: &Path, priority: u32) -> Result<Self> {
        let cgroup =
            File::open(cgroup_dir).map_err(|e| HostError::io(IoOp::Open, cgroup_dir, None, e))?;
        let program = load_egress_priority_program(priority)?;
        let mut attr = AttachAttr {
            target_fd: cgroup.as_raw_fd() as u32,
            attach_bpf_fd: program.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_INET_EGRESS,
            attach_flags: BPF_F_ALLOW_MULTI,
            replace_bpf_fd: 0,
            _tail: [0; 11],
        };
        if bpf(BPF_PROG_ATTACH, &mut attr) < 0 {
            return Err(HostError::Syscall {
                call: "bpf(BPF_PROG_ATTACH)",
                target: cgroup_dir.display().to_string(),
                value: format!("egress priority {priority:#x}"),
                source: io::Error::last_os_error(),
            });
        }
        Ok(EgressPriority {
            program,
            cgroup,
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

    /// Detaches now (also done on drop).
    pub fn detach(self) -> Result<()> {
        self.detach_ref()
    }

    fn detach_ref(&self) -> Result<()> {
        let mut attr = AttachAttr {
            target_fd: self.cgroup.as_raw_fd() as u32,
            attach_bpf_fd: self.program.as_raw_fd() as u32,
            attach_type: BPF_CGROUP_INET_EGRESS,
            attach_flags: 0,
            replace_bpf_fd: 0,
            _tail: [0; 11],
        };
        if bpf(BPF_PROG_DETACH, &mut attr) < 0 {
            let source = io::Error::last_os_error();
            // The cgroup is already gone: nothing is attached any more.
            if source.raw_os_error() == Some(libc::ENOENT) {
                return Ok(());
            }
            return Err(HostError::Syscall {
                call: "bpf(BPF_PROG_DETACH)",
                target: self.cgroup_dir.display().to_string(),
                value: format!("egress priority {:#x}", self.priority),
                source,
            });
        }
        Ok(())
    }
}

impl Drop for EgressPriority {
    fn drop(&mut self) {
        if let Err(e) = self.detach_ref() {
            tracing::warn!("{e}");
        }
    }
}
