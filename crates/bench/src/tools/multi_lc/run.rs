//! One policy's run of `headroom bench multi-lc`: BE (alone, then beside the services), the
//! agent where the policy has one, and the windows.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::config::{agent_config, AgentSpec, Latency, LcEntry};
use super::plan::{window_emu, LcWindow, Verdict, WindowRecord};
use super::{be_alone, load_once, Flags, Lc};
use crate::record::scaled_cooldown_s;
use crate::runner::{
    read_progress, steal_jiffies, steal_pct_since, summarize_decisions, BeSpec, DecisionTail, Proc,
    Runner,
};
use crate::stats;
use crate::tools::error::Result;
use headroom_host::{Cgroups, LinuxHost};
use headroom_load::clock::unix_ms;
use headroom_types::GroupPath;

pub(super) struct Ctx<'a> {
    pub runner: &'a Runner,
    pub dir: &'a Path,
    pub flags: &'a Flags,
    pub lcs: &'a mut Vec<Lc>,
    /// Per LC, the load per window as a fraction of its capacity.
    pub schedule: Vec<Vec<f64>>,
    pub be: BeSpec,
    pub notes: &'a mut Vec<String>,
}

/// LC b's own cpu group under `hybrid` (outside BE's; the agent does not know it), undone on drop.
struct OwnGroup {
    cgroups: Cgroups,
    group: GroupPath,
    pid: i32,
}

impl OwnGroup {
    fn enter(pid: u32) -> Result<OwnGroup> {
        let cgroups = LinuxHost::system().cgroups()?;
        let group = GroupPath::new(&format!("headroom-mlc-{}-b", std::process::id()))?;
        cgroups.create(&group)?;
        let g = OwnGroup {
            cgroups,
            group,
            pid: pid as i32,
        };
        g.cgroups.move_process(&g.group, g.pid)?;
        Ok(g)
    }
}

impl Drop for OwnGroup {
    fn drop(&mut self) {
        let _ = self.cgroups.move_process(&GroupPath::root(), self.pid);
        std::thread::sleep(Duration::from_millis(50));
        if let Err(e) = self.cgroups.remove(&self.group) {
            eprintln!("{TOOL}: removing {}: {e}", self.group, TOOL = super::TOOL);
        }
    }
}

impl Ctx<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The windows of `policy` on the schedule.
    pub fn policy_run(&mut self, policy: &str) -> Result<Vec<WindowRecord>> {
        let flags = self.flags;
        let runner = self.runner;
        let be_alone_ops = be_alone(
            runner,
            self.dir,
            &self.be,
            if flags.quick { 3.0 } else { 5.0 },
        )?;
        println!(
            "\n== {policy} ==\nBE {} alone: {be_alone_ops:.0} ops/s",
            self.be.label()
        );
        let progress = self.path(&format!("{policy}.be.progress.jsonl"));
        let _ = std::fs::remove_file(&progress);
        let mut procs: Vec<Proc> = Vec::new();
        let mut own_group = None;
        let mut tail = None;
        // The LCs the agent watches: none, a (hybrid), both (multi).
        let watched = match policy {
            "none" => 0,
            "hybrid" => 1,
            _ => self.lcs.len(),
        };
        let feeds: Vec<PathBuf> = self
            .lcs
            .iter()
            .map(|l| crate::runner::feed_socket_path(&format!("mlc-{policy}-{}.sock", l.base.name)))
            .collect::<std::result::Result<_, _>>()?;
        let feeding = |i: usize| flags.latency == Latency::Feed && i < watched;
        if policy == "none" {
            procs.push(runner.start_antagonist(&self.be, &progress)?);
        } else {
            if policy == "hybrid" {
                match OwnGroup::enter(self.lcs[1].base.pid) {
                    Ok(g) => own_group = Some(g),
                    Err(e) => {
                        let n = format!("hybrid: LC b stayed in the bench's own cgroup ({e})");
                        println!("note: {n}");
                        self.notes.push(n);
                    }
                }
            }
            let top = format!("headroom-mlc-{}", std::process::id());
            for f in &feeds {
                let _ = std::fs::remove_file(f);
            }
            let spec = AgentSpec {
                policy: policy.to_string(),
                lcs: self
                    .lcs
                    .iter()
                    .zip(&feeds)
                    .take(watched)
                    .map(|(l, f)| LcEntry {
                        name: l.base.name.clone(),
                        cgroup: format!("{top}/{}", l.base.name),
                        pid: l.base.pid,
                        addr: l.base.addr,
                        slo_us: l.base.slo_us,
                        peak_qps: l.base.capacity_qps,
                        feed: f.clone(),
                    })
                    .collect(),
                latency: flags.latency,
                probe_hz: crate::record::probe_rate_hz(99.0, flags.window_s),
                percentile: 99.0,
                window_s: flags.window_s,
                be_cgroup: format!("{top}/be"),
                be_argv: runner.argv(
                    runner.placement.be_cpus(),
                    &self.be.prefix,
                    &self.be.args(&progress),
                ),
                be_cpus: runner.placement.be_cpus().to_vec(),
                violation_cooldown_s: scaled_cooldown_s(
                    flags.window_s * flags.windows() as f64,
                    flags.window_s,
                ),
                state_file: self.path(&format!("agent-{policy}.state.json")),
                socket: self.path(&format!("agent-{policy}.sock")),
                metrics_port: crate::runner::free_port()?,
            };
            let config = self.path(&format!("agent-{policy}.toml"));
            let built = agent_config(&spec).map_err(|e| crate::record::config_error(&config, e))?;
            crate::record::write_config(&config, &built)?;
            let log = self.path(&format!("{policy}.decisions.jsonl"));
            let _ = std::fs::remove_file(&log);
            let p = runner.start_agent(&config, &log, false)?;
            println!("agent: {} ({})", p.command, config.display());
            procs.push(p);
            tail = Some(DecisionTail::new(log));
        }
        std::thread::sleep(Duration::from_secs(2));
        if policy != "none" {
            // The agent keeps BE off until it has a full latency window: one, before measuring.
            let seconds = flags.window_s + 1.0;
            println!("{policy}: warming up for {seconds:.0} s (one latency window)");
            let rates: Vec<f64> = (0..self.lcs.len()).map(|i| self.qps(i, 0)).collect();
            self.loads(&rates, seconds, "warmup", &feeds, &feeding);
        }
        let n = flags.windows();
        let threads = runner.placement.server.len().max(1);
        let mut windows = Vec::new();
        let mut be_silent_said = false;
        for i in 0..n {
            if let Some((c, s)) = procs
                .iter_mut()
                .find_map(|p| p.exited().map(|s| (p.command.clone(), s)))
            {
                let why = format!(
                    "{policy}: `{c}` exited ({s}) at window {i}: {}",
                    procs
                        .iter()
                        .find(|p| p.command == c)
                        .map(|p| p.log_tail(800))
                        .unwrap_or_default()
                );
                println!("note: {why}");
                self.notes.push(why);
                break;
            }
            let rates: Vec<f64> = (0..self.lcs.len()).map(|l| self.qps(l, i)).collect();
            let before = tail.as_mut().and_then(|t: &mut DecisionTail| {
                t.read_new();
                t.last.clone()
            });
            let steal_before = steal_jiffies();
            let start = unix_ms();
            let results = self.loads(
                &rates,
                flags.window_s,
                &format!("{policy}-w{i}"),
                &feeds,
                &feeding,
            );
            let end = unix_ms();
            let mut lcs = Vec::new();
            for (l, (lc, r)) in self.lcs.iter().zip(results).enumerate() {
                let mut w = LcWindow {
                    lc: lc.base.name.clone(),
                    target_fraction: self.schedule[l][i],
                    target_qps: rates[l],
                    slo_us: lc.base.slo_us,
                    ..Default::default()
                };
                match r {
                    Ok(m) => {
                        w.achieved_qps = m.achieved_qps;
                        w.p99_us = m.percentile_us(99.0);
                        w.valid = m.valid;
                        w.failed_checks = m.failed_checks.clone();
                    }
                    Err(e) => w.error = Some(e.to_string()),
                }
                w.verdict = Verdict::of(w.valid, w.error.is_some(), w.p99_us, w.slo_us);
                lcs.push((w, lc.base.capacity_qps));
            }
            let samples = read_progress(&progress);
            let be_ops = stats::counter_rate(&samples, start, end).unwrap_or(0.0);
            let be_fraction = be_ops / be_alone_ops;
            let agent = tail.as_mut().and_then(|t| {
                let new = t.read_new();
                summarize_decisions(before.as_ref(), &new, start, end, threads)
            });
            let rec = WindowRecord {
                policy: policy.into(),
                index: i,
                start_unix_ms: start,
                end_unix_ms: end,
                emu: window_emu(&lcs, Some(be_fraction)),
                lcs: lcs.into_iter().map(|(w, _)| w).collect(),
                be_ops_per_s: Some(be_ops),
                be_fraction: Some(be_fraction),
                agent,
                steal_pct: steal_pct_since(steal_before),
            };
            println!("{}", live_line(&rec, n));
            let given = rec.agent.as_ref().and_then(|a| a.be_cpus_mean);
            if samples.is_empty() && given.is_some_and(|c| c >= 0.5) && !be_silent_said {
                // the agent gave BE CPUs and BE reported nothing: its command failed there
                // (a taskset outside BE's cpuset did, unseen, in every earlier run)
                println!(
                    "note: BE reported no progress although the agent gave it {:.2} CPUs: \
                     its command fails in BE's group? (see {})",
                    given.unwrap_or(0.0),
                    self.path("logs").display()
                );
                be_silent_said = true;
            }
            windows.push(rec);
        }
        for p in procs.iter_mut() {
            p.stop();
        }
        drop(own_group);
        for f in &feeds {
            let _ = std::fs::remove_file(f);
        }
        Ok(windows)
    }

    fn qps(&self, lc: usize, window: usize) -> f64 {
        self.schedule[lc][window] * self.lcs[lc].base.capacity_qps
    }

    /// One load run per LC at once, each its own `headroom load`.
    fn loads(
        &self,
        rates: &[f64],
        seconds: f64,
        label: &str,
        feeds: &[PathBuf],
        feeding: &dyn Fn(usize) -> bool,
    ) -> Vec<crate::Result<headroom_report::model::LoadMetrics>> {
        let runner = self.runner;
        let jobs: Vec<(SocketAddr, f64, PathBuf, Option<PathBuf>)> = self
            .lcs
            .iter()
            .enumerate()
            .map(|(i, l)| {
                (
                    l.base.addr,
                    rates[i],
                    self.path(&format!("{label}-{}.load.json", l.base.name)),
                    feeding(i).then(|| feeds[i].clone()),
                )
            })
            .collect();
        std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .iter()
                .map(|(addr, qps, json, feed)| {
                    s.spawn(move || {
                        let shape = runner.shape_for(*qps, seconds);
                        load_once(
                            runner,
                            *addr,
                            *qps,
                            &shape,
                            json,
                            feed.as_deref(),
                            self.flags.sleep_only,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(crate::BenchError::Input("a load thread panicked".into()))
                    })
                })
                .collect()
        })
    }
}

/// The live line of one window.
fn live_line(w: &WindowRecord, n: usize) -> String {
    let lcs: Vec<String> = w
        .lcs
        .iter()
        .map(|l| {
            format!(
                "{} {:>3.0}% p99 {:>6} µs (SLO {:.0}) {:<8}",
                l.lc,
                l.target_fraction * 100.0,
                l.p99_us.map_or("–".into(), |v| format!("{v:.0}")),
                l.slo_us,
                l.verdict.word()
            )
        })
        .collect();
    format!(
        "{:<6} w{:>2}/{n} | {} | BE {:>4.0}% of alone{} | EMU {}{}",
        w.policy,
        w.index + 1,
        lcs.join(" | "),
        w.be_fraction.unwrap_or(0.0) * 100.0,
        w.agent
            .as_ref()
            .and_then(|a| a.be_cpus_mean)
            .map_or(String::new(), |c| format!(", {c:.2} CPUs")),
        w.emu.map_or("–".into(), |e| format!("{:.0}%", e * 100.0)),
        // a VM's neighbours: worth a look from a few percent on
        w.steal_pct
            .filter(|s| *s >= 0.5)
            .map_or(String::new(), |s| format!(" | steal {s:.1}%")),
    )
}
