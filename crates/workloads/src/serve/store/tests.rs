use super::*;

fn get_value(s: &mut Store, key: &[u8], now: StoreMs) -> Option<Vec<u8>> {
    let mut out = None;
    s.get(key, now, None, |it| out = Some(it.value.to_vec()));
    out
}

#[test]
fn set_get_delete() {
    let mut s = Store::new(1 << 20, 1 << 20);
    assert!(matches!(
        s.store(StoreMode::Set, b"k", 7, 0, b"v1", 0, 1),
        StoreOutcome::Stored { .. }
    ));
    assert_eq!(get_value(&mut s, b"k", 1).as_deref(), Some(&b"v1"[..]));
    assert_eq!(s.counts().curr_items, 1);
    assert_eq!(s.counts().bytes as usize, item_size(1, 2));
    assert_eq!(s.delete(b"k", 0, 1), Ok(true));
    assert_eq!(s.delete(b"k", 0, 1), Ok(false));
    assert_eq!(s.counts().bytes, 0);
}

#[test]
fn add_replace_append_prepend_cas() {
    let mut s = Store::new(1 << 20, 1 << 20);
    assert_eq!(
        s.store(StoreMode::Replace, b"k", 0, 0, b"x", 0, 1),
        StoreOutcome::NotStored
    );
    assert_eq!(
        s.store(StoreMode::Append, b"k", 0, 0, b"x", 0, 1),
        StoreOutcome::NotStored
    );
    let StoreOutcome::Stored { cas } = s.store(StoreMode::Add, b"k", 0, 0, b"mid", 0, 1) else {
        panic!("add failed")
    };
    assert_eq!(
        s.store(StoreMode::Add, b"k", 0, 0, b"x", 0, 1),
        StoreOutcome::NotStored
    );
    assert_eq!(
        s.store(StoreMode::Set, b"k", 0, 0, b"x", cas + 100, 1),
        StoreOutcome::Exists
    );
    assert_eq!(
        s.store(StoreMode::Set, b"zz", 0, 0, b"x", 5, 1),
        StoreOutcome::NotFound
    );
    assert!(matches!(
        s.store(StoreMode::Append, b"k", 0, 0, b"-end", 0, 1),
        StoreOutcome::Stored { .. }
    ));
    assert!(matches!(
        s.store(StoreMode::Prepend, b"k", 0, 0, b"start-", 0, 1),
        StoreOutcome::Stored { .. }
    ));
    assert_eq!(
        get_value(&mut s, b"k", 1).as_deref(),
        Some(&b"start-mid-end"[..])
    );
    assert_eq!(s.counts().bytes as usize, item_size(1, 13));
}

#[test]
fn lru_evicts_least_recently_used_first() {
    // Room for exactly three items of this size.
    let size = item_size(2, 100);
    let mut s = Store::new(size * 3, size * 3);
    let v = vec![b'x'; 100];
    for k in [b"k1", b"k2", b"k3"] {
        s.store(StoreMode::Set, k, 0, 0, &v, 0, 1);
    }
    // Reading k1 makes k2 the least recently used.
    assert!(get_value(&mut s, b"k1", 1).is_some());
    s.store(StoreMode::Set, b"k4", 0, 0, &v, 0, 1);
    assert!(
        get_value(&mut s, b"k2", 1).is_none(),
        "k2 should have been evicted"
    );
    assert!(get_value(&mut s, b"k1", 1).is_some());
    assert!(get_value(&mut s, b"k3", 1).is_some());
    assert!(get_value(&mut s, b"k4", 1).is_some());
    assert_eq!(s.counts().evictions, 1);
    assert!(s.counts().bytes as usize <= size * 3);
}

#[test]
fn oversized_items_are_refused() {
    let mut s = Store::new(10_000, 1000);
    let big = vec![0u8; 1000];
    assert_eq!(
        s.store(StoreMode::Set, b"k", 0, 0, &big, 0, 1),
        StoreOutcome::TooLarge
    );
    let ok = vec![0u8; s.max_value_len(1)];
    assert!(matches!(
        s.store(StoreMode::Set, b"k", 0, 0, &ok, 0, 1),
        StoreOutcome::Stored { .. }
    ));
    assert_eq!(
        s.store(StoreMode::Append, b"k", 0, 0, b"x", 0, 1),
        StoreOutcome::TooLarge
    );
}

#[test]
fn expiry_and_flush() {
    let mut s = Store::new(1 << 20, 1 << 20);
    let exp = expiry_from_exptime(2, 1000, 1_700_000_000);
    assert_eq!(exp, 3000);
    s.store(StoreMode::Set, b"k", 0, exp, b"v", 0, 1000);
    assert!(get_value(&mut s, b"k", 2999).is_some());
    assert!(get_value(&mut s, b"k", 3000).is_none());
    assert_eq!(expiry_from_exptime(-1, 1000, 0), 1);
    assert_eq!(
        expiry_from_exptime(1_700_000_010, 1000, 1_700_000_000),
        11_000
    );
    assert_eq!(expiry_from_exptime(1_600_000_000, 1000, 1_700_000_000), 1);
    s.store(StoreMode::Set, b"a", 0, 0, b"v", 0, 1);
    s.flush(1, 500);
    assert!(get_value(&mut s, b"a", 400).is_some());
    assert!(get_value(&mut s, b"a", 501).is_none());
    s.store(StoreMode::Set, b"b", 0, 0, b"v", 0, 600);
    s.flush(600, 0);
    assert!(get_value(&mut s, b"b", 600).is_none());
}

#[test]
fn arithmetic_rules() {
    let mut s = Store::new(1 << 20, 1 << 20);
    s.store(StoreMode::Set, b"n", 0, 0, b"9", 0, 1);
    assert!(matches!(
        s.arith(b"n", true, 1, None, 0, 1),
        ArithOutcome::Value { value: 10, .. }
    ));
    assert!(matches!(
        s.arith(b"n", false, 100, None, 0, 1),
        ArithOutcome::Value { value: 0, .. }
    ));
    s.store(StoreMode::Set, b"m", 0, 0, b"18446744073709551615", 0, 1);
    assert!(matches!(
        s.arith(b"m", true, 2, None, 0, 1),
        ArithOutcome::Value { value: 1, .. }
    ));
    s.store(StoreMode::Set, b"t", 0, 0, b"abc", 0, 1);
    assert_eq!(s.arith(b"t", true, 1, None, 0, 1), ArithOutcome::NonNumeric);
    assert_eq!(
        s.arith(b"none", true, 1, None, 0, 1),
        ArithOutcome::NotFound
    );
    assert!(matches!(
        s.arith(b"new", true, 1, Some((5, 0)), 0, 1),
        ArithOutcome::Value { value: 5, .. }
    ));
    assert_eq!(get_value(&mut s, b"new", 1).as_deref(), Some(&b"5"[..]));
    assert_eq!(parse_decimal(b"12  "), Some(12));
}
