//! The `bpf(2)` system call, in one place for every loader (the egress classifier, the idle
//! tracker, the latency sensor): command numbers, program, map and attach types, the
//! `union bpf_attr` variants the host passes, the call itself, and loading a program and
//! creating a map on top.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{HostError, Result};

pub(crate) const BPF_MAP_CREATE: libc::c_long = 0;
pub(crate) const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
pub(crate) const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
pub(crate) const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
pub(crate) const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
pub(crate) const BPF_PROG_LOAD: libc::c_long = 5;
pub(crate) const BPF_PROG_TEST_RUN: libc::c_long = 10;
#[cfg(test)]
pub(crate) const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
pub(crate) const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
pub(crate) const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
pub(crate) const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
pub(crate) const BPF_PROG_QUERY: libc::c_long = 16;
pub(crate) const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
pub(crate) const BPF_LINK_CREATE: libc::c_long = 28;

pub(crate) const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;
pub(crate) const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
pub(crate) const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
pub(crate) const BPF_CGROUP_INET_EGRESS: u32 = 1;
pub(crate) const BPF_MAP_TYPE_HASH: u32 = 1;
pub(crate) const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub(crate) const BPF_MAP_TYPE_RINGBUF: u32 = 27;
/// The map can be mmap'ed: the reader sees every CPU's slot without a syscall.
pub(crate) const BPF_F_MMAPABLE: u32 = 1 << 10;
pub(crate) const BPF_F_TEST_RUN_ON_CPU: u32 = 1 << 0;

/// `struct bpf_insn`: opcode, dst (low nibble) and src (high nibble) registers, offset, immediate.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
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

/// The `BPF_LINK_CREATE` part of `union bpf_attr`.
#[repr(C)]
pub(crate) struct LinkCreateAttr {
    pub(crate) prog_fd: u32,
    pub(crate) target_fd: u32,
    pub(crate) attach_type: u32,
    pub(crate) flags: u32,
    pub(crate) _tail: [u64; 8],
}

/// The `BPF_PROG_QUERY` part of `union bpf_attr`.
#[repr(C)]
pub(crate) struct QueryAttr {
    pub(crate) target_fd: u32,
    pub(crate) attach_type: u32,
    pub(crate) query_flags: u32,
    pub(crate) attach_flags: u32,
    pub(crate) prog_ids: u64,
    pub(crate) prog_cnt: u32,
    pub(crate) _pad: u32,
    pub(crate) _tail: [u64; 6],
}

#[repr(C)]
pub(crate) struct MapElemAttr {
    pub(crate) map_fd: u32,
    pub(crate) _pad: u32,
    pub(crate) key: u64,
    pub(crate) value: u64,
    pub(crate) flags: u64,
    pub(crate) _tail: [u64; 4],
}

#[repr(C)]
pub(crate) struct MapCreateAttr {
    pub(crate) map_type: u32,
    pub(crate) key_size: u32,
    pub(crate) value_size: u32,
    pub(crate) max_entries: u32,
    pub(crate) map_flags: u32,
    pub(crate) inner_map_fd: u32,
    pub(crate) numa_node: u32,
    pub(crate) map_name: [u8; 16],
    pub(crate) _tail: [u32; 16],
}

#[repr(C)]
pub(crate) struct RawTracepointAttr {
    pub(crate) name: u64,
    pub(crate) prog_fd: u32,
    pub(crate) _pad: u32,
    pub(crate) cookie: u64,
    pub(crate) _tail: [u64; 4],
}

#[repr(C)]
pub(crate) struct TestRunAttr {
    pub(crate) prog_fd: u32,
    pub(crate) retval: u32,
    pub(crate) data_size_in: u32,
    pub(crate) data_size_out: u32,
    pub(crate) data_in: u64,
    pub(crate) data_out: u64,
    pub(crate) repeat: u32,
    pub(crate) duration: u32,
    pub(crate) ctx_size_in: u32,
    pub(crate) ctx_size_out: u32,
    pub(crate) ctx_in: u64,
    pub(crate) ctx_out: u64,
    pub(crate) flags: u32,
    pub(crate) cpu: u32,
    pub(crate) batch_size: u32,
    pub(crate) _tail: [u32; 7],
}

#[repr(C)]
pub(crate) struct GetIdAttr {
    pub(crate) id: u32,
    pub(crate) next_id: u32,
    pub(crate) open_flags: u32,
    pub(crate) _tail: [u32; 5],
}

#[repr(C)]
pub(crate) struct InfoAttr {
    pub(crate) bpf_fd: u32,
    pub(crate) info_len: u32,
    pub(crate) info: u64,
    pub(crate) _tail: [u64; 2],
}

pub(crate) fn syscall_error(call: &'static str, target: &str, value: String) -> HostError {
    HostError::Syscall {
        call,
        target: target.to_owned(),
        value,
        source: io::Error::last_os_error(),
    }
}

pub(crate) fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

pub(crate) fn create_map(
    map_type: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: &[u8],
) -> Result<OwnedFd> {
    let key_size = if map_type == BPF_MAP_TYPE_RINGBUF {
        0
    } else {
        4
    };
    create_keyed_map(map_type, key_size, value_size, max_entries, flags, name)
}

/// A map with keys of `key_size` bytes (a hash map keyed by a pointer: 8).
pub(crate) fn create_keyed_map(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: &[u8],
) -> Result<OwnedFd> {
    let mut map_name = [0u8; 16];
    map_name[..name.len()].copy_from_slice(name);
    let mut attr = MapCreateAttr {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_flags: flags,
        inner_map_fd: 0,
        numa_node: 0,
        map_name,
        _tail: [0; 16],
    };
    let fd = bpf(BPF_MAP_CREATE, &mut attr);
    if fd < 0 {
        return Err(syscall_error(
            "bpf(BPF_MAP_CREATE)",
            &String::from_utf8_lossy(name),
            format!("type {map_type}, {max_entries} x {value_size} bytes"),
        ));
    }
    Ok(owned(fd))
}

/// Whether a program with this id is still loaded (anything holding it: an fd or a link).
pub fn program_loaded(id: u32) -> bool {
    let mut attr = GetIdAttr {
        id,
        next_id: 0,
        open_flags: 0,
        _tail: [0; 5],
    };
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr);
    if fd < 0 {
        return io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT);
    }
    drop(owned(fd));
    true
}

/// Whether a map with this id still exists.
pub fn map_exists(id: u32) -> bool {
    let mut attr = GetIdAttr {
        id,
        next_id: 0,
        open_flags: 0,
        _tail: [0; 5],
    };
    let fd = bpf(BPF_MAP_GET_FD_BY_ID, &mut attr);
    if fd < 0 {
        return io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT);
    }
    drop(owned(fd));
    true
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

pub(crate) fn map_elem(
    cmd: libc::c_long,
    map: &OwnedFd,
    key: *const u8,
    value: *mut u8,
    flags: u64,
) -> i64 {
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: key as u64,
        value: value as u64,
        flags,
        _tail: [0; 4],
    };
    bpf(cmd, &mut attr) as i64
}

/// A program to hand to the verifier.
pub(crate) struct ProgramToLoad<'a> {
    pub prog_type: u32,
    pub expected_attach_type: u32,
    /// At most 15 bytes (the kernel's name field).
    pub name: &'a str,
    pub license: &'a str,
    pub insns: &'a [Insn],
    /// What it is, for the error (`cgroup_skb egress program`).
    pub target: &'a str,
    /// Its parameters, for the error (`priority 0x10020`).
    pub value: String,
}

/// Loads a program (`BPF_PROG_LOAD`); returns its fd. A refusal names the program, its
/// parameters and the verifier's last lines (they say why).
pub(crate) fn load_program(p: ProgramToLoad) -> Result<OwnedFd> {
    let license = CString::new(p.license).unwrap_or_default();
    let mut log = vec![0u8; 64 * 1024];
    let mut name = [0u8; 16];
    let n = p.name.len().min(15);
    name[..n].copy_from_slice(&p.name.as_bytes()[..n]);
    let mut attr = ProgLoadAttr {
        prog_type: p.prog_type,
        insn_cnt: p.insns.len() as u32,
        insns: p.insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
        prog_ifindex: 0,
        expected_attach_type: p.expected_attach_type,
        _tail: [0; 8],
    };
    let fd = bpf(BPF_PROG_LOAD, &mut attr);
    if fd < 0 {
        let source = io::Error::last_os_error();
        let verifier =
            String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
                .trim()
                .to_owned();
        let tail: Vec<&str> = verifier.lines().rev().take(6).collect();
        let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" / ");
        return Err(HostError::Syscall {
            call: "bpf(BPF_PROG_LOAD)",
            target: p.target.to_owned(),
            value: format!(
                "{} instructions, {}{}",
                p.insns.len(),
                p.value,
                if tail.is_empty() {
                    String::new()
                } else {
                    format!("; verifier: {tail}")
                }
            ),
            source,
        });
    }
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
