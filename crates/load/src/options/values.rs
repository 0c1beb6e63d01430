//! The values some flags take: the protocol name, `MIN:MAX:STEP` (`--scan`) and `P:TARGET_US`
//! (`--search`).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::LoadError;
use crate::protocol::Protocol;

/// Wire protocol spoken to the servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProtocolKind {
    /// memcached ASCII (`get`/`set`), mutilate's default.
    Memcache,
    /// memcached binary protocol (`--binary`).
    Binary,
    /// RESP (redis) `GET`/`SET`.
    Redis,
}

impl ProtocolKind {
    /// The codec from [`crate::protocol`].
    pub fn protocol(self) -> Protocol {
        match self {
            ProtocolKind::Memcache => Protocol::MemcacheAscii,
            ProtocolKind::Binary => Protocol::MemcacheBinary,
            ProtocolKind::Redis => Protocol::Resp,
        }
    }

    /// Port used when `-s HOST` names none.
    pub fn default_port(self) -> u16 {
        match self {
            ProtocolKind::Memcache | ProtocolKind::Binary => 11211,
            ProtocolKind::Redis => 6379,
        }
    }
}

impl FromStr for ProtocolKind {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Self, LoadError> {
        match s {
            "memcache" | "memcached" | "ascii" => Ok(ProtocolKind::Memcache),
            "binary" => Ok(ProtocolKind::Binary),
            "redis" | "resp" => Ok(ProtocolKind::Redis),
            _ => Err(LoadError::invalid(
                "--protocol",
                s,
                "expected memcache, binary or redis",
            )),
        }
    }
}

/// `--scan MIN:MAX:STEP` (QPS).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScanSpec {
    pub min: u64,
    pub max: u64,
    pub step: u64,
}

impl ScanSpec {
    /// The QPS values of the scan, MIN first, MAX included when the steps land on it.
    pub fn steps(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut q = self.min;
        while q <= self.max {
            out.push(q);
            q += self.step;
        }
        out
    }
}

impl FromStr for ScanSpec {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Self, LoadError> {
        let bad = |why: &str| LoadError::invalid("--scan", s, why);
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 3 {
            return Err(bad("expected MIN:MAX:STEP (QPS), e.g. 10000:50000:10000"));
        }
        let num = |p: &str| {
            p.trim()
                .parse::<u64>()
                .map_err(|_| bad(&format!("{p:?} is not a whole number of QPS")))
        };
        let (min, max, step) = (num(parts[0])?, num(parts[1])?, num(parts[2])?);
        if step == 0 {
            return Err(bad("STEP must be at least 1"));
        }
        if min == 0 || min > max {
            return Err(bad("need 0 < MIN <= MAX"));
        }
        if (max - min) / step >= 1000 {
            return Err(bad("more than 1000 steps"));
        }
        Ok(ScanSpec { min, max, step })
    }
}

/// `--search P:TARGET_US`: the highest QPS whose P-th percentile stays under TARGET_US.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchSpec {
    /// Percentile, 0 < P < 100 (fractional allowed: 99.9).
    pub percentile: f64,
    pub target_us: f64,
}

impl FromStr for SearchSpec {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Self, LoadError> {
        let bad = |why: &str| LoadError::invalid("--search", s, why);
        let (p, t) = s
            .split_once(':')
            .ok_or_else(|| bad("expected P:TARGET_US, e.g. 99.9:500"))?;
        let percentile: f64 = p
            .trim()
            .parse()
            .map_err(|_| bad(&format!("percentile {p:?} is not a number")))?;
        let target_us: f64 = t
            .trim()
            .parse()
            .map_err(|_| bad(&format!("target {t:?} is not a number of microseconds")))?;
        if !(percentile > 0.0 && percentile < 100.0) {
            return Err(bad("percentile must be strictly between 0 and 100"));
        }
        if !(target_us > 0.0 && target_us.is_finite()) {
            return Err(bad("target must be a positive number of microseconds"));
        }
        Ok(SearchSpec {
            percentile,
            target_us,
        })
    }
}
