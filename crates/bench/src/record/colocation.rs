//! The colocation experiment: one run per policy over a load trace, window by window, with
//! a live view of each window.

use std::time::Duration;

use serde_json::json;

use super::{be_spec, no_tweak, AgentRun, Session, LATENCY_BLIND_POLICIES};
use crate::error::Result;
use crate::runner::{
    read_progress, steal_jiffies, steal_pct_since, summarize_decisions, DecisionTail, ServeSpec,
};
use crate::stats;
use headroom_load::clock::unix_ms;
use headroom_report::model::{ColocationRun, LcBaseline, Window};
use headroom_report::store::RUNS;

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

    pub(super) fn colocation_run(
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
        let feed = crate::runner::feed_socket_path(&format!("{policy}.sock"))?;
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
                tweak: no_tweak,
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
            let steal_before = steal_jiffies();
            let start = unix_ms();
            let result = self.runner.run_load_feeding(
                addr,
                qps,
                self.opts.duration_s,
                &json,
                feeds.then_some(feed.as_path()),
            );
            let end = unix_ms();
            let mut w = Window {
                index: i,
                start_unix_ms: start,
                end_unix_ms: end,
                target_fraction: *target,
                steal_pct: steal_pct_since(steal_before),
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
