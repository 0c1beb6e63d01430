//! `headroom doctor [--json]`: what this kernel and hardware offer to the policies.

use std::path::PathBuf;

use headroom_types::doctor::{Availability, Doctor};
use headroom_types::mechanism::Mechanism;

/// Flags of `headroom doctor`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the JSON (docs/architecture.md) instead of the table
    #[arg(long)]
    pub json: bool,
    /// Probe a different file-system root (a fake tree for tests); live probes run only for `/`
    #[arg(long, default_value = "/", hide = true)]
    pub root: PathBuf,
    /// An agent config: say who each of its BE (and LC) commands runs as. Without it, the
    /// configs of the agents holding group locks here
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !args.root.is_dir() {
        return Err(super::usage(format!(
            "headroom doctor: --root {} is not a directory",
            args.root.display()
        )));
    }
    let doctor = headroom_host::doctor::probe(&args.root);
    let locks = headroom_agent::state::held_locks(&headroom_agent::state::lock_dir(&args.root));
    let configs: Vec<PathBuf> = match &args.config {
        Some(c) => vec![c.clone()],
        None => {
            let mut held: Vec<PathBuf> = locks
                .iter()
                .filter_map(|(_, h)| h.as_ref())
                .filter(|h| !h.config.is_empty())
                .map(|h| PathBuf::from(&h.config))
                .collect();
            held.sort();
            held.dedup();
            held
        }
    };
    let mut runs = Vec::new();
    let mut pids_notes = Vec::new();
    let cgroups = headroom_host::LinuxHost::new(&args.root).cgroups().ok();
    for path in &configs {
        match headroom_agent::config_file::read_config(path) {
            Ok(config) => {
                runs.extend(runs_as(path, &config));
                if let Some(cg) = &cgroups {
                    pids_notes.extend(kubelet_unbounded(&config, |g| cg.pids_max(g).ok()));
                }
            }
            // A config named here that cannot be read: the operator's error (exit 2).
            Err(e) if args.config.is_some() => {
                return Err(super::usage(format!("headroom doctor: --config: {e}")))
            }
            Err(e) => runs.push(RunsAs {
                config: path.display().to_string(),
                key: String::new(),
                runs_as: format!("not known: {e}"),
                root: false,
            }),
        }
    }
    if args.json {
        let mut v = serde_json::to_value(&doctor)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("group_locks".into(), locks_json(&locks));
            o.insert("commands_run_as".into(), serde_json::to_value(&runs)?);
            o.insert(
                "be_pids_unbounded".into(),
                serde_json::to_value(&pids_notes)?,
            );
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(&doctor));
        print!("{}", render_locks(&locks));
        print!("{}", render_runs_as(&runs, !configs.is_empty()));
        for note in &pids_notes {
            println!("BE process limit: WARNING: {note}");
        }
    }
    Ok(())
}

/// Each BE group of `config` under kubelet's pods root whose `pids.max` (`pids_max`, `None`
/// where unread) is `max`: BE pods there are bounded only by kubelet's `podPidsLimit`, unset
/// by default (hostile pass 26's low; the start says it too, a WARNING).
fn kubelet_unbounded(
    config: &headroom_control::config::Config,
    pids_max: impl Fn(&headroom_types::GroupPath) -> Option<Option<u64>>,
) -> Vec<String> {
    config
        .be
        .iter()
        .filter_map(|b| {
            headroom_control::actuation::target::pids_note(
                &b.cgroup,
                pids_max(&b.cgroup),
                None,
                false,
            )
        })
        .map(|n| n.to_string())
        .collect()
}

/// Who one command of a config runs as.
#[derive(Debug, serde::Serialize)]
struct RunsAs {
    config: String,
    /// `be[i].command` or `lc.command` (with the BE's or LC's name).
    key: String,
    runs_as: String,
    /// It runs as the agent's own user (root as deploy/ runs the agent): no `user` set.
    root: bool,
}

/// Who each BE command (and LC command) of `config` runs as: its `user` looked up here, or
/// the agent's own user (root) when none is set; a BE run as root can leave its group.
fn runs_as(path: &std::path::Path, config: &headroom_control::config::Config) -> Vec<RunsAs> {
    let shown = path.display().to_string();
    let lcs = config.lcs.iter().enumerate().map(|(i, l)| {
        (
            format!("{}.command", config.lc_key(i)),
            &l.name,
            &l.command,
            &l.user,
            None,
        )
    });
    let bes = config.be.iter().enumerate().map(|(i, b)| {
        (
            format!("be[{i}].command"),
            &b.name,
            &b.command,
            &b.user,
            Some((i, b)),
        )
    });
    lcs.chain(bes)
        .filter(|(_, _, command, _, _)| !command.is_empty())
        .map(|(key, name, _, user, be_entry)| {
            let be = be_entry.is_some();
            let (runs_as, root) = match user {
                None => (
                    format!(
                        "the agent's own user: root as deploy/ runs it{} (set {} user)",
                        if be {
                            ", and BE as root can leave its group"
                        } else {
                            ""
                        },
                        if be { "[[be]]" } else { "[lc]" }
                    ),
                    true,
                ),
                Some(spec) => match be_entry.map_or_else(
                    || headroom_agent::run_as::resolve_user(spec),
                    |(i, b)| match headroom_agent::run_as::be_user(i, b) {
                        Ok(Some(u)) => Ok(u),
                        Ok(None) => Err("not known".to_string()),
                        Err(e) => Err(e.to_string()),
                    },
                ) {
                    Ok(u) => {
                        let shown = match spec {
                            headroom_types::UserSpec::Uid(_) => format!("{spec} (gid {})", u.gid()),
                            headroom_types::UserSpec::Name(_) => {
                                format!("user {spec} (uid {}, gid {})", u.uid(), u.gid())
                            }
                        };
                        // uid 0 under another name, or group 0: root as far as BE goes
                        match headroom_agent::run_as::root_like(&u) {
                            Some(why) => (format!("{shown}: {why}, as good as root"), true),
                            None => (shown, false),
                        }
                    }
                    Err(e) => (
                        format!("user {spec}: {e} (the agent refuses to start)"),
                        false,
                    ),
                },
            };
            RunsAs {
                config: shown.clone(),
                key: format!("{key} ({name})"),
                runs_as,
                root,
            }
        })
        .collect()
}

/// The "who runs the commands" lines; `any_config`: a config was given or found.
fn render_runs_as(runs: &[RunsAs], any_config: bool) -> String {
    if !any_config {
        return "
commands: no --config and no agent running; a BE command with no [[be]] user runs as the agent's own user (root as deploy/ runs it), and can leave its group
".into();
    }
    let mut out = String::from(
        "
commands run as:
",
    );
    for r in runs {
        let warn = if r.root { "  WARNING" } else { "" };
        out.push_str(&format!(
            "  {} {}: {}{warn}
",
            r.config, r.key, r.runs_as
        ));
    }
    if runs.is_empty() {
        out.push_str(
            "  (no BE or LC command in the config)
",
        );
    }
    out
}

type HeldLocks = [(PathBuf, Option<headroom_types::control::LockHolder>)];

/// The held group locks (one agent per group) as `doctor --json` lists them.
fn locks_json(locks: &HeldLocks) -> serde_json::Value {
    serde_json::Value::Array(
        locks
            .iter()
            .map(|(path, holder)| {
                serde_json::json!({ "lock": path.display().to_string(), "holder": holder })
            })
            .collect(),
    )
}

/// The held group locks, each with the agent holding it.
fn render_locks(locks: &HeldLocks) -> String {
    if locks.is_empty() {
        return "group locks: none held (no agent running)\n".into();
    }
    let mut out = String::from("group locks (one agent per group):\n");
    for (path, holder) in locks {
        let who = holder
            .as_ref()
            .map_or("a holder that names itself nowhere".to_string(), |h| {
                h.to_string()
            });
        out.push_str(&format!("  {} held by {who}\n", path.display()));
    }
    out
}

/// Which policy features each mechanism enables (the "what a policy can use here" column).
const USES: &[(&str, &str)] = &[
    ("cpuset", "BE cores: static-cores, blind, heracles, hybrid"),
    ("cpu_weight", "weights (Blagodurov 10000:2)"),
    ("cpu_idle", "BE as idle class (BVT-warp successor)"),
    ("cpu_quota", "static-cycles, heracles cycles cap"),
    ("freeze", "disable BE instantly; on_exit = freeze"),
    ("memory", "BE memory limit, kill on low memory"),
    ("io", "BE disk throttling (PerfIso)"),
    (
        "pids",
        "BE process limit (safety.be_pids_max): a BE fork bomb bounded",
    ),
    ("sched_attr", "LC thread pinning / SCHED_IDLE BE threads"),
    ("resctrl_l3", "heracles LLC partitioning"),
    ("resctrl_mba", "heracles DRAM bandwidth cap"),
    ("rapl", "heracles power controller"),
    ("cpufreq", "heracles BE frequency cap"),
    ("tc_htb", "heracles / PerfIso egress ceiling"),
    (
        "net_cls",
        "classify BE egress by cgroup (net_cls + tc cgroup filter)",
    ),
    (
        "net_prio",
        "classify BE egress by cgroup (net_prio priority = HTB class; init netns devices)",
    ),
    (
        "cgroup_bpf",
        "classify BE egress by cgroup (BPF sets priority = HTB class; any netns)",
    ),
    ("proc_stat", "blind: per-CPU idle"),
    ("schedstat", "LC run-queue delay"),
    ("psi", "pressure (cpu, memory, io)"),
    ("resctrl_mon", "heracles DRAM bandwidth sensing"),
    ("cgroup_psi", "per-group pressure"),
    ("meminfo", "MemAvailable for the memory guard"),
    ("cgroup_cpu_usage", "BE/LC CPU usage"),
    (
        "idle_events",
        "blind/hybrid: woken on idle-count crossings instead of polling",
    ),
    (
        "sched_fifo",
        "agent and prober at real-time priority (a nicety: kernel stamps time the prober)",
    ),
    (
        "lc_latency_kernel",
        "[lc.latency] source = \"kernel\": the LC's own requests timed in the kernel",
    ),
];

fn uses(name: &str) -> &'static str {
    USES.iter().find(|(n, _)| *n == name).map_or("", |(_, u)| u)
}

fn row(out: &mut String, name: &str, a: &Availability) {
    let status = if a.available { "yes" } else { "NO" };
    let detail = if a.available {
        a.via.clone().unwrap_or_default()
    } else {
        a.reason.clone().unwrap_or_default()
    };
    out.push_str(&format!("  {name:<17} {status:<4} {detail}\n"));
    if a.available {
        out.push_str(&format!("  {:<17} {:<4} → {}\n", "", "", uses(name)));
    }
}

/// The human-readable table.
pub fn render(d: &Doctor) -> String {
    let mut out = String::new();
    out.push_str(&format!("kernel       {}\n", d.kernel));
    out.push_str(&format!(
        "cgroups      {}{}\n",
        d.cgroup_mode,
        if d.root {
            ""
        } else {
            "   (not root: writes will fail)"
        }
    ));
    out.push_str(&format!(
        "cpus         {} online{}, SMT {}, NUMA nodes {}, LLC {}\n",
        d.cpus,
        d.topology
            .as_ref()
            .map(|t| format!(" ({})", t.cpus_online))
            .unwrap_or_default(),
        if d.smt { "on" } else { "off" },
        d.numa_nodes,
        d.llc_bytes
            .map(|b| format!("{} KiB", b / 1024))
            .unwrap_or_else(|| "unknown".to_owned())
    ));
    out.push_str("\nmechanisms\n");
    for (m, a) in d.mechanisms.iter() {
        row(&mut out, m.name(), a);
    }
    out.push_str("\nsensors\n");
    let s = &d.sensors;
    for (name, a) in [
        ("proc_stat", Some(&s.proc_stat)),
        ("schedstat", Some(&s.schedstat)),
        ("psi", Some(&s.psi)),
        ("resctrl_mon", Some(&s.resctrl_mon)),
        ("cgroup_psi", s.cgroup_psi.as_ref()),
        ("meminfo", s.meminfo.as_ref()),
        ("cgroup_cpu_usage", s.cgroup_cpu_usage.as_ref()),
        ("idle_events", s.idle_events.as_ref()),
        ("sched_fifo", s.sched_fifo.as_ref()),
        ("lc_latency_kernel", s.lc_latency_kernel.as_ref()),
    ] {
        if let Some(a) = a {
            row(&mut out, name, a);
        }
    }
    // The mechanisms some policy part needs (the rest are alternatives of one another).
    let missing: Vec<&str> = [
        Mechanism::ResctrlL3,
        Mechanism::ResctrlMba,
        Mechanism::Rapl,
        Mechanism::Cpufreq,
        Mechanism::TcHtb,
        Mechanism::Cpuset,
        Mechanism::CpuQuota,
        Mechanism::Freeze,
    ]
    .into_iter()
    .filter(|m| d.mechanisms.get(*m).is_some_and(|a| !a.available))
    .map(Mechanism::name)
    .collect();
    if !missing.is_empty() {
        out.push_str(&format!(
            "\npolicies run here without: {} (the parts that need them are disabled, loudly)\n",
            missing.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    /// Hostile pass 26's low: a BE group under kubelet's pods root whose `pids.max` is `max`
    /// (kubelet's `podPidsLimit` unset) is named; one with a limit, and a group of the agent's
    /// own, are not.
    #[test]
    fn a_be_group_under_kubelet_with_no_pids_limit_is_named() {
        let config = headroom_control::config::Config::from_toml_str(
            "[lc]\nname = \"lc\"\ncgroup = \"a/lc\"\n[[be]]\nname = \"pods\"\ncgroup = \"kubepods/besteffort\"\n[[be]]\nname = \"own\"\ncgroup = \"a/be\"\n[policy]\nkind = \"static-cores\"\n",
        )
        .unwrap();
        let said = super::kubelet_unbounded(&config, |_| Some(None));
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("kubepods/besteffort") && said[0].contains("podPidsLimit"),
            "{said:?}"
        );
        assert!(super::kubelet_unbounded(&config, |_| Some(Some(4096))).is_empty());
    }

    /// Pass 18's low: a `[[be]] user` that is uid 0 (under any name) or in group 0 was shown
    /// as a user, not flagged as root.
    #[test]
    fn a_root_like_be_user_is_flagged_as_root() {
        for user in ["user = 0", "user = \"root\"", "user = 65534\ngroup = 0"] {
            let config = headroom_control::config::Config::from_toml_str(&format!(
                "[lc]\nname = \"lc\"\ncgroup = \"a/lc\"\n[[be]]\nname = \"batch\"\ncgroup = \"a/be\"\ncommand = [\"sleep\", \"1\"]\n{user}\n[policy]\nkind = \"static-cores\"\n"
            ))
            .unwrap();
            let runs = super::runs_as(std::path::Path::new("x.toml"), &config);
            assert_eq!(runs.len(), 1);
            assert!(runs[0].root, "{user}: {}", runs[0].runs_as);
            assert!(
                runs[0].runs_as.contains("as good as root"),
                "{}",
                runs[0].runs_as
            );
        }
    }
}
