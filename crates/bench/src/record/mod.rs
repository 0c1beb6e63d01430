//! The record step of every experiment: what to run, in which order, stored point by point so an
//! interrupted run resumes by skipping the points whose result file exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::{BenchError, Result};
use crate::experiments::Experiment;
use crate::runner::{self, strs, Placement, Runner, ServeSpec};
use crate::stats::Spread;
use headroom_load::clock::unix_ms;
use headroom_report::model::Manifest;
use headroom_report::store::RunDir;

mod agent;
mod baselines;
mod capacity_search;
mod colocation;
mod noise_floor;
mod sweep;

pub(crate) use agent::{be_config, config_error, lc_config, write_config, LcService};
pub use agent::{
    no_tweak, scaled_cooldown_s, AgentRun, AgentTweak, PRODUCTION_COOLDOWN_S, TRACE_DAY_S,
};
pub(crate) use capacity_search::capacity_search;
pub use capacity_search::{held_by_majority, Outcome, Search};
pub use colocation::WindowView;
pub use noise_floor::{NoiseFloor, LOW_LOAD_QPS};
pub use sweep::{be_spec, has_smt, sweep_configs, SweepConfig};

/// Everything a recording needs; [`Options::defaults`] gives the defaults per experiment.
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
    /// Run the load generator under `SCHED_FIFO` where allowed (see `Runner::realtime_loadgen`);
    /// off by default: a real-time client polling most of a second is throttled by the kernel's
    /// real-time budget for the rest of it, which 1 s probes never see and 8-15 s windows do.
    pub realtime_loadgen: bool,
    /// The command line that started this recording (for the report).
    pub invocation: String,
}

fn frac(pcts: &[f64]) -> Vec<f64> {
    pcts.iter().map(|p| p / 100.0).collect()
}

impl Options {
    /// The defaults (or the quick version, a couple of minutes) for `exp`.
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
            realtime_loadgen: false,
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
        progress(&format!("placement: {}", opts.placement.describe()));
        let realtime = if opts.realtime_loadgen {
            runner.realtime_loadgen().map_err(|e| e.to_string())
        } else {
            Err("the default; `--realtime-loadgen` asks for SCHED_FIFO".into())
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
        // Said at once: a refused SCHED_FIFO changes what the send lag may show.
        progress(&format!("scheduler: {}", notes[0]));
        let machine = runner::record_machine(&runner, &mut notes);
        let mut manifest = previous.unwrap_or_default();
        manifest.experiment = exp.name().into();
        manifest.machine = machine;
        manifest.percentile = opts.percentile;
        if manifest.started_unix_ms == 0 {
            manifest.started_unix_ms = unix_ms();
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
        Ok(self.dir.write_manifest(&self.manifest)?)
    }

    /// Marks the manifest finished.
    pub fn finish(&mut self) -> Result<()> {
        self.manifest.finished_unix_ms = Some(unix_ms());
        self.save_manifest()
    }
}

fn default_serve() -> ServeSpec {
    ServeSpec {
        threads: 1,
        ..Default::default()
    }
}

/// Records experiment `exp` into `out` and renders its report. Returns the report files.
pub fn run_experiment(
    exp: Experiment,
    opts: Options,
    out: &Path,
    progress: Progress<'_>,
    live: &mut dyn FnMut(&WindowView),
) -> Result<headroom_report::format::ReportFiles> {
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
    crate::study::report(out)
}

/// Median and spread helper re-exported for the CLI's live view.
pub fn spread(values: &[f64]) -> Option<Spread> {
    Spread::of(values)
}
