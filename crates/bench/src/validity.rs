//! Only valid measurements decide. A load run whose self-checks failed measured partly the
//! instrument, not the LC: the capacity, the SLO and the peak come from valid runs only. An
//! invalid run is repeated with the configuration its failed checks call for (more connections
//! when sends waited for the depth cap, another load-generator thread when one ran out of CPU or
//! time, a longer run when the samples were too few or too correlated); when that still fails,
//! the bench stops with the check, its detail and the fix.
//!
//! Pure: the runs themselves are a closure, so the retry and stop rules are tested with fake
//! results.

use crate::error::{BenchError, Result};
use headroom_report::model::LoadMetrics;

/// `headroom load -c`: connections per load-generator thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connections {
    /// `-c auto`: the load generator sizes them from the round trip and the rate.
    Auto,
    Fixed(usize),
}

impl Connections {
    pub fn arg(&self) -> String {
        match self {
            Connections::Auto => "auto".into(),
            Connections::Fixed(n) => n.to_string(),
        }
    }
}

/// The bench's and the demo's `-c`: `auto`, sized by `headroom load` from the measured round
/// trip and grown mid-run at the depth cap (a run that still hits the cap is retried with
/// [`MAX_CONNECTIONS`] explicit connections, see [`correct`]).
pub const DEFAULT_CONNECTIONS: Connections = Connections::Auto;
/// Requests in flight per connection (`-d`).
pub const DEFAULT_DEPTH: usize = 4;
/// The most connections per thread a correction asks for.
pub const MAX_CONNECTIONS: usize = 64;
/// The rate one load-generator thread is given at most when the thread count is chosen: one
/// thread kept 50k QPS valid on the 2-CPU VM (docs/loadgen.md); more threads share the rate.
pub const QPS_PER_THREAD: f64 = 50_000.0;
/// The longest probe a correction asks for when the checks name no length, and the longest
/// confirmation run, seconds (a probe is not an experiment).
pub const MAX_PROBE_S: f64 = 8.0;
/// The longest rerun of a measurement its self-checks refused for too few independent samples:
/// as long as they ask ("run ≥ N s"), up to this. Beyond it the rate is *unknown here*, not
/// slow: the host's own noise (a correlated or drifting tail) is no evidence about the LC.
pub const MAX_RERUN_S: f64 = 32.0;
/// Runs of one measurement at most: the first and two corrections.
pub const MAX_ATTEMPTS: usize = 3;

/// How one `headroom load` run is configured (besides the rate).
#[derive(Debug, Clone, PartialEq)]
pub struct LoadShape {
    pub threads: usize,
    pub connections: Connections,
    pub depth: usize,
    pub seconds: f64,
}

impl LoadShape {
    /// The default shape for `qps`: one thread per [`QPS_PER_THREAD`], at most `max_threads`
    /// (the load generator's CPUs).
    pub fn for_rate(qps: f64, seconds: f64, max_threads: usize) -> LoadShape {
        let threads = (qps / QPS_PER_THREAD).ceil().max(1.0) as usize;
        LoadShape {
            threads: threads.clamp(1, max_threads.max(1)),
            connections: DEFAULT_CONNECTIONS,
            depth: DEFAULT_DEPTH,
            seconds,
        }
    }

    /// `-T N -c C -d D` (the rate and duration are the caller's).
    pub fn args(&self) -> Vec<String> {
        vec![
            "-T".into(),
            self.threads.to_string(),
            "-c".into(),
            self.connections.arg(),
            "-d".into(),
            self.depth.to_string(),
        ]
    }

    pub fn describe(&self) -> String {
        format!(
            "-T {} -c {} -d {}, {:.0} s",
            self.threads,
            self.connections.arg(),
            self.depth,
            self.seconds
        )
    }
}

/// The name of a failed check as `LoadMetrics::failed_checks` holds it (`name: detail`).
fn check_name(c: &str) -> &str {
    c.split(':').next().unwrap_or(c).trim()
}

/// Every failed check is `independence` (the confidence interval's trust, not the run's).
pub fn only_independence_failed(m: &LoadMetrics) -> bool {
    !m.failed_checks.is_empty()
        && m.failed_checks
            .iter()
            .all(|c| check_name(c) == "independence")
}

fn failed<'a>(m: &'a LoadMetrics, name: &str) -> Option<&'a String> {
    m.failed_checks.iter().find(|c| check_name(c) == name)
}

/// Sends waited for a free slot: the `rate` check names connections at their depth cap.
fn depth_capped(m: &LoadMetrics) -> bool {
    failed(m, "rate").is_some_and(|d| d.contains("depth cap"))
}

/// The seconds the `independence` check asks for ("run ≥ N s").
fn asked_seconds(m: &LoadMetrics) -> Option<f64> {
    let d = failed(m, "independence")?;
    let rest = &d[d.find("run ≥ ")? + "run ≥ ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// The configuration a failed run calls for, and what changed; `None` when nothing left to try
/// would change the outcome (the fix is then the user's: see [`fix_for`]).
pub fn correct(
    shape: &LoadShape,
    m: &LoadMetrics,
    max_threads: usize,
) -> Option<(LoadShape, String)> {
    let mut s = shape.clone();
    let more_threads = shape.threads < max_threads.max(1);
    let connections = match shape.connections {
        Connections::Fixed(n) => n,
        Connections::Auto => 0,
    };
    if depth_capped(m) && connections < MAX_CONNECTIONS {
        let next = if connections == 0 {
            MAX_CONNECTIONS
        } else {
            (connections * 2).min(MAX_CONNECTIONS)
        };
        s.connections = Connections::Fixed(next);
        return Some((
            s,
            format!("{next} connections per thread (sends waited for the depth cap)"),
        ));
    }
    let client = ["client_cpu", "interarrival_fit", "rate"]
        .iter()
        .any(|n| failed(m, n).is_some());
    if client {
        if more_threads {
            s.threads += 1;
            let change = format!("{} load-generator threads", s.threads);
            return Some((s, change));
        }
        return None;
    }
    if failed(m, "samples").is_some()
        || failed(m, "independence").is_some()
        || failed(m, "stationarity").is_some()
    {
        // As long as the checks ask (at least twice the last run), within MAX_RERUN_S.
        let cap = if asked_seconds(m).is_some() {
            MAX_RERUN_S
        } else {
            MAX_PROBE_S
        };
        let want = asked_seconds(m).unwrap_or(shape.seconds * 2.0);
        let next = want.max(shape.seconds * 2.0).min(cap).ceil();
        if next > shape.seconds {
            s.seconds = next;
            return Some((
                s,
                format!("a {next:.0} s run (too few independent samples)"),
            ));
        }
        return None;
    }
    if failed(m, "errors").is_some() {
        // Lost requests: once more as it was (a reconnect); a second loss is the server's.
        return Some((s, "the same run again (requests were lost)".into()));
    }
    None
}

/// What the user can do about a run that stayed invalid.
pub fn fix_for(m: &LoadMetrics, shape: &LoadShape, loadgen_cpus: usize) -> String {
    let client_cpu = failed(m, "client_cpu").is_some();
    if client_cpu
        || (!depth_capped(m)
            && (failed(m, "interarrival_fit").is_some() || failed(m, "rate").is_some()))
    {
        return format!(
            "the load generator could not keep its schedule with {} thread(s) on {loadgen_cpus} CPU(s): give it more CPUs of its own (--loadgen-cpus, with --server-cpus for the rest) and keep other work off them",
            shape.threads
        );
    }
    if depth_capped(m) {
        return format!(
            "sends still waited for the depth cap at {} connections × depth {} per thread: the LC answers too slowly at this rate (give it more --server-cpus) or set a lower --peak-qps",
            shape.connections.arg(),
            shape.depth
        );
    }
    if failed(m, "errors").is_some() {
        return "requests were lost: see the LC's log (logs/serve.log) for why it dropped connections".into();
    }
    "the LC's latency was too correlated or drifting for a short probe: run on a quieter machine, or give --slo-us and --peak-qps".into()
}

/// Whether an invalid run above a valid rate says the LC could not carry it: sends waited for
/// the depth cap (its answers were slow) or its tail drifted up, with the load generator on
/// schedule and with CPU to spare. Such a rate is beyond capacity; any other failure is the
/// instrument's, and stops the search.
pub fn server_limited(m: &LoadMetrics) -> bool {
    if failed(m, "client_cpu").is_some() || failed(m, "errors").is_some() {
        return false;
    }
    // Sends held back at the depth cap also leave the inter-arrival fit: that failure is the
    // cap's consequence, not the sender's.
    depth_capped(m)
        || (failed(m, "stationarity").is_some() && failed(m, "interarrival_fit").is_none())
}

/// One run of a measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub shape: LoadShape,
    pub metrics: LoadMetrics,
    /// What this run changed from the one before (empty for the first).
    pub change: String,
}

/// A measurement's runs; the last is valid when `valid()`.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub attempts: Vec<Attempt>,
}

impl Measured {
    pub fn last(&self) -> &Attempt {
        self.attempts.last().expect("at least one attempt")
    }
    /// The run to use: the first whose self-checks all passed. (A run that failed only
    /// `independence` after a longer one was tried used to be taken too; capacity, SLO and
    /// peak now come from valid runs only, and such a run is kept `"used": false`.)
    pub fn valid(&self) -> Option<&Attempt> {
        self.used_index().map(|i| &self.attempts[i])
    }

    /// Which attempt [`Measured::valid`] uses.
    pub fn used_index(&self) -> Option<usize> {
        self.attempts.iter().position(|a| a.metrics.valid)
    }

    /// The last run that failed only `independence` once a longer run was tried: it kept its
    /// schedule and measured the LC, only its confidence interval is untrusted. Never used for
    /// a figure; a tail above a bound in it is still evidence that the rate is not held.
    pub fn schedule_kept(&self) -> Option<&Attempt> {
        if self.attempts.len() < 2 {
            return None;
        }
        self.attempts
            .iter()
            .rev()
            .find(|a| only_independence_failed(&a.metrics))
    }
    /// The failed checks of the last run, `name: detail` each.
    pub fn failed_checks(&self) -> &[String] {
        &self.last().metrics.failed_checks
    }

    /// The error that stops the bench: which check failed, its detail, what was tried, the fix.
    pub fn stop(&self, what: &str, loadgen_cpus: usize) -> BenchError {
        let last = self.last();
        let tried: Vec<String> = self.attempts.iter().map(|a| a.shape.describe()).collect();
        let checks = if last.metrics.failed_checks.is_empty() {
            vec!["(the load generator named no failed check)".to_string()]
        } else {
            last.metrics.failed_checks.clone()
        };
        BenchError::Invalid {
            what: what.to_string(),
            checks,
            tried,
            fix: fix_for(&last.metrics, &last.shape, loadgen_cpus),
        }
    }
}

/// What a measurement at a rate says about the LC alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateVerdict {
    /// A valid run held the rate with the tail within the bound.
    Held,
    /// A valid run missed the rate or the bound.
    NotHeld,
    /// No valid run, and the failure was the LC's ([`server_limited`]): beyond its capacity.
    Beyond,
}

/// Judges a measurement at `qps` against `bound_us`; an invalid one whose failure is the
/// instrument's is the error that stops the bench (`what` names the measurement).
pub fn judge(
    m: &Measured,
    qps: f64,
    percentile: f64,
    bound_us: f64,
    what: &str,
    loadgen_cpus: usize,
) -> Result<RateVerdict> {
    if let Some(a) = m.valid() {
        return Ok(if a.metrics.holds(qps, percentile, bound_us) {
            RateVerdict::Held
        } else {
            RateVerdict::NotHeld
        });
    }
    // No valid run, but one that kept its schedule read the tail above the bound: whatever its
    // interval, the LC did not hold the rate (a tail within the bound proves nothing here).
    if m.schedule_kept()
        .is_some_and(|a| !a.metrics.holds(qps, percentile, bound_us))
    {
        return Ok(RateVerdict::NotHeld);
    }
    if server_limited(&m.last().metrics) {
        return Ok(RateVerdict::Beyond);
    }
    Err(m.stop(what, loadgen_cpus))
}

/// The change of a run repeated as it was.
pub const SAME_AGAIN: &str =
    "the same run again (nothing left to change; a host stall is transient)";

/// Runs `run` until it gives a valid result or nothing is left to correct ([`MAX_ATTEMPTS`]
/// runs at most). An error from `run` (the run could not happen) is returned as is.
pub fn measure_valid(
    shape: LoadShape,
    max_threads: usize,
    mut run: impl FnMut(&LoadShape) -> Result<LoadMetrics>,
) -> Result<Measured> {
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut next = Some((shape, String::new()));
    while let Some((s, change)) = next.take() {
        let metrics = run(&s)?;
        let valid = metrics.valid;
        attempts.push(Attempt {
            shape: s,
            metrics,
            change,
        });
        if valid || attempts.len() >= MAX_ATTEMPTS {
            break;
        }
        let last = attempts.last().expect("pushed");
        next = correct(&last.shape, &last.metrics, max_threads).or_else(|| {
            // Nothing left to change: once, the same run again — a host that stalled the
            // sender (a VM's vCPU, a neighbour) is transient; a second failure is not.
            let repeated = attempts.iter().any(|a| a.change == SAME_AGAIN);
            (!repeated).then(|| (last.shape.clone(), SAME_AGAIN.to_string()))
        });
    }
    Ok(Measured { attempts })
}

/// A failed check as one short phrase for a progress line: its name and the detail's first
/// clause (`rate: client could not keep up: achieved 1900.0 of 2000.0 QPS (-5.00%)`).
pub fn short_reason(m: &LoadMetrics) -> String {
    let parts: Vec<String> = m
        .failed_checks
        .iter()
        .map(|c| {
            let short: String = c.split(';').next().unwrap_or(c).chars().take(110).collect();
            short
        })
        .collect();
    if parts.is_empty() {
        "no failed check named".into()
    } else {
        parts.join(" | ")
    }
}
