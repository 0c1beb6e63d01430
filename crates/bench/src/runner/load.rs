//! The runner's load-generator half: how each `headroom load` is configured and wrapped
//! (threads, connections, SCHED_FIFO where allowed) and run.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{command_line, which, Runner};
use crate::error::{BenchError, Result};
use crate::validity::{Connections, LoadShape};
use headroom_report::model::LoadMetrics;

/// The load generator's real-time priority in the experiments: below the LC's 50 in the
/// `lc-fifo+be-quota` setting (they run on different CPUs; the order only matters if a user
/// places them together).
pub const LOADGEN_FIFO_PRIORITY: u32 = 10;

fn loadgen_fifo_prefix() -> Vec<String> {
    vec![
        "chrt".into(),
        "-f".into(),
        LOADGEN_FIFO_PRIORITY.to_string(),
    ]
}

impl Runner {
    /// The configuration of a run at `qps` for `seconds`: threads for the rate within the load
    /// generator's CPUs, and the connections the corrections so far have settled on.
    pub fn shape_for(&self, qps: f64, seconds: f64) -> LoadShape {
        let max = self.placement.loadgen_threads();
        let mut s = LoadShape::for_rate(qps, seconds, max);
        s.threads = s.threads.max(self.min_threads).min(max);
        s.connections = self.connections;
        s.depth = self.depth;
        s
    }

    /// Keeps what a correction found necessary (more connections, more threads) for every later
    /// run, so the experiments run with the configuration the valid probes had.
    pub fn adopt(&mut self, shape: &LoadShape) {
        let more = match (self.connections, shape.connections) {
            (Connections::Fixed(a), Connections::Fixed(b)) => b > a,
            (Connections::Auto, Connections::Fixed(_)) => true,
            _ => false,
        };
        if more {
            self.connections = shape.connections;
        }
        self.min_threads = self.min_threads.max(shape.threads);
    }

    /// Runs every `headroom load` under `SCHED_FIFO` at [`LOADGEN_FIFO_PRIORITY`], so that
    /// nothing sharing its CPU (the agent's 1 ms loop, a BE allowed there) can delay a scheduled
    /// send; the send lag in every table shows whether it kept up. Tried once with `chrt -f N
    /// true`: without CAP_SYS_NICE, or in a cgroup with no RT budget, the reason comes back and
    /// the load generator stays a normal task.
    pub fn realtime_loadgen(&mut self) -> Result<()> {
        if which("chrt").is_none() {
            return Err(BenchError::Unavailable(
                "chrt (util-linux) was not found".into(),
            ));
        }
        let prefix = loadgen_fifo_prefix();
        let out = Command::new(&prefix[0])
            .args(&prefix[1..])
            .arg("true")
            .stdin(Stdio::null())
            .output()
            .map_err(|source| {
                BenchError::Report(headroom_report::ReportError::Spawn {
                    command: format!("{} true", prefix.join(" ")),
                    source,
                })
            })?;
        if !out.status.success() {
            return Err(BenchError::Report(headroom_report::ReportError::Command {
                command: format!("{} true", prefix.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            }));
        }
        self.loadgen_prefix = prefix;
        Ok(())
    }

    /// The argv of one `headroom load` run at a fixed rate, JSON to `json`.
    pub fn load_argv(&self, addr: SocketAddr, qps: f64, seconds: f64, json: &Path) -> Vec<String> {
        self.load_argv_shaped(addr, qps, &self.shape_for(qps, seconds), json)
    }

    /// [`Runner::load_argv`] with threads, connections, depth and duration given.
    pub fn load_argv_shaped(
        &self,
        addr: SocketAddr,
        qps: f64,
        shape: &LoadShape,
        json: &Path,
    ) -> Vec<String> {
        let mut args: Vec<String> = vec!["load".into(), "-s".into(), addr.to_string()];
        args.extend(shape.args());
        args.extend([
            "-q".into(),
            format!("{}", qps.round().max(1.0) as u64),
            "-t".into(),
            format!("{}", shape.seconds.round().max(1.0) as u64),
            "--noload".into(),
            "--quiet".into(),
            // The bench records invalid runs and judges them from the JSON's checks.
            "--invalid-exit-code".into(),
            "0".into(),
            "--json".into(),
            json.display().to_string(),
        ]);
        self.argv(&self.placement.loadgen, &self.loadgen_prefix, &args)
    }

    /// Loads the keys once (`headroom load --loadonly`), so every measured run can use `--noload`.
    pub fn preload(&self, addr: SocketAddr) -> Result<String> {
        let argv = self.argv(
            &self.placement.loadgen,
            &self.loadgen_prefix,
            &[
                "load".into(),
                "-s".into(),
                addr.to_string(),
                "--loadonly".into(),
                "--quiet".into(),
            ],
        );
        self.run_to_end(&argv, Duration::from_secs(120))?;
        Ok(command_line(&argv[0], &argv[1..]))
    }

    /// One fixed-rate load run: the metrics, the raw JSON and the command line.
    pub fn run_load(
        &self,
        addr: SocketAddr,
        qps: f64,
        seconds: f64,
        json: &Path,
    ) -> Result<(LoadMetrics, Value, String)> {
        self.run_load_feeding(addr, qps, seconds, json, None)
    }

    /// [`Runner::run_load`], also pushing its live per-second windows to an agent's feed
    /// socket (`--feed`).
    pub fn run_load_feeding(
        &self,
        addr: SocketAddr,
        qps: f64,
        seconds: f64,
        json: &Path,
        feed: Option<&Path>,
    ) -> Result<(LoadMetrics, Value, String)> {
        self.run_load_shaped(addr, qps, &self.shape_for(qps, seconds), json, feed)
    }

    /// One fixed-rate load run configured by `shape`.
    pub fn run_load_shaped(
        &self,
        addr: SocketAddr,
        qps: f64,
        shape: &LoadShape,
        json: &Path,
        feed: Option<&Path>,
    ) -> Result<(LoadMetrics, Value, String)> {
        let seconds = shape.seconds;
        let mut argv = self.load_argv_shaped(addr, qps, shape, json);
        if let Some(f) = feed {
            argv.push("--feed".into());
            argv.push(f.display().to_string());
        }
        let cmd = command_line(&argv[0], &argv[1..]);
        let _ = std::fs::remove_file(json);
        self.run_to_end(&argv, Duration::from_secs_f64(seconds + 60.0))?;
        let text = std::fs::read_to_string(json).map_err(|e| BenchError::io("reading", json, e))?;
        let raw: Value = serde_json::from_str(&text).map_err(|source| {
            BenchError::Report(headroom_report::ReportError::Json {
                path: json.to_path_buf(),
                source,
            })
        })?;
        Ok((LoadMetrics::from_value(&raw), raw, cmd))
    }
}
