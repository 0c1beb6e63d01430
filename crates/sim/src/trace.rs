//! LC load over the day: the built-in Heracles-style diurnal day or a CSV trace, and the per-server
//! view of it (a phase shift, a scale and AR(1) noise drawn from the server's seed).

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::SimError;

/// Seconds in a day.
pub const DAY_S: f64 = 86_400.0;

/// The fleet's load shape, as a fraction of each server's peak.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadTrace {
    /// A smooth day: `min` at 04:00, `max` at 16:00 (Heracles Fig. 9's websearch shape).
    Diurnal { min: f64, max: f64 },
    /// `(seconds, load)` points, linearly interpolated, repeated after the last point.
    Points(Vec<(f64, f64)>),
}

impl Default for LoadTrace {
    fn default() -> Self {
        LoadTrace::Diurnal { min: 0.2, max: 0.9 }
    }
}

impl LoadTrace {
    /// The load at `t_s` seconds since midnight.
    pub fn at(&self, t_s: f64) -> f64 {
        match self {
            LoadTrace::Diurnal { min, max } => {
                let day = t_s.rem_euclid(DAY_S) / 3600.0;
                // cosine trough at 4 h, crest at 16 h
                let phase = (day - 16.0) / 24.0 * std::f64::consts::TAU;
                min + (max - min) * 0.5 * (1.0 + phase.cos())
            }
            LoadTrace::Points(p) => {
                let end = p.last().map_or(1.0, |l| l.0).max(1.0);
                let t = t_s.rem_euclid(end);
                let i = p.partition_point(|(ts, _)| *ts <= t);
                match (i.checked_sub(1).map(|j| p[j]), p.get(i)) {
                    (Some((t0, l0)), Some(&(t1, l1))) if t1 > t0 => {
                        l0 + (l1 - l0) * (t - t0) / (t1 - t0)
                    }
                    (Some((_, l0)), _) => l0,
                    (None, Some(&(_, l1))) => l1,
                    (None, None) => 0.0,
                }
            }
        }
    }

    /// The highest load of the trace (before per-server noise).
    pub fn max_load(&self) -> f64 {
        match self {
            LoadTrace::Diurnal { max, .. } => *max,
            LoadTrace::Points(p) => p.iter().map(|x| x.1).fold(0.0, f64::max),
        }
    }

    /// Reads a CSV trace: a header `t_s,load`, then one `seconds,load` row per line (load as a
    /// fraction of peak, 0..=1.5; times increasing); `#` starts a comment.
    pub fn from_csv_file(path: &Path) -> Result<LoadTrace, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::io(path, e))?;
        Self::from_csv_str(&text).map_err(|e| e.in_file(path))
    }

    pub fn from_csv_str(text: &str) -> Result<LoadTrace, SimError> {
        let err = |line: usize, reason: String| SimError::Parse {
            file: None,
            line: Some(line),
            reason,
        };
        let mut points: Vec<(f64, f64)> = Vec::new();
        let mut header = false;
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let cols: Vec<&str> = line.split(',').map(str::trim).collect();
            if !header {
                if cols != ["t_s", "load"] {
                    return Err(err(
                        n,
                        format!("expected the header `t_s,load`, found `{line}`"),
                    ));
                }
                header = true;
                continue;
            }
            if cols.len() != 2 {
                return Err(err(
                    n,
                    format!("expected 2 columns (t_s,load), found {}", cols.len()),
                ));
            }
            let t: f64 = cols[0]
                .parse()
                .map_err(|_| err(n, format!("t_s `{}` is not a number", cols[0])))?;
            let l: f64 = cols[1]
                .parse()
                .map_err(|_| err(n, format!("load `{}` is not a number", cols[1])))?;
            if !(t.is_finite() && t >= 0.0) {
                return Err(err(n, format!("t_s {t} must be >= 0")));
            }
            if !(0.0..=1.5).contains(&l) {
                return Err(err(
                    n,
                    format!("load {l} must be a fraction of peak in 0..=1.5"),
                ));
            }
            if points.last().is_some_and(|p| p.0 >= t) {
                return Err(err(n, format!("t_s {t} does not increase")));
            }
            points.push((t, l));
        }
        if points.len() < 2 {
            return Err(SimError::Parse {
                file: None,
                line: None,
                reason: "a trace needs at least 2 rows after the `t_s,load` header".to_string(),
            });
        }
        Ok(LoadTrace::Points(points))
    }
}

/// One server's load: the fleet trace shifted, scaled, and with AR(1) noise.
#[derive(Debug, Clone)]
pub struct ServerLoad {
    phase_s: f64,
    scale: f64,
    noise_sd: f64,
    /// AR(1) correlation per tick.
    rho: f64,
    noise: f64,
    rng: ChaCha8Rng,
}

impl ServerLoad {
    /// Per-server variation from `seed`: ±30 min phase and ±5 % scale where `vary` (else the
    /// trace as it is), noise of `noise_sd` (fraction of peak) with a 2-minute correlation
    /// time, sampled every `tick_s`.
    pub fn new(seed: u64, noise_sd: f64, tick_s: f64, vary: bool) -> ServerLoad {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_10ad);
        let phase_s = rng.random_range(-1800.0..1800.0);
        let scale = rng.random_range(0.95..1.05);
        let (phase_s, scale) = if vary { (phase_s, scale) } else { (0.0, 1.0) };
        ServerLoad {
            phase_s,
            scale,
            noise_sd,
            rho: (-tick_s / 120.0).exp(),
            noise: 0.0,
            rng,
        }
    }

    /// The load of the next tick, at `t_s` (call once per tick, in order).
    pub fn next(&mut self, trace: &LoadTrace, t_s: f64) -> f64 {
        // Box–Muller from two uniforms: deterministic per seed, no extra crate
        let u1: f64 = self.rng.random::<f64>().max(1e-300);
        let u2: f64 = self.rng.random();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        self.noise = self.rho * self.noise + (1.0 - self.rho * self.rho).sqrt() * self.noise_sd * z;
        (trace.at(t_s + self.phase_s) * self.scale + self.noise).clamp(0.01, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replay's trace is the run's own: no per-server phase or scale.
    #[test]
    fn a_server_load_without_variation_is_the_trace_itself() {
        let t = LoadTrace::Points(vec![(0.0, 0.2), (15.0, 0.4), (30.0, 0.9), (45.0, 0.5)]);
        for seed in 0..20 {
            let mut exact = ServerLoad::new(seed, 0.0, 5.0, false);
            let mut varied = ServerLoad::new(seed, 0.0, 5.0, true);
            let mut differs = false;
            for i in 0..9 {
                let ts = i as f64 * 5.0;
                assert!((exact.next(&t, ts) - t.at(ts)).abs() < 1e-12);
                differs |= (varied.next(&t, ts) - t.at(ts)).abs() > 1e-6;
            }
            assert!(differs, "seed {seed}: a fleet server's trace is its own");
        }
    }

    #[test]
    fn diurnal_has_its_trough_and_crest() {
        let d = LoadTrace::default();
        assert!((d.at(4.0 * 3600.0) - 0.2).abs() < 1e-9);
        assert!((d.at(16.0 * 3600.0) - 0.9).abs() < 1e-9);
    }

    #[test]
    fn csv_interpolates_and_names_bad_lines() {
        let t = LoadTrace::from_csv_str("# day\nt_s,load\n0,0.2\n100,0.4\n").unwrap();
        assert!((t.at(50.0) - 0.3).abs() < 1e-9);
        let e = LoadTrace::from_csv_str("t_s,load\n0,0.2\n10,abc\n").unwrap_err();
        assert_eq!(e.to_string(), "line 3: load `abc` is not a number");
        let e = LoadTrace::from_csv_str("t_s,load\n5,0.2\n5,0.3\n").unwrap_err();
        assert!(e.to_string().contains("line 3"), "{e}");
        assert!(LoadTrace::from_csv_str("time,qps\n").is_err());
    }
}
