//! Record index → key bytes, as mutilate's `KeyGenerator`: the key of record `i` is the decimal
//! `i` zero-padded to a length drawn from the key-size distribution with the uniform
//! U = FNV-64(i) / (2⁶⁴ − 1), so every client derives the same key for the same record.

use std::sync::Arc;

use super::Dist;

/// Up to this many records the key lengths are computed once into a shared table (one byte a
/// record), so a request costs no `ln`/`powf`; above it they are computed per key.
pub const KEY_LEN_TABLE_MAX: u64 = 1 << 22;

/// memcached's longest key; longer drawn lengths are cut to it (mutilate wrote up to 255 bytes,
/// which memcached refuses).
pub const MAX_KEY_LEN: usize = 250;

/// FNV-1a 64 of the 8 little-endian bytes of `v` (mutilate's `fnv_64` on x86).
pub fn fnv_64(v: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in v.to_le_bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Deterministic keys for `records` records with lengths from a key-size distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyGenerator {
    size: Dist,
    records: u64,
    min_len: usize,
    /// Precomputed [`KeyGenerator::key_len`] of every record (variable sizes, few records).
    table: Option<Arc<[u8]>>,
}

impl KeyGenerator {
    /// Keys for records `0..records` (`records` 0 is treated as 1, as mutilate does).
    pub fn new(size: Dist, records: u64) -> KeyGenerator {
        let records = records.max(1);
        // floor(log10(records)) + 1: enough digits for every index (mutilate's minimum).
        let min_len = records.to_string().len();
        let mut g = KeyGenerator {
            size,
            records,
            min_len,
            table: None,
        };
        if !matches!(g.size, Dist::Fixed(_)) && records <= KEY_LEN_TABLE_MAX {
            let table: Vec<u8> = (0..records).map(|i| g.compute_len(i) as u8).collect();
            g.table = Some(table.into());
        }
        g
    }

    /// Number of records.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Shortest key: the digits of the record count.
    pub fn min_len(&self) -> usize {
        self.min_len
    }

    /// Length of record `index`'s key: max(round(G), digits of records), at most
    /// [`MAX_KEY_LEN`], where G is the size distribution at U = FNV-64(index)/(2⁶⁴ − 1).
    pub fn key_len(&self, index: u64) -> usize {
        match &self.table {
            Some(t) if index < self.records => usize::from(t[index as usize]),
            _ => self.compute_len(index),
        }
    }

    fn compute_len(&self, index: u64) -> usize {
        let len = match self.size {
            Dist::Fixed(v) => v,
            ref d => d.from_uniform(fnv_64(index) as f64 / u64::MAX as f64),
        }
        .round();
        let len = if len.is_nan() || len < self.min_len as f64 {
            self.min_len
        } else {
            len.min(MAX_KEY_LEN as f64) as usize
        };
        len.clamp(self.min_len.min(MAX_KEY_LEN), MAX_KEY_LEN)
    }

    /// The key-size distribution.
    pub fn size(&self) -> &Dist {
        &self.size
    }

    /// Appends record `index`'s key to `out` (zero-padded decimal index, mutilate's `%0*llu`).
    /// An index at or beyond `records` is never cut: its key has at least all its digits.
    pub fn write_key(&self, index: u64, out: &mut Vec<u8>) {
        let mut len = self.key_len(index);
        if index >= self.records {
            len = len.max(index.checked_ilog10().map_or(1, |d| d as usize + 1));
        }
        let start = out.len();
        out.resize(start + len, b'0');
        let mut v = index;
        let mut pos = start + len;
        while v > 0 && pos > start {
            pos -= 1;
            out[pos] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    }

    /// Record `index`'s key.
    pub fn key(&self, index: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAX_KEY_LEN);
        self.write_key(index, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_vectors() {
        // FNV-1a 64 of eight zero bytes, computed byte by byte from the published constants.
        assert_eq!(fnv_64(0), 0xa8c7_f832_281a_39c5);
        assert_ne!(fnv_64(1), fnv_64(256));
    }

    #[test]
    fn fixed_keys_are_zero_padded_indices() {
        let g = KeyGenerator::new(Dist::Fixed(30.0), 10_000);
        assert_eq!(g.key(42), b"000000000000000000000000000042".to_vec());
        // Never shorter than the digits of the record count (5 for 10000, as mutilate).
        let g = KeyGenerator::new(Dist::Fixed(2.0), 10_000);
        assert_eq!(g.key(9999), b"09999".to_vec());
        let g = KeyGenerator::new(Dist::Fixed(1000.0), 10);
        assert_eq!(g.key(7).len(), MAX_KEY_LEN);
        // Out-of-range indices keep all their digits (mutilate's printf did too).
        let g = KeyGenerator::new(Dist::Fixed(1.0), 10);
        assert_eq!(g.key(123_456), b"123456".to_vec());
        assert_eq!(g.key(0), b"00".to_vec());
    }

    #[test]
    fn fb_key_lengths_are_deterministic_and_follow_gev() {
        let g = KeyGenerator::new(Dist::fb_key(), 100_000);
        let h = KeyGenerator::new(Dist::fb_key(), 100_000);
        let n = 100_000u64;
        let lens: Vec<usize> = (0..n).map(|i| g.key_len(i)).collect();
        assert!((0..n).all(|i| h.key_len(i) == lens[i as usize]));
        // The lengths are round(GEV) draws: their mean is the GEV mean within 5 standard errors
        // (+0.5 for rounding bias bounds, the minimum of 6 digits is far in the lower tail).
        let d = Dist::fb_key();
        let mean = lens.iter().sum::<usize>() as f64 / n as f64;
        let se = (d.variance().unwrap() / n as f64).sqrt();
        assert!(
            (mean - d.mean().unwrap()).abs() < 5.0 * se + 0.05,
            "mean key length {mean} vs {}",
            d.mean().unwrap()
        );
        // The precomputed table says what the formula says.
        assert!(g.table.is_some());
        assert!((0..n)
            .step_by(97)
            .all(|i| g.compute_len(i) == lens[i as usize]));
        let mut key = Vec::new();
        g.write_key(123, &mut key);
        assert_eq!(key.len(), lens[123]);
        assert!(key.ends_with(b"123") && key.iter().all(u8::is_ascii_digit));
    }
}
