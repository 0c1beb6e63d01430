//! `[actuators]`, `[egress]`, `[sensors]`: which host mechanisms the agent uses.

use crate::config::{invalid, Problems};
use serde::{Deserialize, Serialize};

/// `[actuators]`: which of the extra actuators (`crate::actuators`) may run. Each runs only
/// where `doctor` finds its mechanism; `false` turns it off even there (the policies' parts for
/// it then stay off too). Egress is turned on by `[egress] device` instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ActuatorsConfig {
    /// LLC ways and memory bandwidth of BE through resctrl (`be_llc_ways`, `be_mba_pct`).
    pub resctrl: bool,
    /// The BE CPUs' `scaling_max_freq` (`be_freq_khz`).
    pub cpufreq: bool,
    /// The BE groups' block I/O throttles (`be_io_limits`: `io.max` / `blkio.throttle.*`).
    pub io: bool,
}

impl Default for ActuatorsConfig {
    fn default() -> Self {
        ActuatorsConfig {
            resctrl: true,
            cpufreq: true,
            io: true,
        }
    }
}

/// `[egress]`: the network device whose egress the agent shapes (Heracles Alg. 4). Off unless a
/// device is named: the agent then replaces that device's root qdisc with an HTB tree (LC class
/// 1:10 as the default, BE class 1:20), classifies the BE groups' traffic with a cgroup-BPF
/// program, and removes the tree on exit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Interface name (`""` = no egress control).
    pub device: String,
    /// Link rate, Mbit/s; 0 = read `/sys/class/net/<device>/speed`.
    pub link_mbit: u64,
}

/// Where per-CPU idle time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleSensor {
    /// BPF when it loads (root, CONFIG_BPF_EVENTS), else `/proc/stat`.
    #[default]
    Auto,
    /// A BPF program on the `power:cpu_idle` tracepoint: ns-exact and current, for 1 ms polling.
    Bpf,
    /// `/proc/stat`: idle in 10 ms units, busy time by the scheduler tick.
    ProcStat,
}

/// How the agent learns that the idle-CPU count changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleSensing {
    /// Woken by the BPF idle program's threshold-crossing events wherever it loads (blind and
    /// hybrid policies), sleeping in between; polling at the policy's interval elsewhere.
    #[default]
    Events,
    /// Poll at the policy's interval.
    Poll,
}

/// `[sensors]`: how the machine is read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SensorsConfig {
    /// `"auto"` (default), `"bpf"` (refuse to start without it) or `"proc_stat"`.
    pub idle: IdleSensor,
    /// `"events"` (default) or `"poll"`.
    pub idle_sensing: IdleSensing,
}

impl SensorsConfig {
    /// Refuses idle events without the BPF sensor they come from.
    pub(crate) fn validate(&self, p: &mut Problems) {
        if self.idle == IdleSensor::ProcStat && self.idle_sensing == IdleSensing::Events {
            p.push(invalid(
                "sensors.idle_sensing",
                "events",
                "idle events come from the BPF idle sensor, which sensors.idle = \"proc_stat\" turns off: set idle_sensing = \"poll\"",
            ));
        }
    }
}

impl EgressConfig {
    /// Refuses bad values; the error names the key, the value and the reason.
    pub(crate) fn validate(&self, p: &mut Problems) {
        if !self.device.is_empty()
            && (self.device.len() > 15
                || self.device.contains(['/', ' ', '\0'])
                || self.device == "."
                || self.device == "..")
        {
            p.push(invalid(
                "egress.device",
                &self.device,
                "not a network interface name",
            ));
        }
        if self.link_mbit > 10_000_000 {
            p.push(invalid(
                "egress.link_mbit",
                self.link_mbit,
                "above 10 Tbit/s: the link rate is in Mbit/s (0 = read the device's speed)",
            ));
        }
    }
}
