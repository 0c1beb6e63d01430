//! The tools' own flag values that clap's built-in parsers do not check: each refusal names the
//! value and the bound it broke (clap adds the flag).

use std::path::PathBuf;

/// A flag value out of its range or of the wrong kind.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FlagValueError {
    #[error("{value:?} is not a positive number")]
    NotPositive { value: String },
    #[error("{value:?} is above {max} {unit}")]
    Above {
        value: String,
        max: f64,
        unit: &'static str,
    },
    #[error("{value:?} is outside {lo}..={hi} s")]
    Outside { value: String, lo: f64, hi: f64 },
    #[error("{value:?} is not a count of at least 1")]
    NotACount { value: String },
    #[error("{value} is not a file")]
    NotAFile { value: String },
}

/// The largest value any of the tools' numbers takes (seconds, QPS, µs, CPUs): beyond it a
/// value is a typo, and a duration of `1e300` s overflowed the clock where it was used.
pub const MAX_FLAG_VALUE: f64 = 1e9;

/// A finite number above 0, at most [`MAX_FLAG_VALUE`].
pub fn positive_f64(s: &str) -> Result<f64, FlagValueError> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= MAX_FLAG_VALUE => Ok(v),
        Ok(v) if v.is_finite() && v > 0.0 => Err(FlagValueError::Above {
            value: s.into(),
            max: MAX_FLAG_VALUE,
            unit: "(no tool's figure is larger)",
        }),
        _ => Err(FlagValueError::NotPositive { value: s.into() }),
    }
}

/// A positive number at most `max` (`unit` names what it counts).
pub fn positive_at_most(s: &str, max: f64, unit: &'static str) -> Result<f64, FlagValueError> {
    let v = positive_f64(s)?;
    if v <= max {
        Ok(v)
    } else {
        Err(FlagValueError::Above {
            value: s.into(),
            max,
            unit,
        })
    }
}

/// A number of seconds in `lo..=hi`.
pub fn seconds_in(s: &str, lo: f64, hi: f64) -> Result<f64, FlagValueError> {
    let v = positive_f64(s)?;
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(FlagValueError::Outside {
            value: s.into(),
            lo,
            hi,
        })
    }
}

/// A count of at least 1.
pub fn at_least_one(s: &str) -> Result<usize, FlagValueError> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(FlagValueError::NotACount { value: s.into() }),
    }
}

/// A path to a file that exists.
pub fn existing_file(s: &str) -> Result<PathBuf, FlagValueError> {
    let p = PathBuf::from(s);
    if p.is_file() {
        Ok(p)
    } else {
        Err(FlagValueError::NotAFile { value: s.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_names_the_value_and_the_bound() {
        assert_eq!(positive_f64("2.5"), Ok(2.5));
        for bad in ["0", "-1", "nan", "inf", "x", "1e300"] {
            assert!(positive_f64(bad).is_err(), "{bad}");
        }
        assert!(positive_f64("1e300")
            .unwrap_err()
            .to_string()
            .contains("above 1000000000"));
        let e = positive_at_most("200000", 100_000.0, "Hz").unwrap_err();
        assert_eq!(e.to_string(), "\"200000\" is above 100000 Hz");
        assert_eq!(seconds_in("5", 5.0, 3600.0), Ok(5.0));
        let e = seconds_in("4", 5.0, 3600.0).unwrap_err();
        assert_eq!(e.to_string(), "\"4\" is outside 5..=3600 s");
        assert_eq!(at_least_one("3"), Ok(3));
        assert!(at_least_one("0").is_err() && at_least_one("-2").is_err());
        assert!(existing_file("/no/such/file").is_err());
    }
}
