//! The item store: a hash map plus an intrusive LRU list, bounded in bytes like memcached's `-m`.
//!
//! One store is shared by all worker threads behind a mutex; every operation is a short critical
//! section (a lookup and a copy), the same granularity as memcached's per-item locks for the
//! sizes we serve. Time is passed in by the caller (milliseconds since the server started) so the
//! store itself never reads a clock and is tested with scripted times.

use std::collections::HashMap;

/// Bytes charged per item on top of key and value, like memcached's item header (48 bytes + cas).
pub const ITEM_OVERHEAD: usize = 56;

/// Largest key memcached accepts.
pub const KEY_MAX_LEN: usize = 250;

const NIL: u32 = u32::MAX;

/// Relative expiry times above this many seconds are absolute unix times (memcached's rule).
pub const REALTIME_MAXDELTA_S: i64 = 60 * 60 * 24 * 30;

/// When an item expires, in store milliseconds; 0 means never. 1 means "already expired" because
/// store time starts at 1.
pub type Expiry = u64;

/// Store time in milliseconds since start; always ≥ 1.
pub type StoreMs = u64;

/// Converts a memcached exptime (seconds; 0 = never, negative = expired, ≤ 30 days relative,
/// else an absolute unix time) into a store expiry.
pub fn expiry_from_exptime(exptime: i64, now: StoreMs, unix_now_s: i64) -> Expiry {
    if exptime == 0 {
        0
    } else if exptime < 0 {
        1
    } else if exptime <= REALTIME_MAXDELTA_S {
        now + exptime as u64 * 1000
    } else {
        let delta = exptime - unix_now_s;
        if delta <= 0 {
            1
        } else {
            now + delta as u64 * 1000
        }
    }
}

struct Entry {
    key: Box<[u8]>,
    value: Vec<u8>,
    flags: u32,
    expires: Expiry,
    cas: u64,
    prev: u32,
    next: u32,
}

impl Entry {
    fn size(&self) -> usize {
        item_size(self.key.len(), self.value.len())
    }
    fn expired(&self, now: StoreMs) -> bool {
        self.expires != 0 && self.expires <= now
    }
}

/// The bytes an item of these lengths is charged.
pub fn item_size(key_len: usize, value_len: usize) -> usize {
    key_len + value_len + ITEM_OVERHEAD
}

/// How a storage command treats an existing or missing item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
}

/// Outcome of a storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOutcome {
    Stored {
        cas: u64,
    },
    NotStored,
    /// CAS mismatch (or `add` of an existing key in the binary protocol's terms).
    Exists,
    /// CAS given but the key is missing.
    NotFound,
    /// The item would exceed the item size limit or the whole memory limit.
    TooLarge,
}

/// Outcome of incr/decr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOutcome {
    Value { value: u64, cas: u64 },
    NotFound,
    NonNumeric,
    Exists,
}

/// A copy of what a get returns, written straight into the caller's buffer by a closure.
pub struct ItemRef<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub flags: u32,
    pub cas: u64,
}

/// Counters the store owns (reported by `stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCounts {
    pub curr_items: u64,
    pub total_items: u64,
    pub bytes: u64,
    pub evictions: u64,
    pub reclaimed: u64,
    pub limit_maxbytes: u64,
}

/// The LRU-bounded key-value store.
pub struct Store {
    map: HashMap<Box<[u8]>, u32>,
    slots: Vec<Entry>,
    free: Vec<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used: evicted first.
    tail: u32,
    bytes: usize,
    limit_bytes: usize,
    max_item_bytes: usize,
    next_cas: u64,
    /// `flush_all N`: everything stored before this time is invalid once it passes.
    pending_flush: Option<StoreMs>,
    counts: StoreCounts,
}

impl Store {
    /// A store holding at most `limit_bytes` (items charged [`item_size`]), refusing single
    /// items larger than `max_item_bytes`.
    pub fn new(limit_bytes: usize, max_item_bytes: usize) -> Self {
        Store {
            map: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            bytes: 0,
            limit_bytes,
            max_item_bytes: max_item_bytes.min(limit_bytes),
            next_cas: 1,
            pending_flush: None,
            counts: StoreCounts {
                limit_maxbytes: limit_bytes as u64,
                ..StoreCounts::default()
            },
        }
    }

    /// Whether an item with these lengths can ever be stored.
    pub fn fits(&self, key_len: usize, value_len: usize) -> bool {
        item_size(key_len, value_len) <= self.max_item_bytes
    }

    /// The largest value (bytes) storable under a key of this length.
    pub fn max_value_len(&self, key_len: usize) -> usize {
        self.max_item_bytes.saturating_sub(key_len + ITEM_OVERHEAD)
    }

    pub fn counts(&self) -> StoreCounts {
        StoreCounts {
            curr_items: self.map.len() as u64,
            bytes: self.bytes as u64,
            ..self.counts
        }
    }

    fn take_cas(&mut self) -> u64 {
        let c = self.next_cas;
        self.next_cas += 1;
        c
    }

    fn apply_pending_flush(&mut self, now: StoreMs) {
        if let Some(at) = self.pending_flush {
            if at <= now {
                self.pending_flush = None;
                self.clear();
            }
        }
    }

    fn clear(&mut self) {
        self.map.clear();
        self.slots.clear();
        self.free.clear();
        self.head = NIL;
        self.tail = NIL;
        self.bytes = 0;
    }

    /// `flush_all [delay]`: invalidate every item now, or once `delay_ms` has passed.
    pub fn flush(&mut self, now: StoreMs, delay_ms: u64) {
        if delay_ms == 0 {
            self.pending_flush = None;
            self.clear();
        } else {
            self.pending_flush = Some(now + delay_ms);
        }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let e = &self.slots[i as usize];
            (e.prev, e.next)
        };
        if prev != NIL {
            self.slots[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.slots[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
        let e = &mut self.slots[i as usize];
        e.prev = NIL;
        e.next = NIL;
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        {
            let e = &mut self.slots[i as usize];
            e.prev = NIL;
            e.next = old;
        }
        if old != NIL {
            self.slots[old as usize].prev = i;
        } else {
            self.tail = i;
        }
        self.head = i;
    }

    fn touch_lru(&mut self, i: u32) {
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    fn remove_slot(&mut self, i: u32) {
        self.unlink(i);
        let e = &mut self.slots[i as usize];
        let key = std::mem::take(&mut e.key);
        let value = std::mem::take(&mut e.value);
        self.bytes -= item_size(key.len(), value.len());
        self.map.remove(&key);
        self.free.push(i);
    }

    /// Looks a key up, dropping it when expired.
    fn find(&mut self, key: &[u8], now: StoreMs) -> Option<u32> {
        self.apply_pending_flush(now);
        let i = *self.map.get(key)?;
        if self.slots[i as usize].expired(now) {
            self.remove_slot(i);
            self.counts.reclaimed += 1;
            return None;
        }
        Some(i)
    }

    /// Makes room for `need` more bytes by evicting from the LRU tail (expired items first are
    /// naturally at the tail or get reclaimed on lookup). `keep` is never evicted.
    fn make_room(&mut self, need: usize, keep: u32, now: StoreMs) {
        while self.bytes + need > self.limit_bytes {
            let mut victim = self.tail;
            if victim == keep && victim != NIL {
                victim = self.slots[victim as usize].prev;
            }
            if victim == NIL {
                break;
            }
            if self.slots[victim as usize].expired(now) {
                self.counts.reclaimed += 1;
            } else {
                self.counts.evictions += 1;
            }
            self.remove_slot(victim);
        }
    }

    fn insert_new(
        &mut self,
        key: &[u8],
        value: Vec<u8>,
        flags: u32,
        expires: Expiry,
        now: StoreMs,
    ) -> u64 {
        let size = item_size(key.len(), value.len());
        self.make_room(size, NIL, now);
        let cas = self.take_cas();
        let entry = Entry {
            key: key.into(),
            value,
            flags,
            expires,
            cas,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = entry;
                i
            }
            None => {
                self.slots.push(entry);
                (self.slots.len() - 1) as u32
            }
        };
        self.map.insert(key.into(), i);
        self.bytes += size;
        self.push_front(i);
        self.counts.total_items += 1;
        cas
    }

    /// Replaces the value of slot `i` in place, accounting bytes and evicting others if needed.
    fn replace_value(&mut self, i: u32, value: Vec<u8>, now: StoreMs) -> u64 {
        let old = self.slots[i as usize].size();
        let key_len = self.slots[i as usize].key.len();
        let new = item_size(key_len, value.len());
        if new > old {
            self.make_room(new - old, i, now);
        }
        self.bytes = self.bytes - old + new;
        let cas = self.take_cas();
        let e = &mut self.slots[i as usize];
        e.value = value;
        e.cas = cas;
        self.touch_lru(i);
        self.counts.total_items += 1;
        cas
    }

    /// set/add/replace/append/prepend, with an optional CAS check (`cas_check != 0`).
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &mut self,
        mode: StoreMode,
        key: &[u8],
        flags: u32,
        expires: Expiry,
        data: &[u8],
        cas_check: u64,
        now: StoreMs,
    ) -> StoreOutcome {
        let existing = self.find(key, now);
        let final_len = match (mode, existing) {
            (StoreMode::Append | StoreMode::Prepend, Some(i)) => {
                self.slots[i as usize].value.len() + data.len()
            }
            _ => data.len(),
        };
        if !self.fits(key.len(), final_len) {
            return StoreOutcome::TooLarge;
        }
        if cas_check != 0 {
            match existing {
                None => return StoreOutcome::NotFound,
                Some(i) if self.slots[i as usize].cas != cas_check => return StoreOutcome::Exists,
                Some(_) => {}
            }
        }
        match (mode, existing) {
            (StoreMode::Add, Some(i)) => {
                // memcached bumps an item that an add collided with.
                self.touch_lru(i);
                StoreOutcome::NotStored
            }
            (StoreMode::Replace | StoreMode::Append | StoreMode::Prepend, None) => {
                StoreOutcome::NotStored
            }
            (StoreMode::Set | StoreMode::Add, None)
            | (StoreMode::Replace | StoreMode::Set, Some(_)) => {
                if let Some(i) = existing {
                    self.remove_slot(i);
                }
                let cas = self.insert_new(key, data.to_vec(), flags, expires, now);
                StoreOutcome::Stored { cas }
            }
            (StoreMode::Append, Some(i)) => {
                // While the value is out of its slot, the byte count must not include it.
                let mut v = std::mem::take(&mut self.slots[i as usize].value);
                self.bytes -= v.len();
                v.extend_from_slice(data);
                let cas = self.replace_value(i, v, now);
                StoreOutcome::Stored { cas }
            }
            (StoreMode::Prepend, Some(i)) => {
                let old = std::mem::take(&mut self.slots[i as usize].value);
                self.bytes -= old.len();
                let mut v = Vec::with_capacity(old.len() + data.len());
                v.extend_from_slice(data);
                v.extend_from_slice(&old);
                let cas = self.replace_value(i, v, now);
                StoreOutcome::Stored { cas }
            }
        }
    }

    /// Calls `f` with the item when present (and bumps it in the LRU); returns whether it was.
    /// `new_expiry` (get-and-touch) updates the expiry first.
    pub fn get<F: FnOnce(ItemRef<'_>)>(
        &mut self,
        key: &[u8],
        now: StoreMs,
        new_expiry: Option<Expiry>,
        f: F,
    ) -> bool {
        match self.find(key, now) {
            None => false,
            Some(i) => {
                self.touch_lru(i);
                let e = &mut self.slots[i as usize];
                if let Some(exp) = new_expiry {
                    e.expires = exp;
                }
                f(ItemRef {
                    key: &e.key,
                    value: &e.value,
                    flags: e.flags,
                    cas: e.cas,
                });
                true
            }
        }
    }

    /// Deletes a key (with an optional CAS check); true when it existed.
    pub fn delete(
        &mut self,
        key: &[u8],
        cas_check: u64,
        now: StoreMs,
    ) -> Result<bool, StoreOutcome> {
        match self.find(key, now) {
            None => Ok(false),
            Some(i) => {
                if cas_check != 0 && self.slots[i as usize].cas != cas_check {
                    return Err(StoreOutcome::Exists);
                }
                self.remove_slot(i);
                Ok(true)
            }
        }
    }

    /// Updates the expiry of a key; true when it existed.
    pub fn touch(&mut self, key: &[u8], expires: Expiry, now: StoreMs) -> bool {
        match self.find(key, now) {
            None => false,
            Some(i) => {
                self.slots[i as usize].expires = expires;
                self.touch_lru(i);
                true
            }
        }
    }

    /// incr/decr: decimal arithmetic on the value, wrapping at 2^64 on incr and stopping at 0 on
    /// decr (memcached's rules). `create` = (initial value, expiry) creates a missing key (binary
    /// protocol); `cas_check != 0` must match.
    pub fn arith(
        &mut self,
        key: &[u8],
        incr: bool,
        delta: u64,
        create: Option<(u64, Expiry)>,
        cas_check: u64,
        now: StoreMs,
    ) -> ArithOutcome {
        match self.find(key, now) {
            None => match create {
                None => ArithOutcome::NotFound,
                Some((initial, expires)) => {
                    let v = initial.to_string().into_bytes();
                    let cas = self.insert_new(key, v, 0, expires, now);
                    ArithOutcome::Value {
                        value: initial,
                        cas,
                    }
                }
            },
            Some(i) => {
                if cas_check != 0 && self.slots[i as usize].cas != cas_check {
                    return ArithOutcome::Exists;
                }
                let Some(current) = parse_decimal(&self.slots[i as usize].value) else {
                    return ArithOutcome::NonNumeric;
                };
                let value = if incr {
                    current.wrapping_add(delta)
                } else {
                    current.saturating_sub(delta)
                };
                let cas = self.replace_value(i, value.to_string().into_bytes(), now);
                ArithOutcome::Value { value, cas }
            }
        }
    }
}

/// Parses a stored value as memcached's incr does: decimal digits, optionally followed by
/// spaces (memcached pads decr results with spaces).
pub fn parse_decimal(v: &[u8]) -> Option<u64> {
    let end = v
        .iter()
        .rposition(|&b| b != b' ')
        .map(|p| p + 1)
        .unwrap_or(0);
    let digits = &v[..end];
    if digits.is_empty() || digits.len() > 20 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

#[cfg(test)]
mod tests;
