//! The metrics' registration: every metric made and named in the registry the scrape server
//! encodes.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::{F64Gauge, LcServiceFamilies, Metrics};

impl Metrics {
    /// New metrics, registered in a registry the caller serves.
    pub fn new() -> (Metrics, Registry) {
        let mut r = Registry::with_prefix("headroom");
        let g = F64Gauge::default;
        let m = Metrics {
            lc_latency_us: g(),
            lc_latency_by_source_us: Family::default(),
            lc_slo_us: g(),
            lc_slack: g(),
            lc_load: g(),
            lc_qps: g(),
            idle_cpus: g(),
            be_enabled: g(),
            be_cpus: g(),
            lc_cpu_usage: g(),
            be_cpu_usage: g(),
            cpus: g(),
            kube_refused: g(),
            kube_refusals_total: g(),
            kube_lcs: g(),
            be_cpu_weight: g(),
            be_cpu_idle: g(),
            be_quota_pct: g(),
            be_llc_ways: g(),
            be_egress_ceil_bytes_per_s: g(),
            actuating: g(),
            paused: g(),
            decisions: Family::default(),
            sensor_errors: Family::default(),
            be_held_off: Family::default(),
            held_off_shown: Arc::default(),
            be_cpu_advertised: Family::default(),
            be_memory_advertised: Family::default(),
            writes: Counter::default(),
            write_errors: Counter::default(),
            drift_repairs: Counter::default(),
            be_restarts: Counter::default(),
            state_write_errors: Counter::default(),
            loop_seconds: Histogram::new(exponential_buckets(1e-6, 2.0, 20)),
            lc_service: LcServiceFamilies::default(),
            binding_lc: Family::default(),
            last: Default::default(),
        };
        let f = &m.lc_service;
        for (name, help, family) in [
            ("lc_service_latency_us", "Each LC service's tail latency at its SLO percentile (µs)", &f.latency_us),
            ("lc_service_slo_us", "Each LC service's latency SLO target (µs)", &f.slo_us),
            ("lc_service_slack", "Each LC service's (SLO - latency) / SLO", &f.slack),
            ("lc_service_qps", "Each LC service's requests per second", &f.qps),
            ("lc_service_load", "Each LC service's load as a fraction of its peak_qps", &f.load),
            ("lc_service_cpu_usage_cpus", "CPU used by each LC service's group, in CPUs (measured)", &f.cpu_usage),
            ("lc_service_cpus", "CPUs each LC service's threads may run on (union of affinities; NaN: unknown)", &f.cpus),
            ("lc_service_latency_by_source_us", "Each LC service's tail latency by source (kernel sensor, prober, prometheus, feed; NaN: none this window), µs", &f.latency_by_source_us),
        ] {
            r.register(name, help, family.clone());
        }
        r.register(
            "binding_lc",
            "1 for the LC service whose slack bound the last decision, 0 for the others",
            m.binding_lc.clone(),
        );
        r.register(
            "lc_latency_us",
            "LC tail latency at the SLO percentile (µs)",
            m.lc_latency_us.clone(),
        );
        r.register(
            "lc_latency_by_source_us",
            "LC tail latency at the SLO percentile by source (kernel sensor, prober; NaN: none this window), µs",
            m.lc_latency_by_source_us.clone(),
        );
        r.register(
            "lc_slo_us",
            "LC latency SLO target (µs)",
            m.lc_slo_us.clone(),
        );
        r.register("lc_slack", "(SLO - latency) / SLO", m.lc_slack.clone());
        r.register(
            "lc_load",
            "LC load as a fraction of peak_qps",
            m.lc_load.clone(),
        );
        r.register("lc_qps", "LC requests per second", m.lc_qps.clone());
        r.register(
            "idle_cpus",
            "Idle CPUs seen by the last tick",
            m.idle_cpus.clone(),
        );
        r.register(
            "lc_cpu_usage_cpus",
            "CPU used by the LC group, in CPUs (measured)",
            m.lc_cpu_usage.clone(),
        );
        r.register(
            "be_cpu_usage_cpus",
            "CPU used by the BE groups, in CPUs (measured)",
            m.be_cpu_usage.clone(),
        );
        r.register("cpus", "Online CPUs of this machine", m.cpus.clone());
        r.register(
            "kube_refused_pods",
            "Annotated pods refused as LC services now (bad annotation, BestEffort, a static [lc]'s or BE's group)",
            m.kube_refused.clone(),
        );
        r.register(
            "kube_refusals",
            "Pod refusals since start (each distinct refusal once)",
            m.kube_refusals_total.clone(),
        );
        r.register(
            "kube_lc_pods",
            "Discovered LC pods the agent protects now",
            m.kube_lcs.clone(),
        );
        r.register(
            "be_cpu_advertised_millicpu",
            "The node's advertised headroom.io/be-cpu (milli-CPUs) on the label of why it is that",
            m.be_cpu_advertised.clone(),
        );
        r.register(
            "be_memory_advertised_bytes",
            "The node's advertised headroom.io/be-memory (bytes) on the label of why it is that",
            m.be_memory_advertised.clone(),
        );
        r.register(
            "be_held_off_reason",
            "1 while BE is held off for lack of a trustworthy latency signal, by reason",
            m.be_held_off.clone(),
        );
        r.register(
            "be_enabled",
            "1 when BE may run, 0 when frozen",
            m.be_enabled.clone(),
        );
        r.register(
            "be_cpus",
            "CPUs in the BE cpuset (0 when BE is disabled, -1 = unrestricted)",
            m.be_cpus.clone(),
        );
        r.register(
            "be_cpu_weight",
            "BE native CPU weight (-1 = original)",
            m.be_cpu_weight.clone(),
        );
        r.register(
            "be_cpu_idle",
            "1 when BE runs as cpu.idle",
            m.be_cpu_idle.clone(),
        );
        r.register(
            "be_quota_pct",
            "BE CPU quota in % of one CPU (-1 = unlimited)",
            m.be_quota_pct.clone(),
        );
        r.register(
            "be_llc_ways",
            "LLC ways given to BE (-1 = unmanaged)",
            m.be_llc_ways.clone(),
        );
        r.register(
            "be_egress_ceil_bytes_per_s",
            "BE egress ceiling (-1 = unmanaged)",
            m.be_egress_ceil_bytes_per_s.clone(),
        );
        r.register(
            "actuating",
            "1 while the agent applies decisions (0 after ctl off or in --dry-run)",
            m.actuating.clone(),
        );
        r.register("paused", "1 while paused by ctl", m.paused.clone());
        r.register("decisions", "Decisions by reason", m.decisions.clone());
        r.register(
            "sensor_errors",
            "Sensor errors by sensor",
            m.sensor_errors.clone(),
        );
        r.register(
            "writes",
            "Knob writes made by the reconciler",
            m.writes.clone(),
        );
        r.register(
            "write_errors",
            "Reconciliations that failed and were rolled back",
            m.write_errors.clone(),
        );
        r.register(
            "drift_repairs",
            "Knobs found changed by someone else and repaired",
            m.drift_repairs.clone(),
        );
        r.register(
            "be_restarts",
            "Restarts of supervised BE commands",
            m.be_restarts.clone(),
        );
        r.register(
            "state_write_errors",
            "Failed writes of the state file (the record a restart after a crash needs)",
            m.state_write_errors.clone(),
        );
        r.register(
            "loop_duration_seconds",
            "Time of one sensor+policy+reconcile tick",
            m.loop_seconds.clone(),
        );
        (m, r)
    }
}
