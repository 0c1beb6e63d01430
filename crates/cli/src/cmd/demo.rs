//! `headroom demo`: the end-to-end colocation demo. Starts `headroom serve` (LC) and a BE
//! antagonist, finds the LC's peak, then runs a short diurnal colocation twice — without the
//! agent and with its default policy — with a live view, and ends with the report and a verdict.

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
    if args.minutes.is_nan() || args.minutes <= 0.0 {
        return Err(super::usage(format!(
            "--minutes {}: must be positive",
            args.minutes
        )));
    }
    if args.window.is_nan() || args.window < 2.0 {
        return Err(super::usage(format!(
            "--window {}: must be at least 2 seconds",
            args.window
        )));
    }
    if !matches!(args.be.as_str(), "spin" | "dram" | "mix") {
        return Err(super::usage(format!(
            "--be {:?}: the demo runs spin, dram or mix",
            args.be
        )));
    }
    if args.policy == "none" {
        return Err(super::usage(
            "--policy none: the demo compares an agent policy with none",
        ));
    }
    let mut rest = vec![
        "--minutes".to_string(),
        format!("{}", args.minutes / 2.0),
        "--duration".into(),
        format!("{}", args.window),
        "--be".into(),
        args.be.clone(),
        "--policies".into(),
        format!("none,{}", args.policy),
    ];
    if let Some(s) = args.slo_us {
        rest.extend(["--slo-us".to_string(), s.to_string()]);
    }
    if let Some(p) = args.peak_qps {
        rest.extend(["--peak-qps".to_string(), p.to_string()]);
    }
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
            rest.push("--dry-run".into());
        }
    }
    let invocation = std::iter::once("headroom".to_string())
        .chain(std::env::args().skip(1))
        .map(|a| headroom_bench::runner::shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ");
    let opts = super::bench::experiment_options(Experiment::Colocation, &rest, invocation)?;
    let slo_note = if args.slo_us.is_some() {
        "given"
    } else {
        "derived from LC alone"
    };
    println!(
        "  placement: load generator + agent on CPU {}, LC + BE on CPU {}; SLO {slo_note}",
        headroom_bench::format::cpu_list(&opts.placement.loadgen),
        headroom_bench::format::cpu_list(&opts.placement.server)
    );
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
    Ok(())
}

fn bar(pct: f64) -> String {
    let n = ((pct / 10.0).round().clamp(0.0, 10.0)) as usize;
    format!("[{}{}]", "#".repeat(n), " ".repeat(10 - n))
}

/// Five lines: SLO, one line per run, and what the comparison says.
fn verdict(s: &headroom_types::summary::Summary) -> Vec<String> {
    let mut out = vec![format!(
        "verdict (SLO p{} ≤ {:.0} µs):",
        headroom_bench::plot::trim_num(s.percentile),
        s.slo_us
    )];
    let pct = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:.0}%", v * 100.0));
    for r in &s.runs {
        out.push(format!(
            "  {:<8} + {}: {} of {} windows violated the SLO, EMU mean {} (min {}), worst p99 {}",
            r.policy,
            r.be,
            r.slo_violations,
            r.windows,
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
            out.push(format!(
                "  at a mean EMU of {} versus {} without it.",
                pct(a.emu_mean),
                pct(n.emu_mean)
            ));
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
