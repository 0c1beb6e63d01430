//! CPU (and memory node) lists in the kernel's list syntax: `0-3,8,10-11`.
//!
//! The one rule set for every CPU list headroom reads (config keys, cgroup and sysfs files, the
//! agent's knob values, `--cpus` flags): elements separated by commas, each a number or a range
//! `a-b` with `a <= b`; whitespace around elements and at the ends ignored (files end in a
//! newline); a CPU named twice in a string folded (the kernel accepts `0-2,1`), in an array
//! refused (a config mistake), and in a string someone wrote (a config key, `ctl set`: read
//! with [`CpuSet::deserialize_distinct`]) refused too; empty elements (`1,,2`) and numbers
//! above [`MAX_CPU_ID`] refused.
//! An empty or blank string is the empty set: what a `cpuset.cpus` file holding no CPUs reads
//! back (on cgroup v2, a group inheriting its parent's). A caller to whom no CPUs means nothing
//! (an affinity mask, `antagonist --cpus`) refuses the empty set itself.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use super::ValueError;

/// The largest CPU number accepted (the kernel's `CONFIG_NR_CPUS` ceiling is 8192).
pub const MAX_CPU_ID: u32 = 8191;

/// A set of CPU (or NUMA node) numbers, parsed from and printed as a kernel list (`0-3,8`).
///
/// In JSON and TOML it is an array of numbers (`[0, 1, 2]`, what decision logs have always held);
/// it may also be read from a kernel list string (`"0-2"`). Reading refuses a CPU listed twice
/// and numbers above [`MAX_CPU_ID`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        CpuSet(BTreeSet::new())
    }

    /// The set of `0..n`.
    pub fn first_n(n: u32) -> Self {
        (0..n).collect()
    }

    pub fn insert(&mut self, cpu: u32) -> bool {
        self.0.insert(cpu)
    }

    pub fn remove(&mut self, cpu: u32) -> bool {
        self.0.remove(&cpu)
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The CPUs in ascending order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = u32> + ExactSizeIterator + '_ {
        self.0.iter().copied()
    }

    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }

    pub fn first(&self) -> Option<u32> {
        self.0.first().copied()
    }

    pub fn last(&self) -> Option<u32> {
        self.0.last().copied()
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.union(&other.0).copied().collect())
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.difference(&other.0).copied().collect())
    }

    /// Builds a set from a list that must not name a CPU twice (a config's `cpus = [0, 0]` is
    /// a mistake worth naming, not something to fold silently).
    pub fn from_distinct(cpus: &[u32]) -> Result<Self, ValueError> {
        let mut set = BTreeSet::new();
        for &cpu in cpus {
            check_id(cpu, || format!("{cpus:?}"))?;
            if !set.insert(cpu) {
                return Err(ValueError::new(
                    "cpu list",
                    format!("{cpus:?}"),
                    "lists a CPU twice",
                ));
            }
        }
        Ok(CpuSet(set))
    }

    /// Parses the kernel list syntax; an empty or whitespace-only string is the empty set.
    pub fn parse_list(text: &str) -> Result<Self, ValueError> {
        let bad = |reason: &str| ValueError::new("cpu list", text, reason);
        let mut set = BTreeSet::new();
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Ok(CpuSet(set));
        }
        let number = |s: &str| -> Result<u32, ValueError> {
            let n: u32 = s.trim().parse().map_err(|_| bad("not a number"))?;
            check_id(n, || text.to_owned())?;
            Ok(n)
        };
        for part in trimmed.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(bad("empty element"));
            }
            match part.split_once('-') {
                Some((lo, hi)) => {
                    let (lo, hi) = (number(lo)?, number(hi)?);
                    if lo > hi {
                        return Err(bad("range start above its end"));
                    }
                    set.extend(lo..=hi);
                }
                None => {
                    set.insert(number(part)?);
                }
            }
        }
        Ok(CpuSet(set))
    }

    /// [`CpuSet::parse_list`] for a list a person wrote (a config key, `ctl set`): a CPU named
    /// twice, by repeating it or by overlapping ranges (`"1,1"`, `"0-2,1"`), is a mistake worth
    /// naming, not something to fold silently (fourth hostile pass: `"1,1,1"` was taken as `1`).
    pub fn parse_distinct_list(text: &str) -> Result<Self, ValueError> {
        let whole = CpuSet::parse_list(text)?;
        let mut seen = BTreeSet::new();
        for part in text.trim().split(',') {
            for cpu in &CpuSet::parse_list(part)? {
                if !seen.insert(cpu) {
                    return Err(ValueError::new(
                        "cpu list",
                        text,
                        format!("lists CPU {cpu} twice"),
                    ));
                }
            }
        }
        Ok(whole)
    }

    /// Reads a config's CPU list (`#[serde(deserialize_with = "CpuSet::deserialize_distinct")]`):
    /// as [`CpuSet`]'s own reading, but a string naming a CPU twice is refused as an array
    /// naming one twice is.
    pub fn deserialize_distinct<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Visitor { distinct: true })
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

fn check_id(cpu: u32, value: impl FnOnce() -> String) -> Result<(), ValueError> {
    if cpu > MAX_CPU_ID {
        return Err(ValueError::new(
            "cpu list",
            value(),
            format!("CPU {cpu} is above the kernel's limit ({MAX_CPU_ID})"),
        ));
    }
    Ok(())
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_list())
    }
}

impl FromStr for CpuSet {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse_list(s)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        CpuSet(iter.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a CpuSet {
    type Item = u32;
    type IntoIter = std::iter::Copied<std::collections::btree_set::Iter<'a, u32>>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().copied()
    }
}

impl From<&[u32]> for CpuSet {
    fn from(cpus: &[u32]) -> Self {
        cpus.iter().copied().collect()
    }
}

impl From<Vec<u32>> for CpuSet {
    fn from(cpus: Vec<u32>) -> Self {
        cpus.into_iter().collect()
    }
}

impl<const N: usize> From<[u32; N]> for CpuSet {
    fn from(cpus: [u32; N]) -> Self {
        cpus.into_iter().collect()
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

/// An array of distinct numbers or a kernel list string (`distinct`: naming no CPU twice).
struct Visitor {
    distinct: bool,
}

impl<'de> serde::de::Visitor<'de> for Visitor {
    type Value = CpuSet;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of CPU numbers, e.g. [0, 1] or \"0-3,8\"")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<CpuSet, E> {
        let parsed = if self.distinct {
            CpuSet::parse_distinct_list(v)
        } else {
            CpuSet::parse_list(v)
        };
        parsed.map_err(|e| E::custom(e.reason))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<CpuSet, A::Error> {
        let mut cpus = Vec::new();
        while let Some(cpu) = seq.next_element::<u32>()? {
            cpus.push(cpu);
        }
        CpuSet::from_distinct(&cpus).map_err(|e| serde::de::Error::custom(e.reason))
    }
}

/// An array of distinct numbers or a kernel list string; the error is the reason alone (the
/// reader names the key or line).
impl<'de> serde::Deserialize<'de> for CpuSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Visitor { distinct: false })
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
        assert_eq!(CpuSet::from([1]).to_list(), "1");
    }

    #[test]
    fn rejects_malformed_lists_naming_the_input() {
        for bad in ["a", "3-1", "1,,2", "-1", "0-99999"] {
            let err = CpuSet::parse_list(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }

    #[test]
    fn reads_arrays_and_strings_and_refuses_duplicates() {
        let a: CpuSet = serde_json::from_str("[2, 0, 1]").unwrap();
        assert_eq!(a.to_vec(), [0, 1, 2]);
        let s: CpuSet = serde_json::from_str("\"0-2\"").unwrap();
        assert_eq!(a, s);
        assert_eq!(serde_json::to_string(&a).unwrap(), "[0,1,2]");
        let err = serde_json::from_str::<CpuSet>("[1, 1]")
            .unwrap_err()
            .to_string();
        assert!(err.contains("lists a CPU twice"), "{err}");
        let err = serde_json::from_str::<CpuSet>("[9000]")
            .unwrap_err()
            .to_string();
        assert!(err.contains("9000"), "{err}");
    }

    #[test]
    fn a_written_list_naming_a_cpu_twice_is_refused() {
        for (text, cpu) in [("1,1,1", 1), ("0-2,1", 1), ("3,0-3", 3)] {
            let err = CpuSet::parse_distinct_list(text).unwrap_err().to_string();
            assert!(err.contains(&format!("lists CPU {cpu} twice")), "{err}");
            assert!(err.contains(text), "{err}");
            // the kernel's files fold them
            assert!(CpuSet::parse_list(text).is_ok());
        }
        assert_eq!(
            CpuSet::parse_distinct_list("0-2,5").unwrap().to_list(),
            "0-2,5"
        );
        assert!(CpuSet::parse_distinct_list(" ").unwrap().is_empty());
        #[derive(serde::Deserialize)]
        struct Key {
            #[serde(deserialize_with = "CpuSet::deserialize_distinct")]
            cpus: CpuSet,
        }
        let err = serde_json::from_str::<Key>(r#"{"cpus":"1,1"}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("lists CPU 1 twice"), "{err}");
        let err = serde_json::from_str::<Key>(r#"{"cpus":[2,2]}"#)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("lists a CPU twice"), "{err}");
        let ok: Key = serde_json::from_str(r#"{"cpus":"0,2-3"}"#).unwrap();
        assert_eq!(ok.cpus.to_vec(), [0, 2, 3]);
    }

    #[test]
    fn set_operations() {
        let a = CpuSet::from([0, 1, 2]);
        let b = CpuSet::from([2, 3]);
        assert_eq!(a.union(&b).to_vec(), [0, 1, 2, 3]);
        assert_eq!(a.intersection(&b).to_vec(), [2]);
        assert_eq!(a.difference(&b).to_vec(), [0, 1]);
        assert_eq!((a.first(), a.last()), (Some(0), Some(2)));
    }
}
