//! Prometheus metrics of the agent (prometheus-client), served by a tiny HTTP/1.1 responder
//! (`scrape_server`, `api.metrics`, 127.0.0.1:9464 by default). The loop updates atomics only;
//! encoding happens in the server thread when scraped. The metrics are made and named in
//! `registry.rs`.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use headroom_control::advertise::Resource;
use headroom_types::allocation::Allocation;
use headroom_types::observation::Observation;

mod registry;

type F64Gauge = Gauge<f64, AtomicU64>;
type Labels = Vec<(String, String)>;

/// The agent's metrics.
#[derive(Clone)]
pub struct Metrics {
    pub lc_latency_us: F64Gauge,
    /// The kernel sensor's and the prober's figures side by side (`source` label), µs.
    pub lc_latency_by_source_us: Family<Labels, F64Gauge>,
    pub lc_slo_us: F64Gauge,
    pub lc_slack: F64Gauge,
    pub lc_load: F64Gauge,
    pub lc_qps: F64Gauge,
    pub idle_cpus: F64Gauge,
    /// Measured CPU use of the LC and BE groups (CPUs), and the machine's CPU count.
    pub lc_cpu_usage: F64Gauge,
    pub be_cpu_usage: F64Gauge,
    pub cpus: F64Gauge,
    /// `[kubernetes] discover`: pods refused as LCs now, and refusals since start.
    pub kube_refused: F64Gauge,
    pub kube_refusals_total: F64Gauge,
    /// `[kubernetes] discover`: discovered LC pods now.
    pub kube_lcs: F64Gauge,
    pub be_enabled: F64Gauge,
    pub be_cpus: F64Gauge,
    pub be_cpu_weight: F64Gauge,
    pub be_cpu_idle: F64Gauge,
    pub be_quota_pct: F64Gauge,
    pub be_llc_ways: F64Gauge,
    pub be_egress_ceil_bytes_per_s: F64Gauge,
    pub actuating: F64Gauge,
    pub paused: F64Gauge,
    pub decisions: Family<Labels, Counter>,
    pub sensor_errors: Family<Labels, Counter>,
    /// 1 for the reason BE is held off for lack of a trustworthy latency signal now, 0 for
    /// the others seen (`headroom_be_held_off_reason{reason}`).
    pub be_held_off: Family<Labels, F64Gauge>,
    /// The reason last set in `be_held_off` (`Some(None)`: none; `None`: never set): the
    /// gauges are rewritten only when it changes (every slow pass rebuilt each label set).
    held_off_shown: Arc<Mutex<Option<Option<String>>>>,
    /// `[kubernetes] advertise`: the value advertised, milli-CPUs, on its reason's label (0 on
    /// the other reasons', so a sum over labels is the value).
    pub be_cpu_advertised: Family<Labels, F64Gauge>,
    /// The same for `headroom.io/be-memory`, bytes.
    pub be_memory_advertised: Family<Labels, F64Gauge>,
    pub writes: Counter,
    pub write_errors: Counter,
    pub drift_repairs: Counter,
    pub be_restarts: Counter,
    /// Failed writes of the state file (a kill -9 while they fail leaves the next start blind).
    pub state_write_errors: Counter,
    pub loop_seconds: Histogram,
    /// Per LC service (`lc` label = `[[lc]] name`; one series with a single LC too): latency
    /// at its SLO percentile, its SLO, slack, qps, load, CPU use and CPUs, and latency by source
    /// (`lc`, `source`). The unlabelled `headroom_lc_*` series stay the first service's.
    pub lc_service: LcServiceFamilies,
    /// 1 for the service whose slack bound the last decision, 0 for the others.
    pub binding_lc: Family<Labels, F64Gauge>,
    /// What the loop last set (one lock per tick instead of a store into every metric).
    last: std::sync::Arc<std::sync::Mutex<TickCache>>,
}

/// What [`Metrics::observe_tick`] last set.
#[derive(Default)]
struct TickCache {
    /// The counter of the last reason, so a steady reason costs no label lookup per tick.
    reason: Option<(String, Counter)>,
    /// The bits last stored into the observation gauges (`lc_latency_us`, `lc_slo_us`,
    /// `lc_slack`, `lc_load`, `lc_qps`, `idle_cpus`); `None` = store them all.
    obs_gauges: Option<[u64; 8]>,
    /// Each service's gauges, looked up once (a label lookup per tick would cost a lock and
    /// an allocation per series).
    services: Vec<ServiceGauges>,
    /// The binding service last set.
    binding: Option<Option<String>>,
}

/// The per-service families (`lc` label).
#[derive(Clone, Default)]
pub struct LcServiceFamilies {
    pub latency_us: Family<Labels, F64Gauge>,
    pub slo_us: Family<Labels, F64Gauge>,
    pub slack: Family<Labels, F64Gauge>,
    pub qps: Family<Labels, F64Gauge>,
    pub load: Family<Labels, F64Gauge>,
    pub cpu_usage: Family<Labels, F64Gauge>,
    pub cpus: Family<Labels, F64Gauge>,
    pub latency_by_source_us: Family<Labels, F64Gauge>,
}

/// One service's gauges: latency, SLO, slack, qps, load, CPU use, CPUs.
struct ServiceGauges {
    name: String,
    gauges: [F64Gauge; 7],
}

/// One LC service as the metrics see it: its name and SLO target, µs.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceSlo {
    pub name: String,
    pub slo_us: f64,
}

impl Metrics {
    /// Updates the gauges from one tick.
    pub fn observe(&self, obs: &Observation, allocation: &Allocation, slo_us: f64, reason: &str) {
        self.last.lock().expect("metrics lock").obs_gauges = None;
        self.observe_tick(obs, allocation, true, slo_us, reason);
    }

    /// [`Metrics::observe`] for the control loop: the allocation's gauges are only set when
    /// `allocation_changed`, and an observation gauge only when its value differs from the one
    /// last set (otherwise they would be set to the values they hold already).
    pub fn observe_tick(
        &self,
        obs: &Observation,
        allocation: &Allocation,
        allocation_changed: bool,
        slo_us: f64,
        reason: &str,
    ) {
        let opt = |v: Option<f64>| v.unwrap_or(f64::NAN);
        let values = [
            opt(obs.lc_latency_us),
            slo_us,
            opt(obs.slack(slo_us)),
            opt(obs.lc_load),
            opt(obs.lc_qps),
            opt(obs.idle_cpu_count(0.5)),
            opt(obs.lc_cpu_usage),
            opt(obs.be_cpu_usage),
        ];
        let gauges = [
            &self.lc_latency_us,
            &self.lc_slo_us,
            &self.lc_slack,
            &self.lc_load,
            &self.lc_qps,
            &self.idle_cpus,
            &self.lc_cpu_usage,
            &self.be_cpu_usage,
        ];
        let mut last = self.last.lock().expect("metrics lock");
        let bits = values.map(f64::to_bits);
        match &mut last.obs_gauges {
            Some(prev) => {
                for (((p, b), g), v) in prev.iter_mut().zip(bits).zip(gauges).zip(values) {
                    if *p != b {
                        g.set(v);
                        *p = b;
                    }
                }
            }
            None => {
                for (g, v) in gauges.iter().zip(values) {
                    g.set(v);
                }
                last.obs_gauges = Some(bits);
            }
        }
        if obs.lc_latency_source.is_some() {
            for (source, v) in [
                ("kernel", obs.lc_latency_kernel_us),
                ("probe", obs.lc_latency_probe_us),
            ] {
                self.lc_latency_by_source_us
                    .get_or_create(&vec![("source".to_string(), source.to_string())])
                    .set(v.unwrap_or(f64::NAN));
            }
        }
        if allocation_changed {
            self.observe_allocation(allocation);
        }
        self.count_decision(&mut last.reason, reason);
    }

    /// Sets the per-service series from one tick: from `obs.lc_groups` (several services, in
    /// `services`' order) or, with one service, from the top-level fields; and which service
    /// bound the decision.
    pub fn observe_services(
        &self,
        services: &[ServiceSlo],
        obs: &Observation,
        binding: Option<&str>,
    ) {
        let mut last = self.last.lock().expect("metrics lock");
        if last.services.len() != services.len()
            || last
                .services
                .iter()
                .zip(services)
                .any(|(g, s)| g.name != s.name)
        {
            last.services = services
                .iter()
                .map(|s| {
                    let f = &self.lc_service;
                    let l = vec![("lc".to_string(), s.name.clone())];
                    let g = |fam: &Family<Labels, F64Gauge>| fam.get_or_create(&l).clone();
                    ServiceGauges {
                        name: s.name.clone(),
                        gauges: [
                            g(&f.latency_us),
                            g(&f.slo_us),
                            g(&f.slack),
                            g(&f.qps),
                            g(&f.load),
                            g(&f.cpu_usage),
                            g(&f.cpus),
                        ],
                    }
                })
                .collect();
        }
        let opt = |v: Option<f64>| v.unwrap_or(f64::NAN);
        for (i, (s, g)) in services.iter().zip(&last.services).enumerate() {
            let (latency, qps, load, usage, cpus, source) = match obs.lc_groups.get(i) {
                Some(e) if !obs.lc_groups.is_empty() && services.len() > 1 => (
                    e.latency_us,
                    e.qps,
                    e.load,
                    e.cpu_usage,
                    e.cpus.as_ref().map(|c| c.len() as f64),
                    e.latency_source.as_deref(),
                ),
                _ => (
                    obs.lc_latency_us,
                    obs.lc_qps,
                    obs.lc_load,
                    obs.lc_cpu_usage,
                    obs.lc_cpus.as_ref().map(|c| c.len() as f64),
                    obs.lc_latency_source.as_deref(),
                ),
            };
            let slack = latency
                .filter(|_| s.slo_us > 0.0)
                .map(|l| (s.slo_us - l) / s.slo_us);
            let values = [
                opt(latency),
                s.slo_us,
                opt(slack),
                opt(qps),
                opt(load),
                opt(usage),
                opt(cpus),
            ];
            for (gauge, v) in g.gauges.iter().zip(values) {
                gauge.set(v);
            }
            // The first service's kernel sensor and prober side by side; every other source
            // under its own name.
            if i == 0 && obs.lc_latency_source.is_some() {
                for (src, v) in [
                    ("kernel", obs.lc_latency_kernel_us),
                    ("probe", obs.lc_latency_probe_us),
                ] {
                    self.lc_service
                        .latency_by_source_us
                        .get_or_create(&vec![
                            ("lc".to_string(), s.name.clone()),
                            ("source".to_string(), src.to_string()),
                        ])
                        .set(opt(v));
                }
            } else if let (Some(src), Some(v)) = (source, latency) {
                self.lc_service
                    .latency_by_source_us
                    .get_or_create(&vec![
                        ("lc".to_string(), s.name.clone()),
                        ("source".to_string(), src.to_string()),
                    ])
                    .set(v);
            }
        }
        let binding = binding.map(str::to_string);
        if last.binding.as_ref() != Some(&binding) {
            for s in services {
                let v = if binding.as_deref() == Some(s.name.as_str()) {
                    1.0
                } else {
                    0.0
                };
                self.binding_lc
                    .get_or_create(&vec![("lc".to_string(), s.name.clone())])
                    .set(v);
            }
            last.binding = Some(binding);
        }
    }

    fn observe_allocation(&self, allocation: &Allocation) {
        self.be_enabled
            .set(if allocation.be_enabled { 1.0 } else { 0.0 });
        self.be_cpus
            .set(match (&allocation.be_cpus, allocation.be_enabled) {
                (_, false) => 0.0,
                (Some(c), true) => c.len() as f64,
                (None, true) => -1.0,
            });
        self.be_cpu_weight
            .set(allocation.be_cpu_weight.map_or(-1.0, |w| w.shares as f64));
        self.be_cpu_idle
            .set(if allocation.be_cpu_idle == Some(true) {
                1.0
            } else {
                0.0
            });
        self.be_quota_pct
            .set(allocation.be_quota_pct.unwrap_or(-1.0));
        self.be_llc_ways
            .set(allocation.be_llc_ways.map_or(-1.0, f64::from));
        self.be_egress_ceil_bytes_per_s.set(
            allocation
                .be_egress_ceil_bytes_per_s
                .map_or(-1.0, |v| v as f64),
        );
    }

    fn count_decision(&self, last: &mut Option<(String, Counter)>, reason: &str) {
        match last.as_ref() {
            Some((r, c)) if r == reason => {
                c.inc();
            }
            _ => {
                let c = self
                    .decisions
                    .get_or_create(&vec![("reason".to_string(), reason.to_string())])
                    .clone();
                c.inc();
                *last = Some((reason.to_string(), c));
            }
        }
    }

    /// Sets a sensor's error count (the sensors keep the totals).
    pub fn sensor_errors_total(&self, sensor: &str, total: u64) {
        let c = self
            .sensor_errors
            .get_or_create(&vec![("sensor".to_string(), sensor.to_string())]);
        let now = c.get();
        if total > now {
            c.inc_by(total - now);
        }
    }
}

impl Metrics {
    /// Sets `headroom_be_held_off_reason`: 1 for `reason` (none: BE is not held off), 0 for
    /// every other reason seen.
    pub fn be_held_off_reason(&self, reason: Option<&str>, seen: &[&str]) {
        if let Ok(mut shown) = self.held_off_shown.lock() {
            if shown.as_ref().is_some_and(|s| s.as_deref() == reason) {
                return;
            }
            *shown = Some(reason.map(str::to_string));
        }
        for r in seen {
            let v = if Some(*r) == reason { 1.0 } else { 0.0 };
            self.be_held_off
                .get_or_create(&vec![("reason".to_string(), (*r).to_string())])
                .set(v);
        }
    }
}

impl Metrics {
    /// Sets `headroom_be_cpu_advertised_millicpu{reason}`: the value on `reason`, 0 on the
    /// other reasons.
    pub fn be_cpu_advertised(&self, millicpu: u64, reason: &str) {
        by_reason(&self.be_cpu_advertised, Resource::BeCpu, millicpu, reason);
    }

    /// Sets `headroom_be_memory_advertised_bytes{reason}` the same way.
    pub fn be_memory_advertised(&self, bytes: u64, reason: &str) {
        by_reason(
            &self.be_memory_advertised,
            Resource::BeMemory,
            bytes,
            reason,
        );
    }
}

/// An advertised value on its reason's label, 0 on the resource's other reasons'.
fn by_reason(family: &Family<Labels, F64Gauge>, resource: Resource, value: u64, reason: &str) {
    for r in resource.reasons() {
        let v = if r.as_str() == reason {
            value as f64
        } else {
            0.0
        };
        family
            .get_or_create(&vec![("reason".to_string(), r.as_str().to_string())])
            .set(v);
    }
}

/// The text exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    encode(&mut out, registry).expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_off_lines(registry: &Registry) -> Vec<String> {
        render(registry)
            .lines()
            .filter(|l| l.starts_with("headroom_be_held_off_reason{"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn held_off_reason_is_rewritten_only_when_it_changes_and_always_shown() {
        let (m, registry) = Metrics::new();
        let seen = ["a", "b"];
        m.be_held_off_reason(None, &seen);
        let none = held_off_lines(&registry);
        assert_eq!(none.len(), 2, "{none:?}");
        assert!(none.iter().all(|l| l.ends_with(" 0.0")), "{none:?}");
        m.be_held_off_reason(Some("b"), &seen);
        let b = held_off_lines(&registry);
        assert!(
            b.iter().any(|l| l.contains("\"b\"") && l.ends_with(" 1.0")),
            "{b:?}"
        );
        // unchanged: the same exposition (a gauge set behind its back stays: not rewritten)
        m.be_held_off
            .get_or_create(&vec![("reason".into(), "a".into())])
            .set(7.0);
        m.be_held_off_reason(Some("b"), &seen);
        assert!(held_off_lines(&registry)
            .iter()
            .any(|l| l.ends_with(" 7.0")));
        m.be_held_off_reason(None, &seen);
        let back = held_off_lines(&registry);
        assert!(back.iter().all(|l| l.ends_with(" 0.0")), "{back:?}");
    }
}
