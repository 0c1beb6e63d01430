//! Turning merged raw results into the result JSON (docs/architecture.md "The JSON contracts", plus headroom's extra
//! keys), the mutilate-style table and CSV rows.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use headroom_types::load_result::{ClientStats, LatencyStats, LoadResult, LOAD_RESULT_VERSION};

use crate::checks::{achieved_qps, run_checks};
use crate::dist::Dist;
use crate::results::RawResults;
use crate::stats::summary_blocked;

/// The result JSON: the contract keys of [`LoadResult`] (flattened) plus headroom's extras.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    #[serde(flatten)]
    pub result: LoadResult,
    /// SET latency timed from the actual send.
    pub update_uncorrected: LatencyStats,
    /// The client's own send lag of every measured request (see `client.send_lag_p99_us`).
    pub send_lag: LatencyStats,
    /// Requests sent in the measured interval.
    pub sent: u64,
    pub completed: u64,
    pub reconnects: u64,
    /// Sends skipped by `-S` (due, never sent).
    #[serde(default)]
    pub skipped: u64,
    pub bytes_tx: u64,
    pub bytes_rx: u64,
    /// Seconds measured (warmup excluded).
    pub measured_s: f64,
    /// Load threads over all clients (measurement thread included).
    pub threads: usize,
    /// 1 + remote agents.
    pub clients: usize,
    /// The reported latency comes from dedicated measurement connections (`-C/-Q/-D`).
    pub measurement_connections: bool,
}

/// Summarizes merged results and runs the checks. `percentile` is the one the caller relies on.
pub fn build_report(raw: &RawResults, iadist_unit: &Dist, percentile: f64) -> LoadReport {
    let mut checks = run_checks(raw, iadist_unit, percentile);
    let limited_by = crate::checks::limited_by(raw, &checks);
    if let Some(why) = &limited_by {
        // Never a silently late run: one that did not keep its schedule is not valid, whichever
        // other check it passed.
        if checks.iter().all(|c| c.ok) {
            checks.push(headroom_types::load_result::Check {
                name: "schedule".into(),
                ok: false,
                detail: format!("rate not carried on time: limited by {why}"),
            });
        }
    }
    let hists = raw.reported();
    let c = &raw.counters;
    LoadReport {
        result: LoadResult {
            version: LOAD_RESULT_VERSION,
            target_qps: raw.target_qps,
            achieved_qps: achieved_qps(raw),
            valid: checks.iter().all(|c| c.ok),
            checks,
            read: summary_blocked(&hists.read, &hists.read_blocks),
            read_uncorrected: hists.read_uncorrected.summary(),
            update: summary_blocked(&hists.update, &hists.update_blocks),
            late: c.late,
            errors: c.errors,
            misses: c.misses,
            client: ClientStats {
                cpu_s: raw.cpu_s,
                send_lag_p99_us: raw.send_lag.percentile_us(99.0),
                busy_poll_s: raw.busy_poll_s,
                engine: (!raw.engine.is_empty()).then(|| raw.engine.clone()),
                engine_fallback_reason: raw.engine_fallback_reason.clone(),
                sched: raw.sched.as_ref().map(|s| s.class.clone()),
                sched_reason: raw.sched.as_ref().map(|s| s.reason.clone()),
                connections: raw.connections.clone(),
                limited_by,
            },
        },
        update_uncorrected: hists.update_uncorrected.summary(),
        send_lag: raw.send_lag.summary(),
        sent: c.sent,
        completed: c.completed,
        reconnects: c.reconnects,
        skipped: c.skipped,
        bytes_tx: c.bytes_tx,
        bytes_rx: c.bytes_rx,
        measured_s: raw.measured_s,
        threads: raw.threads,
        clients: raw.clients,
        measurement_connections: raw.has_measure,
    }
}

const COLUMNS: [&str; 11] = [
    "avg", "std", "min", "5th", "10th", "50th", "90th", "95th", "99th", "99.9th", "99.99th",
];

fn row(name: &str, s: &LatencyStats) -> String {
    let vals = [
        s.avg_us, s.std_us, s.min_us, s.p5_us, s.p10_us, s.p50_us, s.p90_us, s.p95_us, s.p99_us,
        s.p999_us, s.p9999_us,
    ];
    let mut line = format!("{name:<10}");
    for v in vals {
        let _ = write!(line, " {v:>8.1}");
    }
    line
}

/// mutilate's table (µs) with p99.9/p99.99, the uncorrected rows, the CIs and the checks.
pub fn format_table(r: &LoadReport) -> String {
    let res = &r.result;
    let mut out = String::new();
    let mut header = format!("{:<10}", "#type");
    for c in COLUMNS {
        let _ = write!(header, " {c:>8}");
    }
    out.push_str(&header);
    out.push('\n');
    out.push_str(&row("read", &res.read));
    out.push('\n');
    out.push_str(&row("update", &res.update));
    out.push('\n');
    out.push_str(&row("read_unc", &res.read_uncorrected));
    out.push('\n');
    out.push_str(&row("update_unc", &r.update_uncorrected));
    out.push('\n');
    out.push_str(&row("send_lag", &r.send_lag));
    out.push('\n');
    out.push('\n');
    for (name, s) in [("read", &res.read), ("update", &res.update)] {
        if s.count > 0 {
            let _ = writeln!(
                out,
                "{name} p50 = {:.1} us (95% CI {:.1}..{:.1}), p99 = {:.1} us (95% CI {:.1}..{:.1}), p99.9 = {:.1} us (95% CI {:.1}..{:.1})",
                s.p50_us, s.p50_ci_us[0], s.p50_ci_us[1],
                s.p99_us, s.p99_ci_us[0], s.p99_ci_us[1], s.p999_us, s.p999_ci_us[0], s.p999_ci_us[1]
            );
            if s.ci_batches > 0 {
                let _ = writeln!(
                    out,
                    "{:width$} (batch means over {} time batches; variance ×{:.1} at p50, ×{:.1} at p99 that of independent samples)",
                    "",
                    s.ci_batches,
                    s.p50_variance_inflation,
                    s.p99_variance_inflation,
                    width = name.len()
                );
            }
        }
    }
    if r.measurement_connections {
        out.push_str("(latency from the measurement connections -C/-Q/-D)\n");
    }
    let target = if res.target_qps > 0.0 {
        format!("target {:.0}", res.target_qps)
    } else {
        "peak".to_string()
    };
    let _ = writeln!(
        out,
        "\nTotal QPS = {:.1} ({} / {:.1}s; {target})",
        res.achieved_qps, r.completed, r.measured_s
    );
    let gets = res.read.count.max(1) as f64;
    let _ = writeln!(
        out,
        "\nMisses = {} ({:.1}%)",
        res.misses,
        res.misses as f64 * 100.0 / gets
    );
    let _ = writeln!(
        out,
        "Late = {} ({:.1}%)   Errors = {}   Reconnects = {}",
        res.late,
        res.late as f64 * 100.0 / r.sent.max(1) as f64,
        res.errors,
        r.reconnects
    );
    if r.skipped > 0 {
        let _ = writeln!(
            out,
            "Skipped TXs = {} ({:.1}%)",
            r.skipped,
            r.skipped as f64 * 100.0 / (r.sent + r.skipped).max(1) as f64
        );
    }
    let secs = r.measured_s.max(1e-9);
    let _ = writeln!(
        out,
        "\nRX {:>12} bytes : {:>7.1} MB/s",
        r.bytes_rx,
        r.bytes_rx as f64 / secs / 1e6
    );
    let _ = writeln!(
        out,
        "TX {:>12} bytes : {:>7.1} MB/s",
        r.bytes_tx,
        r.bytes_tx as f64 / secs / 1e6
    );
    let _ = writeln!(
        out,
        "\nClient: {:.2} CPU-s ({:.2} s busy-polling for send times), send lag p99 {:.1} us, {} threads, {} client(s)",
        res.client.cpu_s, res.client.busy_poll_s, res.client.send_lag_p99_us, r.threads, r.clients
    );
    if let Some(engine) = &res.client.engine {
        let _ = writeln!(out, "Engine: {engine}");
    }
    if let Some(t) = res.checks.iter().find(|c| c.name == "timestamps") {
        let _ = writeln!(out, "Timestamps: {}", t.detail);
    }
    if let Some(reason) = &res.client.engine_fallback_reason {
        let _ = writeln!(out, "Engine fallback: {reason}");
    }
    if let (Some(class), Some(why)) = (&res.client.sched, &res.client.sched_reason) {
        let _ = writeln!(out, "Scheduling: {class}: {why}");
    }
    if let Some(s) = &res.client.connections {
        let _ = writeln!(
            out,
            "Connections: {} ({}: {}){}",
            s.total,
            s.mode,
            s.reason,
            if s.grown > 0 || s.growth_refused > 0 {
                format!(
                    "; {} more opened during the run, {} in all ({} sends found them all full at the cap)",
                    s.grown, s.grown_to, s.growth_refused
                )
            } else {
                String::new()
            }
        );
    }
    if let Some(why) = &res.client.limited_by {
        let _ = writeln!(out, "Rate not carried: limited by {why}");
    }
    out.push_str(&format_checks(res));
    out
}

/// The checks block (also printed for scan/search rows that fail).
pub fn format_checks(res: &LoadResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nChecks: {}",
        if res.valid {
            "all passed"
        } else {
            "FAILED (result not valid)"
        }
    );
    for c in &res.checks {
        let _ = writeln!(
            out,
            "  [{}] {:<16} {}",
            if c.ok { " ok " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    out
}

/// CSV header matching [`csv_row`].
pub fn csv_header() -> String {
    let mut cols = vec![
        "target_qps".to_string(),
        "achieved_qps".into(),
        "valid".into(),
    ];
    for class in ["read", "read_uncorrected", "update", "update_uncorrected"] {
        for f in [
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
            "p99_ci_lo_us",
            "p99_ci_hi_us",
        ] {
            cols.push(format!("{class}_{f}"));
        }
    }
    for f in [
        "late",
        "errors",
        "misses",
        "sent",
        "reconnects",
        "bytes_tx",
        "bytes_rx",
        "client_cpu_s",
        "send_lag_p99_us",
        "failed_checks",
    ] {
        cols.push(f.into());
    }
    csv_line(&cols)
}

/// One CSV row with the figures of the JSON.
pub fn csv_row(r: &LoadReport) -> String {
    let res = &r.result;
    let mut cols = vec![
        format!("{}", res.target_qps),
        format!("{:.3}", res.achieved_qps),
        res.valid.to_string(),
    ];
    for s in [
        &res.read,
        &res.read_uncorrected,
        &res.update,
        &r.update_uncorrected,
    ] {
        cols.push(s.count.to_string());
        for v in [
            s.avg_us,
            s.std_us,
            s.min_us,
            s.p5_us,
            s.p10_us,
            s.p50_us,
            s.p90_us,
            s.p95_us,
            s.p99_us,
            s.p999_us,
            s.p9999_us,
            s.p99_ci_us[0],
            s.p99_ci_us[1],
        ] {
            cols.push(format!("{v:.3}"));
        }
    }
    let failed: Vec<&str> = res
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    cols.extend([
        res.late.to_string(),
        res.errors.to_string(),
        res.misses.to_string(),
        r.sent.to_string(),
        r.reconnects.to_string(),
        r.bytes_tx.to_string(),
        r.bytes_rx.to_string(),
        format!("{:.3}", res.client.cpu_s),
        format!("{:.3}", res.client.send_lag_p99_us),
        failed.join(";"),
    ]);
    csv_line(&cols)
}

/// One CSV line (no terminator), each field quoted where it needs it.
fn csv_line(fields: &[String]) -> String {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    // Writing into memory cannot fail.
    w.write_record(fields).expect("CSV into memory");
    let mut line = String::from_utf8(w.into_inner().expect("CSV into memory")).expect("UTF-8");
    line.pop();
    line
}
