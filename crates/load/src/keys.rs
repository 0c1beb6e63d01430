//! Which record each request touches: uniform over the records (mutilate's only mode) or Zipf
//! popularity (`--popularity zipf:S`, record 0 hottest). Keys themselves come from
//! [`crate::dist::KeyGenerator`] (mutilate's key layout).

use std::str::FromStr;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::dist::Dist;
use crate::error::LoadError;

/// Key popularity: which record each request touches.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Popularity {
    /// Every record equally likely (mutilate's only mode).
    Uniform,
    /// Zipf with exponent S over the records (record 0 hottest).
    Zipf(f64),
}

impl FromStr for Popularity {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Self, LoadError> {
        if s == "uniform" {
            return Ok(Popularity::Uniform);
        }
        if let Some(exp) = s.strip_prefix("zipf:") {
            let v: f64 = exp.parse().map_err(|_| {
                LoadError::invalid("--popularity", s, "zipf exponent is not a number")
            })?;
            if !(v > 0.0 && v.is_finite()) {
                return Err(LoadError::invalid(
                    "--popularity",
                    s,
                    "zipf exponent must be positive",
                ));
            }
            return Ok(Popularity::Zipf(v));
        }
        Err(LoadError::invalid(
            "--popularity",
            s,
            "expected uniform or zipf:S",
        ))
    }
}

/// Draws record indices in `0..records`.
#[derive(Clone, Debug)]
pub enum KeyChooser {
    Uniform(u64),
    Zipf { dist: Dist, records: u64 },
}

impl KeyChooser {
    pub fn new(popularity: Popularity, records: u64) -> Result<KeyChooser, LoadError> {
        let records = records.max(1);
        match popularity {
            Popularity::Uniform => Ok(KeyChooser::Uniform(records)),
            Popularity::Zipf(s) => {
                let dist = Dist::zipf(s, records).map_err(|e| {
                    LoadError::invalid("--popularity", format!("zipf:{s}"), e.to_string())
                })?;
                Ok(KeyChooser::Zipf { dist, records })
            }
        }
    }

    #[inline]
    pub fn choose<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        match self {
            KeyChooser::Uniform(n) => rng.random_range(0..*n),
            KeyChooser::Zipf { dist, records } => (dist.sample(rng) as u64).min(records - 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn uniform_stays_in_range() {
        let c = KeyChooser::new(Popularity::Uniform, 7).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        assert!((0..1000).all(|_| c.choose(&mut rng) < 7));
    }

    #[test]
    fn zipf_prefers_low_records() {
        let c = KeyChooser::new(Popularity::Zipf(1.0), 1000).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let hot = (0..10000).filter(|_| c.choose(&mut rng) < 10).count();
        // H(10)/H(1000) is about 0.39.
        assert!((3300..4500).contains(&hot), "{hot}");
    }
}
