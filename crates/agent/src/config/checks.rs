//! Value checks shared by the config sections: each names the key, the value and the reason.

use std::path::{Component, Path};

use crate::config::{invalid, ConfigError};

/// Refuses cgroup paths that are empty, absolute, or climb out of the cgroup root.
pub fn validate_cgroup_path(key: &str, path: &str) -> Result<(), ConfigError> {
    if path.trim().is_empty() {
        return Err(invalid(key, path, "must not be empty"));
    }
    if path.contains('\0') {
        return Err(invalid(key, path, "contains a NUL byte"));
    }
    let p = Path::new(path);
    for comp in p.components() {
        match comp {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return Err(invalid(key, path, "path escapes the cgroup root"));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(invalid(
                    key,
                    path,
                    "absolute path; give it relative to the cgroup root",
                ));
            }
        }
    }
    if !p.components().any(|c| matches!(c, Component::Normal(_))) {
        return Err(invalid(key, path, "names the cgroup root itself"));
    }
    // What the agent will use: a GroupPath (`./x`, `a//b` and `a/` are refused here, not at start).
    if let Err(e) = headroom_host::GroupPath::new(path) {
        return Err(invalid(key, path, e.to_string()));
    }
    Ok(())
}

pub(crate) fn same_or_nested(a: &str, b: &str) -> bool {
    let norm = |s: &str| -> Vec<String> {
        Path::new(s)
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect()
    };
    let (a, b) = (norm(a), norm(b));
    a.starts_with(&b) || b.starts_with(&a)
}

pub(crate) fn positive(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(invalid(key, v, "must be a finite number > 0"))
    }
}

pub(crate) fn non_negative(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(invalid(key, v, "must be a finite number >= 0"))
    }
}

pub(crate) fn fraction(key: &str, v: f64) -> Result<(), ConfigError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, v, "must be a fraction in [0, 1]"))
    }
}

pub(crate) fn period(key: &str, v: u64) -> Result<(), ConfigError> {
    if (1000..=1_000_000).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, v, "CFS period must be in 1000..=1000000 µs"))
    }
}

pub(crate) fn shares(key: &str, v: u64) -> Result<(), ConfigError> {
    if (2..=262_144).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, v, "cpu.shares must be in 2..=262144"))
    }
}

pub(crate) fn weight_v2(key: &str, v: u64) -> Result<(), ConfigError> {
    if (1..=10_000).contains(&v) {
        Ok(())
    } else {
        Err(invalid(key, v, "cpu.weight must be in 1..=10000"))
    }
}

pub(crate) fn distinct(key: &str, cpus: &[u32]) -> Result<(), ConfigError> {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid(key, cpus, "lists a CPU twice"));
    }
    Ok(())
}

pub(crate) fn require_some(key: &str, v: Option<&str>, when: &str) -> Result<(), ConfigError> {
    match v {
        Some(s) if !s.trim().is_empty() => Ok(()),
        _ => Err(invalid(key, v, format!("required when {when}"))),
    }
}

pub(crate) fn require_address(key: &str, v: Option<&str>) -> Result<(), ConfigError> {
    let Some(addr) = v else {
        return Err(invalid(key, v, "required for this source (host:port)"));
    };
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            key,
            addr,
            "expected host:port, e.g. 127.0.0.1:11211",
        ))
    }
}
