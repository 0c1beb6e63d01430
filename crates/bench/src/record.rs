//! The record step of every experiment: what to run, in which order, stored point by point so an
//! interrupted run resumes by skipping the points whose result file exists.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::error::{BenchError, Result};
use crate::experiments::Experiment;
use crate::model::{ColocationRun, LcBaseline, LoadMetrics, Manifest, Point, SoloBaseline, Window};
use crate::runner::{
    self, cpu_jiffies, idle_pct, now_unix_ms, read_progress, steal_jiffies, steal_pct_since, strs,
    summarize_decisions, BeSpec, DecisionTail, Placement, Proc, Runner, ServeSpec,
};
use crate::stats::{self, Spread};
use crate::store::{RunDir, BASELINES, POINTS, RUNS};

/// Everything a recording needs; [`Options::defaults`] gives the issue's defaults per experiment.
#[derive(Debug, Clone)]
pub struct Options {
    pub bin: PathBuf,
    pub quick: bool,
    /// Seconds of load per point (per window for colocation).
    pub duration_s: f64,
    pub repeats: u32,
    /// LC load levels as fractions of the peak.
    pub loads: Vec<f64>,
    pub slo_us: Option<f64>,
    pub peak_qps: Option<f64>,
    pub percentile: f64,
    /// BE workloads (colocation, isolation, scheduling) or antagonists (interference).
    pub be: Vec<String>,
    /// Agent policies (colocation, isolation) or scheduler settings (scheduling).
    pub policies: Vec<String>,
    /// Colocation trace length.
    pub minutes: f64,
    pub placement: Placement,
    /// Run the agent with `--dry-run` (no root / no writable cgroupfs).
    pub dry_run: bool,
    /// Run the load generator under `SCHED_FIFO` where allowed (see `Runner::realtime_loadgen`).
    pub realtime_loadgen: bool,
    /// The command line that started this recording (for the report).
    pub invocation: String,
}

fn frac(pcts: &[f64]) -> Vec<f64> {
    pcts.iter().map(|p| p / 100.0).collect()
}

impl Options {
    /// The issue's defaults (or the quick version, a couple of minutes) for `exp`.
    pub fn defaults(exp: Experiment, quick: bool, bin: PathBuf) -> Options {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut o = Options {
            bin,
            quick,
            duration_s: if quick { 2.0 } else { 10.0 },
            repeats: 3,
            loads: vec![],
            slo_us: None,
            peak_qps: None,
            percentile: 99.0,
            be: strs(&["spin"]),
            policies: vec![],
            minutes: if quick { 1.5 } else { 10.0 },
            placement: Placement::default_for(cpus),
            dry_run: false,
            realtime_loadgen: true,
            invocation: String::new(),
        };
        match exp {
            Experiment::LatencyVsLoad => {
                o.loads = if quick {
                    frac(&[10.0, 30.0, 50.0, 70.0, 90.0])
                } else {
                    frac(&[
                        5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0,
                    ])
                };
            }
            Experiment::Interference => {
                o.duration_s = if quick { 2.0 } else { 5.0 };
                o.loads = if quick {
                    frac(&[10.0, 50.0, 90.0])
                } else {
                    frac(&[10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0])
                };
                o.be = if quick {
                    strs(&["llc:0.5", "dram", "spin-os"])
                } else {
                    strs(&[
                        "llc:0.25", "llc:0.5", "llc:1.0", "dram", "ht", "power", "net", "spin-os",
                    ])
                };
            }
            Experiment::Scheduling => {
                o.duration_s = if quick { 2.0 } else { 5.0 };
                o.loads = if quick {
                    frac(&[20.0, 50.0, 80.0])
                } else {
                    frac(&[10.0, 30.0, 50.0, 70.0, 90.0])
                };
                o.be = if quick {
                    strs(&["spin"])
                } else {
                    strs(&["square", "spin"])
                };
                o.policies = strs(&[
                    "equal",
                    "weights-10000:2",
                    "be-cpu.idle",
                    "be-sched-idle",
                    "lc-fifo+be-quota",
                    "lc-slice",
                ]);
            }
            Experiment::Imbalance => {
                o.duration_s = if quick { 2.0 } else { 5.0 };
                o.loads = if quick {
                    frac(&[20.0, 50.0, 80.0])
                } else {
                    frac(&[10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0])
                };
                o.policies = strs(&["static", "pinned", "shared"]);
            }
            Experiment::Isolation => {
                o.duration_s = if quick { 3.0 } else { 10.0 };
                o.loads = frac(&[50.0, 100.0]);
                o.policies = strs(&[
                    "none",
                    "static-cores",
                    "static-cycles",
                    "weights",
                    "blind",
                    "heracles",
                    "hybrid",
                ]);
            }
            Experiment::Colocation => {
                o.duration_s = 15.0;
                o.policies = strs(&["none", "hybrid"]);
            }
        }
        o
    }

    fn probe_s(&self) -> f64 {
        if self.quick {
            1.0
        } else {
            2.0
        }
    }

    fn params(&self, exp: Experiment, series: &[String]) -> BTreeMap<String, Value> {
        let mut p = BTreeMap::new();
        p.insert("duration_s".into(), json!(self.duration_s));
        p.insert("repeats".into(), json!(self.repeats));
        p.insert("quick".into(), json!(self.quick));
        p.insert("percentile".into(), json!(self.percentile));
        p.insert("series".into(), json!(series));
        if exp != Experiment::Colocation {
            p.insert(
                "loads_pct".into(),
                json!(self.loads.iter().map(|l| l * 100.0).collect::<Vec<_>>()),
            );
        } else {
            p.insert("minutes".into(), json!(self.minutes));
            p.insert("window_s".into(), json!(self.duration_s));
            p.insert(
                "trace".into(),
                json!("20% -> 90% -> 20% of peak (half sine)"),
            );
        }
        p.insert("be".into(), json!(self.be));
        p.insert("agent_dry_run".into(), json!(self.dry_run));
        p.insert("headroom_bin".into(), json!(self.bin.display().to_string()));
        p
    }
}

/// Policies run without the safety layer's SLO-violation cooldown: PerfIso's two static
/// baselines, Blagodurov's weights and PerfIso's blind isolation, none of which turns BE off for
/// minutes after one bad window in its paper. `heracles` and `hybrid` keep it (Alg. 1 has it).
pub const LATENCY_BLIND_POLICIES: [&str; 4] = ["static-cores", "static-cycles", "weights", "blind"];

/// The agent prober's rate: 200 probes/s, or enough to fill the window twice over with the
/// samples the percentile needs (10 beyond it), whichever is more.
pub fn probe_rate_hz(percentile: f64, window_s: f64) -> f64 {
    let needed = headroom_load::stats::min_samples_for(percentile) as f64;
    (2.0 * needed / window_s.max(1.0)).ceil().max(200.0)
}

/// A progress callback: one line per recorded point or window (the CLI prints or draws it).
pub type Progress<'a> = &'a mut dyn FnMut(&str);

/// The state shared by every experiment's recording.
pub struct Session<'a> {
    pub exp: Experiment,
    pub opts: Options,
    pub dir: RunDir,
    pub runner: Runner,
    pub manifest: Manifest,
    pub progress: Progress<'a>,
    /// Points recorded now (not resumed).
    pub recorded: usize,
    /// Results taken from an earlier run of this directory.
    pub resumed: usize,
    /// Baselines recorded by this session (their later reuse is not a resumption).
    baselines_recorded: std::collections::HashSet<String>,
}

impl<'a> Session<'a> {
    /// Opens the run directory, records the machine and writes the manifest (keeping the start
    /// time, SLO and peak of an interrupted run).
    pub fn open(
        exp: Experiment,
        opts: Options,
        out: &Path,
        progress: Progress<'a>,
    ) -> Result<Session<'a>> {
        let dir = RunDir::create(out)?;
        let mut runner = Runner::new(opts.bin.clone(), opts.placement.clone(), out.join("logs"));
        let previous = dir.try_read_manifest()?;
        if let Some(prev) = &previous {
            if prev.experiment != exp.name() {
                return Err(BenchError::Input(format!(
                    "{} holds a {} run, not {}: use another --out",
                    out.display(),
                    prev.experiment,
                    exp.name()
                )));
            }
        }
        let mut notes = Vec::new();
        let realtime = if opts.realtime_loadgen {
            runner.realtime_loadgen()
        } else {
            Err("--no-realtime-loadgen".into())
        };
        notes.push(match realtime {
            Ok(()) => format!(
                "the load generator ran under SCHED_FIFO priority {} (`{}`): the agent and any BE sharing its CPUs cannot delay its sends; its send lag is reported per point",
                runner::LOADGEN_FIFO_PRIORITY,
                runner.loadgen_prefix.join(" ")
            ),
            Err(why) => format!(
                "the load generator ran under the normal scheduler ({why}): the agent shares its CPUs and can delay its sends; see the send lag per point"
            ),
        });
        let machine = runner::record_machine(&runner, &mut notes);
        let mut manifest = previous.unwrap_or_default();
        manifest.experiment = exp.name().into();
        manifest.machine = machine;
        manifest.percentile = opts.percentile;
        if manifest.started_unix_ms == 0 {
            manifest.started_unix_ms = now_unix_ms();
        }
        manifest.finished_unix_ms = None;
        if !opts.invocation.is_empty() && !manifest.invocations.contains(&opts.invocation) {
            manifest.invocations.push(opts.invocation.clone());
        }
        for n in notes {
            if !manifest.notes.contains(&n) {
                manifest.notes.push(n);
            }
        }
        dir.write_manifest(&manifest)?;
        Ok(Session {
            exp,
            opts,
            dir,
            runner,
            manifest,
            progress,
            recorded: 0,
            resumed: 0,
            baselines_recorded: Default::default(),
        })
    }

    pub fn note(&mut self, n: impl Into<String>) {
        let n = n.into();
        if !self.manifest.notes.contains(&n) {
            (self.progress)(&format!("note: {n}"));
            self.manifest.notes.push(n);
        }
    }

    fn save_manifest(&self) -> Result<()> {
        self.dir.write_manifest(&self.manifest)
    }

    /// LC alone: capacity, the SLO, and the peak QPS meeting the SLO (stored; resumed when present).
    pub fn lc_baseline(&mut self) -> Result<LcBaseline> {
        if let Some(b) = self.dir.load::<LcBaseline>(BASELINES, "lc")? {
            self.resumed += 1;
            self.apply_baseline(&b)?;
            return Ok(b);
        }
        (self.progress)("LC alone: finding capacity, SLO and peak ...");
        let (mut serve, addr) = self.runner.start_serve(&default_serve())?;
        let mut b = LcBaseline {
            commands: vec![serve.command.clone()],
            ..Default::default()
        };
        b.commands.push(self.runner.preload(addr)?);
        let result = self.find_peak(addr, &mut b);
        serve.stop();
        result?;
        self.dir.save(BASELINES, "lc", &b)?;
        self.apply_baseline(&b)?;
        Ok(b)
    }

    fn apply_baseline(&mut self, b: &LcBaseline) -> Result<()> {
        self.manifest.slo_us = b.slo_us;
        self.manifest.slo_source = b.slo_source.clone();
        self.manifest.peak_qps = Some(b.peak_qps);
        self.manifest.peak_source = b.peak_source.clone();
        self.save_manifest()
    }

    fn probe(&mut self, addr: SocketAddr, qps: f64, b: &mut LcBaseline) -> Result<LoadMetrics> {
        let json = self.dir.scratch_path("probe.json")?;
        let (m, _, cmd) = self
            .runner
            .run_load(addr, qps, self.opts.probe_s(), &json)?;
        (self.progress)(&format!(
            "  probe {:>8.0} QPS: achieved {:>8.0}, p99 {} µs{}",
            qps,
            m.achieved_qps,
            m.p99_us.map_or("–".into(), |v| format!("{v:.0}")),
            if m.valid { "" } else { " (self-checks failed)" }
        ));
        if b.commands.len() < 6 {
            b.commands.push(cmd);
        }
        b.probes.push((qps, m.clone()));
        Ok(m)
    }

    /// Whether the LC alone holds `qps` with its tail within `bound_us`: one probe that holds
    /// decides; one that does not is repeated, and the rate holds if 2 of 3 probes do. A single
    /// probe hit by a host hiccup (p99 3.8 ms at 20k QPS between 160 µs probes at 17.5k and
    /// 19.4k) otherwise stopped a capacity search at a quarter of the LC's capacity.
    fn holds_at(
        &mut self,
        addr: SocketAddr,
        qps: f64,
        bound_us: f64,
        b: &mut LcBaseline,
    ) -> Result<bool> {
        let p = self.opts.percentile;
        held_by_majority(|| Ok(self.probe(addr, qps, b)?.holds(qps, p, bound_us)))
    }

    fn find_peak(&mut self, addr: SocketAddr, b: &mut LcBaseline) -> Result<()> {
        let p = self.opts.percentile;
        // The low-load tail anchors the capacity knee: the median of 3 probes, so one probe
        // hit by other work on the machine does not move the knee tenfold.
        let mut low_tails = Vec::new();
        for _ in 0..3 {
            let low = self.probe(addr, 2000.0, b)?;
            low_tails.extend(low.percentile_us(p));
        }
        b.low_load_p99_us = stats::median(&low_tails);
        let low_tail = b.low_load_p99_us.unwrap_or(100.0);
        // Capacity: the highest rate the LC sustains (rate self-check passes) before its tail
        // leaves the flat part of the curve (10x the low-load tail, at least 1 ms), measured by
        // a load generator with CPU to spare. A saturated client still reaches its rate, but its
        // tail is its own queue: on a 2-CPU VM the search otherwise found "capacity" 260k QPS
        // with send lag p99 0.8 ms, and LC alone then broke the SLO at 69% of that peak.
        let knee = (10.0 * low_tail).max(1000.0);
        let capacity = if let Some(peak) = self.opts.peak_qps {
            peak
        } else {
            let mut ok = 0.0;
            let mut bad = None;
            let mut q = 10_000.0;
            for _ in 0..9 {
                if self.holds_at(addr, q, knee, b)? {
                    ok = q;
                    q *= 2.0;
                } else {
                    bad = Some(q);
                    break;
                }
            }
            if let Some(mut hi) = bad {
                let mut lo: f64 = ok;
                for _ in 0..4 {
                    let mid = (lo + hi) / 2.0;
                    if self.holds_at(addr, mid, knee, b)? {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                ok = lo;
            }
            if ok <= 0.0 {
                return Err(BenchError::Unavailable(format!(
                    "the LC alone could not sustain 10000 QPS within p{p} ≤ {knee:.0} µs with the load generator unsaturated: see the probes in {}",
                    self.dir.root().display()
                )));
            }
            ok
        };
        b.capacity_qps = capacity;
        // SLO: given, or 5x the LC-alone tail at 50% of capacity (median of 3 probes).
        if let Some(slo) = self.opts.slo_us {
            b.slo_us = slo;
            b.slo_source = "set with --slo-us".into();
        } else {
            let mut tails = Vec::new();
            for _ in 0..3 {
                let m = self.probe(addr, capacity * 0.5, b)?;
                tails.extend(m.percentile_us(p));
            }
            let med = stats::median(&tails).unwrap_or(low_tail);
            b.slo_us = (5.0 * med).round();
            b.slo_source = format!(
                "5 × the LC-alone p{} at 50% of capacity ({med:.0} µs)",
                crate::plot::trim_num(p)
            );
        }
        // Peak: the highest rate ≤ capacity at which the LC alone meets the SLO.
        if let Some(peak) = self.opts.peak_qps {
            b.peak_qps = peak;
            b.peak_source = "set with --peak-qps".into();
        } else {
            let slo = b.slo_us;
            let peak = if self.holds_at(addr, capacity, slo, b)? {
                capacity
            } else {
                let (mut lo, mut hi) = (capacity * 0.5, capacity);
                for _ in 0..4 {
                    let mid = (lo + hi) / 2.0;
                    if self.holds_at(addr, mid, slo, b)? {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                lo
            };
            b.peak_qps = peak.round();
            b.peak_source = format!(
                "highest rate with LC alone meeting the SLO (capacity {capacity:.0} QPS: rate sustained with p{} ≤ {knee:.0} µs and the load generator below {:.0}% CPU)",
                crate::plot::trim_num(p),
                headroom_load::checks::CPU_SATURATED * 100.0
            );
        }
        (self.progress)(&format!(
            "LC alone: capacity {:.0} QPS, SLO p{} ≤ {:.0} µs, peak {:.0} QPS",
            b.capacity_qps,
            crate::plot::trim_num(p),
            b.slo_us,
            b.peak_qps
        ));
        Ok(())
    }

    /// A BE workload alone on the server CPUs: its ops/s, the EMU denominator.
    pub fn solo(&mut self, be: &BeSpec) -> Result<SoloBaseline> {
        let id = format!("solo-{}-{}t", be.label(), be.threads);
        self.solo_as(be, &id)
    }

    /// [`Session::solo`] stored under `id`.
    pub fn solo_as(&mut self, be: &BeSpec, id: &str) -> Result<SoloBaseline> {
        let id = id.to_string();
        // Long enough for several progress lines; no longer than a point or a window needs.
        let seconds = self.opts.duration_s.clamp(3.0, 10.0);
        let dir = self.dir.clone();
        let runner = self.runner.clone();
        let (b, resumed) = dir.get_or_record(BASELINES, &id, || {
            let progress = dir.scratch_path(&format!("{id}.progress.jsonl"))?;
            let _ = std::fs::remove_file(&progress);
            let mut p = runner.start_antagonist(be, &progress)?;
            let ran = runner::run_for(&mut p, seconds);
            p.stop();
            ran?;
            let samples = read_progress(&progress);
            let rate = samples
                .first()
                .zip(samples.last())
                .and_then(|(a, z)| stats::counter_rate(&samples, a.0, z.0));
            let per_cpu = crate::runner::progress_cpu_span(&progress).and_then(|(a, z)| {
                let cpu = z.1 - a.1;
                (cpu > 0.05).then(|| (z.0 - a.0) / cpu)
            });
            match rate {
                Some(r) if r > 0.0 => Ok(SoloBaseline {
                    kind: be.label(),
                    ops_per_s: per_cpu.map_or(r, |p| (p * be.threads.max(1) as f64).max(r)),
                    measured_ops_per_s: r,
                    ops_per_cpu_s: per_cpu,
                    seconds,
                    commands: vec![p.command.clone()],
                }),
                _ => Err(BenchError::Unavailable(format!(
                    "`{}` wrote no usable progress to {} in {seconds} s",
                    p.command,
                    progress.display()
                ))),
            }
        })?;
        if resumed && !self.baselines_recorded.contains(&id) {
            self.resumed += 1;
        }
        if !resumed {
            self.baselines_recorded.insert(id);
            (self.progress)(&format!(
                "BE {} alone: {:.0} ops/s",
                be.label(),
                b.ops_per_s
            ));
        }
        Ok(b)
    }

    /// The window (s) over which the agent's latency is taken: a colocation window, else
    /// Heracles' 15 s.
    fn agent_window_s(&self) -> f64 {
        if self.exp == Experiment::Colocation {
            self.opts.duration_s
        } else {
            15.0
        }
    }

    /// Runs the load for one latency window (plus a second) before anything is measured, so a
    /// latency-driven policy has seen a full window: the agent publishes no tail before its
    /// window has filled once, and keeps BE off until it has one. The result is not recorded.
    fn warm_up_agent(&self, addr: SocketAddr, qps: f64, feed: &Path, label: &str) -> Result<()> {
        let json = self
            .dir
            .scratch_path(&format!("{label}-warmup.load.json"))?;
        self.runner
            .run_load_feeding(addr, qps, self.agent_window_s() + 1.0, &json, Some(feed))
            .map(|_| ())
    }

    /// Writes the agent's config for a policy and returns its path.
    ///
    /// Policies whose papers define them without a latency-triggered BE shutdown run with the
    /// safety layer's SLO-violation cooldown off (see [`LATENCY_BLIND_POLICIES`]).
    pub fn agent_config(&self, a: &AgentRun) -> Result<PathBuf> {
        let AgentRun {
            name,
            policy,
            extra,
            lc_pid,
            addr,
            be_argv,
            slo_us,
            peak_qps,
            feed_socket,
        } = a;
        let path = self.dir.scratch_path(&format!("agent-{name}.toml"))?;
        let state = self.dir.scratch_path(&format!("agent-{name}.state.json"))?;
        let socket = self.dir.scratch_path(&format!("agent-{name}.sock"))?;
        let metrics_port = runner::free_port()?;
        let server: Vec<String> = self
            .opts
            .placement
            .server
            .iter()
            .map(|c| c.to_string())
            .collect();
        let cmd: Vec<String> = be_argv.iter().map(|a| format!("{a:?}")).collect();
        // The latency the agent acts on: the load generator's own windows when it feeds them
        // (the same measurement that judges the SLO), else the agent's prober.
        let window_s = self.agent_window_s();
        let latency = match feed_socket {
            Some(sock) => format!("source = \"feed\"\nsocket = \"{}\"", sock.display()),
            None => format!(
                "source = \"probe\"\nprotocol = \"memcache\"\naddress = \"{addr}\"\nrate_hz = {:?}",
                probe_rate_hz(self.opts.percentile, window_s)
            ),
        };
        // PerfIso's static baselines, Blagodurov's weights and blind isolation do not react to an
        // SLO violation by switching BE off for minutes; the agent's safety layer would (its
        // production default), and then the experiment compares that rule, not the policies.
        let safety_cooldown = if LATENCY_BLIND_POLICIES.contains(&policy.as_str()) {
            "# as its paper defines it, this policy does not switch BE off after an SLO violation\nviolation_cooldown_s = 0.0\n"
        } else {
            ""
        };
        let text = format!(
            r#"# Written by headroom bench {exp}: {name}
[lc]
name = "serve"
cgroup = "headroom-bench/lc"
pids = [{lc_pid}]

[lc.slo]
percentile = {pct:?}
target_us = {slo_us:?}
window_s = {window:?}

[lc.latency]
{latency}

[lc.load]
source = "memcache-stats"
address = "{addr}"
peak_qps = {peak_qps:?}

[[be]]
name = "be"
cgroup = "headroom-bench/be"
command = [{cmd}]

[policy]
kind = "{policy}"

[policy.blind]
be_cpus = [{server}]

[policy.static-cores]
cpus = [{server}]
{extra}
[safety]
on_exit = "restore"
state_file = "{state}"
# the agent shares its CPU with the load generator here: a SCHED_FIFO agent would preempt the
# instrument (its send lag grew to 393 ms in a demo run), so it stays a normal task
agent_fifo_priority = 0
{safety_cooldown}
[api]
socket = "{socket}"
metrics = "127.0.0.1:{metrics_port}"
"#,
            exp = self.exp.name(),
            pct = self.opts.percentile,
            window = window_s,
            cmd = cmd.join(", "),
            server = server.join(", "),
            state = state.display(),
            socket = socket.display(),
        );
        std::fs::write(&path, text).map_err(|e| BenchError::io("writing", &path, e))?;
        Ok(path)
    }

    /// Marks the manifest finished.
    pub fn finish(&mut self) -> Result<()> {
        self.manifest.finished_unix_ms = Some(now_unix_ms());
        self.save_manifest()
    }
}

fn default_serve() -> ServeSpec {
    ServeSpec {
        threads: 1,
        ..Default::default()
    }
}

/// What the agent's config for one run says.
#[derive(Debug, Clone)]
pub struct AgentRun {
    pub name: String,
    pub policy: String,
    /// Extra TOML appended to the generated config (policy or LC thread settings).
    pub extra: String,
    pub lc_pid: u32,
    pub addr: SocketAddr,
    /// The BE command the agent launches in the BE group.
    pub be_argv: Vec<String>,
    pub slo_us: f64,
    pub peak_qps: f64,
    /// The agent takes the LC latency from `headroom load --feed` on this socket.
    pub feed_socket: Option<std::path::PathBuf>,
}

/// One configuration of a sweep experiment.
#[derive(Debug, Clone, Default)]
pub struct SweepConfig {
    pub name: String,
    pub serve: ServeSpec,
    pub be: Option<BeSpec>,
    /// Agent policy and extra TOML (the BE is then launched by the agent).
    pub agent: Option<(String, String)>,
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

/// Runs `try_once` until the outcome is decided: a first success decides; after a failure, the
/// answer is whether 2 of 3 tries succeed (stopping as soon as that is settled).
pub fn held_by_majority(mut try_once: impl FnMut() -> Result<bool>) -> Result<bool> {
    let mut held = 0;
    for tried in 1..=3 {
        if try_once()? {
            held += 1;
        }
        if (tried == 1 && held == 1) || held >= 2 {
            return Ok(true);
        }
        if held + (3 - tried) < 2 {
            return Ok(false);
        }
    }
    Ok(false)
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

    fn sweep_config(
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
        // Unix socket paths are short (108 bytes): keep it in the temp dir.
        let feed = std::env::temp_dir()
            .join(format!("headroom-feed-{}-{label}.sock", std::process::id(),));
        if let Some(be) = &cfg.be {
            match &cfg.agent {
                None => {
                    let p = self.runner.start_antagonist(be, &progress)?;
                    setup.push(p.command.clone());
                    procs.push(p);
                }
                Some((policy, extra)) => {
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
                        extra: extra.clone(),
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
                return Err(BenchError::Command {
                    command: p.0,
                    status: p.1,
                    stderr: "exited during the experiment (see logs/)".into(),
                });
            }
            let qps = load * base.peak_qps;
            let json = self.dir.scratch_path(&format!("{id}.load.json"))?;
            let before_decision = tail.as_mut().and_then(|t| {
                t.read_new();
                t.last.clone()
            });
            let stat_before = cpu_jiffies(Path::new("/proc/stat"), &self.opts.placement.server);
            let steal_before = steal_jiffies(Path::new("/proc/stat"));
            let start = now_unix_ms();
            let feeding = agent_log.is_some().then_some(feed.as_path());
            let result =
                self.runner
                    .run_load_feeding(addr, qps, self.opts.duration_s, &json, feeding);
            let end = now_unix_ms();
            let stat_after = cpu_jiffies(Path::new("/proc/stat"), &self.opts.placement.server);
            let steal_pct = steal_pct_since(steal_before, Path::new("/proc/stat"));
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
                crate::plot::trim_num(pct),
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
                    let mut agent = None;
                    match pol.as_str() {
                        "equal" => {}
                        "be-nice-19" => b.prefix = strs(&["nice", "-n", "19"]),
                        "be-sched-idle" => b.prefix = strs(&["chrt", "-i", "0"]),
                        "weights-10000:2" => {
                            agent = Some(("weights".into(), "\n[policy.weights]\nmode = \"static\"\nlc_shares = 10000\nbe_shares = 2\n".into()))
                        }
                        "be-cpu.idle" => {
                            agent = Some(("weights".into(), "\n[policy.weights]\nmode = \"static\"\nbe_cpu_idle = true\n".into()))
                        }
                        "lc-fifo+be-quota" => {
                            s.prefix = strs(&["chrt", "-f", "50"]);
                            agent = Some(("static-cycles".into(), "\n[policy.static-cycles]\npercent = 50.0\n".into()));
                        }
                        "lc-slice" => {
                            agent = Some(("none".into(), "\n[lc.threads]\nslice_us = 100\n".into()))
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
                    agent: (pol != "none").then(|| (pol.clone(), String::new())),
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

/// A line per colocation window, for live views.
#[derive(Debug, Clone)]
pub struct WindowView {
    pub policy: String,
    pub index: usize,
    pub windows: usize,
    pub load_pct: f64,
    pub tail_us: Option<f64>,
    pub slo_us: f64,
    pub be_cpus: Option<f64>,
    pub emu: Option<f64>,
}

impl Session<'_> {
    /// Records the colocation experiment: for each BE × policy, the diurnal trace.
    pub fn colocation(&mut self, live: &mut dyn FnMut(&WindowView)) -> Result<()> {
        let names: Vec<String> = self
            .opts
            .be
            .iter()
            .flat_map(|b| self.opts.policies.iter().map(move |p| format!("{p}-{b}")))
            .collect();
        self.manifest.params = self.opts.params(self.exp, &self.opts.policies.clone());
        self.manifest.params.insert("runs".into(), json!(names));
        self.save_manifest()?;
        let base = self.lc_baseline()?;
        for be_name in self.opts.be.clone() {
            for policy in self.opts.policies.clone() {
                let id = format!("{policy}-{be_name}");
                if self.dir.result_path(RUNS, &id).is_file() {
                    self.resumed += 1;
                    (self.progress)(&format!("{id}: stored, skipped"));
                    continue;
                }
                match self.colocation_run(&policy, &be_name, &base, live) {
                    Ok(run) => {
                        self.dir.save(RUNS, &id, &run)?;
                        self.recorded += 1;
                    }
                    Err(e) => self.note(format!("{id}: not measured: {e}")),
                }
            }
        }
        self.finish()
    }

    fn colocation_run(
        &mut self,
        policy: &str,
        be_name: &str,
        base: &LcBaseline,
        live: &mut dyn FnMut(&WindowView),
    ) -> Result<ColocationRun> {
        let threads = self.opts.placement.server.len().max(1);
        let be = be_spec(be_name, threads);
        // The solo rate is measured right before each run: on a shared machine it drifts.
        let solo = self.solo_as(
            &be,
            &format!("solo-{}-{}t-before-{policy}", be.label(), be.threads),
        )?;
        let (mut serve, addr) = self.runner.start_serve(&ServeSpec {
            threads,
            ..Default::default()
        })?;
        let mut run = ColocationRun {
            policy: policy.into(),
            be: be.label(),
            dry_run: self.opts.dry_run && policy != "none",
            be_solo_ops_per_s: Some(solo.ops_per_s),
            commands: vec![serve.command.clone(), self.runner.preload(addr)?],
            ..Default::default()
        };
        let progress = self
            .dir
            .scratch_path(&format!("coloc-{policy}-{be_name}.progress.jsonl"))?;
        let _ = std::fs::remove_file(&progress);
        let mut procs = Vec::new();
        let mut tail = None;
        // Unix socket paths are short (108 bytes): keep it in the temp dir.
        let feed = std::env::temp_dir().join(format!(
            "headroom-feed-{}-{policy}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&feed);
        let feeds = policy != "none";
        if policy == "none" {
            let p = self.runner.start_antagonist(&be, &progress)?;
            run.commands.push(p.command.clone());
            procs.push(p);
        } else {
            // The agent launches the BE in its group; in --dry-run it moves nothing, so the BE
            // is started here instead.
            let be_argv = if self.opts.dry_run {
                let p = self.runner.start_antagonist(&be, &progress)?;
                run.commands.push(p.command.clone());
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
                name: format!("coloc-{policy}"),
                policy: policy.to_string(),
                extra: String::new(),
                lc_pid: serve.pid(),
                addr,
                be_argv,
                slo_us: base.slo_us,
                peak_qps: base.peak_qps,
                feed_socket: Some(feed.clone()),
            })?;
            let log = self
                .dir
                .scratch_path(&format!("coloc-{policy}-{be_name}.decisions.jsonl"))?;
            let _ = std::fs::remove_file(&log);
            let p = self.runner.start_agent(&config, &log, self.opts.dry_run)?;
            run.commands.push(format!(
                "# {}:\n{}",
                config.display(),
                std::fs::read_to_string(&config).unwrap_or_default()
            ));
            run.commands.push(p.command.clone());
            procs.push(p);
            tail = Some(DecisionTail::new(log));
        }
        std::thread::sleep(Duration::from_secs(2));
        let n = ((self.opts.minutes * 60.0) / self.opts.duration_s)
            .round()
            .max(1.0) as usize;
        let trace = crate::fixture::diurnal(n, 0.2, 0.9);
        if feeds && !LATENCY_BLIND_POLICIES.contains(&policy) {
            let first = trace.first().copied().unwrap_or(0.2);
            let seconds = self.agent_window_s() + 1.0;
            (self.progress)(&format!(
                "{policy}: warming up for {seconds:.0} s (one latency window) at {:.0}% load",
                first * 100.0
            ));
            self.warm_up_agent(
                addr,
                first * base.peak_qps,
                &feed,
                &format!("coloc-{policy}-{be_name}"),
            )?;
        }
        for (i, target) in trace.iter().enumerate() {
            if let Some((c, s)) = procs
                .iter_mut()
                .find_map(|p| p.exited().map(|s| (p.command.clone(), s)))
            {
                run.notes.push(format!("`{c}` exited ({s}) at window {i}"));
                break;
            }
            let qps = target * base.peak_qps;
            let json = self
                .dir
                .scratch_path(&format!("coloc-{policy}-{be_name}-w{i}.load.json"))?;
            let before = tail.as_mut().and_then(|t: &mut DecisionTail| {
                t.read_new();
                t.last.clone()
            });
            let steal_before = steal_jiffies(Path::new("/proc/stat"));
            let start = now_unix_ms();
            let result = self.runner.run_load_feeding(
                addr,
                qps,
                self.opts.duration_s,
                &json,
                feeds.then_some(feed.as_path()),
            );
            let end = now_unix_ms();
            let mut w = Window {
                index: i,
                start_unix_ms: start,
                end_unix_ms: end,
                target_fraction: *target,
                steal_pct: steal_pct_since(steal_before, Path::new("/proc/stat")),
                ..Default::default()
            };
            match result {
                Ok((m, _, cmd)) => {
                    w.lc_load_fraction = m.achieved_qps / base.peak_qps;
                    w.load = Some(m);
                    if i == 0 {
                        run.commands.push(cmd);
                    }
                }
                Err(e) => w.error = Some(e.to_string()),
            }
            // No progress line in or before the window: the BE was frozen or starved.
            let samples = read_progress(&progress);
            w.be_ops_per_s = Some(stats::counter_rate(&samples, start, end).unwrap_or(0.0));
            w.be_fraction = w.be_ops_per_s.map(|r| r / solo.ops_per_s);
            if let Some(t) = tail.as_mut() {
                let new = t.read_new();
                w.agent = summarize_decisions(before.as_ref(), &new, start, end, threads);
            }
            let view = WindowView {
                policy: policy.into(),
                index: i,
                windows: n,
                load_pct: w.lc_load_fraction * 100.0,
                tail_us: w
                    .load
                    .as_ref()
                    .and_then(|m| m.percentile_us(self.opts.percentile)),
                slo_us: base.slo_us,
                be_cpus: w
                    .agent
                    .as_ref()
                    .and_then(|a| a.be_cpus_mean)
                    .or((policy == "none").then_some(threads as f64)),
                emu: w.be_fraction.map(|b| stats::emu(w.lc_load_fraction, b)),
            };
            live(&view);
            run.windows.push(w);
        }
        for p in procs.iter_mut() {
            p.stop();
        }
        serve.stop();
        Ok(run)
    }
}

/// Records experiment `exp` into `out` and renders its report. Returns the report files.
pub fn run_experiment(
    exp: Experiment,
    opts: Options,
    out: &Path,
    progress: Progress<'_>,
    live: &mut dyn FnMut(&WindowView),
) -> Result<crate::format::ReportFiles> {
    let mut session = Session::open(exp, opts, out, progress)?;
    match exp {
        Experiment::Colocation => session.colocation(live)?,
        _ => {
            let configs = sweep_configs(exp, &session.opts, has_smt(&session.manifest));
            session.sweep(&configs)?;
        }
    }
    let (recorded, resumed) = (session.recorded, session.resumed);
    (session.progress)(&format!(
        "{}: {recorded} results recorded now, {resumed} reused from stored results",
        exp.name()
    ));
    crate::experiments::report(out)
}

/// Median and spread helper re-exported for the CLI's live view.
pub fn spread(values: &[f64]) -> Option<Spread> {
    Spread::of(values)
}
