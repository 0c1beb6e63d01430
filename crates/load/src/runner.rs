//! One local run: preload ([`crate::preload`]), plan the connections over the threads, start the
//! workers, merge their per-second interval histograms ([`crate::interval_merge`]) for progress,
//! the live feed and the HDR log, and merge their final histograms into [`RawResults`].

use std::io::Write;
use std::net::SocketAddr;
use std::sync::mpsc;

use rand::Rng;

use crate::clock::{now_ns, online_cpus};
use crate::dist::Dist;
use crate::dist::KeyGenerator;
use crate::engine::{
    choose_engine, run_worker, ConnPlan, IntervalMsg, SavedSample, WorkerOut, WorkerPlan,
    WorkerShared,
};
use crate::error::LoadError;
use crate::feed::FeedWriter;
use crate::hdrlog::HdrLogWriter;
use crate::interval_merge::IntervalMerger;
use crate::keys::KeyChooser;
use crate::options::{LoadOptions, Validated};
use crate::preload::{preload, records_per_server};
use crate::results::Interval;
use crate::results::{RawResults, MAX_IA_SAMPLES};
use crate::sizing;
use headroom_host::process::{cpu_split, Usage};
use headroom_types::load_result::ConnectionSizing;

/// Splits the connections over the worker threads. A distribution that has no form at a
/// connection's share of the rate (a pareto whose LOC is above that share's mean gap) is
/// refused here, naming the rate, rather than leaving the connection unpaced.
fn plan_workers(
    opts: &LoadOptions,
    v: &Validated,
    base_seed: u64,
) -> Result<Vec<WorkerPlan>, LoadError> {
    let servers: Vec<SocketAddr> = v.servers.iter().map(|(_, a)| *a).collect();
    let ncpu = online_cpus();
    let has_measure = v.measure_connections > 0;
    // -R: thread t takes servers t, t + T, … (each server once overall when T ≤ servers, thread
    // t the server t mod S otherwise), as mutilate assigns them.
    let servers_of = |t: usize| -> Vec<SocketAddr> {
        if opts.roundrobin {
            (t % servers.len()..servers.len())
                .step_by(opts.threads)
                .map(|i| servers[i])
                .collect()
        } else {
            servers.clone()
        }
    };
    let load_conns: usize = (0..opts.threads)
        .map(|t| servers_of(t).len() * opts.connections)
        .sum();
    let load_rate = if v.load_qps > 0 {
        v.load_qps as f64 / load_conns as f64
    } else {
        0.0
    };
    let load_peak = opts.qps == 0;
    let ia_at = |rate: f64| -> Result<Option<Dist>, LoadError> {
        if rate > 0.0 {
            Dist::interarrival(&opts.iadist, rate)
                .map(Some)
                .map_err(|e| {
                    LoadError::invalid(
                        "-i/--iadist",
                        &opts.iadist,
                        format!("at one connection's share of the rate, {rate:.3}/s: {e}"),
                    )
                })
        } else {
            Ok(None)
        }
    };
    let mut plans = Vec::new();
    // With -Q equal to -q no load is left for the load connections.
    if load_rate > 0.0 || load_peak {
        for t in 0..opts.threads {
            let mut conns = Vec::new();
            for addr in &servers_of(t) {
                for _ in 0..opts.connections {
                    conns.push(ConnPlan {
                        addr: *addr,
                        rate: load_rate,
                        depth: opts.depth,
                        measure: false,
                        ia: ia_at(load_rate)?,
                        reported: !has_measure,
                    });
                }
            }
            plans.push(WorkerPlan {
                conns,
                cpu: opts.affinity.then_some(t % ncpu),
                seed: base_seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            });
        }
    }
    if has_measure {
        // Measurement connections get a thread of their own so load never queues in front of them.
        let n = v.measure_connections * servers.len();
        let rate = v.measure_qps as f64 / n as f64;
        let mut conns = Vec::new();
        for addr in &servers {
            for _ in 0..v.measure_connections {
                conns.push(ConnPlan {
                    addr: *addr,
                    rate,
                    depth: v.measure_depth,
                    measure: true,
                    ia: ia_at(rate)?,
                    reported: true,
                });
            }
        }
        plans.push(WorkerPlan {
            conns,
            cpu: opts.affinity.then_some(opts.threads % ncpu),
            seed: base_seed ^ 0xabcd_ef01_2345_6789,
        });
    }
    Ok(plans)
}

/// The load connections per server per thread: `-c N` as given, or `-c auto` sized from the round
/// trip measured by a ping phase (every server; the slowest p99 counts) and the rate.
fn size_connections(
    opts: &LoadOptions,
    v: &Validated,
    keys: &KeyGenerator,
) -> Result<ConnectionSizing, LoadError> {
    let fixed = ConnectionSizing {
        mode: "fixed".into(),
        per_thread: opts.connections,
        depth: opts.depth,
        reason: format!("-c {} -d {} as given", opts.connections, opts.depth),
        ..ConnectionSizing::default()
    };
    if !opts.connections_auto {
        return Ok(fixed);
    }
    // One thread's share of the rate for one server: the rate of a group of connections.
    let one = LoadOptions {
        connections: 1,
        ..opts.clone()
    };
    let groups = plan_workers(&one, v, 0)?
        .iter()
        .flat_map(|p| &p.conns)
        .filter(|c| !c.measure)
        .count()
        .max(1);
    let rate = v.load_qps as f64 / groups as f64;
    let mut key = Vec::new();
    keys.write_key(0, &mut key);
    let (mut p50, mut p99) = (0u64, 0u64);
    for (_, addr) in &v.servers {
        let rtt = sizing::ping(
            *addr,
            opts.protocol.protocol(),
            &key,
            sizing::PINGS,
            sizing::PING_GAP,
        )?;
        p50 = p50.max(rtt.quantile_ns(0.5));
        p99 = p99.max(rtt.quantile_ns(0.99));
    }
    let s = sizing::size_connections(rate, p99, opts.depth);
    let reserve = sizing::reserve(s.per_thread, rate, opts.depth, opts.threads);
    let reason = if reserve > 0 {
        format!(
            "{}; + {reserve} reserve connection(s) for {:.0} ms of the rate in flight",
            s.reason,
            sizing::RESERVE_S * 1e3
        )
    } else {
        s.reason.clone()
    };
    Ok(ConnectionSizing {
        mode: "auto".into(),
        grow_cap: sizing::grow_cap(s.per_thread).max(s.per_thread + reserve),
        reserve,
        per_thread: s.per_thread,
        depth: opts.depth,
        rtt_p50_us: p50 as f64 * 1e-3,
        rtt_p99_us: p99 as f64 * 1e-3,
        needed_in_flight: s.needed_in_flight,
        reason,
        ..ConnectionSizing::default()
    })
}

/// Runs the load from this process only (no agents). `progress` sees each merged second.
pub fn run_local(
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&Interval),
) -> Result<RawResults, LoadError> {
    let v = opts.validate()?;
    run_local_validated(opts, &v, progress)
}

/// [`run_local`] on options already validated into `v` (the servers resolved once).
pub(crate) fn run_local_validated(
    opts: &LoadOptions,
    v: &Validated,
    progress: &mut dyn FnMut(&Interval),
) -> Result<RawResults, LoadError> {
    let engine = choose_engine(opts.engine)?;
    if let Some(reason) = &engine.fallback_reason {
        tracing::warn!("{reason}; using epoll");
    }
    if !opts.noload {
        preload(opts, v)?;
    }
    let mut feed = match &opts.feed {
        Some(p) => Some(FeedWriter::connect(p)?),
        None => None,
    };
    let mut hdr = match &opts.hdr_log {
        Some(p) => Some(HdrLogWriter::create(p)?),
        None => None,
    };
    let records = records_per_server(opts);
    let keys = KeyGenerator::new(v.keysize.clone(), records);
    let chooser = KeyChooser::new(opts.popularity, records)?;
    let base_seed = opts.seed.unwrap_or_else(|| rand::rng().random());
    let mut sizing = size_connections(opts, v, &keys)?;
    let sized = LoadOptions {
        connections: sizing.per_thread,
        ..opts.clone()
    };
    let plans = plan_workers(&sized, v, base_seed)?;
    sizing.total = plans
        .iter()
        .flat_map(|p| &p.conns)
        .filter(|c| !c.measure)
        .count();
    let groups = sizing.total / sizing.per_thread.max(1);
    let reserve_total = sizing.reserve * groups;
    let nconns: usize = plans.iter().map(|p| p.conns.len()).sum::<usize>() + reserve_total;
    // Time to open the connections before the first send is due.
    let setup_ns = 50_000_000 + nconns as u64 * 200_000;
    let t0 = now_ns() + setup_ns;
    let warm_end = t0 + (opts.warmup_s * 1e9) as u64;
    let end = warm_end + (opts.time_s * 1e9) as u64;
    let shared = WorkerShared {
        protocol: opts.protocol.protocol(),
        keys,
        chooser,
        valuesize: v.valuesize.clone(),
        update: opts.update,
        t0,
        warm_end,
        end,
        drain_end: end + opts.drain_ms * 1_000_000,
        spin_ns: opts.spin_us * 1000,
        adaptive_lead: !opts.sleep_only,
        save: opts.save.is_some(),
        skip: opts.skip,
        moderate: opts.moderate,
        nodelay: !opts.no_nodelay,
        engine: engine.kind,
        grow: opts.connections_auto,
        grow_cap: sizing.grow_cap,
        reserve: sizing.reserve,
        grow_connect_timeout: crate::sizing::grow_connect_timeout((sizing.rtt_p99_us * 1e3) as u64),
        fifo: opts.fifo,
    };
    let nworkers = plans.len();
    let cpu_before = cpu_split(Usage::Process).total_s();
    let (tx, rx) = mpsc::channel::<IntervalMsg>();
    let outs: Vec<Result<WorkerOut, LoadError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = plans
            .into_iter()
            .enumerate()
            .map(|(id, plan)| {
                let tx = tx.clone();
                let shared = &shared;
                std::thread::Builder::new()
                    .name(format!("load-{id}"))
                    .spawn_scoped(scope, move || run_worker(id, plan, shared, tx))
                    .map_err(|e| LoadError::system("starting a load thread", e))
            })
            .collect();
        drop(tx);
        let mut merger = IntervalMerger::new(nworkers, t0, warm_end);
        for msg in rx.iter() {
            for iv in merger.add(msg) {
                emit(&iv, progress, &mut feed, &mut hdr);
            }
        }
        for iv in merger.finish(now_ns()) {
            emit(&iv, progress, &mut feed, &mut hdr);
        }
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().unwrap_or_else(|_| {
                    Err(LoadError::system(
                        "a load thread panicked",
                        std::io::Error::other("panic"),
                    ))
                }),
                Err(e) => Err(e),
            })
            .collect()
    });
    let wall_s = (now_ns().saturating_sub(t0)) as f64 * 1e-9;
    let cpu_s = cpu_split(Usage::Process).total_s() - cpu_before;
    if let Some(h) = hdr.as_mut() {
        h.finish()?;
    }
    let mut raw = RawResults {
        has_measure: v.measure_connections > 0,
        target_qps: opts.qps as f64,
        measured_s: opts.time_s,
        cpu_s,
        wall_s,
        threads: nworkers,
        clients: 1,
        engine: engine.kind.name().to_string(),
        engine_fallback_reason: engine.fallback_reason.clone(),
        ..RawResults::default()
    };
    let mut sched = None;
    let mut saved: Vec<SavedSample> = Vec::new();
    for out in outs {
        let out = out?;
        raw.load.merge(&out.load);
        raw.measure.merge(&out.measure);
        raw.send_lag.merge(&out.send_lag);
        raw.counters.add(&out.counters);
        if raw.stamps_refused.is_none() {
            raw.stamps_refused = out.stamps_refused.clone();
        }
        raw.busy_poll_s += out.busy_poll_ns as f64 * 1e-9;
        sched.get_or_insert(out.sched);
        let room = MAX_IA_SAMPLES.saturating_sub(raw.ia_samples.len());
        raw.ia_samples
            .extend(out.ia_samples.iter().take(room).copied());
        saved.extend(out.saved);
    }
    if let Some(path) = &opts.save {
        write_samples(path, &mut saved)?;
    }
    sizing.grown = raw.counters.grown;
    sizing.grown_to = sizing.total + reserve_total + raw.counters.grown as usize;
    sizing.growth_refused = raw.counters.growth_refused;
    raw.sched = sched;
    raw.connections = Some(sizing);
    Ok(raw)
}

fn emit(
    iv: &Interval,
    progress: &mut dyn FnMut(&Interval),
    feed: &mut Option<FeedWriter>,
    hdr: &mut Option<HdrLogWriter>,
) {
    progress(iv);
    if let Some(f) = feed.as_mut() {
        if let Err(e) = f.send(iv) {
            tracing::warn!("live feed stopped: {e}");
            *feed = None;
        }
    }
    if let Some(h) = hdr.as_mut() {
        if let Err(e) = h.log(iv) {
            tracing::warn!("HDR interval log stopped: {e}");
            *hdr = None;
        }
    }
}

/// `--save`: one line per measured request: scheduled time (s since start), latency (µs), op.
fn write_samples(path: &std::path::Path, saved: &mut [SavedSample]) -> Result<(), LoadError> {
    saved.sort_by_key(|s| s.sched_ns);
    let io = |source| LoadError::Output {
        what: "writing samples to",
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::create(path).map_err(io)?;
    let mut w = std::io::BufWriter::new(f);
    writeln!(w, "# scheduled_s latency_us op").map_err(io)?;
    for s in saved.iter() {
        writeln!(
            w,
            "{:.9} {:.3} {}",
            s.sched_ns as f64 * 1e-9,
            s.latency_ns as f64 * 1e-3,
            if s.update { "set" } else { "get" }
        )
        .map_err(io)?;
    }
    w.flush().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers_per_thread(threads: usize, nservers: usize, roundrobin: bool) -> Vec<Vec<u16>> {
        let opts = LoadOptions {
            servers: (0..nservers)
                .map(|i| format!("127.0.0.1:{}", 1000 + i))
                .collect(),
            threads,
            connections: 1,
            qps: 1200,
            roundrobin,
            ..LoadOptions::default()
        };
        let v = opts.validate().unwrap();
        plan_workers(&opts, &v, 1)
            .unwrap()
            .iter()
            .map(|p| p.conns.iter().map(|c| c.addr.port() - 1000).collect())
            .collect()
    }

    #[test]
    fn roundrobin_assigns_servers_as_mutilate_does() {
        // Without -R every thread connects to every server.
        assert_eq!(
            servers_per_thread(2, 2, false),
            vec![vec![0, 1], vec![0, 1]]
        );
        // With -R: thread t takes t, t + T, … ; more threads than servers wrap around.
        assert_eq!(servers_per_thread(2, 2, true), vec![vec![0], vec![1]]);
        assert_eq!(
            servers_per_thread(2, 5, true),
            vec![vec![0, 2, 4], vec![1, 3]]
        );
        assert_eq!(
            servers_per_thread(3, 2, true),
            vec![vec![0], vec![1], vec![0]]
        );
    }

    #[test]
    fn roundrobin_keeps_the_aggregate_rate() {
        let opts = LoadOptions {
            servers: vec!["127.0.0.1:1000".into(), "127.0.0.1:1001".into()],
            threads: 3,
            connections: 2,
            qps: 1200,
            roundrobin: true,
            ..LoadOptions::default()
        };
        let v = opts.validate().unwrap();
        let total: f64 = plan_workers(&opts, &v, 1)
            .unwrap()
            .iter()
            .flat_map(|p| p.conns.iter().map(|c| c.rate))
            .sum();
        assert!((total - 1200.0).abs() < 1e-6, "{total}");
    }

    /// A pareto whose LOC (50 ms) is below the validated rate's gap but not below a
    /// connection's gap at the run's rate: refused naming the flag and that rate, never a
    /// connection left unpaced.
    #[test]
    fn a_distribution_with_no_form_at_a_connections_rate_is_refused() {
        let opts = |qps: u64| LoadOptions {
            servers: vec!["127.0.0.1:1000".into()],
            threads: 1,
            connections: 1,
            qps,
            iadist: "pareto:0.05,1,0.5".into(),
            ..LoadOptions::default()
        };
        // 10/s: a 100 ms gap, above LOC
        let slow = opts(10);
        let v = slow.validate().unwrap();
        assert!(plan_workers(&slow, &v, 1).unwrap()[0].conns[0].ia.is_some());
        // 1000/s: a 1 ms gap, below LOC
        let fast = opts(1000);
        let v = fast.validate().unwrap();
        let e = plan_workers(&fast, &v, 1).unwrap_err().to_string();
        assert!(e.contains("-i/--iadist") && e.contains("1000.000/s"), "{e}");
    }
}
