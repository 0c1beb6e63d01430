//! The `bpf(2)` commands the idle tracker uses beyond loading a program: map creation, test
//! runs, program ids and info, raw tracepoint links — their attribute layouts and errors.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::bpf::bpf;
use crate::error::{HostError, Result};

pub(crate) const BPF_MAP_CREATE: libc::c_long = 0;
pub(crate) const BPF_PROG_TEST_RUN: libc::c_long = 10;
pub(crate) const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
pub(crate) const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
pub(crate) const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
pub(crate) const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
pub(crate) const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub(crate) const BPF_MAP_TYPE_RINGBUF: u32 = 27;
/// The map can be mmap'ed: the reader sees every CPU's slot without a syscall.
pub(crate) const BPF_F_MMAPABLE: u32 = 1 << 10;
pub(crate) const BPF_F_TEST_RUN_ON_CPU: u32 = 1 << 0;
/// Ring buffer bytes: 2730 events of 32 bytes (header included).
pub(crate) const RING_BYTES: usize = 64 * 1024;

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

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize
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
