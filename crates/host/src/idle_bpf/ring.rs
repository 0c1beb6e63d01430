//! The consumer side of a BPF ring buffer (`BPF_MAP_TYPE_RINGBUF`), woken through epoll.
//!
//! Layout (kernel/bpf/ringbuf.c): page 0 holds the consumer position (written by us), page 1
//! the producer position, then the data area mapped twice in a row so a record that wraps
//! reads contiguously. Each record starts with an 8-byte header `{ u32 len, u32 pg_off }`
//! whose `len` carries a BUSY bit while the producer writes it and a DISCARD bit when dropped.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::program::{DIRECTION_HIGH, DIRECTION_LOW, EVENT_SIZE};

const BUSY_BIT: u32 = 1 << 31;
const DISCARD_BIT: u32 = 1 << 30;
const HEADER: usize = 8;

/// Which way the watched CPUs' idle count crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Fell below the low threshold (LC needs CPUs: shrink BE).
    Low,
    /// Rose to the high threshold (room for BE).
    High,
}

/// One threshold crossing, as the kernel saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleEvent {
    /// `bpf_ktime_get_ns()` at the crossing: CLOCK_MONOTONIC ns.
    pub ktime_ns: u64,
    /// The watched CPUs' idle count just after the crossing.
    pub idle_count: i64,
    /// The CPU whose idle entry/exit made the crossing.
    pub cpu: u32,
    pub direction: Direction,
}

impl IdleEvent {
    /// Decodes the program's 24-byte record; `None` for a direction it never writes.
    pub fn decode(b: &[u8]) -> Option<IdleEvent> {
        if b.len() < EVENT_SIZE {
            return None;
        }
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
        let direction = match u32_at(20) {
            DIRECTION_LOW => Direction::Low,
            DIRECTION_HIGH => Direction::High,
            _ => return None,
        };
        Some(IdleEvent {
            ktime_ns: u64_at(0),
            idle_count: u64_at(8) as i64,
            cpu: u32_at(16),
            direction,
        })
    }
}

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
pub(super) struct Mapping {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

impl Mapping {
    /// Maps `len` bytes of `fd` at `offset`, writable when `write`.
    pub(super) fn new(fd: &OwnedFd, len: usize, offset: usize, write: bool) -> io::Result<Mapping> {
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of a map fd; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr as *mut u8,
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

// SAFETY: the mapping is plain shared memory accessed with volatile/atomic operations only.
unsafe impl Send for Mapping {}

/// The epoll token of a fd added with [`RingReader::watch`] (the ring buffer's is 0).
const WATCHED_TOKEN: u64 = 1;

/// What woke a [`RingReader::wait_any`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ready {
    /// Records wait in the ring buffer.
    pub ring: bool,
    /// The fd added with [`RingReader::watch`] is readable.
    pub watched: bool,
}

/// The reader of the idle program's ring buffer.
#[derive(Debug)]
pub struct RingReader {
    consumer: Mapping,
    producer: Mapping,
    page: usize,
    mask: u64,
    epoll: OwnedFd,
}

impl RingReader {
    /// Maps the ring buffer `map` of `size` bytes (a power of two, multiple of the page) and
    /// registers it with a new epoll instance.
    pub(super) fn new(map: &OwnedFd, size: usize, page: usize) -> io::Result<RingReader> {
        let consumer = Mapping::new(map, page, 0, true)?;
        let producer = Mapping::new(map, page + 2 * size, page, false)?;
        // SAFETY: epoll_create1 has no preconditions.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new fd nothing else owns.
        let epoll = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ep) };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: both fds are open; ev is a valid epoll_event.
        if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, map.as_raw_fd(), &mut ev) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RingReader {
            consumer,
            producer,
            page,
            mask: size as u64 - 1,
            epoll,
        })
    }

    /// The epoll fd: readable while records wait.
    pub fn epoll_fd(&self) -> i32 {
        self.epoll.as_raw_fd()
    }

    fn consumer_pos(&self) -> &AtomicU64 {
        // SAFETY: the first 8 bytes of the consumer page, page-aligned, alive as long as self.
        unsafe { &*(self.consumer.ptr as *const AtomicU64) }
    }

    fn producer_pos(&self) -> &AtomicU64 {
        // SAFETY: as above, the producer page.
        unsafe { &*(self.producer.ptr as *const AtomicU64) }
    }

    /// Whether records wait to be read.
    pub fn pending(&self) -> bool {
        self.producer_pos().load(Ordering::Acquire) > self.consumer_pos().load(Ordering::Relaxed)
    }

    /// Adds `fd` to the epoll set: [`RingReader::wait_any`] then also wakes when it is
    /// readable (the agent's control requests share the ring buffer's sleep).
    pub fn watch(&self, fd: std::os::fd::RawFd) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: WATCHED_TOKEN,
        };
        // SAFETY: both fds are open (the caller keeps `fd` open while watched); ev is valid.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sleeps until a record waits or `timeout` passes (`None`: forever); true when woken by
    /// a record. EINTR counts as a timeout.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        self.wait_any(timeout).map(|r| r.ring)
    }

    /// Sleeps until a record waits, a watched fd is readable, or `timeout` passes; says which
    /// woke it. EINTR counts as a timeout.
    pub fn wait_any(&self, timeout: Option<Duration>) -> io::Result<Ready> {
        if self.pending() {
            return Ok(Ready {
                ring: true,
                watched: false,
            });
        }
        let ms = timeout.map_or(-1, |t| {
            // round up: a 0.4 ms timeout must not become a busy 0
            t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
        });
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: two epoll_events of room.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), evs.as_mut_ptr(), 2, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(Ready::default())
            } else {
                Err(e)
            };
        }
        let mut ready = Ready::default();
        for ev in &evs[..n as usize] {
            if ev.u64 == WATCHED_TOKEN {
                ready.watched = true;
            } else {
                ready.ring = true;
            }
        }
        Ok(ready)
    }

    /// Reads every complete record, calling `each` on each event; returns how many records
    /// were consumed (discarded or undecodable ones included).
    pub fn drain(&mut self, mut each: impl FnMut(IdleEvent)) -> usize {
        let mut cons = self.consumer_pos().load(Ordering::Relaxed);
        let mut n = 0;
        loop {
            let prod = self.producer_pos().load(Ordering::Acquire);
            if cons >= prod {
                break;
            }
            let at = self.page + (cons & self.mask) as usize;
            // SAFETY: `at` is inside the data area (twice mapped, so the header and a record
            // that wraps read contiguously); the length word is 4-byte aligned.
            let len_word = unsafe { &*(self.producer.ptr.add(at) as *const AtomicU32) };
            let len = len_word.load(Ordering::Acquire);
            if len & BUSY_BIT != 0 {
                break;
            }
            let data_len = (len & !(BUSY_BIT | DISCARD_BIT)) as usize;
            if len & DISCARD_BIT == 0 {
                // SAFETY: the record's data follows its header inside the mapping.
                let data = unsafe {
                    std::slice::from_raw_parts(self.producer.ptr.add(at + HEADER), data_len)
                };
                if let Some(e) = IdleEvent::decode(data) {
                    each(e);
                }
            }
            cons += (HEADER + data_len).next_multiple_of(8) as u64;
            self.consumer_pos().store(cons, Ordering::Release);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_decodes_from_the_programs_layout() {
        let mut b = Vec::new();
        b.extend_from_slice(&123_456u64.to_ne_bytes());
        b.extend_from_slice(&3i64.to_ne_bytes());
        b.extend_from_slice(&1u32.to_ne_bytes());
        b.extend_from_slice(&DIRECTION_LOW.to_ne_bytes());
        assert_eq!(
            IdleEvent::decode(&b),
            Some(IdleEvent {
                ktime_ns: 123_456,
                idle_count: 3,
                cpu: 1,
                direction: Direction::Low
            })
        );
        b[20] = 7;
        assert_eq!(IdleEvent::decode(&b), None, "unknown direction");
        assert_eq!(IdleEvent::decode(&b[..20]), None, "short record");
    }
}
