//! Several LC services (`[[lc]]`): each service's own signals — its latency and load cells,
//! its group's threads and CPU use — and the assembly of `Observation::lc_groups`, one entry per
//! service in the config's order. The first service is also described by the top-level `lc_*`
//! fields (read as for a single LC in [`super::Sensors`]), so single-LC policies protect it.

use std::time::Instant;

use headroom_host::Cgroups;
use headroom_types::observation::LcGroupObservation;
use headroom_types::GroupPath;

use super::lc_signal::Reading;
use super::LcSignals;
use headroom_types::observation::Observation;

/// One LC service other than the first: its name, group and signal cells.
pub struct LcServiceSensor {
    pub name: String,
    pub group: GroupPath,
    pub signals: LcSignals,
    tids: Vec<i32>,
    usage_prev: Option<(Instant, u64)>,
}

impl LcServiceSensor {
    pub fn new(name: &str, group: GroupPath, signals: LcSignals) -> LcServiceSensor {
        LcServiceSensor {
            name: name.to_string(),
            group,
            signals,
            tids: Vec::new(),
            usage_prev: None,
        }
    }

    /// The slow fields (CPUs its threads may use, its group's CPU use since the last slow
    /// sample); `refresh`: re-read the thread list. Errors are returned by sensor name.
    pub(super) fn sample_slow(
        &mut self,
        cgroups: &Cgroups,
        now: Instant,
        refresh: bool,
        errors: &mut Vec<(&'static str, String)>,
    ) -> LcGroupObservation {
        let mut g = LcGroupObservation {
            name: self.name.clone(),
            ..LcGroupObservation::default()
        };
        if refresh || self.tids.is_empty() {
            match cgroups.threads(&self.group) {
                Ok(t) => self.tids = t,
                Err(e) => errors.push(("lc_threads", e.to_string())),
            }
        }
        let mut cpus: Vec<u32> = Vec::new();
        for &tid in &self.tids {
            if let Ok(set) = headroom_host::sched::affinity(tid) {
                cpus.extend(set.iter());
            }
        }
        cpus.sort_unstable();
        cpus.dedup();
        g.cpus = (!cpus.is_empty()).then_some(cpus);
        match cgroups.cpu_usage_ns(&self.group) {
            Ok(ns) => {
                if let Some((t, ns0)) = self.usage_prev {
                    let dt = now.saturating_duration_since(t).as_nanos().max(1) as f64;
                    g.cpu_usage = Some(ns.saturating_sub(ns0) as f64 / dt);
                }
                self.usage_prev = Some((now, ns));
            }
            Err(e) => errors.push(("cgroup_cpu_usage", e.to_string())),
        }
        g
    }

    /// This tick's latency and load into `g` (its slow fields kept).
    pub(super) fn sample_fast(&self, g: &mut LcGroupObservation, now: Instant) {
        let latency = self.signals.latency.as_ref().and_then(|c| c.latest());
        let qps = self.signals.qps.as_ref().and_then(|c| c.latest());
        let sources = self.signals.latency_sources.as_ref().map(|s| s.sources());
        let untrusted = sources.as_ref().and_then(|s| s.untrusted.clone());
        let source = sources
            .map(|s| s.chosen)
            .or_else(|| self.signals.latency_label.map(str::to_string));
        fill_fast(g, latency, source, qps, self.signals.peak_qps, now);
        g.latency_untrusted = latency.and(untrusted);
    }
}

/// The fast fields of one service from its sources' latest readings (pure).
pub fn fill_fast(
    g: &mut LcGroupObservation,
    latency: Option<Reading>,
    source: Option<String>,
    qps: Option<Reading>,
    peak_qps: Option<f64>,
    now: Instant,
) {
    let age = |r: &Reading| now.saturating_duration_since(r.at).as_millis() as u64;
    g.latency_us = latency.map(|r| r.value);
    g.latency_age_ms = latency.as_ref().map(age);
    g.latency_source = latency.and(source);
    g.qps = qps.map(|r| r.value);
    g.load = qps.and_then(|r| peak_qps.filter(|p| *p > 0.0).map(|p| r.value / p));
}

/// The first service's entry, from the top-level fields its sensors filled (pure).
pub fn first_service(
    name: &str,
    obs: &Observation,
    source: Option<String>,
    g: &mut LcGroupObservation,
) {
    g.name.clear();
    g.name.push_str(name);
    g.latency_us = obs.lc_latency_us;
    g.latency_age_ms = obs.lc_latency_age_ms;
    g.latency_source = obs
        .lc_latency_us
        .and(obs.lc_latency_source.clone().or(source));
    g.latency_untrusted = obs.lc_latency_us.and(obs.lc_latency_untrusted.clone());
    g.qps = obs.lc_qps;
    g.load = obs.lc_load;
    g.cpu_usage = obs.lc_cpu_usage;
    g.cpus.clone_from(&obs.lc_cpus);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_service_entry_takes_its_own_readings_and_ages() {
        let now = Instant::now();
        let at = now - Duration::from_millis(250);
        let mut g = LcGroupObservation {
            name: "b".into(),
            cpus: Some(vec![1]),
            cpu_usage: Some(0.5),
            ..Default::default()
        };
        fill_fast(
            &mut g,
            Some(Reading { value: 700.0, at }),
            Some("probe".into()),
            Some(Reading {
                value: 2000.0,
                at: now,
            }),
            Some(10_000.0),
            now,
        );
        assert_eq!(g.latency_us, Some(700.0));
        assert_eq!(g.latency_age_ms, Some(250));
        assert_eq!(g.latency_source.as_deref(), Some("probe"));
        assert_eq!(g.qps, Some(2000.0));
        assert_eq!(g.load, Some(0.2));
        // the slow fields stay
        assert_eq!(g.cpus, Some(vec![1]));
        assert_eq!(g.cpu_usage, Some(0.5));
        // no reading: nothing claimed, no source named, no load without a peak
        fill_fast(&mut g, None, Some("probe".into()), None, None, now);
        assert_eq!(
            (
                g.latency_us,
                g.latency_age_ms,
                g.latency_source,
                g.qps,
                g.load
            ),
            (None, None, None, None, None)
        );
    }

    #[test]
    fn the_first_service_repeats_the_top_level_fields() {
        let obs = Observation {
            lc_latency_us: Some(300.0),
            lc_latency_age_ms: Some(12),
            lc_latency_source: Some("kernel".into()),
            lc_latency_untrusted: Some("the kernel sensor reads 100 µs".into()),
            lc_qps: Some(50.0),
            lc_load: Some(0.5),
            lc_cpu_usage: Some(1.5),
            lc_cpus: Some(vec![0, 1]),
            ..Observation::default()
        };
        let mut g = LcGroupObservation::default();
        first_service("memcached", &obs, Some("probe".into()), &mut g);
        assert_eq!(
            g,
            LcGroupObservation {
                name: "memcached".into(),
                latency_us: Some(300.0),
                latency_age_ms: Some(12),
                latency_source: Some("kernel".into()),
                latency_untrusted: Some("the kernel sensor reads 100 µs".into()),
                qps: Some(50.0),
                load: Some(0.5),
                cpu_usage: Some(1.5),
                cpus: Some(vec![0, 1]),
            }
        );
        // without the kernel sensor the configured source is named
        let obs = Observation {
            lc_latency_source: None,
            ..obs
        };
        first_service("memcached", &obs, Some("probe".into()), &mut g);
        assert_eq!(g.latency_source.as_deref(), Some("probe"));
    }
}
