//! `headroom ctl`: talk to a running agent over its control socket.

use std::path::PathBuf;

use headroom_agent::control::{request, Request};

/// Flags of `headroom ctl`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent's control socket (api.socket)
    #[arg(long, default_value = "/run/headroom.sock")]
    pub socket: PathBuf,
    /// Print the agent's raw JSON answer
    #[arg(long)]
    pub json: bool,
    /// status | pause | resume | off | set KEY=VALUE
    pub command: String,
    /// KEY=VALUE for `set`
    pub assignment: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let req = match (args.command.as_str(), &args.assignment) {
        ("status", None) => Request::Status,
        ("pause", None) => Request::Pause,
        ("resume", None) => Request::Resume,
        ("off", None) => Request::Off,
        ("set", Some(kv)) => match kv.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Request::Set {
                key: k.trim().to_string(),
                value: v.trim().to_string(),
            },
            _ => return Err(super::usage(format!("set {kv:?}: expected KEY=VALUE"))),
        },
        ("set", None) => return Err(super::usage("set needs KEY=VALUE")),
        (other, extra) => {
            return Err(super::usage(format!(
                "unknown ctl command {other:?}{}: expected status | pause | resume | off | set KEY=VALUE",
                extra.as_ref().map(|e| format!(" {e}")).unwrap_or_default()
            )))
        }
    };
    // The error's message already names the socket and the OS error.
    let response = request(&args.socket, &req).map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&response)?);
    } else if let Some(status) = &response.status {
        print_status(status);
    } else {
        println!("{}", response.message);
    }
    if !response.ok {
        anyhow::bail!("agent refused: {}", response.message);
    }
    Ok(())
}

fn print_status(s: &serde_json::Value) {
    let f = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::Number(n) => match n.as_f64() {
            Some(x) if x.fract() != 0.0 => format!("{x:.3}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    };
    let lc = &s["lc"];
    println!(
        "agent pid {}  policy {}  up {:.1}s  ticks {}  {}{}{}",
        f(&s["pid"]),
        s["policy"].as_str().unwrap_or("?"),
        s["uptime_s"].as_f64().unwrap_or(0.0),
        f(&s["ticks"]),
        if s["actuating"] == true {
            "actuating"
        } else {
            "NOT actuating"
        },
        if s["paused"] == true { ", paused" } else { "" },
        if s["dry_run"] == true {
            ", dry run"
        } else {
            ""
        },
    );
    println!(
        "LC {}: p{} latency {} µs (age {} ms) vs SLO {} µs, slack {}; load {} ({} qps); cpus {}",
        lc["group"].as_str().unwrap_or("?"),
        f(&lc["percentile"]),
        f(&lc["latency_us"]),
        f(&lc["latency_age_ms"]),
        f(&lc["slo_us"]),
        f(&lc["slack"]),
        f(&lc["load"]),
        f(&lc["qps"]),
        f(&lc["cpus"]),
    );
    let a = &s["allocation"];
    println!(
        "BE {}: enabled {}  cpus {}  weight {}  idle {}  quota {}%  (idle CPUs {})",
        f(&s["be_groups"]),
        f(&a["be_enabled"]),
        f(&a["be_cpus"]),
        f(&a["be_cpu_weight"]),
        f(&a["be_cpu_idle"]),
        f(&a["be_quota_pct"]),
        f(&s["idle_cpus"]),
    );
    println!(
        "writes {}  failed reconciliations {}{}",
        f(&s["writes"]),
        f(&s["write_errors"]),
        s["last_write_error"]
            .as_str()
            .map(|e| format!(" (last: {e})"))
            .unwrap_or_default()
    );
    let act = &s["actuators"];
    let names = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect()
    };
    let off: Vec<String> = act["disabled"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            format!(
                "{} ({})",
                d["actuator"].as_str().unwrap_or("?"),
                d["reason"].as_str().unwrap_or("?")
            )
        })
        .collect();
    if !act.is_null() {
        let on = names(&act["active"]);
        println!(
            "actuators on: {}; off: {}",
            if on.is_empty() {
                "cgroups only".to_string()
            } else {
                on.join(", ")
            },
            if off.is_empty() {
                "none".to_string()
            } else {
                off.join("; ")
            }
        );
    }
    println!("last reasons:");
    for r in s["last_reasons"].as_array().into_iter().flatten() {
        println!(
            "  t={} ms  {}",
            f(&r["t_ms"]),
            r["reason"].as_str().unwrap_or("?")
        );
    }
}
