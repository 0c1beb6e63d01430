//! `headroom ctl`: talk to a running agent over its control socket.

use std::path::PathBuf;

use headroom_types::control::AgentStatus;

use headroom_agent::publish::control::{request, Request};

/// Flags of `headroom ctl`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The agent's control socket (api.socket)
    #[arg(long, default_value = headroom_control::config::DEFAULT_SOCKET)]
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

/// The kernel sensor and the prober side by side, and what the kernel's counts say about its
/// figure.
fn sensors_line(l: &headroom_types::control::LatencySources) -> String {
    let us = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1} µs"));
    // segments far above requests: pipelined requests behind a pending one are not timed
    let behind = l.kernel_segments.saturating_sub(l.kernel_requests) as f64
        / l.kernel_segments.max(1) as f64;
    format!(
        "chosen {}{}; kernel {} over {} requests ({} segments{}); probe {}{}",
        l.chosen,
        if l.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", l.reason)
        },
        us(l.kernel_us),
        l.kernel_requests,
        l.kernel_segments,
        if behind >= 0.1 {
            format!(
                ": {:.0}% arrived behind a pending request — pipelined requests are timed from \
                 the first of each burst, so the figure reads low",
                behind * 100.0
            )
        } else {
            String::new()
        },
        us(l.probe_us),
        if l.probe_running { " (running)" } else { "" },
    )
}

fn print_status(s: &AgentStatus) {
    let f = |v: Option<f64>| {
        v.map_or("-".to_string(), |x| {
            if x.fract() != 0.0 {
                format!("{x:.3}")
            } else {
                format!("{x}")
            }
        })
    };
    let lc = &s.lc;
    println!(
        "agent pid {}  policy {}  up {:.1}s  ticks {}  {}{}{}",
        s.pid,
        s.policy,
        s.uptime_s,
        s.ticks,
        if s.actuating {
            "actuating"
        } else {
            "NOT actuating"
        },
        if s.paused { ", paused" } else { "" },
        if s.dry_run { ", dry run" } else { "" },
    );
    if let Some(l) = &s.lock {
        println!("group locks held by {l}: {}", l.groups.join(", "));
    }
    if let Some(aside) = &s.state_set_aside {
        println!(
            "state file: could not be read at start and was set aside at {aside}; the groups' settings at start were taken as originals (compare them with the originals in that file and fix any by hand)"
        );
    }
    if let Some(e) = &s.state_write_error {
        println!(
            "STATE FILE NOT WRITTEN: {e} (a crash now leaves the next start without the originals and BE pids: fix the path)"
        );
    }
    for a in &s.start_actions {
        println!("at start: {a}");
    }
    let line = |lc: &headroom_types::control::LcStatus| {
        format!(
            "p{} latency {} µs{} (age {} ms) vs SLO {} µs, slack {}; load {} ({} qps); cpus {}",
            f(Some(lc.percentile)),
            f(lc.latency_us),
            lc.latency_source
                .as_deref()
                .map(|s| format!(" [{s}]"))
                .unwrap_or_default(),
            lc.latency_age_ms.map_or("-".into(), |a| a.to_string()),
            f(Some(lc.slo_us)),
            f(lc.slack),
            f(lc.load),
            f(lc.qps),
            lc.cpus.as_ref().map_or("-".into(), |c| format!("{c:?}")),
        )
    };
    if s.lcs.len() > 1 {
        // Several services: one line each, and the one that bound the last decision.
        println!(
            "LC services: {} (binding: {})",
            s.lcs.len(),
            s.binding_lc.as_deref().unwrap_or("-")
        );
        for lc in &s.lcs {
            println!(
                "LC {} (priority {}) {}: {}",
                lc.name,
                lc.priority,
                lc.group,
                line(lc)
            );
        }
    } else {
        println!("LC {}: {}", lc.group, line(lc));
    }
    let a = s.allocation.clone().unwrap_or_default();
    println!(
        "BE {:?}: enabled {}  cpus {}  weight {}  idle {}  quota {}%  (idle CPUs {})",
        s.be_groups,
        a.be_enabled,
        a.be_cpus.as_ref().map_or("-".into(), |c| format!("{c:?}")),
        a.be_cpu_weight
            .map_or("-".into(), |w| format!("{}/{}", w.shares, w.weight)),
        a.be_cpu_idle.map_or("-".into(), |i| i.to_string()),
        f(a.be_quota_pct),
        f(s.idle_cpus),
    );
    if !s.actuators.be_held.is_empty() {
        // What the kernel holds, which a failed plan makes differ from the line above.
        let held: Vec<String> = s
            .actuators
            .be_held
            .iter()
            .map(|(file, v)| format!("{file} = {v}"))
            .collect();
        println!("BE holds (kernel): {}", held.join(", "));
    }
    for c in &s.be_commands {
        // only what needs a look: a command that died (the agent restarts it with backoff)
        if c.restarts > 0 || c.last_exit.is_some() {
            println!(
                "BE command {}: {}  restarts {}{}",
                c.name,
                c.pid.map_or("not running".into(), |p| format!("pid {p}")),
                c.restarts,
                c.last_exit
                    .as_deref()
                    .map(|e| format!("  (last ended: {e})"))
                    .unwrap_or_default()
            );
        }
    }
    println!(
        "writes {}  failed reconciliations {}{}",
        s.writes,
        s.write_errors,
        s.last_write_error
            .as_deref()
            .map(|e| format!(" (last: {e})"))
            .unwrap_or_default()
    );
    let off: Vec<String> = s
        .actuators
        .disabled
        .iter()
        .map(|d| format!("{} ({})", d.actuator, d.reason))
        .collect();
    println!(
        "actuators on: {}; off: {}",
        if s.actuators.active.is_empty() {
            "cgroups only".to_string()
        } else {
            s.actuators.active.join(", ")
        },
        if off.is_empty() {
            "none".to_string()
        } else {
            off.join("; ")
        }
    );
    println!(
        "idle sensor: {}; idle sensing: {}",
        match s.idle_sensor.as_str() {
            "bpf" => "bpf (idle tracepoint)",
            other => other,
        },
        if s.idle_sensing.is_empty() {
            "poll (agent predates event sensing)"
        } else {
            s.idle_sensing.as_str()
        }
    );
    if let Some(src) = &s.latency_source {
        println!("latency source: {src}");
    }
    let services: Vec<&headroom_types::control::LcStatus> = if s.lcs.len() > 1 {
        s.lcs.iter().collect()
    } else {
        vec![&s.lc]
    };
    for lc in services {
        if let Some(l) = &lc.latency_sources {
            println!("latency sensors of {}: {}", lc.name, sensors_line(l));
        }
    }
    if let Some(why) = &s.be_held_off {
        println!("{why}");
    }
    if let Some(a) = &s.advertise {
        for l in advertise_lines(a) {
            println!("{l}");
        }
    }
    println!("last reasons:");
    for r in &s.last_reasons {
        println!("  t={} ms  {}", r.t_ms, r.reason);
    }
    if !s.targets_followed.is_empty() {
        println!("targets followed (moved by someone else):");
        for r in &s.targets_followed {
            println!("  t={} ms  {}", r.t_ms, r.reason);
        }
    }
}

/// `[kubernetes] advertise` in words: the value and why, the floor, the horizon's figures, the
/// last change and its reason, what the API took (`ctl status`, `kube-discover --socket`).
pub(super) fn advertise_lines(a: &headroom_types::advertise::AdvertiseStatus) -> Vec<String> {
    use headroom_types::advertise::RESOURCE;
    let e = &a.edge;
    let api = format!(
        "API: {} ({} patches, {} errors{})",
        e.published_millicpu
            .map_or("nothing published yet".into(), |v| format!(
                "published {v}m"
            )),
        e.patches,
        e.errors,
        e.last_error
            .as_deref()
            .map(|x| format!("; now: {x}"))
            .unwrap_or_default()
    );
    let Some(ad) = &a.advertisement else {
        return vec![
            format!(
                "advertise {RESOURCE}: nothing yet ({})",
                if e.floor_synced {
                    "no decision yet"
                } else {
                    "waiting for the first list of the node's pods: the floor is unknown"
                }
            ),
            format!("  {api}"),
        ];
    };
    let h = &ad.horizon;
    let mut lines = vec![
        format!(
            "advertise {RESOURCE}: {}m ({}: {}); floor {}m (bound pods' requests); target {}m",
            ad.value_millicpu,
            ad.reason.as_str(),
            ad.detail,
            ad.floor_millicpu,
            ad.target_millicpu
        ),
        format!(
            "  horizon: {:.0} of {:.0} s seen, {} buckets ({} troubled): p{} {}m (min {}m, max {}m), margin {}m",
            h.covered_s,
            h.horizon_s,
            h.buckets,
            h.troubled_buckets,
            h.percentile,
            h.percentile_millicpu,
            h.min_millicpu,
            h.max_millicpu,
            h.margin_millicpu
        ),
    ];
    if let Some(c) = &ad.last_change {
        lines.push(format!(
            "  last change: t={} ms {} → {}m ({}: {})",
            c.t_ms,
            c.from_millicpu
                .map_or("none".to_string(), |v| format!("{v}m")),
            c.to_millicpu,
            c.reason.as_str(),
            c.detail
        ));
    }
    if let Some(m) = &a.memory {
        lines.extend(memory_lines(a, m));
    }
    lines.push(format!("  {api}"));
    lines
}

/// `headroom.io/be-memory` in words: the value and why, the floor, the node's memory figures,
/// the horizon's, the last change, what the API took.
fn memory_lines(
    a: &headroom_types::advertise::AdvertiseStatus,
    m: &headroom_types::advertise::Advertised,
) -> Vec<String> {
    let show = |v: u64| m.resource.show(v);
    let h = &m.horizon;
    let mut lines = vec![format!(
        "advertise {}: {} ({}: {}); floor {} (bound pods' requests); target {}",
        m.resource.name(),
        show(m.value),
        m.reason.as_str(),
        m.detail,
        show(m.floor),
        show(m.target)
    )];
    if let Some(i) = &a.memory_input {
        lines.push(format!(
            "  node memory {}, LC groups hold {}, room for BE now {}",
            show(i.total_bytes),
            i.lc_bytes.map_or("(not read)".to_string(), show),
            show(i.room_bytes)
        ));
    }
    lines.push(format!(
        "  horizon: {:.0} of {:.0} s seen, {} buckets ({} troubled): least room {} (most {}), margin {}{}",
        h.covered_s,
        h.horizon_s,
        h.buckets,
        h.troubled_buckets,
        show(h.percentile_value),
        show(h.max),
        show(h.margin),
        h.cap
            .map(|c| format!(", cap {}", show(c)))
            .unwrap_or_default()
    ));
    if let Some(c) = &m.last_change {
        lines.push(format!(
            "  last change: t={} ms {} → {} ({}: {})",
            c.t_ms,
            c.from.map_or("none".to_string(), show),
            show(c.to),
            c.reason.as_str(),
            c.detail
        ));
    }
    lines.push(format!(
        "  API: {}",
        a.edge
            .published_memory_bytes
            .map_or("nothing published yet".to_string(), |v| format!(
                "published {}",
                show(v)
            ))
    ));
    lines
}
