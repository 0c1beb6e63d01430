//! Lancet-style self-checks of a run: did the client hold the rate, do its actual send gaps follow
//! the configured distribution, are there enough samples for the percentiles asked for, did the
//! client saturate, were requests lost. A failed check makes the result invalid.

mod independence;
pub use independence::*;

use std::fmt::Write as _;

use headroom_types::load_result::Check;

use crate::dist::Dist;
use crate::results::RawResults;
use crate::stats::gof::ks_test_dist;
use crate::stats::min_samples_for;

/// Tolerance of the rate check (fraction of the target).
pub const RATE_TOLERANCE: f64 = 0.01;
/// Inter-arrival samples tested (a random subset: consecutive gaps of one connection are not
/// independent at microsecond scale, and a huge n would flag timer granularity nobody cares about).
pub const KS_SAMPLES: usize = 1000;
/// Client CPU utilisation (of its threads) above which it counts as saturated.
pub const CPU_SATURATED: f64 = 0.9;

/// Significance level of the inter-arrival fit test.
pub const FIT_ALPHA: f64 = 0.01;

/// Most client send lag (p99, µs) a valid run may have. The lag is no part of the latencies
/// (they are timed from the kernel's transmit stamp), but a client that sends this late no
/// longer offers the arrivals it was asked for.
pub const SEND_LAG_P99_MAX_US: f64 = 1000.0;

/// Samples needed for the p-th percentile (p in percent) to have 10 samples beyond it.
pub fn samples_needed(p: f64) -> u64 {
    min_samples_for(p)
}

/// All checks of one run. `iadist_unit` is the inter-arrival distribution at rate 1;
/// `percentile` is the percentile the caller cares about (99 by default, or `--search`'s P).
pub fn run_checks(raw: &RawResults, iadist_unit: &Dist, percentile: f64) -> Vec<Check> {
    let mut checks = vec![rate_check(raw)];
    checks.push(interarrival_check(raw, iadist_unit));
    checks.push(samples_check(raw, percentile));
    let (all, blocks) = raw.reported().all_corrected();
    checks.push(independence_check(
        &all,
        &blocks,
        raw.measured_s,
        percentile,
    ));
    checks.push(stationarity_check(&all, &blocks, percentile));
    checks.push(saturation_check(raw));
    checks.push(send_lag_check(raw));
    checks.push(timestamps_check(raw));
    checks.push(errors_check(raw));
    checks
}

/// The client's own lateness, bounded: the time from when the server let a send go (its
/// scheduled time, or when a connection at the depth cap got room) to the kernel's transmit stamp
/// of its bytes.
pub fn send_lag_check(raw: &RawResults) -> Check {
    let name = "send_lag".to_string();
    let h = &raw.send_lag;
    if h.count() == 0 {
        return Check {
            name,
            ok: true,
            detail: "no measured sends".into(),
        };
    }
    let p99 = h.percentile_us(99.0);
    let ok = p99 <= SEND_LAG_P99_MAX_US;
    Check {
        name,
        ok,
        detail: format!(
            "the client's own lateness (transmit stamp − when the send could go): p50 {:.1} µs, p99 {p99:.1} µs, p99.9 {:.1} µs, max {:.0} µs (bound: p99 ≤ {SEND_LAG_P99_MAX_US:.0} µs); not part of the latencies{}",
            h.percentile_us(50.0),
            h.percentile_us(99.9),
            h.percentile_us(100.0),
            if ok {
                ""
            } else {
                ": the client's thread ran late (a busy CPU, slow wake-ups), so the server was not offered the configured arrivals; give the client a CPU of its own (--affinity) or more threads (-T)"
            }
        ),
    }
}

/// Where the figures' times come from: the kernel's transmit and receive stamps, or, where it
/// gave none, the client's own clock (said, never silent; not a failure).
pub fn timestamps_check(raw: &RawResults) -> Check {
    let c = &raw.counters;
    let n = c.completed;
    let mut detail = format!(
        "kernel transmit stamps timed {} of {n} requests, kernel receive stamps {} of {n}",
        c.tx_stamped, c.rx_stamped
    );
    if n > 0 && (c.tx_stamped < n || c.rx_stamped < n) {
        detail.push_str(
            "; the rest were timed in user space (from the thread's send, to its read), which charges the client's own lateness around them to the server",
        );
    }
    if let Some(why) = &raw.stamps_refused {
        let _ = write!(detail, "; {why}");
    }
    Check {
        name: "timestamps".into(),
        ok: true,
        detail,
    }
}

/// For a run that did not carry its rate on time (its `rate` check failed, more than 1% of its
/// sends waited for a depth cap, or its send lag p99 passed 1 ms): the rate reached and what
/// limited it — the client's CPU, its connections, its scheduling or the server — with the
/// figures and the fix. None for a run that kept its schedule.
pub fn limited_by(raw: &RawResults, checks: &[Check]) -> Option<String> {
    if raw.target_qps <= 0.0 {
        return None;
    }
    let c = &raw.counters;
    let (_, late_frac) = late_sends(c);
    let lag_p99 = raw.send_lag.percentile_us(99.0);
    let rate_ok = checks.iter().all(|k| k.name != "rate" || k.ok);
    if rate_ok && late_frac <= 0.01 && lag_p99 <= 1000.0 {
        return None;
    }
    let reached = format!(
        "reached {:.0} of {:.0} QPS (send lag p99 {lag_p99:.0} µs, {:.1}% of sends late)",
        achieved_qps(raw),
        raw.target_qps,
        late_frac * 100.0
    );
    if let Some(why) = server_unanswered(c) {
        return Some(format!("server: {reached}; {why}"));
    }
    let util = cpu_utilisation(raw);
    if util >= CPU_SATURATED {
        return Some(format!(
            "client CPU: {reached}; {:.0}% of {} thread(s) busy: add threads (-T) on CPUs of their own",
            util * 100.0,
            raw.threads
        ));
    }
    let unc_p50 = raw.reported().read_uncorrected.percentile_us(50.0);
    if late_frac > 0.001 || c.growth_refused > 0 {
        match &raw.connections {
            Some(s) if s.mode == "auto" => {
                let idle = s.rtt_p50_us.max(1.0);
                if unc_p50 > 10.0 * idle && unc_p50 > 200.0 {
                    return Some(format!(
                        "server: {reached}; its replies took p50 {unc_p50:.0} µs against {idle:.0} µs idle with {} connection(s) × depth {} in flight: the server does not answer faster",
                        s.grown_to, s.depth
                    ));
                }
                if let Some(why) = server_paused(raw, s.grown_to * s.depth) {
                    return Some(format!("server: {reached}; {why}"));
                }
                return Some(format!(
                    "connections: {reached}; grown from {} to {} connection(s) × depth {} (the cap: {} per server per thread), {} sends found them all full",
                    s.total, s.grown_to, s.depth, s.grow_cap, s.growth_refused
                ));
            }
            Some(s) => {
                let in_flight = s.total * s.depth;
                if let Some(why) = server_paused(raw, in_flight) {
                    return Some(format!("server: {reached}; {why}"));
                }
                // A thread that ran late reads its replies late, and its connections sit at
                // their depth cap: blamed on too few connections while they held twice the
                // requests this rate has in flight at the round trip the kernel stamped (`-c 50
                // -d 4` at 30 000 QPS against a 50 µs server, the client beside a busy CPU:
                // hostile pass 31).
                // Not when the sends that found no room waited on the server: the thread's
                // lateness did not fill its connections (hostile pass 34: a server answering
                // every request in 5 ms, `-c 1 -d 2` at 100 QPS, was "client scheduling" on a VM
                // whose wake-ups put the send lag's p99 past 1 ms).
                if lag_p99 > 1000.0
                    && !room_held_by_server(c)
                    && carries_the_rate(raw, in_flight, 99.0)
                {
                    return Some(format!(
                        "client scheduling: {reached}; the thread ran late ({:.0}% CPU) and read its replies late: -c {} -d {} ({in_flight} in flight at most) carry this rate at the round trip measured (p99 {:.0} µs)",
                        util * 100.0,
                        s.per_thread,
                        s.depth,
                        unc_p99_us(raw)
                    ));
                }
                return Some(format!(
                    "connections: {reached}; -c {} -d {} ({} connection(s)) too few for this rate and round trip: -c auto sizes them from the measured round trip",
                    s.per_thread, s.depth, s.total
                ));
            }
            None => {
                return Some(format!(
                    "connections: {reached}; sends waited for the depth cap: raise -c/-d or use -c auto"
                ));
            }
        }
    }
    if lag_p99 > 1000.0 {
        return Some(format!(
            "client scheduling: {reached}; the CPU was not saturated ({:.0}%) but the thread ran late: give it a CPU of its own (--affinity)",
            util * 100.0
        ));
    }
    Some(format!(
        "server: {reached}; {:.2}% of the {} scheduled requests answered",
        c.completed as f64 * 100.0 / c.scheduled.max(1) as f64,
        c.scheduled
    ))
}

fn cpu_utilisation(raw: &RawResults) -> f64 {
    let capacity = raw.wall_s * raw.threads.max(1) as f64;
    if capacity > 0.0 {
        (raw.cpu_s - raw.busy_poll_s).max(0.0) / capacity
    } else {
        0.0
    }
}

fn rate_check(raw: &RawResults) -> Check {
    let achieved = achieved_qps(raw);
    if raw.target_qps <= 0.0 {
        return Check {
            name: "rate".into(),
            ok: true,
            detail: format!("peak mode (no target rate): {achieved:.1} QPS"),
        };
    }
    let dev = (achieved - raw.target_qps) / raw.target_qps;
    let c = &raw.counters;
    // A random schedule's own count varies (Poisson: sd = sqrt(n)); short runs get that slack.
    let expected = raw.target_qps * raw.measured_s;
    let tolerance = RATE_TOLERANCE.max(3.0 / expected.max(1.0).sqrt());
    let kept = c.completed as f64 / c.scheduled.max(1) as f64;
    if dev.abs() <= tolerance && kept >= 1.0 - RATE_TOLERANCE {
        return Check {
            name: "rate".into(),
            ok: true,
            detail: format!(
                "achieved within {:.2}% of target; {:.2}% of the {} scheduled requests answered",
                dev.abs() * 100.0,
                kept * 100.0,
                c.scheduled
            ),
        };
    }
    let mut reasons = Vec::new();
    // Most sends left unanswered is the server's doing, whatever else the client shows (a
    // client waiting on a silent server polls and reads busy): said first, and the verdict.
    let unanswered = server_unanswered(c);
    if let Some(why) = &unanswered {
        reasons.push(why.clone());
    }
    let (late, late_frac) = late_sends(c);
    if late_frac > 0.001 {
        reasons.push(format!(
            "{late} late sends ({:.1}%): connections at their depth cap",
            late_frac * 100.0
        ));
    }
    let util = cpu_utilisation(raw);
    if util >= CPU_SATURATED {
        reasons.push(format!(
            "client CPU saturated ({:.0}% of {} threads)",
            util * 100.0,
            raw.threads
        ));
    }
    let lag_p99 = raw.send_lag.percentile_us(99.0);
    if lag_p99 > 1000.0 {
        reasons.push(format!("send lag p99 {lag_p99:.0} µs"));
    }
    if c.errors > 0 {
        reasons.push(format!("{} requests lost (errors)", c.errors));
    }
    if c.skipped > 0 {
        reasons.push(format!("{} sends skipped (-S)", c.skipped));
    }
    if reasons.is_empty() {
        reasons.push(format!(
            "{:.2}% of the {} scheduled requests answered",
            kept * 100.0,
            c.scheduled
        ));
    }
    let verdict = if unanswered.is_some() {
        "the server did not keep up"
    } else if dev < 0.0 {
        "client could not keep up"
    } else {
        "client overshot the target"
    };
    Check {
        name: "rate".into(),
        ok: false,
        detail: format!(
            "{verdict}: achieved {achieved:.1} of {:.1} QPS ({:+.2}%){}{}",
            raw.target_qps,
            dev * 100.0,
            if reasons.is_empty() { "" } else { "; " },
            reasons.join("; ")
        ),
    }
}

fn interarrival_check(raw: &RawResults, iadist_unit: &Dist) -> Check {
    let name = "interarrival_fit".to_string();
    if raw.target_qps <= 0.0 {
        return Check {
            name,
            ok: true,
            detail: "peak mode: no inter-arrival distribution to test".into(),
        };
    }
    if raw.ia_samples.len() < 50 {
        return Check {
            name,
            ok: true,
            detail: format!(
                "only {} send intervals: too few to test",
                raw.ia_samples.len()
            ),
        };
    }
    let xs: Vec<f64> = raw.ia_samples.iter().take(KS_SAMPLES).copied().collect();
    match ks_test_dist(&xs, iadist_unit) {
        None => Check {
            name,
            ok: true,
            detail: "the configured distribution has no continuous CDF: not tested".into(),
        },
        Some(fit) => {
            let ok = fit.p_value >= FIT_ALPHA;
            let late = raw.counters.late as f64 / raw.counters.sent.max(1) as f64;
            let why = if ok {
                String::new()
            } else if late > 0.01 {
                format!(
                    ": sends do not follow the configured distribution; {:.1}% of them waited for the depth cap (raise -c or -d)",
                    late * 100.0
                )
            } else {
                ": sends do not follow the configured distribution (client timing; see send_lag)"
                    .to_string()
            };
            Check {
                name,
                ok,
                detail: format!(
                    "Kolmogorov-Smirnov D = {:.4}, p = {:.3} on {} actual send intervals (alpha {FIT_ALPHA}){}",
                    fit.statistic,
                    fit.p_value,
                    fit.n,
                    why
                ),
            }
        }
    }
}

fn samples_check(raw: &RawResults, percentile: f64) -> Check {
    let hists = raw.reported();
    let n = hists.read.count() + hists.update.count();
    let need = samples_needed(percentile);
    let trusted: Vec<&str> = [(99.9, "p99.9"), (99.99, "p99.99")]
        .iter()
        .filter(|(p, _)| n < samples_needed(*p))
        .map(|(_, name)| *name)
        .collect();
    let extra = if trusted.is_empty() {
        String::new()
    } else {
        format!(
            "; not enough for {} (shown, not trusted)",
            trusted.join(", ")
        )
    };
    Check {
        name: "samples".into(),
        ok: n >= need,
        detail: if n >= need {
            format!("{n} samples, p{percentile} needs {need}{extra}")
        } else {
            format!("too few samples for p{percentile}: {n} < {need}; run longer{extra}")
        },
    }
}

fn saturation_check(raw: &RawResults) -> Check {
    let util = cpu_utilisation(raw);
    Check {
        name: "client_cpu".into(),
        ok: util < CPU_SATURATED,
        detail: format!(
            "client used {:.2} CPU-s in {:.2} s over {} threads ({:.0}% without {:.2} s of busy-polling for send times){}",
            raw.cpu_s,
            raw.wall_s,
            raw.threads,
            util * 100.0,
            raw.busy_poll_s,
            if util < CPU_SATURATED {
                ""
            } else {
                ": saturated, latencies include client queueing"
            }
        ),
    }
}

fn errors_check(raw: &RawResults) -> Check {
    let c = &raw.counters;
    Check {
        name: "errors".into(),
        ok: c.errors == 0,
        detail: format!(
            "{} lost requests, {} connections re-opened",
            c.errors, c.reconnects
        ),
    }
}

/// When the server answered fewer than half the requests sent to it: how many, and that the
/// rest are the server's (silent, stalled, or replying with something that is not a reply).
fn server_unanswered(c: &crate::results::Counters) -> Option<String> {
    // Not one reply is the server's doing however few were sent: a silent server holds
    // `-c 1 -d 1` at one send, which was blamed on too few connections (hostile pass 28).
    let none_answered = c.sent > 0 && c.completed == 0;
    if !none_answered && (c.sent < 10 || c.completed * 2 >= c.sent) {
        // A server that answered some and then stopped, or closed its connections, holds a
        // few fixed connections waiting (sends few, most answered): blamed on the connections
        // until hostile pass 30.
        if c.stalled > 0 {
            return Some(format!(
                "{} of the {} requests sent were still unanswered when the drain ended ({} answered): the server stopped answering, or stalls",
                c.stalled, c.sent, c.completed
            ));
        }
        if c.closed > 0 {
            return Some(format!(
                "the server closed the load connections {} time(s) (each re-opened after a pause; {} requests lost)",
                c.closed, c.errors
            ));
        }
        return None;
    }
    Some(format!(
        "the server answered {} of the {} requests sent ({:.1}%; {} lost to errors): it stopped answering, stalls, or does not speak the protocol",
        c.completed,
        c.sent,
        c.completed as f64 * 100.0 / c.sent as f64,
        c.errors
    ))
}

/// Measured requests that waited for a depth cap, and their fraction of those due: the late
/// sends and the requests due and never sent. These waited behind a backlog the caps held
/// (one is marked late only once it heads its connection's queue): a warmup backlog that
/// outlasted the run left every measured request unsent and none late, and the verdict
/// blamed the server (hostile pass 32).
fn late_sends(c: &crate::results::Counters) -> (u64, f64) {
    let unsent = c.scheduled.saturating_sub(c.sent + c.skipped);
    // A connection's head, marked late and never sent, is in both.
    let late = (c.late + unsent).min(c.sent + unsent);
    (late, late as f64 / (c.sent + unsent).max(1) as f64)
}

/// Whether `in_flight` requests carry the target rate at the round trip the kernel stamped (at
/// `percentile`), twice over: Little's law with room for the rate's own bursts.
fn carries_the_rate(raw: &RawResults, in_flight: usize, percentile: f64) -> bool {
    let round_trip_us = raw.reported().read_uncorrected.percentile_us(percentile);
    in_flight as f64 >= 2.0 * raw.target_qps * round_trip_us / 1e6
}

/// How many times the client's share the server's must be, of the lateness of the sends that
/// waited for room, for the server to have held the room.
const ROOM_SERVER_OVER_CLIENT: u64 = 2;

/// A server that paused, for a run whose connections carry its rate at the round trip the
/// kernel stamped but whose sends still found them full: the sends that waited for room waited
/// mostly while the server held their room's request (from its send, or their schedule if
/// later, to its reply), not for the client (which sent that request late, or reacted to its
/// reply late). The send lag's own p99 cannot tell them apart: a client's reaction to a burst
/// of replies after a pause is about 1 ms on a 2-vCPU VM (hostile pass 32: a 10 ms pause every
/// 500 ms was blamed on the client's scheduling), and a late thread's room wait is its own.
fn server_paused(raw: &RawResults, in_flight: usize) -> Option<String> {
    let c = &raw.counters;
    // Judged at the ordinary round trip (p90): a pause is the tail, and the requests it held
    // lengthen the p99 itself (4 in flight at 1000 QPS, a 50 ms pause every 500 ms).
    let p90_us = raw.reported().read_uncorrected.percentile_us(90.0);
    // A server that answers steadily, only slower than the connections allow, holds a send
    // that found no room for the rest of one round trip (its connection's oldest request's); one
    // that paused held it past its ordinary round trip (hostile pass 34: a server answering
    // every request in 5 ms, `-c 1 -d 2` at 100 QPS, was "the server paused").
    let mean_wait_us = c.room_server_ns as f64 / c.room_waits.max(1) as f64 / 1e3;
    if !room_held_by_server(c) || mean_wait_us <= p90_us || !carries_the_rate(raw, in_flight, 90.0)
    {
        return None;
    }
    Some(format!(
        "the {} sends that found no room waited {:.1} ms in all while the server held it (on average {mean_wait_us:.0} µs, past its ordinary round trip), {:.1} ms on the client; {in_flight} in flight carry this rate at that round trip (p90 {p90_us:.0} µs, p99 {:.0} µs): the server paused or answered in bursts (more connections, -c auto, hold more requests through a pause)",
        c.room_waits,
        c.room_server_ns as f64 / 1e6,
        c.room_client_ns as f64 / 1e6,
        unc_p99_us(raw)
    ))
}

/// The sends that found no room waited mostly while the server held their room's request, not
/// for the client (which sent that request late, or reacted to its reply late).
fn room_held_by_server(c: &crate::results::Counters) -> bool {
    c.room_server_ns > 0
        && c.room_server_ns >= ROOM_SERVER_OVER_CLIENT.saturating_mul(c.room_client_ns)
}

/// The reads' round trip p99 (µs) as the kernel stamped the replies, not as the client read
/// them.
fn unc_p99_us(raw: &RawResults) -> f64 {
    raw.reported().read_uncorrected.percentile_us(99.0)
}

/// Completed requests per second over the measured interval.
pub fn achieved_qps(raw: &RawResults) -> f64 {
    raw.counters.completed as f64 / raw.measured_s.max(1e-9)
}

#[cfg(test)]
mod tests;
