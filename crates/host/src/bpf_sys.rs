//! The `bpf(2)` system call, in one place for every loader (the egress classifier, the idle
//! tracker, the latency sensor): command numbers, program, map and attach types, the
//! `union bpf_attr` variants the host passes, the call itself, and one typed function per
//! command the host uses (load a program, create a map, read and write its elements, test-run a
//! program, look objects up by id, attach through a link). The loaders never see an attribute
//! struct; each failure names the command, what it was for and the errno.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{HostError, Result};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
#[cfg(test)]
const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_LINK_CREATE: libc::c_long = 28;

pub(crate) const BPF_PROG_TYPE_TRACEPOINT: u32 = 5;
pub(crate) const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
pub(crate) const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
pub(crate) const BPF_CGROUP_INET_EGRESS: u32 = 1;
pub(crate) const BPF_MAP_TYPE_HASH: u32 = 1;
pub(crate) const BPF_MAP_TYPE_ARRAY: u32 = 2;
pub(crate) const BPF_MAP_TYPE_RINGBUF: u32 = 27;
/// The map can be mmap'ed: the reader sees every CPU's slot without a syscall.
pub(crate) const BPF_F_MMAPABLE: u32 = 1 << 10;

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
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    _tail: [u64; 8],
}

/// The `BPF_LINK_CREATE` part of `union bpf_attr`.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    _tail: [u64; 8],
}

/// The `BPF_PROG_QUERY` part of `union bpf_attr`.
#[repr(C)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    _tail: [u64; 6],
}

#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
    _tail: [u64; 4],
}

#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    _tail: [u32; 16],
}

#[repr(C)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
    cookie: u64,
    _tail: [u64; 4],
}

#[repr(C)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _tail: [u32; 7],
}

#[repr(C)]
struct GetIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
    _tail: [u32; 5],
}

#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
    _tail: [u64; 2],
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

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> libc::c_long {
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
    Ok(owned(fd))
}

/// `bpf_map_lookup_elem`: the value at `key` into `value`; false when absent.
pub(crate) fn map_lookup<K: Copy, V: ?Sized>(map: &OwnedFd, key: &K, value: &mut V) -> bool {
    map_elem(
        BPF_MAP_LOOKUP_ELEM,
        map,
        key as *const K as *const u8,
        value as *mut V as *mut u8,
        0,
    ) == 0
}

/// `bpf_map_update_elem` (`flags` 0: create or replace).
pub(crate) fn map_update<K: Copy, V: Copy>(
    map: &OwnedFd,
    key: &K,
    value: &V,
    flags: u64,
) -> io::Result<()> {
    let rc = map_elem(
        BPF_MAP_UPDATE_ELEM,
        map,
        key as *const K as *const u8,
        value as *const V as *mut u8,
        flags,
    );
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `bpf_map_delete_elem`; false when the key was absent.
pub(crate) fn map_delete<K: Copy>(map: &OwnedFd, key: &K) -> bool {
    map_elem(
        BPF_MAP_DELETE_ELEM,
        map,
        key as *const K as *const u8,
        std::ptr::null_mut(),
        0,
    ) == 0
}

/// The key after `key` (`None`: the first), or `None` at the end.
pub(crate) fn map_next_key<K: Copy>(map: &OwnedFd, key: Option<&K>, next: &mut K) -> bool {
    let key = key.map_or(std::ptr::null(), |k| k as *const K as *const u8);
    map_elem(BPF_MAP_GET_NEXT_KEY, map, key, next as *mut K as *mut u8, 0) == 0
}

fn map_elem(cmd: libc::c_long, map: &OwnedFd, key: *const u8, value: *mut u8, flags: u64) -> i64 {
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

/// Runs `prog` once in the kernel on the context `ctx` (`BPF_PROG_TEST_RUN`): how the tests
/// run the real bytecode on made-up events. `what` names the program and the event for the
/// error.
pub(crate) fn test_run(prog: &OwnedFd, ctx: &[u64], what: (&str, String)) -> Result<()> {
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        retval: 0,
        data_size_in: 0,
        data_size_out: 0,
        data_in: 0,
        data_out: 0,
        repeat: 0,
        duration: 0,
        ctx_size_in: std::mem::size_of_val(ctx) as u32,
        ctx_size_out: 0,
        ctx_in: ctx.as_ptr() as u64,
        ctx_out: 0,
        flags: 0,
        cpu: 0,
        batch_size: 0,
        _tail: [0; 7],
    };
    if bpf(BPF_PROG_TEST_RUN, &mut attr) < 0 {
        return Err(syscall_error("bpf(BPF_PROG_TEST_RUN)", what.0, what.1));
    }
    Ok(())
}

/// The start of a program's or map's info (`bpf_prog_info` / `bpf_map_info`) into `info`.
pub(crate) fn object_info(fd: &OwnedFd, info: &mut [u8]) -> io::Result<()> {
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
        _tail: [0; 2],
    };
    if bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The kernel's id of a program or map (what `bpftool` lists): the second word of its info.
pub(crate) fn object_id(fd: &OwnedFd, what: &str) -> Result<u32> {
    let mut info = [0u8; 8]; // { u32 type, u32 id }
    object_info(fd, &mut info).map_err(|source| HostError::Syscall {
        call: "bpf(BPF_OBJ_GET_INFO_BY_FD)",
        target: what.to_owned(),
        value: String::new(),
        source,
    })?;
    Ok(u32::from_ne_bytes([info[4], info[5], info[6], info[7]]))
}

/// A command that returns a new fd (an object by id, a link).
fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = bpf(cmd, attr);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned(fd))
}

impl GetIdAttr {
    fn of(id: u32) -> GetIdAttr {
        GetIdAttr {
            id,
            next_id: 0,
            open_flags: 0,
            _tail: [0; 5],
        }
    }
}

fn get_fd_by_id(cmd: libc::c_long, id: u32) -> io::Result<OwnedFd> {
    bpf_fd(cmd, &mut GetIdAttr::of(id))
}

/// A loaded program by id (an fd of one's own on it).
#[cfg(test)]
pub(crate) fn program_by_id(id: u32) -> io::Result<OwnedFd> {
    get_fd_by_id(BPF_PROG_GET_FD_BY_ID, id)
}

/// The id of the next loaded program after `id` (0: the first), or `None` at the end.
#[cfg(test)]
pub(crate) fn next_program_id(id: u32) -> Option<u32> {
    let mut attr = GetIdAttr::of(id);
    (bpf(BPF_PROG_GET_NEXT_ID, &mut attr) == 0).then_some(attr.next_id)
}

/// Whether a program with this id is still loaded (anything holding it: an fd or a link).
pub fn program_loaded(id: u32) -> bool {
    match get_fd_by_id(BPF_PROG_GET_FD_BY_ID, id) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() != Some(libc::ENOENT),
    }
}

/// Whether a map with this id still exists.
pub fn map_exists(id: u32) -> bool {
    match get_fd_by_id(BPF_MAP_GET_FD_BY_ID, id) {
        Ok(_) => true,
        Err(e) => e.raw_os_error() != Some(libc::ENOENT),
    }
}

/// Attaches `prog` to the raw tracepoint of `system:event` (`BPF_RAW_TRACEPOINT_OPEN`, which
/// takes the event's name alone); the fd is the link: closing it detaches. `what` names the
/// program for the error.
pub(crate) fn raw_tracepoint_open(
    (system, event): (&str, &str),
    prog: &OwnedFd,
    what: &str,
) -> Result<OwnedFd> {
    let tp = CString::new(event).map_err(|_| HostError::Invalid {
        what: "raw tracepoint",
        value: event.to_owned(),
        reason: "holds a NUL byte".to_owned(),
    })?;
    let mut attr = RawTracepointAttr {
        name: tp.as_ptr() as u64,
        prog_fd: prog.as_raw_fd() as u32,
        _pad: 0,
        cookie: 0,
        _tail: [0; 4],
    };
    let fd = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr);
    if fd < 0 {
        return Err(syscall_error(
            "bpf(BPF_RAW_TRACEPOINT_OPEN)",
            &format!("{system}:{event}"),
            what.to_owned(),
        ));
    }
    Ok(owned(fd))
}

/// Attaches `prog` to `target` (a cgroup directory's fd) at `attach_type` through a link
/// (`BPF_LINK_CREATE`): detached when the link's last fd closes.
pub(crate) fn link_create(
    prog: &OwnedFd,
    target: &std::fs::File,
    attach_type: u32,
) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: target.as_raw_fd() as u32,
        attach_type,
        flags: 0,
        _tail: [0; 8],
    };
    bpf_fd(BPF_LINK_CREATE, &mut attr)
}

/// How many programs are attached to `target` (a cgroup directory's fd) at `attach_type`, by
/// any means (`BPF_PROG_QUERY`).
pub(crate) fn attached_count(target: &std::fs::File, attach_type: u32) -> io::Result<u32> {
    let mut attr = QueryAttr {
        target_fd: target.as_raw_fd() as u32,
        attach_type,
        query_flags: 0,
        attach_flags: 0,
        prog_ids: 0,
        prog_cnt: 0,
        _pad: 0,
        _tail: [0; 6],
    };
    if bpf(BPF_PROG_QUERY, &mut attr) < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr.prog_cnt)
}
