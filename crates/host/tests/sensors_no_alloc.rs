//! The idle-core reader allocates nothing per poll (a counting global allocator proves it). Own
//! test binary: the allocator counts every thread, so nothing else may run beside it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn polling_proc_stat_and_schedstat_allocates_nothing() {
    let host = headroom_host::LinuxHost::system();
    let mut sampler = host.idle_sampler().unwrap();
    let pid = std::process::id() as i32;
    let tid = nix::unistd::gettid().as_raw();
    let mut schedstat = host.schedstat(pid, tid).ok();
    // Warm up: buffers reach their steady size.
    for _ in 0..10 {
        sampler.sample().unwrap();
        if let Some(s) = schedstat.as_mut() {
            s.read().unwrap();
        }
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let mut sum = 0.0;
    for _ in 0..1000 {
        for (_, idle) in sampler.sample().unwrap() {
            sum += idle;
        }
        if let Some(s) = schedstat.as_mut() {
            sum += s.read().unwrap().run_ns as f64 * 0.0;
        }
    }
    let after = ALLOCATIONS.load(Ordering::Relaxed);
    assert!(sum >= 0.0);
    assert_eq!(
        after - before,
        0,
        "{} allocations in 1000 polls",
        after - before
    );
}
