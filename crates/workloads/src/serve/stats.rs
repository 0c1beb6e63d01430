//! Server-wide counters reported by `stats`, named as memcached names them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::store::StoreCounts;

/// Counters bumped by the worker threads (relaxed atomics: they are statistics, not locks).
#[derive(Debug, Default)]
pub struct Counters {
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_flush: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub delete_hits: AtomicU64,
    pub delete_misses: AtomicU64,
    pub incr_hits: AtomicU64,
    pub incr_misses: AtomicU64,
    pub decr_hits: AtomicU64,
    pub decr_misses: AtomicU64,
    pub cas_hits: AtomicU64,
    pub cas_misses: AtomicU64,
    pub cas_badval: AtomicU64,
    pub touch_hits: AtomicU64,
    pub touch_misses: AtomicU64,
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub rejected_connections: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Requests executed (each command, binary or ASCII): the basis for the `--service-time` work.
    pub requests: AtomicU64,
}

impl Counters {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// Zeroes what `stats reset` resets (not the gauges).
    pub fn reset(&self) {
        for c in [
            &self.cmd_get,
            &self.cmd_set,
            &self.cmd_flush,
            &self.cmd_touch,
            &self.get_hits,
            &self.get_misses,
            &self.delete_hits,
            &self.delete_misses,
            &self.incr_hits,
            &self.incr_misses,
            &self.decr_hits,
            &self.decr_misses,
            &self.cas_hits,
            &self.cas_misses,
            &self.cas_badval,
            &self.touch_hits,
            &self.touch_misses,
            &self.total_connections,
            &self.rejected_connections,
            &self.bytes_read,
            &self.bytes_written,
            &self.requests,
        ] {
            c.store(0, Relaxed);
        }
    }
}

/// Everything `stats` prints, in memcached's order, as (name, value) pairs.
pub struct StatsSnapshot {
    pub pairs: Vec<(&'static str, String)>,
}

/// Process-level facts that go into `stats`.
pub struct ProcessFacts {
    pub pid: u32,
    pub uptime_s: u64,
    pub time_unix_s: u64,
    pub version: &'static str,
    pub threads: usize,
    pub rusage_user_s: f64,
    pub rusage_system_s: f64,
    pub max_connections: usize,
}

impl StatsSnapshot {
    pub fn build(c: &Counters, store: StoreCounts, p: &ProcessFacts) -> Self {
        let g = |a: &AtomicU64| a.load(Relaxed).to_string();
        let pairs = vec![
            ("pid", p.pid.to_string()),
            ("uptime", p.uptime_s.to_string()),
            ("time", p.time_unix_s.to_string()),
            ("version", p.version.to_string()),
            ("pointer_size", (usize::BITS).to_string()),
            ("rusage_user", format!("{:.6}", p.rusage_user_s)),
            ("rusage_system", format!("{:.6}", p.rusage_system_s)),
            ("max_connections", p.max_connections.to_string()),
            ("curr_connections", g(&c.curr_connections)),
            ("total_connections", g(&c.total_connections)),
            ("rejected_connections", g(&c.rejected_connections)),
            ("cmd_get", g(&c.cmd_get)),
            ("cmd_set", g(&c.cmd_set)),
            ("cmd_flush", g(&c.cmd_flush)),
            ("cmd_touch", g(&c.cmd_touch)),
            ("get_hits", g(&c.get_hits)),
            ("get_misses", g(&c.get_misses)),
            ("delete_misses", g(&c.delete_misses)),
            ("delete_hits", g(&c.delete_hits)),
            ("incr_misses", g(&c.incr_misses)),
            ("incr_hits", g(&c.incr_hits)),
            ("decr_misses", g(&c.decr_misses)),
            ("decr_hits", g(&c.decr_hits)),
            ("cas_misses", g(&c.cas_misses)),
            ("cas_hits", g(&c.cas_hits)),
            ("cas_badval", g(&c.cas_badval)),
            ("touch_hits", g(&c.touch_hits)),
            ("touch_misses", g(&c.touch_misses)),
            ("bytes_read", g(&c.bytes_read)),
            ("bytes_written", g(&c.bytes_written)),
            ("limit_maxbytes", store.limit_maxbytes.to_string()),
            ("threads", p.threads.to_string()),
            ("requests", g(&c.requests)),
            ("bytes", store.bytes.to_string()),
            ("curr_items", store.curr_items.to_string()),
            ("total_items", store.total_items.to_string()),
            ("reclaimed", store.reclaimed.to_string()),
            ("evictions", store.evictions.to_string()),
        ];
        StatsSnapshot { pairs }
    }
}
