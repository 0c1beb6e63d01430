//! `headroom demo`: the end-to-end colocation demo. Starts `headroom serve` (LC) and a BE
//! antagonist, finds the LC's peak, then runs a short diurnal colocation twice — without the
//! agent and with its default policy — with a live view, and ends with the report and a verdict.

use anyhow::Context as _;
use std::path::PathBuf;

use headroom_bench::experiments::Experiment;

/// Flags of `headroom demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where the run directory goes (report.html, summary.json, raw results)
    #[arg(long, default_value = "headroom-demo")]
    pub out: PathBuf,
    /// Total colocation time in minutes (split between the two runs)
    #[arg(long, default_value_t = 3.0)]
    pub minutes: f64,
    /// BE workload: spin, dram or mix (alternating compute and memory phases)
    #[arg(long, default_value = "spin")]
    pub be: String,
    /// The agent policy to compare with no agent
    #[arg(long, default_value = "hybrid")]
    pub policy: String,
    /// LC SLO in µs (default: 5x the LC-alone p99 at 50% of capacity)
    #[arg(long)]
    pub slo_us: Option<f64>,
    /// LC peak QPS (default: found by probing)
    #[arg(long)]
    pub peak_qps: Option<f64>,
    /// Window length in seconds (one load-generator run and one p99 per window)
    #[arg(long, default_value_t = 10.0)]
    pub window: f64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    // Each of the two runs takes half of --minutes.
    let max_minutes = 2.0 * super::bench::MAX_MINUTES;
    if !(args.minutes.is_finite() && args.minutes > 0.0 && args.minutes <= max_minutes) {
        problems.push(format!(
            "--minutes {}: must be above 0 and at most {max_minutes} (two days: a day a run)",
            super::number(args.minutes)
        ));
    }
    if args.window.is_nan() || args.window < 2.0 {
        problems.push(format!(
            "--window {}: must be at least 2 seconds",
            args.window
        ));
    } else if args.minutes.is_finite() && args.window > args.minutes * 30.0 {
        problems.push(format!(
            "--window {}: longer than each run ({} s of --minutes {}): not one window would fit",
            args.window,
            args.minutes * 30.0,
            args.minutes
        ));
    }
    if !matches!(args.be.as_str(), "spin" | "dram" | "mix") {
        problems.push(format!(
            "--be {:?}: the demo runs spin, dram or mix",
            args.be
        ));
    }
    if args.policy == "none" {
        problems.push("--policy none: the demo compares an agent policy with none".into());
    }
    let mut flags = super::bench::ExperimentFlags {
        minutes: Some(args.minutes / 2.0),
        duration: Some(args.window),
        be: Some(vec![args.be.clone()]),
        policies: Some(vec!["none".into(), args.policy.clone()]),
        slo_us: args.slo_us,
        peak_qps: args.peak_qps,
        ..super::bench::ExperimentFlags::defaults()
    };
    // The flags the demo hands the bench, checked with its own: --minutes (halved there) is the
    // demo's to name, and the bench's --duration is the demo's --window.
    problems.extend(
        super::bench::flag_problems(&flags)
            .into_iter()
            .filter(|p| !p.starts_with("--minutes"))
            .map(|p| match p.strip_prefix("--duration") {
                Some(rest) => format!("--window{rest}"),
                None => p,
            }),
    );
    super::bench::refuse(problems)?;
    headroom_bench::stop_on_signal::install().context("watching for SIGTERM, SIGINT and SIGHUP")?;
    println!(
        "headroom demo: LC = headroom serve, BE = headroom antagonist {}",
        args.be
    );
    match headroom_bench::capability::agent_can_actuate(std::path::Path::new("/sys/fs/cgroup")) {
        Ok(()) => println!("  the agent can act here (root, writable cgroupfs)"),
        Err(why) => {
            println!("  the agent CANNOT act here:");
            for w in &why {
                println!("    - {w}");
            }
            println!("  so it runs with --dry-run: it logs the decisions it would take and changes nothing;");
            println!(
                "  the '{}' run then shows those decisions, not their effect.",
                args.policy
            );
            flags.dry_run = true;
        }
    }
    let invocation = std::iter::once("headroom".to_string())
        .chain(std::env::args().skip(1))
        .map(|a| headroom_bench::runner::shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ");
    let opts = super::bench::options_from_flags(Experiment::Colocation, flags, invocation)?;
    let slo_note = if args.slo_us.is_some() {
        "given"
    } else {
        "derived from LC alone"
    };
    println!("  SLO {slo_note}; the layout and the load generator's scheduler follow");
    println!(
        "  results go to {} (re-render with `headroom report {}`)\n",
        args.out.display(),
        args.out.display()
    );
    let mut progress = |line: &str| println!("{line}");
    let mut live = |w: &headroom_bench::record::WindowView| {
        let ok = match w.tail_us {
            Some(t) if t <= w.slo_us => "ok  ",
            Some(_) => "VIOL",
            None => "??  ",
        };
        println!(
            "  {:<8} {:>2}/{:<2} load {:>3.0}% {}  p99 {:>6} µs / SLO {:<5.0} {}  BE CPUs {:>4}  EMU {:>4}",
            w.policy,
            w.index + 1,
            w.windows,
            w.load_pct,
            bar(w.load_pct),
            w.tail_us.map_or("–".into(), |t| format!("{t:.0}")),
            w.slo_us,
            ok,
            w.be_cpus.map_or("–".into(), |c| format!("{c:.1}")),
            w.emu.map_or("–".into(), |e| format!("{:.0}%", e * 100.0)),
        );
    };
    let files = headroom_bench::record::run_experiment(
        Experiment::Colocation,
        opts,
        &args.out,
        &mut progress,
        &mut live,
    );
    super::bench::remove_bench_groups();
    let files = files?;
    let summary: headroom_types::summary::Summary =
        serde_json::from_str(&std::fs::read_to_string(&files.summary_json)?)?;
    println!();
    println!("report:  {}", files.html.display());
    println!("summary: {}", files.summary_json.display());
    println!();
    for line in verdict(&summary) {
        println!("{line}");
    }
    let cooldown =
        headroom_bench::record::scaled_cooldown_s(args.minutes / 2.0 * 60.0, args.window);
    for line in story(&args.out, &summary, cooldown) {
        println!("{line}");
    }
    Ok(())
}

/// The rest of the story the counts do not tell: whether BE came back after a violation, which
/// windows' measurements failed their self-checks, and which baseline probes were set aside.
fn story(
    out: &std::path::Path,
    s: &headroom_types::summary::Summary,
    cooldown_s: f64,
) -> Vec<String> {
    use headroom_report::model::{ColocationRun, LcBaseline};
    let Ok(dir) = headroom_report::store::RunDir::open(out) else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    let runs: Vec<ColocationRun> = dir.all(headroom_report::store::RUNS).unwrap_or_default();
    for r in runs.iter().filter(|r| r.policy != "none") {
        lines.push(format!(
            "  {}: {}",
            r.policy,
            be_after_violation(&r.windows, s.slo_us, s.percentile, cooldown_s)
        ));
    }
    for r in &runs {
        let bad: Vec<String> = r
            .windows
            .iter()
            .filter(|w| !w.load.as_ref().is_some_and(|l| l.valid))
            .map(|w| {
                let why = match (&w.load, &w.error) {
                    (Some(l), _) => headroom_bench::validity::short_reason(l),
                    (None, Some(e)) => e.chars().take(110).collect(),
                    (None, None) => "no result".into(),
                };
                format!("window {}: {why}", w.index + 1)
            })
            .collect();
        if !bad.is_empty() {
            lines.push(format!(
                "  {} + {}: {} of {} windows' load runs failed their self-checks (hollow in the report): {}",
                r.policy,
                r.be,
                bad.len(),
                r.windows.len(),
                bad.join("; ")
            ));
        }
    }
    if let Ok(Some(b)) = dir.load::<LcBaseline>(headroom_report::store::BASELINES, "lc") {
        let invalid: Vec<&headroom_report::model::Probe> =
            b.probes.iter().filter(|p| !p.valid).collect();
        let used = b.probes.iter().filter(|p| p.used).count();
        let mut line = format!(
            "  LC alone: {} probes, {used} used for the capacity, SLO and peak (all valid)",
            b.probes.len()
        );
        if let Some(p) = invalid.last() {
            line.push_str(&format!(
                "; {} failed their self-checks and were set aside, the last at {:.0} QPS: {}",
                invalid.len(),
                p.target_qps,
                headroom_bench::validity::short_reason(&p.metrics)
            ));
        }
        lines.push(line);
    }
    lines
}

/// Whether BE came back after the agent's first SLO violation, or why it stayed off.
fn be_after_violation(
    windows: &[headroom_report::model::Window],
    slo_us: f64,
    percentile: f64,
    cooldown_s: f64,
) -> String {
    let tail = |w: &headroom_report::model::Window| {
        w.load.as_ref().and_then(|l| l.percentile_us(percentile))
    };
    let be_on = |w: &headroom_report::model::Window| {
        w.agent
            .as_ref()
            .and_then(|a| a.be_cpus_mean)
            .map_or(w.be_fraction.is_some_and(|f| f > 0.01), |c| c > 0.05)
    };
    let Some(v) = windows
        .iter()
        .position(|w| tail(w).is_some_and(|t| t > slo_us))
    else {
        let on = windows.iter().filter(|w| be_on(w)).count();
        return format!(
            "no SLO violation; BE ran in {on} of {} windows",
            windows.len()
        );
    };
    // BE "came back" only after a window it was off in: one still running while the agent cut
    // it (a tenth of a CPU on average in the window after the violation) did not come back.
    let Some(off) = (v..windows.len()).find(|&k| !be_on(&windows[k])) else {
        return format!(
            "BE was never off after the violation in window {} (the agent shrank it, or did not act)",
            v + 1
        );
    };
    match windows[off + 1..].iter().find(|w| be_on(w)) {
        Some(w) => format!(
            "BE was off from window {} and came back in window {} after the violation in window {} (violation cooldown {cooldown_s:.0} s)",
            off + 1,
            w.index + 1,
            v + 1
        ),
        None if off + 1 == windows.len() => {
            format!(
                "BE was off in the last window ({}) after the violation in window {}",
                off + 1,
                v + 1
            )
        }
        None => {
            let reason = windows[off + 1..]
                .iter()
                .rev()
                .find_map(|w| w.agent.as_ref().and_then(|a| a.last_reason.clone()))
                .unwrap_or_else(|| "no decision logged".into());
            format!(
                "BE stayed off from window {} to the end after the violation in window {} (violation cooldown {cooldown_s:.0} s); the agent's last reason: {reason}",
                off + 1,
                v + 1
            )
        }
    }
}

fn bar(pct: f64) -> String {
    let n = ((pct / 10.0).round().clamp(0.0, 10.0)) as usize;
    format!("[{}{}]", "#".repeat(n), " ".repeat(10 - n))
}

/// Five lines: SLO, one line per run, and what the comparison says.
fn verdict(s: &headroom_types::summary::Summary) -> Vec<String> {
    let mut out = vec![format!(
        "verdict (SLO p{} ≤ {:.0} µs):",
        headroom_report::plot::trim_num(s.percentile),
        s.slo_us
    )];
    let pct = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:.0}%", v * 100.0));
    for r in &s.runs {
        out.push(format!(
            "  {:<8} + {}: {} of {} windows violated the SLO{}, EMU mean {} (min {}), worst p99 {}",
            r.policy,
            r.be,
            r.slo_violations,
            r.windows,
            valid_part(r),
            pct(r.emu_mean),
            pct(r.emu_min),
            r.lc_p99_us_max.map_or("–".into(), |v| format!("{v:.0} µs"))
        ));
    }
    let none = s.runs.iter().find(|r| r.policy == "none");
    let agent = s.runs.iter().find(|r| r.policy != "none");
    match (none, agent) {
        (Some(n), Some(a)) => {
            out.push(format!(
                "  the agent ({}) {} SLO violations ({} → {}),",
                a.policy,
                if a.slo_violations < n.slo_violations {
                    "reduced"
                } else if a.slo_violations == n.slo_violations {
                    "did not change"
                } else {
                    "INCREASED"
                },
                n.slo_violations,
                a.slo_violations
            ));
            let us = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.0} µs"));
            out.push(format!(
                "  at a mean EMU of {} versus {} without it; worst p{} {} versus {} without it.",
                pct(a.emu_mean),
                pct(n.emu_mean),
                headroom_report::plot::trim_num(s.percentile),
                us(a.lc_p99_us_max),
                us(n.lc_p99_us_max)
            ));
            // Both can hold: a run with no violation whose windows were mostly not measured
            // validly says first that its counts rest on hollow windows.
            if let Some(why) = mostly_hollow(n, a) {
                out.push(format!("  {why}"));
            }
            if let Some(why) = no_difference_shown(s.slo_us, n) {
                out.push(format!("  this host did not show a difference: {why}"));
            }
        }
        _ => {
            out.push("  one of the two runs did not complete: see the notes in the report.".into())
        }
    }
    while out.len() < 5 {
        out.push(String::new());
    }
    out
}

/// ` (of the N whose load runs passed their self-checks: M)`, where the run kept validity and
/// some window failed.
fn valid_part(r: &headroom_types::summary::RunSummary) -> String {
    match (r.valid_windows, r.slo_violations_valid) {
        (Some(v), Some(m)) if v < r.windows => {
            format!(" (of the {v} whose load runs passed their self-checks: {m})")
        }
        _ => String::new(),
    }
}

/// Where fewer than half of either run's windows were measured validly, the verdict's counts
/// rest on figures the load generator could not vouch for: said, with the valid windows' own
/// comparison.
fn mostly_hollow(
    none: &headroom_types::summary::RunSummary,
    agent: &headroom_types::summary::RunSummary,
) -> Option<String> {
    let (nv, av) = (none.valid_windows?, agent.valid_windows?);
    if 2 * nv >= none.windows && 2 * av >= agent.windows {
        return None;
    }
    let head = format!(
        "these counts rest mostly on windows whose load runs failed their self-checks ({nv} of {} valid without the agent, {av} of {} with it)",
        none.windows, agent.windows
    );
    Some(if nv == 0 || av == 0 {
        format!("{head}; with no valid window on one side there is no valid comparison: the colocation figures above are unknown here")
    } else {
        format!(
            "{head}; over the valid ones alone: {} → {} violating",
            none.slo_violations_valid.unwrap_or(0),
            agent.slo_violations_valid.unwrap_or(0)
        )
    })
}

/// Why the run without the agent could show no difference, where it could not: BE never pushed
/// the LC past its SLO, so there was nothing for the agent to prevent.
fn no_difference_shown(slo_us: f64, none: &headroom_types::summary::RunSummary) -> Option<String> {
    if none.slo_violations > 0 || none.windows == 0 {
        return None;
    }
    Some(match none.lc_p99_us_max {
        Some(worst) => format!(
            "without the agent BE never pushed the LC past its SLO (worst p99 {worst:.0} µs against {slo_us:.0} µs), so there was no violation for the agent to prevent; the SLO was set above this host's own noise (the \"host noise\" line above): a larger BE, a higher load (--peak-qps) or a quieter host is what would show one"
        ),
        None => "without the agent no window measured the LC validly, so there was nothing to compare (see the windows that failed their self-checks below)".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::be_after_violation;

    #[test]
    fn a_run_without_violations_says_the_host_showed_no_difference_and_why() {
        use headroom_types::summary::RunSummary;
        let none = RunSummary {
            policy: "none".into(),
            be: "spin".into(),
            slo_violations: 0,
            windows: 9,
            emu_mean: Some(1.55),
            emu_min: Some(1.17),
            lc_p99_us_max: Some(3125.0),
            be_throughput_norm: None,
            valid_windows: None,
            slo_violations_valid: None,
        };
        let why = super::no_difference_shown(7588.0, &none).expect("said");
        assert!(why.contains("worst p99 3125 µs against 7588 µs"), "{why}");
        let violated = RunSummary {
            slo_violations: 3,
            ..none.clone()
        };
        assert_eq!(super::no_difference_shown(7588.0, &violated), None);
        let unmeasured = RunSummary {
            lc_p99_us_max: None,
            ..none
        };
        assert!(super::no_difference_shown(500.0, &unmeasured)
            .unwrap()
            .contains("no window measured"));
    }

    #[test]
    fn a_verdict_on_mostly_hollow_windows_says_so_with_the_valid_ones_counted() {
        use headroom_types::summary::{RunSummary, Summary};
        // The 2026-11-29 14:44 run: none 8 of 9 violating, 3 valid (2 of them violating);
        // hybrid 0 of 9, 2 valid.
        let none = RunSummary {
            policy: "none".into(),
            be: "spin".into(),
            slo_violations: 8,
            windows: 9,
            emu_mean: Some(1.33),
            emu_min: Some(1.04),
            lc_p99_us_max: Some(4542.0),
            be_throughput_norm: None,
            valid_windows: Some(3),
            slo_violations_valid: Some(2),
        };
        let hybrid = RunSummary {
            policy: "hybrid".into(),
            slo_violations: 0,
            valid_windows: Some(2),
            slo_violations_valid: Some(0),
            ..none.clone()
        };
        let s = Summary {
            experiment: "colocation".into(),
            slo_us: 3686.0,
            percentile: 99.0,
            runs: vec![none.clone(), hybrid.clone()],
        };
        let text = super::verdict(&s).join("\n");
        assert!(
            text.contains("8 of 9 windows violated the SLO (of the 3 whose load runs passed their self-checks: 2)"),
            "{text}"
        );
        assert!(
            text.contains("3 of 9 valid without the agent, 2 of 9 with it); over the valid ones alone: 2 → 0 violating"),
            "{text}"
        );
        // Every window valid: the plain counts, nothing more said.
        let all_valid = |r: &RunSummary| RunSummary {
            valid_windows: Some(9),
            slo_violations_valid: Some(r.slo_violations),
            ..r.clone()
        };
        let s = Summary {
            runs: vec![all_valid(&none), all_valid(&hybrid)],
            ..s
        };
        let text = super::verdict(&s).join("\n");
        assert!(
            text.contains("8 of 9 windows violated the SLO, EMU"),
            "{text}"
        );
        assert!(!text.contains("self-checks"), "{text}");
        // The 2026-11-29 17:14 run: no window valid on either side and no violation: both the
        // hollow windows and the missing difference are said, the hollow first.
        let hollow = |r: &RunSummary| RunSummary {
            slo_violations: 0,
            valid_windows: Some(0),
            slo_violations_valid: Some(0),
            ..r.clone()
        };
        let s = Summary {
            slo_us: 8778.0,
            runs: vec![hollow(&none), hollow(&hybrid)],
            ..s
        };
        let lines = super::verdict(&s);
        let at = |needle: &str| lines.iter().position(|l| l.contains(needle));
        let (h, d) = (at("no valid comparison"), at("did not show a difference"));
        assert!(h.is_some() && d.is_some() && h < d, "{lines:#?}");
    }
    use headroom_report::model::{AgentWindow, LoadMetrics, Window};

    fn window(i: usize, p99: f64, be_cpus: f64, reason: &str) -> Window {
        Window {
            index: i,
            load: Some(LoadMetrics {
                valid: true,
                p99_us: Some(p99),
                ..Default::default()
            }),
            agent: Some(AgentWindow {
                be_cpus_mean: Some(be_cpus),
                last_reason: Some(reason.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_verdict_says_whether_be_came_back_after_a_violation_or_why_not() {
        let came_back = [
            window(0, 900.0, 0.0, "slo violated"),
            window(1, 200.0, 0.0, "cooldown"),
            window(2, 200.0, 1.0, "slack"),
        ];
        let s = be_after_violation(&came_back, 500.0, 99.0, 10.0);
        assert!(
            s.contains("came back in window 3") && s.contains("window 1"),
            "{s}"
        );
        let stayed = [
            window(0, 200.0, 1.0, "slack"),
            window(1, 900.0, 0.0, "slo violated"),
            window(2, 200.0, 0.0, "violation cooldown: 290 s left"),
        ];
        let s = be_after_violation(&stayed, 500.0, 99.0, 300.0);
        assert!(
            s.contains("stayed off from window 2") && s.contains("violation in window 2"),
            "{s}"
        );
        assert!(
            s.contains("cooldown 300 s") && s.contains("290 s left"),
            "{s}"
        );
        // The 16-CPU demo: BE at 14 CPUs in the violating window, a tenth of a CPU in the next
        // (cut during it), then off: it did not come back.
        let cut = [
            window(0, 200.0, 14.0, "slack"),
            window(1, 314.0, 14.0, "slack"),
            window(2, 3992.0, 0.1, "slo violated"),
            window(3, 1738.0, 0.0, "violation cooldown"),
            window(4, 49.0, 0.0, "violation cooldown"),
        ];
        let s = be_after_violation(&cut, 292.0, 99.0, 10.0);
        assert!(
            s.contains("stayed off from window 4") && s.contains("violation in window 2"),
            "{s}"
        );
        let calm = [window(0, 200.0, 1.0, "slack")];
        assert!(be_after_violation(&calm, 500.0, 99.0, 10.0).contains("no SLO violation"));
    }
}
