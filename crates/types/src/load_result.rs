//! `headroom load --json` result (docs/architecture.md "The JSON contracts"): produced by headroom-load.
//!
//! The keys are a contract (bench and users parse them): extend with optional fields, never rename.

use serde::{Deserialize, Serialize};

/// Version of the result format written in [`LoadResult::version`].
pub const LOAD_RESULT_VERSION: u32 = 1;

/// One run of `headroom load` (one QPS step of a scan or search).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadResult {
    /// Format version, [`LOAD_RESULT_VERSION`].
    pub version: u32,
    /// Requested aggregate rate (0 = as fast as possible).
    pub target_qps: f64,
    /// Completed requests per second over the measured interval.
    pub achieved_qps: f64,
    /// All `checks` passed.
    pub valid: bool,
    /// Self-checks (rate, inter-arrival fit, sample count, client saturation).
    pub checks: Vec<Check>,
    /// GET latency timed from the scheduled send (coordinated-omission corrected).
    pub read: LatencyStats,
    /// GET latency timed from the actual send.
    pub read_uncorrected: LatencyStats,
    /// SET latency timed from the scheduled send.
    pub update: LatencyStats,
    /// Requests sent after their scheduled time because the depth cap was reached.
    pub late: u64,
    /// Malformed replies, server errors and connection failures.
    pub errors: u64,
    /// GETs answered "not found".
    pub misses: u64,
    /// What the load generator itself spent.
    pub client: ClientStats,
}

/// One self-check of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Short machine-readable name: "rate", "interarrival_fit", "samples", ...
    pub name: String,
    pub ok: bool,
    /// Human-readable explanation with the figures involved.
    pub detail: String,
}

/// The client's own cost.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientStats {
    /// User + system CPU seconds of the load generator during the measured interval.
    pub cpu_s: f64,
    /// 99th percentile of the client's own send lag, µs: the kernel's transmit stamp of a request
    /// − when it could go (its scheduled send, or when a connection at its depth cap got room). Not part of any latency figure; bounded by the `send_lag` check.
    pub send_lag_p99_us: f64,
    /// Of `cpu_s`, seconds spent busy-polling for sends to fall due (precision, not load).
    #[serde(default)]
    pub busy_poll_s: f64,
    /// The event loop that ran: "io_uring" or "epoll" (absent from results before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Why epoll ran where io_uring was wanted (io_uring disabled, refused by seccomp, too old).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_fallback_reason: Option<String>,
    /// The load threads' scheduling class ("SCHED_OTHER", "SCHED_FIFO 10", …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sched: Option<String>,
    /// Why that class: "SCHED_FIFO refused (EPERM)", "not requested", "inherited from the caller".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sched_reason: Option<String>,
    /// How many connections ran and why (`-c N` as given, or `-c auto` sized from the round trip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<ConnectionSizing>,
    /// For a run that did not carry its rate: what limited it ("client CPU", "connections",
    /// "server"), with the figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limited_by: Option<String>,
}

/// The load connections of one client: how many, why, and how many were opened during the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionSizing {
    /// "auto" (`-c auto`) or "fixed" (`-c N`).
    pub mode: String,
    /// Connections per server per thread at the start (`-c`).
    pub per_thread: usize,
    /// Requests in flight per connection (`-d`).
    pub depth: usize,
    /// Load connections at the start, over every thread and server.
    pub total: usize,
    /// Round trip measured by the ping phase before the run (µs; 0 when not measured).
    pub rtt_p50_us: f64,
    pub rtt_p99_us: f64,
    /// Requests in flight the sizing provides for (rate × RTT p99 × headroom).
    pub needed_in_flight: f64,
    /// The sizing in words.
    pub reason: String,
    /// Connections opened during the run because a send found its connection at the depth cap.
    pub grown: u64,
    /// Load connections at the end (total + reserve + grown).
    pub grown_to: usize,
    /// Sends that found every connection full with growth at its cap (they waited, late).
    #[serde(default)]
    pub growth_refused: u64,
    /// Most load connections per server per thread the run may grow to (0: no growth).
    #[serde(default)]
    pub grow_cap: usize,
    /// Connections per server per thread opened before the run beside the scheduled ones, with
    /// no schedule of their own: they take sends that find their connection at the depth cap.
    #[serde(default)]
    pub reserve: usize,
}

/// Summary of one latency histogram, in microseconds (mutilate's table plus confidence intervals).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    pub count: u64,
    pub avg_us: f64,
    pub std_us: f64,
    pub min_us: f64,
    pub p5_us: f64,
    pub p10_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
    /// 95% confidence interval of `p99_us` (ranks mapped through the histogram; their spread from
    /// batch means over time blocks when `ci_batches` > 0).
    pub p99_ci_us: [f64; 2],
    /// 95% confidence interval of `p999_us`.
    #[serde(default)]
    pub p999_ci_us: [f64; 2],
    /// 95% confidence interval of `p50_us`.
    #[serde(default)]
    pub p50_ci_us: [f64; 2],
    /// Time batches the intervals come from (batch means, valid for autocorrelated latencies);
    /// 0 = order statistics of independent samples (no time blocks were recorded).
    #[serde(default)]
    pub ci_batches: u32,
    /// Variance of the p50 estimate over what independent samples would give (batch means):
    /// ≈ how many of these samples are worth one independent one. 0 when not measured.
    #[serde(default)]
    pub p50_variance_inflation: f64,
    /// Likewise for p99 (noisier: tail samples are few and cluster).
    #[serde(default)]
    pub p99_variance_inflation: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn design_example_parses_and_round_trips() {
        let text = r#"{"version": 1, "target_qps": 20000, "achieved_qps": 19987.5, "valid": true,
 "checks": [{"name": "rate", "ok": true, "detail": "achieved within 0.06% of target"}],
 "read":   {"count": 59962, "avg_us": 41.2, "std_us": 9.9, "min_us": 18.0, "p5_us": 0, "p10_us": 0,
            "p50_us": 39.1, "p90_us": 52.0, "p95_us": 58.3, "p99_us": 80.1, "p999_us": 190.2,
            "p9999_us": 640.0, "p99_ci_us": [77.0, 83.5]},
 "read_uncorrected": {"count": 1, "avg_us": 1, "std_us": 0, "min_us": 1, "p5_us": 1, "p10_us": 1,
            "p50_us": 1, "p90_us": 1, "p95_us": 1, "p99_us": 1, "p999_us": 1,
            "p9999_us": 1, "p99_ci_us": [1, 1], "p999_ci_us": [1, 1]},
 "update": {"count": 0, "avg_us": 0, "std_us": 0, "min_us": 0, "p5_us": 0, "p10_us": 0,
            "p50_us": 0, "p90_us": 0, "p95_us": 0, "p99_us": 0, "p999_us": 0,
            "p9999_us": 0, "p99_ci_us": [0, 0]},
 "late": 0, "errors": 0, "misses": 0, "client": {"cpu_s": 0.81, "send_lag_p99_us": 3.1}}"#;
        let r: LoadResult = serde_json::from_str(text).unwrap();
        assert_eq!(r.read.count, 59962);
        assert_eq!(r.read.p99_ci_us, [77.0, 83.5]);
        assert_eq!(r.checks[0].name, "rate");
        assert_eq!(r.client.send_lag_p99_us, 3.1);
        let back: LoadResult = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn serializes_every_contract_key() {
        let v = serde_json::to_value(LoadResult::default()).unwrap();
        for key in [
            "version",
            "target_qps",
            "achieved_qps",
            "valid",
            "checks",
            "read",
            "read_uncorrected",
            "update",
            "late",
            "errors",
            "misses",
            "client",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        for key in [
            "count",
            "avg_us",
            "std_us",
            "min_us",
            "p5_us",
            "p10_us",
            "p50_us",
            "p90_us",
            "p95_us",
            "p99_us",
            "p999_us",
            "p9999_us",
            "p99_ci_us",
            "p999_ci_us",
        ] {
            assert!(v["read"].get(key).is_some(), "missing read.{key}");
        }
        assert!(v["client"].get("cpu_s").is_some());
        assert!(v["client"].get("send_lag_p99_us").is_some());
    }
}
