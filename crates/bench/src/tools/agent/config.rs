//! The configs of `headroom bench agent`'s agents, built as typed values and validated once:
//! blind isolation of an LC pinned by pid, one BE group (a spinner the agent starts, or none),
//! the idle sensor and how the agent learns of crossings.

use std::path::{Path, PathBuf};

use headroom_control::config::{
    BeConfig, Config, IdleSensing, IdleSensor, LcConfig, OnExit, PolicyConfig, PolicyKind,
    SafetyConfig, SloConfig,
};
use headroom_types::GroupPath;

use super::super::error::{Result, ToolError};
use crate::record::write_config;

/// One bench agent.
pub(super) struct BenchAgent<'a> {
    /// Where the config, state file and control socket go.
    pub dir: &'a Path,
    /// The bench's top group (`<top>/lc`, `<top>/be`).
    pub top: &'a GroupPath,
    pub lc_pid: u32,
    /// Whether the agent starts a two-thread spinner in BE.
    pub be_spinner: bool,
    pub buffer_cores: f64,
    pub poll_ms: u64,
    pub grow_interval_ms: u64,
    pub idle: IdleSensor,
    pub sensing: IdleSensing,
    /// The config file's name in `dir`.
    pub file_name: String,
}

/// The bench's label of an idle sensor (`events`: BPF, woken by its crossings; `bpf`,
/// `proc_stat`: polled) as the config's values.
pub(super) fn idle_sensing(label: &str) -> Result<(IdleSensor, IdleSensing)> {
    match label {
        "events" => Ok((IdleSensor::Bpf, IdleSensing::Events)),
        "bpf" => Ok((IdleSensor::Bpf, IdleSensing::Poll)),
        "proc_stat" => Ok((IdleSensor::ProcStat, IdleSensing::Poll)),
        other => Err(ToolError::Measurement(format!(
            "no idle sensor is called {other:?} (events, bpf, proc_stat)"
        ))),
    }
}

impl BenchAgent<'_> {
    /// Builds, validates and writes the config; its path.
    pub fn write(&self) -> Result<PathBuf> {
        let path = self.dir.join(&self.file_name);
        let lc = LcConfig::new(
            "lc",
            self.top.join("lc")?,
            vec![self.lc_pid],
            SloConfig::default(),
            None,
            None,
        );
        let command = if self.be_spinner {
            let bin = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("headroom"));
            let mut argv = vec![bin.display().to_string()];
            argv.extend(
                ["antagonist", "spin", "--threads", "2", "--duration", "600"].map(String::from),
            );
            argv
        } else {
            Vec::new()
        };
        let be = BeConfig::new("be", self.top.join("be")?, command);
        let mut config = Config::new(vec![lc], vec![be], PolicyConfig::of(PolicyKind::Blind));
        config.policy.blind.buffer_cores = self.buffer_cores;
        config.policy.blind.poll_ms = self.poll_ms;
        config.policy.blind.grow_interval_ms = self.grow_interval_ms;
        config.safety = SafetyConfig {
            on_exit: OnExit::Restore,
            state_file: self.dir.join("state.json").display().to_string(),
            ..SafetyConfig::default()
        };
        config.api.socket = self.dir.join("ctl.sock").display().to_string();
        config.sensors.idle = self.idle;
        config.sensors.idle_sensing = self.sensing;
        write_config(&path, &config)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bench_agents_config_reads_back_as_built() {
        let dir = tempfile::tempdir().unwrap();
        let top = GroupPath::new("headroom-bench-agent").unwrap();
        let (idle, sensing) = idle_sensing("events").unwrap();
        let path = BenchAgent {
            dir: dir.path(),
            top: &top,
            lc_pid: 4242,
            be_spinner: true,
            buffer_cores: 0.5,
            poll_ms: 1,
            grow_interval_ms: 50,
            idle,
            sensing,
            file_name: "a.toml".into(),
        }
        .write()
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let c = Config::from_file_text(&text, &path).unwrap();
        assert_eq!(c.lcs[0].cgroup.to_string(), "headroom-bench-agent/lc");
        assert_eq!(c.lcs[0].pids, vec![4242]);
        assert_eq!(c.be[0].command[1..3], ["antagonist", "spin"]);
        assert_eq!(c.policy.kind, PolicyKind::Blind);
        assert_eq!(c.policy.blind.buffer_cores, 0.5);
        assert_eq!(c.policy.blind.grow_interval_ms, 50);
        assert_eq!(
            (c.sensors.idle, c.sensors.idle_sensing),
            (IdleSensor::Bpf, IdleSensing::Events)
        );
        assert!(idle_sensing("perf").is_err());
    }
}
