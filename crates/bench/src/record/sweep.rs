//! Sweep experiments (latency-vs-load, interference, scheduling, imbalance, isolation): the
//! configurations, and every point of every configuration at every load.

use std::time::Duration;

use serde_json::Value;

use super::{no_tweak, AgentRun, AgentTweak, Options, Session, LATENCY_BLIND_POLICIES};
use crate::error::{BenchError, Result};
use crate::experiments::Experiment;
use crate::runner::{
    cpu_jiffies, idle_pct, read_progress, steal_jiffies, steal_pct_since, strs,
    summarize_decisions, BeSpec, DecisionTail, Proc, ServeSpec,
};
use crate::stats;
use headroom_control::config::{Config, WeightsMode};
use headroom_load::clock::unix_ms;
use headroom_report::model::{LcBaseline, Manifest, Point};
use headroom_report::store::POINTS;

/// One configuration of a sweep experiment.
#[derive(Debug, Clone, Default)]
pub struct SweepConfig {
    pub name: String,
    pub serve: ServeSpec,
    pub be: Option<BeSpec>,
    /// Agent policy and what the run changes in its config (the BE is then launched by the
    /// agent).
    pub agent: Option<(String, AgentTweak)>,
}

/// Turns `llc:0.5` / `spin-os` / `dram` into an antagonist spec with `threads` threads.
pub fn be_spec(name: &str, threads: usize) -> BeSpec {
    let (kind, arg) = match name.split_once(':') {
        Some((k, a)) => (k, Some(a)),
        None => (name, None),
    };
    let kind = kind.strip_suffix("-os").unwrap_or(kind);
    let mut args = Vec::new();
    match (kind, arg) {
        ("llc", Some(f)) => {
            args.push("--fraction".into());
            args.push(f.into());
        }
        ("square", _) => {
            args.extend(["--on-ms", "6", "--off-ms", "42"].map(String::from));
        }
        ("net", _) => {
            // Loopback flows to a sink the antagonist runs itself, on a port free right now.
            let port = crate::runner::free_port().unwrap_or(19_000);
            args.extend([
                "--to".to_string(),
                format!("127.0.0.1:{port}"),
                "--sink".into(),
            ]);
        }
        _ => {}
    }
    BeSpec {
        kind: kind.into(),
        args,
        threads,
        prefix: vec![],
    }
}

/// A point to record: its id, load fraction and repeat index.
type PointKey = (String, f64, u32);

impl Session<'_> {
    /// Records every point of every configuration (skipping those already stored).
    pub fn sweep(&mut self, configs: &[SweepConfig]) -> Result<()> {
        let names: Vec<String> = configs.iter().map(|c| c.name.clone()).collect();
        self.manifest.params = self.opts.params(self.exp, &names);
        self.save_manifest()?;
        let base = self.lc_baseline()?;
        for cfg in configs {
            let ids: Vec<(String, f64, u32)> = (0..self.opts.repeats)
                .flat_map(|r| self.opts.loads.iter().map(move |l| (*l, r)))
                .map(|(l, r)| (point_id(&cfg.name, l, r), l, r))
                .collect();
            let missing: Vec<&(String, f64, u32)> = ids
                .iter()
                .filter(|(id, _, _)| !self.dir.result_path(POINTS, id).is_file())
                .collect();
            self.resumed += ids.len() - missing.len();
            if missing.is_empty() {
                (self.progress)(&format!(
                    "{}: all {} points stored, skipped",
                    cfg.name,
                    ids.len()
                ));
                continue;
            }
            let missing: Vec<(String, f64, u32)> = missing.into_iter().cloned().collect();
            // A policy with minutes of memory (Heracles' 5-minute cooldown after a violation)
            // would carry one load level's state into the next, alternating every 10 s. PerfIso
            // measured each load on its own, so in `isolation` each level gets its own agent.
            let runs: Vec<(String, Vec<PointKey>)> = if self.exp == Experiment::Isolation
                && cfg.agent.is_some()
            {
                self.opts
                    .loads
                    .iter()
                    .map(|l| {
                        let pts: Vec<_> = missing.iter().filter(|p| p.1 == *l).cloned().collect();
                        (format!("{}-{:03.0}", cfg.name, l * 100.0), pts)
                    })
                    .filter(|(_, pts)| !pts.is_empty())
                    .collect()
            } else {
                vec![(cfg.name.clone(), missing)]
            };
            for (label, points) in runs {
                if let Err(e) = self.sweep_config(cfg, &base, &points, &label) {
                    // One configuration failing (a missing antagonist kind, an agent that cannot
                    // start) must not cost the others: note it and go on.
                    self.note(format!("{label}: not measured: {e}"));
                }
            }
        }
        self.finish()
    }

    pub(super) fn sweep_config(
        &mut self,
        cfg: &SweepConfig,
        base: &LcBaseline,
        points: &[(String, f64, u32)],
        label: &str,
    ) -> Result<()> {
        let solo = match &cfg.be {
            Some(be) => Some(self.solo(be)?),
            None => None,
        };
        let (mut serve, addr) = self.runner.start_serve(&cfg.serve)?;
        let mut setup = vec![serve.command.clone(), self.runner.preload(addr)?];
        let progress = self.dir.scratch_path(&format!("{label}.progress.jsonl"))?;
        let _ = std::fs::remove_file(&progress);
        let mut procs: Vec<Proc> = Vec::new();
        let mut agent_log = None;
        // The agent acts on the load generator's own windows (the measurement that judges the
        // SLO). Its prober would share the load generator's CPU here, and its wake-up delays
        // behind a busy client read as LC latency: it saw p99 650-1000 µs while the load
        // generator measured 150-190 µs, and hybrid kept BE off for the whole run.
        let feed = crate::runner::feed_socket_path(&format!("{label}.sock"))?;
        if let Some(be) = &cfg.be {
            match &cfg.agent {
                None => {
                    let p = self.runner.start_antagonist(be, &progress)?;
                    setup.push(p.command.clone());
                    procs.push(p);
                }
                Some((policy, tweak)) => {
                    // The agent launches the BE in its group; in --dry-run it moves nothing, so
                    // the BE is started here instead, as the OS alone would run it.
                    let be_argv = if self.opts.dry_run {
                        let p = self.runner.start_antagonist(be, &progress)?;
                        setup.push(p.command.clone());
                        procs.push(p);
                        Vec::new()
                    } else {
                        self.runner.argv(
                            self.opts.placement.be_cpus(),
                            &be.prefix,
                            &be.args(&progress),
                        )
                    };
                    let config = self.agent_config(&AgentRun {
                        name: label.to_string(),
                        policy: policy.clone(),
                        tweak: *tweak,
                        lc_pid: serve.pid(),
                        addr,
                        be_argv,
                        slo_us: base.slo_us,
                        peak_qps: base.peak_qps,
                        feed_socket: Some(feed.clone()),
                    })?;
                    let log = self.dir.scratch_path(&format!("agent-{label}.jsonl"))?;
                    let _ = std::fs::remove_file(&log);
                    let p = self.runner.start_agent(&config, &log, self.opts.dry_run)?;
                    setup.push(p.command.clone());
                    procs.push(p);
                    agent_log = Some(log);
                }
            }
            // Let the BE (and the agent) settle before measuring.
            std::thread::sleep(Duration::from_secs(2));
            if let (Some((policy, _)), Some(first)) = (&cfg.agent, points.first()) {
                if !LATENCY_BLIND_POLICIES.contains(&policy.as_str()) {
                    self.warm_up_agent(addr, first.1 * base.peak_qps, &feed, label)?;
                }
            }
        }
        let mut tail = agent_log.clone().map(DecisionTail::new);
        for (id, load, repeat) in points {
            if let Some(p) = procs
                .iter_mut()
                .find_map(|p| p.exited().map(|s| (p.command.clone(), s)))
            {
                return Err(BenchError::Report(headroom_report::ReportError::Command {
                    command: p.0,
                    status: p.1,
                    stderr: "exited during the experiment (see logs/)".into(),
                }));
            }
            let qps = load * base.peak_qps;
            let json = self.dir.scratch_path(&format!("{id}.load.json"))?;
            let before_decision = tail.as_mut().and_then(|t| {
                t.read_new();
                t.last.clone()
            });
            let stat_before = cpu_jiffies(&self.opts.placement.server);
            let steal_before = steal_jiffies();
            let start = unix_ms();
            let feeding = agent_log.is_some().then_some(feed.as_path());
            let result =
                self.runner
                    .run_load_feeding(addr, qps, self.opts.duration_s, &json, feeding);
            let end = unix_ms();
            let stat_after = cpu_jiffies(&self.opts.placement.server);
            let steal_pct = steal_pct_since(steal_before);
            let mut point = Point {
                id: id.clone(),
                series: cfg.name.clone(),
                be: cfg.be.as_ref().map_or("none".into(), |b| b.label()),
                load_fraction: *load,
                repeat: *repeat,
                start_unix_ms: start,
                end_unix_ms: end,
                commands: setup.clone(),
                idle_cpu_pct: stat_before
                    .zip(stat_after)
                    .and_then(|(a, b)| idle_pct(a, b)),
                steal_pct,
                ..Default::default()
            };
            match result {
                Ok((m, raw, cmd)) => {
                    point.load = Some(m);
                    point.raw_load = Some(raw);
                    point.commands.push(cmd);
                }
                Err(e) => point.error = Some(e.to_string()),
            }
            if cfg.be.is_some() {
                // The BE was started before the point: no progress line means no progress
                // (frozen or starved), i.e. zero throughput.
                let samples = read_progress(&progress);
                point.be_ops_per_s = Some(stats::counter_rate(&samples, start, end).unwrap_or(0.0));
                point.be_norm = point
                    .be_ops_per_s
                    .zip(solo.as_ref())
                    .map(|(r, s)| r / s.ops_per_s);
            }
            if let Some(t) = tail.as_mut() {
                let new = t.read_new();
                point.agent = summarize_decisions(
                    before_decision.as_ref(),
                    &new,
                    start,
                    end,
                    self.opts.placement.server.len(),
                );
            }
            (self.progress)(&point_line(&point, base.slo_us, self.opts.percentile));
            self.dir.save(POINTS, id, &point)?;
            self.recorded += 1;
        }
        for p in procs.iter_mut() {
            p.stop();
        }
        serve.stop();
        Ok(())
    }
}

fn point_id(series: &str, load: f64, repeat: u32) -> String {
    format!("{series}/{:05.1}/r{repeat}", load * 100.0)
}

fn point_line(p: &Point, slo: f64, pct: f64) -> String {
    match &p.load {
        Some(m) => {
            let tail = m.percentile_us(pct);
            format!(
                "{:<22} load {:>5.1}% r{}: {:>8.0} QPS  p{} {:>7} µs {}{}{}{}",
                p.series,
                p.load_fraction * 100.0,
                p.repeat,
                m.achieved_qps,
                headroom_report::plot::trim_num(pct),
                tail.map_or("–".into(), |t| format!("{t:.0}")),
                if tail.is_some_and(|t| t > slo) {
                    "> SLO"
                } else {
                    ""
                },
                p.be_norm
                    .map_or(String::new(), |b| format!("  BE {:.0}%", b * 100.0)),
                p.steal_pct
                    .filter(|s| *s >= 1.0)
                    .map_or(String::new(), |s| format!("  steal {s:.0}%")),
                if m.valid {
                    ""
                } else {
                    "  [self-checks failed]"
                }
            )
        }
        None => format!(
            "{:<22} load {:>5.1}% r{}: FAILED: {}",
            p.series,
            p.load_fraction * 100.0,
            p.repeat,
            p.error.as_deref().unwrap_or("?")
        ),
    }
}

/// The configurations of each sweep experiment for this machine.
pub fn sweep_configs(exp: Experiment, opts: &Options, smt: bool) -> Vec<SweepConfig> {
    let server_threads = opts.placement.server.len().max(1);
    let serve = ServeSpec {
        threads: server_threads,
        ..Default::default()
    };
    let mut out = Vec::new();
    match exp {
        Experiment::LatencyVsLoad => out.push(SweepConfig {
            name: "alone".into(),
            serve,
            ..Default::default()
        }),
        Experiment::Interference => {
            out.push(SweepConfig {
                name: "alone".into(),
                serve: serve.clone(),
                ..Default::default()
            });
            for b in &opts.be {
                if b == "ht" && !smt {
                    continue;
                }
                out.push(SweepConfig {
                    name: b.replace(':', "-"),
                    serve: serve.clone(),
                    be: Some(be_spec(b, server_threads)),
                    agent: None,
                });
            }
        }
        Experiment::Scheduling => {
            for be in &opts.be {
                for pol in &opts.policies {
                    let mut s = ServeSpec {
                        threads: 1,
                        ..Default::default()
                    };
                    let mut b = be_spec(be, 1);
                    let mut agent: Option<(String, AgentTweak)> = None;
                    match pol.as_str() {
                        "equal" => {}
                        "be-nice-19" => b.prefix = strs(&["nice", "-n", "19"]),
                        "be-sched-idle" => b.prefix = strs(&["chrt", "-i", "0"]),
                        "weights-10000:2" => {
                            agent = Some(("weights".into(), |c: &mut Config| {
                                c.policy.weights.mode = WeightsMode::Static;
                                c.policy.weights.lc_shares = 10_000;
                                c.policy.weights.be_shares = 2;
                            }))
                        }
                        "be-cpu.idle" => {
                            agent = Some(("weights".into(), |c: &mut Config| {
                                c.policy.weights.mode = WeightsMode::Static;
                                c.policy.weights.be_cpu_idle = true;
                            }))
                        }
                        "lc-fifo+be-quota" => {
                            s.prefix = strs(&["chrt", "-f", "50"]);
                            agent = Some(("static-cycles".into(), |c: &mut Config| {
                                c.policy.static_cycles.percent = 50.0;
                            }));
                        }
                        "lc-slice" => {
                            agent = Some(("none".into(), |c: &mut Config| {
                                c.lc_mut().threads.slice_us = Some(100);
                            }))
                        }
                        _ => {}
                    }
                    out.push(SweepConfig {
                        name: if opts.be.len() > 1 {
                            format!("{pol} ({be})")
                        } else {
                            pol.clone()
                        },
                        serve: s,
                        be: Some(b),
                        agent,
                    });
                }
            }
        }
        Experiment::Imbalance => {
            for mode in &opts.policies {
                let (dispatch, pin) = match mode.as_str() {
                    "pinned" => ("static", true),
                    "shared" => ("shared", false),
                    _ => ("static", false),
                };
                out.push(SweepConfig {
                    name: mode.clone(),
                    serve: ServeSpec {
                        threads: server_threads + 1,
                        dispatch: Some(dispatch.into()),
                        pin,
                        ..Default::default()
                    },
                    ..Default::default()
                });
            }
        }
        Experiment::Isolation => {
            out.push(SweepConfig {
                name: "alone".into(),
                serve: serve.clone(),
                ..Default::default()
            });
            let be_name = opts.be.first().cloned().unwrap_or_else(|| "spin".into());
            for pol in &opts.policies {
                let be = be_spec(&be_name, server_threads);
                out.push(SweepConfig {
                    name: pol.clone(),
                    serve: serve.clone(),
                    be: Some(be),
                    agent: (pol != "none").then(|| (pol.clone(), no_tweak as AgentTweak)),
                });
            }
        }
        Experiment::Colocation => {}
    }
    out
}

/// Whether `doctor --json` says the machine has SMT siblings.
pub fn has_smt(m: &Manifest) -> bool {
    m.machine
        .doctor
        .as_ref()
        .and_then(|d| d.get("smt"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}
