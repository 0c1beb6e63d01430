//! The idle-core reader allocates nothing per poll (a counting global allocator proves it). Only
//! the polling thread's allocations count: the test harness's own threads may allocate at any
//! time (seen once under load), and they are not what is measured.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on the polling thread only (const-initialised: no allocation to read it).
    static COUNTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if COUNTED.with(|c| c.get()) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
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
    COUNTED.with(|c| c.set(true));
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
    COUNTED.with(|c| c.set(false));
    assert!(sum >= 0.0);
    assert_eq!(
        after - before,
        0,
        "{} allocations in 1000 polls",
        after - before
    );
}
