//! Value checks shared by the config sections: each names the key, the value and the reason.

use crate::config::error::{invalid, ConfigError, TOO_LARGE};

/// The largest number any key accepts: far above every sane value, and small enough that a
/// duration made of it (seconds, µs) cannot overflow an instant or a counter.
pub(crate) const MAX_NUMBER: f64 = 1e12;

pub(crate) fn positive(key: &str, v: f64) -> Result<(), ConfigError> {
    if !(v.is_finite() && v > 0.0) {
        Err(invalid(key, v, "must be a finite number > 0"))
    } else if v > MAX_NUMBER {
        Err(invalid(key, v, TOO_LARGE))
    } else {
        Ok(())
    }
}

/// The shortest policy interval (`policy.*.interval_s`, heracles' `cores_`, `power_` and
/// `net_interval_s`): 1 ms, the control loop's own floor (it ticks at most once per ms). Below
/// it an interval was taken and ticked once per ms without a word (hostile pass 12). The papers'
/// intervals are 1 s and more (Heracles 15, 2, 2, 1 s; Parties-style weights 5 s).
pub(crate) const MIN_INTERVAL_S: f64 = 0.001;

/// A policy interval, seconds: finite, at least [`MIN_INTERVAL_S`], at most `MAX_NUMBER`.
pub(crate) fn interval(key: &str, v: f64) -> Result<(), ConfigError> {
    positive(key, v)?;
    if v < MIN_INTERVAL_S {
        Err(invalid(
            key,
            v,
            format!(
                "must be at least {MIN_INTERVAL_S} s (1 ms: the control loop ticks at most once \
                 per ms, so a shorter interval would not be kept)"
            ),
        ))
    } else {
        Ok(())
    }
}

/// An SLO latency window, seconds (`lc.slo.window_s`, `kubernetes.window_s`): finite, at least
/// [`MIN_INTERVAL_S`] (the floor the policy intervals got in pass 12; `window_s = 1e-300` was
/// taken, a window no loop tick could close, hostile passes 14 and 15 "Found, not fixed").
pub(crate) fn window(key: &str, v: f64) -> Result<(), ConfigError> {
    positive(key, v)?;
    if v < MIN_INTERVAL_S {
        Err(invalid(
            key,
            v,
            format!(
                "must be at least {MIN_INTERVAL_S} s (1 ms: the control loop ticks at most once \
                 per ms, so a shorter window would hold no tick's latency)"
            ),
        ))
    } else {
        Ok(())
    }
}

pub(crate) fn non_negative(key: &str, v: f64) -> Result<(), ConfigError> {
    if !(v.is_finite() && v >= 0.0) {
        Err(invalid(key, v, "must be a finite number >= 0"))
    } else if v > MAX_NUMBER {
        Err(invalid(key, v, TOO_LARGE))
    } else {
        Ok(())
    }
}

/// A duration in seconds: finite, in `0..=max_s`.
pub(crate) fn duration_s(key: &str, v: f64, max_s: f64, what: &str) -> Result<(), ConfigError> {
    if v.is_finite() && (0.0..=max_s).contains(&v) {
        Ok(())
    } else {
        Err(invalid(
            key,
            v,
            format!("must be in 0..={max_s} s ({what})"),
        ))
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
