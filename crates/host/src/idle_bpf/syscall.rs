//! The `bpf(2)` commands the idle tracker uses beyond loading a program: map creation, test
//! runs, program ids and info, raw tracepoint links — their attribute layouts and errors.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::bpf::bpf;
use crate::error::{HostError, Result};

pub(super) const BPF_MAP_CREATE: libc::c_long = 0;
pub(super) const BPF_PROG_TEST_RUN: libc::c_long = 10;
pub(super) const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
pub(super) const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
pub(super) const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
pub(super) const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
pub(super) const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub(super) const BPF_MAP_TYPE_RINGBUF: u32 = 27;
/// The map can be mmap'ed: the reader sees every CPU's slot without a syscall.
pub(super) const BPF_F_MMAPABLE: u32 = 1 << 10;
pub(super) const BPF_F_TEST_RUN_ON_CPU: u32 = 1 << 0;
/// Ring buffer bytes: 2730 events of 32 bytes (header included).
pub(super) const RING_BYTES: usize = 64 * 1024;

#[repr(C)]
pub(super) struct MapCreateAttr {
    pub(super) map_type: u32,
    pub(super) key_size: u32,
    pub(super) value_size: u32,
    pub(super) max_entries: u32,
    pub(super) map_flags: u32,
    pub(super) inner_map_fd: u32,
    pub(super) numa_node: u32,
    pub(super) map_name: [u8; 16],
    pub(super) _tail: [u32; 16],
}

#[repr(C)]
pub(super) struct RawTracepointAttr {
    pub(super) name: u64,
    pub(super) prog_fd: u32,
    pub(super) _pad: u32,
    pub(super) cookie: u64,
    pub(super) _tail: [u64; 4],
}

#[repr(C)]
pub(super) struct TestRunAttr {
    pub(super) prog_fd: u32,
    pub(super) retval: u32,
    pub(super) data_size_in: u32,
    pub(super) data_size_out: u32,
    pub(super) data_in: u64,
    pub(super) data_out: u64,
    pub(super) repeat: u32,
    pub(super) duration: u32,
    pub(super) ctx_size_in: u32,
    pub(super) ctx_size_out: u32,
    pub(super) ctx_in: u64,
    pub(super) ctx_out: u64,
    pub(super) flags: u32,
    pub(super) cpu: u32,
    pub(super) batch_size: u32,
    pub(super) _tail: [u32; 7],
}

#[repr(C)]
pub(super) struct GetIdAttr {
    pub(super) id: u32,
    pub(super) next_id: u32,
    pub(super) open_flags: u32,
    pub(super) _tail: [u32; 5],
}

#[repr(C)]
pub(super) struct InfoAttr {
    pub(super) bpf_fd: u32,
    pub(super) info_len: u32,
    pub(super) info: u64,
    pub(super) _tail: [u64; 2],
}

pub(super) fn syscall_error(call: &'static str, target: &str, value: String) -> HostError {
    HostError::Syscall {
        call,
        target: target.to_owned(),
        value,
        source: io::Error::last_os_error(),
    }
}

pub(super) fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel returned a new file descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

pub(super) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
}

pub(super) fn create_map(
    map_type: u32,
    value_size: u32,
    max_entries: u32,
    flags: u32,
    name: &[u8],
) -> Result<OwnedFd> {
    let mut map_name = [0u8; 16];
    map_name[..name.len()].copy_from_slice(name);
    let mut attr = MapCreateAttr {
        map_type,
        key_size: if map_type == BPF_MAP_TYPE_RINGBUF {
            0
        } else {
            4
        },
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
