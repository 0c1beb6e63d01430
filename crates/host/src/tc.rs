//! Egress throttling with `tc` HTB: a root qdisc, an unlimited LC class (the default, so
//! unclassified traffic is never restricted), and a BE class whose `ceil` changes at run time.
//! BE sockets are classified by cgroup: the v1 `net_cls.classid` of the sending task plus a tc
//! `cgroup` filter. `tc` is run behind [`TcRunner`] so the command sequence is testable.

use std::fmt;
use std::process::Command;
use std::sync::Mutex;

use crate::error::{HostError, Result};

/// Runs one `tc` command line and returns its stdout.
pub trait TcRunner: Send + Sync + fmt::Debug {
    fn run(&self, args: &[String]) -> Result<String>;
}

/// The real `tc` binary, optionally inside a named network namespace (`tc -n NS`).
#[derive(Debug, Clone, Default)]
pub struct SystemTc {
    pub netns: Option<String>,
    /// The binary (default `tc`).
    pub program: Option<String>,
}

impl SystemTc {
    pub fn new() -> Self {
        SystemTc::default()
    }

    pub fn in_netns(netns: &str) -> Self {
        SystemTc {
            netns: Some(netns.to_owned()),
            program: None,
        }
    }
}

impl TcRunner for SystemTc {
    fn run(&self, args: &[String]) -> Result<String> {
        let program = self.program.as_deref().unwrap_or("tc");
        let mut full: Vec<String> = Vec::new();
        if let Some(ns) = &self.netns {
            full.push("-n".to_owned());
            full.push(ns.clone());
        }
        full.extend_from_slice(args);
        let shown = format!("{program} {}", full.join(" "));
        tracing::debug!(command = %shown, "tc");
        let output =
            Command::new(program)
                .args(&full)
                .output()
                .map_err(|e| HostError::Command {
                    command: shown.clone(),
                    reason: format!("cannot start: {e}"),
                })?;
        if !output.status.success() {
            return Err(HostError::Command {
                command: shown,
                reason: format!(
                    "{}: {}",
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// A test double: records every command and answers `show` commands with a canned reply.
#[derive(Debug, Default)]
pub struct RecordingTc {
    calls: Mutex<Vec<Vec<String>>>,
    show_reply: Mutex<String>,
    fail_on: Mutex<Option<(String, String)>>,
}

impl RecordingTc {
    pub fn new() -> Self {
        RecordingTc::default()
    }

    /// What `tc … show …` commands answer.
    pub fn set_show_reply(&self, json: &str) {
        *self.show_reply.lock().unwrap_or_else(|p| p.into_inner()) = json.to_owned();
    }

    /// Makes the first command containing `word` fail with `stderr`.
    pub fn fail_when(&self, word: &str, stderr: &str) {
        *self.fail_on.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((word.to_owned(), stderr.to_owned()));
    }

    /// The commands run so far, each joined with spaces.
    pub fn calls(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|c| c.join(" "))
            .collect()
    }
}

impl TcRunner for RecordingTc {
    fn run(&self, args: &[String]) -> Result<String> {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(args.to_vec());
        let mut fail_on = self.fail_on.lock().unwrap_or_else(|p| p.into_inner());
        let hit = fail_on
            .as_ref()
            .is_some_and(|(word, _)| args.iter().any(|a| a == word));
        if hit {
            let (_, stderr) = fail_on.take().unwrap_or_default();
            return Err(HostError::Command {
                command: format!("tc {}", args.join(" ")),
                reason: stderr,
            });
        }
        if args.iter().any(|a| a == "show") {
            return Ok(self
                .show_reply
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone());
        }
        Ok(String::new())
    }
}

/// The HTB layout: handle `1:`, parent class `1:1`, LC class `1:<lc_minor>` (default),
/// BE class `1:<be_minor>`. tc writes minors in hex: `be_minor: 0x20` is class `1:20`, whose
/// class id (for `net_cls.classid` or `skb->priority`) is 0x0001_0020.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HtbConfig {
    /// Link capacity in bits per second (the LC class's rate and ceil).
    pub link_bits_per_s: u64,
    /// BE ceiling in bits per second.
    pub be_ceil_bits_per_s: u64,
    pub lc_minor: u16,
    pub be_minor: u16,
}

impl HtbConfig {
    pub fn new(link_bits_per_s: u64, be_ceil_bits_per_s: u64) -> Self {
        HtbConfig {
            link_bits_per_s,
            be_ceil_bits_per_s,
            lc_minor: 0x10,
            be_minor: 0x20,
        }
    }

    /// The BE class id as `net_cls.classid` and `skb->priority` want it (`0x0001_0020`).
    pub fn be_classid(&self) -> u32 {
        net_cls_classid(1, self.be_minor)
    }

    /// The LC class id as `net_cls.classid` wants it.
    pub fn lc_classid(&self) -> u32 {
        net_cls_classid(1, self.lc_minor)
    }
}

/// `major:minor` as a `net_cls.classid` value.
pub fn net_cls_classid(major: u16, minor: u16) -> u32 {
    (u32::from(major) << 16) | u32::from(minor)
}

/// Byte counters of one tc class.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TcClassStats {
    /// `1:20`.
    pub handle: String,
    pub bytes: u64,
    pub packets: u64,
    pub drops: u64,
}

#[derive(serde::Deserialize)]
struct JsonClass {
    handle: String,
    /// Newer iproute2 nests the counters in `stats`.
    #[serde(default)]
    stats: Option<JsonStats>,
    /// Others put them at the top level (as for qdiscs).
    #[serde(flatten)]
    flat: JsonStats,
}

#[derive(serde::Deserialize, Default)]
struct JsonStats {
    #[serde(default)]
    bytes: u64,
    #[serde(default)]
    packets: u64,
    #[serde(default)]
    drops: u64,
}

/// Parses `tc -s -j class show dev D`, or the text of `tc -s class show dev D` (iproute2
/// releases such as 6.1 print classes as text even with `-j`).
pub fn parse_class_stats(output: &str) -> Result<Vec<TcClassStats>> {
    let trimmed = output.trim_start();
    if trimmed.starts_with('[') {
        let classes: Vec<JsonClass> =
            serde_json::from_str(trimmed).map_err(|e| HostError::Command {
                command: "tc -s -j class show".to_owned(),
                reason: format!(
                    "unexpected JSON ({e}): {}",
                    output.chars().take(200).collect::<String>()
                ),
            })?;
        return Ok(classes
            .into_iter()
            .map(|c| {
                let s = c.stats.unwrap_or(c.flat);
                TcClassStats {
                    handle: c.handle,
                    bytes: s.bytes,
                    packets: s.packets,
                    drops: s.drops,
                }
            })
            .collect());
    }
    parse_class_stats_text(output)
}

/// `class htb 1:20 parent 1:1 … \n Sent 123 bytes 4 pkt (dropped 0, overlimits 0 requeues 0)`.
fn parse_class_stats_text(output: &str) -> Result<Vec<TcClassStats>> {
    let bad = |line: &str| HostError::Command {
        command: "tc -s class show".to_owned(),
        reason: format!("unexpected output line {line:?}"),
    };
    let mut out: Vec<TcClassStats> = Vec::new();
    for line in output.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().copied() {
            Some("class") => {
                let handle = words.get(2).ok_or_else(|| bad(line))?;
                out.push(TcClassStats {
                    handle: (*handle).to_owned(),
                    bytes: 0,
                    packets: 0,
                    drops: 0,
                });
            }
            Some("Sent") => {
                let current = out.last_mut().ok_or_else(|| bad(line))?;
                let number = |i: usize| -> Result<u64> {
                    words
                        .get(i)
                        .map(|w| w.trim_matches(|c: char| !c.is_ascii_digit()))
                        .and_then(|w| w.parse().ok())
                        .ok_or_else(|| bad(line))
                };
                current.bytes = number(1)?;
                current.packets = number(3)?;
                if words.get(5) == Some(&"(dropped") {
                    current.drops = number(6)?;
                }
            }
            Some(_) if out.is_empty() && !line.trim().is_empty() => return Err(bad(line)),
            _ => {}
        }
    }
    Ok(out)
}

/// HTB egress control of one device.
#[derive(Debug)]
pub struct Egress<R: TcRunner> {
    runner: R,
    device: String,
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

fn rate(bits_per_s: u64) -> String {
    format!("{}bit", bits_per_s.max(8))
}

impl<R: TcRunner> Egress<R> {
    /// `device` must be a plain interface name.
    pub fn new(runner: R, device: &str) -> Result<Self> {
        if device.is_empty()
            || device.len() > 15
            || device.contains(['/', ' ', '\0'])
            || device == "."
            || device == ".."
        {
            return Err(HostError::invalid(
                "network device",
                device,
                "not a valid interface name",
            ));
        }
        Ok(Egress {
            runner,
            device: device.to_owned(),
        })
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    /// Installs (or replaces) the HTB tree. Unclassified traffic goes to the LC class. BE traffic
    /// reaches the BE class either through `skb->priority` = the BE class id (set per cgroup
    /// with `Cgroups::set_net_prio`, or per socket with SO_PRIORITY: HTB matches it without a
    /// filter) or through [`Egress::add_net_cls_filter`] where the kernel has `cls_cgroup`.
    pub fn setup(&self, config: &HtbConfig) -> Result<()> {
        if config.be_ceil_bits_per_s == 0 || config.link_bits_per_s == 0 {
            return Err(HostError::invalid(
                "htb rates",
                format!("{config:?}"),
                "rates must be positive",
            ));
        }
        let d = self.device.as_str();
        let link = rate(config.link_bits_per_s);
        let lc = format!("1:{:x}", config.lc_minor);
        let default = format!("{:x}", config.lc_minor);
        self.runner.run(&args(&[
            "qdisc", "replace", "dev", d, "root", "handle", "1:", "htb", "default", &default,
        ]))?;
        self.runner.run(&args(&[
            "class", "replace", "dev", d, "parent", "1:", "classid", "1:1", "htb", "rate", &link,
            "ceil", &link,
        ]))?;
        self.runner.run(&args(&[
            "class", "replace", "dev", d, "parent", "1:1", "classid", &lc, "htb", "rate", &link,
            "ceil", &link,
        ]))?;
        self.set_be_class(config, "replace")?;
        Ok(())
    }

    /// Classifies by the sending task's v1 `net_cls.classid` (tc `cgroup` filter, `cls_cgroup`).
    pub fn add_net_cls_filter(&self) -> Result<()> {
        self.runner.run(&args(&[
            "filter",
            "replace",
            "dev",
            &self.device,
            "parent",
            "1:",
            "protocol",
            "all",
            "prio",
            "10",
            "handle",
            "1:",
            "cgroup",
        ]))?;
        Ok(())
    }

    fn set_be_class(&self, config: &HtbConfig, verb: &str) -> Result<()> {
        let ceil = rate(config.be_ceil_bits_per_s.min(config.link_bits_per_s));
        // rate = ceil: HTB serves classes within their rate before any borrowing, so a BE
        // rate below its ceil would leave BE starved whenever LC is backlogged. With rate = ceil
        // BE gets exactly up to its ceiling (Heracles sets it to link − LC − headroom) and LC
        // keeps everything else, including what BE leaves unused.
        let be = format!("1:{:x}", config.be_minor);
        self.runner.run(&args(&[
            "class",
            verb,
            "dev",
            &self.device,
            "parent",
            "1:1",
            "classid",
            &be,
            "htb",
            "rate",
            &ceil,
            "ceil",
            &ceil,
        ]))?;
        Ok(())
    }

    /// Changes the BE ceiling at run time (`tc class change`).
    pub fn set_be_ceil(&self, config: &HtbConfig, be_ceil_bits_per_s: u64) -> Result<()> {
        if be_ceil_bits_per_s == 0 {
            return Err(HostError::invalid("BE ceil", "0", "must be positive"));
        }
        let mut next = *config;
        next.be_ceil_bits_per_s = be_ceil_bits_per_s;
        self.set_be_class(&next, "change")
    }

    /// Byte counters of every class.
    pub fn class_stats(&self) -> Result<Vec<TcClassStats>> {
        let out = self
            .runner
            .run(&args(&["-s", "-j", "class", "show", "dev", &self.device]))?;
        parse_class_stats(&out)
    }

    /// Removes the root qdisc (and with it every class and filter).
    pub fn teardown(&self) -> Result<()> {
        self.runner
            .run(&args(&["qdisc", "del", "dev", &self.device, "root"]))?;
        Ok(())
    }
}
