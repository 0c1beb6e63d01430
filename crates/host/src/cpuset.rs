//! CPU (and memory node) lists in the kernel's list syntax: `0-3,8,10-11`.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::error::HostError;

/// A set of CPU (or NUMA node) numbers, parsed from and printed as a kernel list (`0-3,8`).
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct CpuSet(BTreeSet<usize>);

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        CpuSet(BTreeSet::new())
    }

    /// The set of `0..n`.
    pub fn first_n(n: usize) -> Self {
        (0..n).collect()
    }

    pub fn insert(&mut self, cpu: usize) -> bool {
        self.0.insert(cpu)
    }

    pub fn remove(&mut self, cpu: usize) -> bool {
        self.0.remove(&cpu)
    }

    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().copied()
    }

    pub fn to_vec(&self) -> Vec<usize> {
        self.iter().collect()
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    /// Parses the kernel list syntax; an empty or whitespace-only string is the empty set.
    pub fn parse_list(text: &str) -> Result<Self, HostError> {
        let bad = |reason: &str| HostError::invalid("cpu list", text, reason);
        let mut set = BTreeSet::new();
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(CpuSet(set));
        }
        for part in trimmed.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(bad("empty element"));
            }
            match part.split_once('-') {
                Some((lo, hi)) => {
                    let lo: usize = lo.trim().parse().map_err(|_| bad("not a number"))?;
                    let hi: usize = hi.trim().parse().map_err(|_| bad("not a number"))?;
                    if lo > hi {
                        return Err(bad("range start above its end"));
                    }
                    if hi - lo > 1 << 16 {
                        return Err(bad("range too large"));
                    }
                    set.extend(lo..=hi);
                }
                None => {
                    set.insert(part.parse().map_err(|_| bad("not a number"))?);
                }
            }
        }
        Ok(CpuSet(set))
    }

    /// The kernel list syntax, ranges collapsed (`0-3,8`); empty for the empty set.
    pub fn to_list(&self) -> String {
        let mut out = String::new();
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end = iter.next().unwrap_or(end);
            }
            if !out.is_empty() {
                out.push(',');
            }
            if start == end {
                out.push_str(&start.to_string());
            } else {
                out.push_str(&format!("{start}-{end}"));
            }
        }
        out
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_list())
    }
}

impl FromStr for CpuSet {
    type Err = HostError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse_list(s)
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        CpuSet(iter.into_iter().collect())
    }
}

impl From<&[usize]> for CpuSet {
    fn from(cpus: &[usize]) -> Self {
        cpus.iter().copied().collect()
    }
}

impl From<Vec<usize>> for CpuSet {
    fn from(cpus: Vec<usize>) -> Self {
        cpus.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_kernel_lists() {
        let set = CpuSet::parse_list("0-3,8,10-11\n").unwrap();
        assert_eq!(set.to_vec(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(set.to_list(), "0-3,8,10-11");
        assert!(CpuSet::parse_list("").unwrap().is_empty());
        assert_eq!(CpuSet::from(vec![1]).to_list(), "1");
    }

    #[test]
    fn rejects_malformed_lists_naming_the_input() {
        for bad in ["a", "3-1", "1,,2", "-1"] {
            let err = CpuSet::parse_list(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
