//! The host's own noise with the LC alone at a low rate: the client's wake-up lateness and the
//! LC's stalls, measured before any experiment so a figure is read above it.

use crate::stats;

/// The low rate the host's noise is measured at (and the capacity's knee anchored on).
pub const LOW_LOAD_QPS: f64 = 2000.0;

/// The host's own noise, measured with the LC alone at [`LOW_LOAD_QPS`] (medians of the valid
/// low-load probes): the load generator's wake-up lateness (its send lag, kernel-stamped, no part
/// of the latency) and the LC's tail where it has no queue (its stalls).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NoiseFloor {
    pub runs: usize,
    pub client_lag_p99_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
}

impl NoiseFloor {
    /// From the baseline's used low-load probes.
    pub fn from_probes(probes: &[headroom_report::model::Probe]) -> NoiseFloor {
        let used: Vec<&headroom_report::model::LoadMetrics> = probes
            .iter()
            .filter(|p| p.purpose == "low load" && p.used && p.metrics.valid)
            .map(|p| &p.metrics)
            .collect();
        let med = |f: &dyn Fn(&headroom_report::model::LoadMetrics) -> Option<f64>| {
            let v: Vec<f64> = used.iter().filter_map(|m| f(m)).collect();
            stats::median(&v)
        };
        NoiseFloor {
            runs: used.len(),
            client_lag_p99_us: med(&|m| m.send_lag_p99_us),
            p50_us: med(&|m| m.p50_us),
            p99_us: med(&|m| m.p99_us),
            p999_us: med(&|m| m.p999_us),
        }
    }

    /// A stall: a request slower than 10 × the median, and at least 1 ms.
    fn stall_us(&self) -> f64 {
        (10.0 * self.p50_us.unwrap_or(0.0)).max(1000.0)
    }

    /// How often the LC stalled, bracketed by the percentiles the probes carry.
    fn stall_rate(&self) -> String {
        let s = self.stall_us();
        match (self.p99_us, self.p999_us) {
            (Some(p99), _) if p99 > s => "more than 1% of requests".into(),
            (_, Some(p999)) if p999 > s => "0.1–1% of requests".into(),
            (_, Some(_)) => "under 0.1% of requests".into(),
            _ => "not measured".into(),
        }
    }

    /// The figures in a phrase.
    pub fn summary(&self) -> String {
        let us = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.0} µs"));
        format!(
            "client wake-up lateness p99 {}; LC p50 {}, p99 {}, p99.9 {}; stalls over {:.0} µs in {}",
            us(self.client_lag_p99_us),
            us(self.p50_us),
            us(self.p99_us),
            us(self.p999_us),
            self.stall_us(),
            self.stall_rate()
        )
    }

    /// The one line the demo and the bench print first.
    pub fn line(&self) -> String {
        format!(
            "host noise at {LOW_LOAD_QPS:.0} QPS, LC alone ({} run{}): {}",
            self.runs,
            if self.runs == 1 { "" } else { "s" },
            self.summary()
        )
    }

    /// The least SLO that the host's noise alone does not violate: the low-load p99.9, and
    /// twice the low-load p99 (a window's p99 at low load rarely passes either).
    pub fn floor_us(&self) -> Option<f64> {
        match (self.p99_us, self.p999_us) {
            (None, None) => None,
            (a, b) => Some((2.0 * a.unwrap_or(0.0)).max(b.unwrap_or(0.0))),
        }
    }

    /// Why this host cannot show a colocation difference, where its noise alone says so.
    pub fn cannot_show(&self) -> Option<String> {
        let lag = self.client_lag_p99_us?;
        (lag > headroom_load::checks::SEND_LAG_P99_MAX_US).then(|| {
            format!(
                "the load generator's own wake-up lateness (send lag p99 {lag:.0} µs at {LOW_LOAD_QPS:.0} QPS) passes its bound ({:.0} µs): its runs are refused here; give it a CPU of its own (--loadgen-cpus)",
                headroom_load::checks::SEND_LAG_P99_MAX_US
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::NoiseFloor;

    #[test]
    fn the_noise_floor_is_read_from_the_used_low_load_probes_and_says_when_it_hides_everything() {
        use headroom_report::model::{LoadMetrics, Probe};
        let probe = |purpose: &str, used: bool, lag: f64, p50: f64, p99: f64, p999: f64| Probe {
            target_qps: 2000.0,
            valid: true,
            used,
            purpose: purpose.into(),
            metrics: LoadMetrics {
                valid: true,
                send_lag_p99_us: Some(lag),
                p50_us: Some(p50),
                p99_us: Some(p99),
                p999_us: Some(p999),
                ..Default::default()
            },
            ..Default::default()
        };
        let probes = vec![
            probe("low load", true, 20.0, 50.0, 300.0, 800.0),
            probe("low load", true, 30.0, 60.0, 400.0, 2500.0),
            probe("low load", true, 40.0, 70.0, 500.0, 3000.0),
            // not used, or another purpose: not part of the floor
            probe("low load", false, 5000.0, 1.0, 1.0, 1.0),
            probe("capacity", true, 5000.0, 1.0, 1.0, 1.0),
        ];
        let n = NoiseFloor::from_probes(&probes);
        assert_eq!(n.runs, 3);
        assert_eq!(n.client_lag_p99_us, Some(30.0));
        assert_eq!(
            (n.p50_us, n.p99_us, n.p999_us),
            (Some(60.0), Some(400.0), Some(2500.0))
        );
        // The floor: the p99.9 (2.5 ms) over twice the p99 (0.8 ms).
        assert_eq!(n.floor_us(), Some(2500.0));
        let line = n.line();
        assert!(line.starts_with("host noise at 2000 QPS, LC alone (3 runs): client wake-up lateness p99 30 µs; LC p50 60 µs, p99 400 µs, p99.9 2500 µs"), "{line}");
        assert!(
            line.contains("stalls over 1000 µs in 0.1–1% of requests"),
            "{line}"
        );
        assert_eq!(n.cannot_show(), None);
        // A client that wakes 1.5 ms late cannot measure here, and it is said.
        let late = NoiseFloor {
            client_lag_p99_us: Some(1500.0),
            ..n.clone()
        };
        assert!(late.cannot_show().unwrap().contains("send lag p99 1500 µs"));
        assert_eq!(NoiseFloor::default().floor_us(), None);
    }
}
