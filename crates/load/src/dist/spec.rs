//! The spec syntax (the table in the module's documentation): parsing a spec into a [`Dist`] and
//! writing one back.

use std::fmt;
use std::str::FromStr;

use super::{Dist, DistError, DEFAULT_RECORDS, DIST_NAMES};

fn parse_number(input: &str, text: &str, what: &str) -> Result<f64, DistError> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(DistError::new(
            input,
            format!("{what} must be a finite number, got \"{text}\""),
        )),
    }
}

impl FromStr for Dist {
    type Err = DistError;

    fn from_str(input: &str) -> Result<Dist, DistError> {
        let spec = input.trim();
        if spec.is_empty() {
            return Err(DistError::new(
                input,
                format!("empty; expected one of {DIST_NAMES}"),
            ));
        }
        if let Ok(v) = spec.parse::<f64>() {
            return if v.is_finite() {
                Ok(Dist::Fixed(v))
            } else {
                Err(DistError::new(input, "a fixed value must be finite"))
            };
        }
        let (name, args) = match spec.split_once(':') {
            Some((n, a)) => (n.trim().to_ascii_lowercase(), Some(a)),
            None => (spec.to_ascii_lowercase(), None),
        };
        let (syntax, names): (&str, &[&str]) = match name.as_str() {
            "fixed" => ("fixed:V", &["V"]),
            "uniform" => ("uniform:MAX", &["MAX"]),
            "normal" => ("normal:M,SD", &["M", "SD"]),
            "exponential" => ("exponential[:L]", &["L"]),
            "pareto" => ("pareto:LOC,SCALE,SHAPE", &["LOC", "SCALE", "SHAPE"]),
            "gev" => ("gev:LOC,SCALE,SHAPE", &["LOC", "SCALE", "SHAPE"]),
            "fb_key" | "fb_value" | "fb_ia" => ("no parameters", &[]),
            "zipf" => ("zipf:S[,N]", &["S", "N"]),
            _ => {
                return Err(DistError::new(
                    input,
                    format!("unknown distribution \"{name}\"; expected one of {DIST_NAMES}"),
                ))
            }
        };
        let parts: Vec<&str> = match args {
            None => Vec::new(),
            Some(a) => a.split(',').collect(),
        };
        let optional_last = matches!(name.as_str(), "exponential" | "zipf");
        let min_args = if optional_last {
            names.len() - 1
        } else {
            names.len()
        };
        if parts.len() < min_args
            || parts.len() > names.len()
            || (args.is_some() && names.is_empty())
        {
            return Err(DistError::new(
                input,
                format!(
                    "{} takes {}; expected {syntax}",
                    name,
                    match names.len() {
                        0 => "no parameters".to_string(),
                        n if min_args != n => format!("{min_args} or {n} parameters"),
                        1 => "1 parameter".to_string(),
                        n => format!("{n} parameters"),
                    }
                ),
            ));
        }
        let mut v = Vec::with_capacity(parts.len());
        for (text, what) in parts.iter().zip(names) {
            v.push(parse_number(input, text, what)?);
        }
        let positive = |x: f64, what: &str| {
            if x > 0.0 {
                Ok(x)
            } else {
                Err(DistError::new(
                    input,
                    format!("{what} must be > 0, got {x}; expected {syntax}"),
                ))
            }
        };
        let dist = match name.as_str() {
            "fixed" => Dist::Fixed(v[0]),
            "uniform" => {
                if v[0] < 0.0 {
                    return Err(DistError::new(input, "MAX must be >= 0"));
                }
                Dist::Uniform { max: v[0] }
            }
            "normal" => {
                if v[1] < 0.0 {
                    return Err(DistError::new(input, "SD must be >= 0"));
                }
                Dist::Normal {
                    mean: v[0],
                    sd: v[1],
                }
            }
            "exponential" => Dist::Exponential {
                lambda: positive(v.first().copied().unwrap_or(1.0), "L")?,
            },
            "pareto" => Dist::Pareto {
                loc: v[0],
                scale: positive(v[1], "SCALE")?,
                shape: v[2],
            },
            "gev" => Dist::Gev {
                loc: v[0],
                scale: positive(v[1], "SCALE")?,
                shape: v[2],
            },
            "fb_key" => Dist::fb_key(),
            "fb_value" => Dist::fb_value(),
            "fb_ia" => Dist::fb_ia(),
            "zipf" => {
                let s = positive(v[0], "S")?;
                let records = match v.get(1) {
                    None => DEFAULT_RECORDS,
                    Some(&n) if n >= 1.0 && n.fract() == 0.0 && n <= u64::MAX as f64 => n as u64,
                    Some(&n) => {
                        return Err(DistError::new(
                            input,
                            format!("N must be a whole number >= 1, got {n}"),
                        ))
                    }
                };
                Dist::zipf(s, records).map_err(|e| DistError::new(input, e.reason))?
            }
            _ => unreachable!("names are matched above"),
        };
        Ok(dist)
    }
}

impl fmt::Display for Dist {
    /// The spec in this module's syntax (parses back to an equal distribution).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dist::Fixed(v) => write!(f, "fixed:{v}"),
            Dist::Uniform { max } => write!(f, "uniform:{max}"),
            Dist::Normal { mean, sd } => write!(f, "normal:{mean},{sd}"),
            Dist::Exponential { lambda } => write!(f, "exponential:{lambda}"),
            Dist::Pareto { loc, scale, shape } => write!(f, "pareto:{loc},{scale},{shape}"),
            Dist::Gev { loc, scale, shape } => write!(f, "gev:{loc},{scale},{shape}"),
            d @ Dist::Discrete { .. } if *d == Dist::fb_value() => f.write_str("fb_value"),
            Dist::Discrete { table, rest } => {
                // Not expressible in the spec syntax; a readable form for logs.
                write!(f, "discrete{table:?}+{rest}")
            }
            Dist::Zipf(z) => write!(f, "zipf:{},{}", z.exponent(), z.records()),
        }
    }
}
