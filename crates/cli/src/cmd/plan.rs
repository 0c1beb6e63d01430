//! `headroom plan`: Leverich & Kozyrakis' TCO model — the paper's Table 2 from its own inputs, and
//! servers / TCO with and without colocation for an operator's fleet.

use std::path::PathBuf;

use headroom_sim::tco::{leverich_table2, plan, PlanConfig, TcoParams};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Reproduce a paper's table from its own inputs (`leverich`: Table 2's perf/TCO row)
    #[arg(long, value_parser = ["leverich"])]
    pub paper: Option<String>,
    /// Plan file (TOML): [lc] peak_qps, qps_per_server, mean_load; [be] demand_servers;
    /// [colocation] emu or summary (+ policy); [server] cost parameters (docs/simulation.md)
    #[arg(long, conflicts_with = "paper")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.paper.is_some() {
        let rows = leverich_table2(&TcoParams::default());
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({ "rows": rows }))?
            );
        } else {
            println!(
                "Leverich & Kozyrakis EuroSys'14 Table 2: perf/TCO-$ improvement of co-location"
            );
            println!("(geo. mean SPEC throughput of the 12 listed benchmarks; $2000 server, 300 W peak, 50% static, K1/L1/K2 1.33/0.8/0.25, $0.08/kWh, 3 years)");
            println!(
                "{:<22} {:>8} {:>10} {:>7}",
                "memcached load", "paper", "computed", "diff"
            );
            for r in &rows {
                println!(
                    "{:<22} {:>7.0}% {:>9.1}% {:>+6.1}",
                    r.name,
                    r.paper_pct,
                    r.computed_pct,
                    r.computed_pct - r.paper_pct
                );
            }
        }
        return Ok(());
    }
    let Some(path) = args.config else {
        return Err(super::usage(
            "headroom plan: give --paper leverich or --config FILE",
        ));
    };
    let bad = |e: headroom_sim::SimError| {
        if e.is_bad_input() {
            super::usage(format!("headroom plan: {e}"))
        } else {
            anyhow::Error::new(e)
        }
    };
    let cfg = PlanConfig::from_file(&path).map_err(bad)?;
    let dir = path.parent().map(PathBuf::from).unwrap_or_default();
    let (emu, mean_load, source) = cfg.resolve(&dir).map_err(|e| match e {
        headroom_sim::SimError::Io { .. } => super::usage(format!("headroom plan: {e}")),
        other => bad(other),
    })?;
    let a = plan(&cfg, emu, mean_load, source);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&a)?);
        return Ok(());
    }
    println!(
        "LC: peak {:.0} QPS at {:.0} QPS per server -> {} LC servers, mean load {:.0}%",
        cfg.lc.peak_qps,
        cfg.lc.qps_per_server,
        a.lc_servers,
        100.0 * a.mean_load
    );
    println!(
        "BE: {:.0} servers' worth of work; colocation EMU {:.1}% (from {})",
        cfg.be.demand_servers,
        100.0 * a.emu,
        a.emu_source
    );
    println!(
        "{:<22} {:>10} {:>10} {:>14}",
        "", "servers", "BE servers", "TCO (3 y)"
    );
    println!(
        "{:<22} {:>10} {:>10} {:>14.0}",
        "without colocation", a.servers_without, a.be_servers_without, a.tco_without_usd
    );
    println!(
        "{:<22} {:>10} {:>10} {:>14.0}",
        "with colocation", a.servers_with, a.be_servers_with, a.tco_with_usd
    );
    println!(
        "saving: {} servers, ${:.0} ({:.1}% of TCO); perf/TCO-$ +{:.1}%",
        a.servers_without as i64 - a.servers_with as i64,
        a.tco_saving_usd,
        a.tco_saving_pct,
        a.perf_per_tco_improvement_pct
    );
    Ok(())
}
