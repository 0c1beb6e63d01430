//! The LC services of a multi-service server (`sim fleet --services F`): a TOML file of
//! `[[service]]` tables, each with its own service time, SLO, share of the server and trace
//! offset.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::queue::ServiceDist;

/// One LC service of a server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceSpec {
    /// `[[lc]] name` in the simulated agent's config.
    pub name: String,
    /// Mean CPU time per request at full frequency, alone, µs.
    pub service_us: f64,
    /// Coefficient of variation of the service time.
    pub service_cv: f64,
    /// Tail-latency SLO, µs, at `percentile`.
    pub slo_us: f64,
    pub percentile: f64,
    /// The service's peak as a share of its peak alone on the server (the shares of a server's
    /// services sum to at most 1: at every service's peak at once the server is full).
    pub share: f64,
    /// The day's trace shifted by this many hours (its crest comes this much later).
    pub offset_h: f64,
    /// `[[lc]] priority` (higher = more important).
    pub priority: i32,
}

impl Default for ServiceSpec {
    fn default() -> Self {
        ServiceSpec {
            name: String::new(),
            service_us: 25.0,
            service_cv: 0.6,
            slo_us: 500.0,
            percentile: 99.0,
            share: 0.3,
            offset_h: 0.0,
            priority: 0,
        }
    }
}

impl ServiceSpec {
    pub fn dist(&self) -> ServiceDist {
        ServiceDist::with_mean_cv(self.service_us, self.service_cv)
    }
}

/// `--services F`: the services every server of the fleet hosts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicesFile {
    pub service: Vec<ServiceSpec>,
}

impl ServicesFile {
    pub fn from_file(path: &Path) -> Result<ServicesFile, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
        Self::from_toml_str(&text).map_err(|e| e.in_file(path))
    }

    /// Parses and checks the file; errors name the key (or line) and the reason.
    pub fn from_toml_str(text: &str) -> Result<ServicesFile, SimError> {
        let f: ServicesFile = toml::from_str(text).map_err(|e| SimError::Parse {
            file: None,
            line: e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1),
            reason: e.message().to_string(),
        })?;
        f.validate()?;
        Ok(f)
    }

    fn validate(&self) -> Result<(), SimError> {
        if self.service.is_empty() {
            return Err(SimError::invalid(
                "service",
                "[]",
                "needs at least one [[service]]",
            ));
        }
        let mut share = 0.0;
        for (i, s) in self.service.iter().enumerate() {
            let key = |k: &str| format!("service[{i}].{k}");
            let name_ok = !s.name.is_empty()
                && s.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !name_ok {
                return Err(SimError::invalid(
                    &key("name"),
                    format!("{:?}", s.name),
                    "must be non-empty: letters, digits, - and _ (it names a cgroup)",
                ));
            }
            if self.service[..i].iter().any(|o| o.name == s.name) {
                return Err(SimError::invalid(
                    &key("name"),
                    &s.name,
                    "names a service twice",
                ));
            }
            for (k, v) in [("service_us", s.service_us), ("slo_us", s.slo_us)] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(SimError::invalid(&key(k), v, "must be > 0"));
                }
            }
            if !(s.service_cv.is_finite() && s.service_cv >= 0.0) {
                return Err(SimError::invalid(
                    &key("service_cv"),
                    s.service_cv,
                    "must be >= 0",
                ));
            }
            if !(s.percentile > 0.0 && s.percentile < 100.0) {
                return Err(SimError::invalid(
                    &key("percentile"),
                    s.percentile,
                    "must be in (0, 100)",
                ));
            }
            if !(s.share > 0.0 && s.share <= 1.0) {
                return Err(SimError::invalid(
                    &key("share"),
                    s.share,
                    "must be in (0, 1]",
                ));
            }
            if !s.offset_h.is_finite() {
                return Err(SimError::invalid(
                    &key("offset_h"),
                    s.offset_h,
                    "must be a number of hours",
                ));
            }
            share += s.share;
        }
        if share > 1.0 + 1e-9 {
            return Err(SimError::invalid(
                "service.share",
                format!("{share:.3}"),
                "the shares sum to more than 1: the services' peaks at once would exceed the server",
            ));
        }
        Ok(())
    }
}

/// The mix of several services' requests in one queue: mean and coefficient of variation of
/// the service time over the request-weighted services (`rates[i]` requests/s of `specs[i]`).
pub fn mixed_service(specs: &[ServiceSpec], rates: &[f64]) -> ServiceDist {
    let total: f64 = rates.iter().sum();
    if total <= 0.0 {
        return specs[0].dist();
    }
    let (mut m1, mut m2) = (0.0, 0.0);
    for (s, r) in specs.iter().zip(rates) {
        let w = r / total;
        m1 += w * s.service_us;
        m2 += w * s.service_us * s.service_us * (1.0 + s.service_cv * s.service_cv);
    }
    let cv = ((m2 / (m1 * m1)) - 1.0).max(0.0).sqrt();
    ServiceDist::with_mean_cv(m1, cv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_files_naming_the_key() {
        let e = ServicesFile::from_toml_str(
            "[[service]]\nname = \"a\"\nshare = 0.7\n[[service]]\nname = \"b\"\nshare = 0.5\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("service.share"), "{e}");
        let e =
            ServicesFile::from_toml_str("[[service]]\nname = \"a\"\n[[service]]\nname = \"a\"\n")
                .unwrap_err();
        assert!(e.to_string().contains("service[1].name"), "{e}");
        let e = ServicesFile::from_toml_str("[[service]]\nname = \"a\"\nslo = 3\n").unwrap_err();
        assert!(e.to_string().contains("slo"), "{e}");
    }

    #[test]
    fn the_mix_of_one_service_is_that_service() {
        let s = ServiceSpec {
            name: "a".into(),
            ..ServiceSpec::default()
        };
        let m = mixed_service(&[s.clone(), s.clone()], &[3.0, 1.0]);
        assert!((m.mean_us() - 25.0).abs() < 1e-9);
        assert!((m.scv() - 0.36).abs() < 1e-6, "{}", m.scv());
    }
}
