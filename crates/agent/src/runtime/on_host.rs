//! The config's checks that need this host, made before the start touches anything and
//! reported with the file's own errors' form (key, value, fix; every one at once; exit 2): an
//! LC pid that runs, a command whose program is there to run, a disk to throttle, an LC
//! user's name this host knows, a BE group that does not hold the agent itself. Before
//! (fifth hostile pass), `[lc] pids` naming no running process passed, and the start failed
//! after it had made the groups (exit 1); a BE command naming a program that is not there
//! "died" with status 127 at every restart for as long as the agent ran.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use headroom_control::config::{Config, ConfigError};
use headroom_host::pids;

/// Every `[lc] pids` entry that is not a running process here (or one that started after the
/// config file, `written` its mtime, was last written), and every `command` whose program is
/// not an executable file (by its path, or found in `PATH`).
pub(super) fn check_on_host(
    root: &Path,
    config: &Config,
    written: Option<std::time::SystemTime>,
) -> Result<(), ConfigError> {
    let mut problems = Vec::new();
    let mut commands = Vec::new();
    for (i, lc) in config.lcs.iter().enumerate() {
        let key = config.lc_key(i);
        let gone: Vec<u32> = lc
            .pids
            .iter()
            .copied()
            .filter(|&p| !runs(root, p))
            .collect();
        if !gone.is_empty() {
            problems.push(ConfigError::Invalid {
                key: format!("{key}.pids"),
                value: format!("{gone:?}"),
                reason: "no such process is running here: give the running LC's pids (or its command, pid_file or listen_port)".into(),
            });
        }
        for &p in lc.pids.iter().filter(|&&p| runs(root, p)) {
            if let Some(reason) = not_a_service(root, p) {
                problems.push(ConfigError::Invalid {
                    key: format!("{key}.pids"),
                    value: p.to_string(),
                    reason,
                });
            } else if let Some(later) = written.and_then(|w| pids::started_after(root, p, w)) {
                // The LC the file named ended and its number was reused (an agent restarted
                // after the LC died while none ran: hostile pass 35 saw the restart move an
                // unrelated process into the LC group).
                problems.push(ConfigError::Invalid {
                    key: format!("{key}.pids"),
                    value: p.to_string(),
                    reason: format!(
                        "that process started {:.1} s after the config file was last written, so it is not the one the file names (that one ended and its number was reused): give the LC's pids now, or its pid_file, listen_port or command",
                        later.as_secs_f64()
                    ),
                });
            }
        }
        commands.push((format!("{key}.command"), &lc.command));
        // `user` by name: a name this host does not know would take no process as the LC.
        if let Some(headroom_types::UserSpec::Name(n)) = &lc.user {
            let reason = match headroom_host::process::uid_of_user(n) {
                Ok(Some(_)) => None,
                Ok(None) => Some(
                    "no such user on this host: give the login name (or the uid) the LC runs as"
                        .to_string(),
                ),
                Err(e) => Some(format!(
                    "looking the user up failed ({e}): give the uid the LC runs as"
                )),
            };
            if let Some(reason) = reason {
                problems.push(ConfigError::Invalid {
                    key: format!("{key}.user"),
                    value: format!("{n:?}"),
                    reason,
                });
            }
        }
    }
    for (i, be) in config.be.iter().enumerate() {
        commands.push((format!("be[{i}].command"), &be.command));
    }
    for (key, command) in commands {
        if let Some(reason) = command.first().and_then(|p| not_runnable(p)) {
            problems.push(ConfigError::Invalid {
                key,
                value: format!("{command:?}"),
                reason,
            });
        }
    }
    problems.extend(io_device_problems(root, config));
    problems.extend(crate::run_as::problems(config));
    problems.extend(be_groups_holding_the_agent(root, config));
    into_result(problems)
}

/// Why a running `pid` cannot be an LC process: a thread id (moving it moves its whole
/// process: hostile pass 33 moved a memcached by one of its threads' ids), the host's init,
/// or a kernel thread (its move failed at start with EINVAL, no word of why).
fn not_a_service(root: &Path, pid: u32) -> Option<String> {
    if let Some(process) = pids::thread_group(root, pid).filter(|&t| t != pid) {
        return Some(format!(
            "names a thread of process {process}, not a process: give the process's pid ({process}) if it is the LC"
        ));
    }
    if pid == 1 {
        return Some("is the host's init (pid 1), not a service: give the LC's own pids".into());
    }
    if pids::is_kernel_thread(root, pid) {
        return Some("is a kernel thread, not a service: give the LC's own pids".into());
    }
    None
}

/// Every `[[be]] cgroup` that is the agent's own group or one above it, in any hierarchy
/// (`<root>/proc/self/cgroup`). Hostile pass 25: a BE group holding the agent was accepted,
/// and the start froze BE with the agent in it: the agent hung at once (no tick, no control
/// socket, no exit action on SIGTERM) with BE frozen until it was killed, again at every
/// restart; had it run on, a restart's kill of the BE processes it did not record would
/// SIGKILL it (a first start spares what it finds in the group, itself too; a restart only
/// what that start recorded). (A DaemonSet's pod left without resources is BestEffort: its
/// container then sits in the shipped `kubepods/besteffort`.)
fn be_groups_holding_the_agent(root: &Path, config: &Config) -> Vec<ConfigError> {
    let text = std::fs::read_to_string(root.join("proc/self/cgroup")).unwrap_or_default();
    let mine: Vec<headroom_types::GroupPath> = text
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .filter_map(|p| headroom_types::GroupPath::new(p.trim_start_matches('/')).ok())
        .collect();
    config
        .be
        .iter()
        .enumerate()
        .filter_map(|(i, be)| {
            let inside = mine.iter().find(|m| m.is_within(&be.cgroup))?;
            Some(ConfigError::Invalid {
                key: format!("be[{i}].cgroup"),
                value: format!("{:?}", be.cgroup.as_str()),
                reason: format!(
                    "holds the agent itself (its group {:?}): freezing or killing BE would freeze or kill the agent; give BE a group of its own, or run the agent outside it",
                    inside.as_str()
                ),
            })
        })
        .collect()
}

/// Every socket the agent binds (`api.socket`, each feed socket) whose directory another user
/// made or can write: that user could remove the socket, so `ctl` could not reach the agent,
/// and bind its own there (ninth hostile pass). The rule is `ctl`'s for believing a server.
pub(super) fn check_socket_dirs(config: &Config) -> Result<(), ConfigError> {
    let uid = headroom_host::process::effective_uid();
    let mut sockets = vec![("api.socket".to_string(), config.api.socket.as_str())];
    for (i, lc) in config.lcs.iter().enumerate() {
        let key = config.lc_key(i);
        let latency = lc.latency.as_ref().and_then(|l| l.socket.as_deref());
        let load = lc.load.as_ref().and_then(|l| l.socket.as_deref());
        for (what, feed) in [("latency", latency), ("load", load)] {
            if let Some(feed) = feed {
                sockets.push((format!("{key}.{what}.socket"), feed));
            }
        }
    }
    let problems = sockets
        .into_iter()
        .filter_map(|(key, path)| {
            crate::socket_file::dir_refusal(Path::new(path), uid).map(|reason| {
                ConfigError::Invalid {
                    key,
                    value: path.to_string(),
                    reason,
                }
            })
        })
        .collect();
    into_result(problems)
}

/// Every managed group (v2) with a level that is not a domain: refused before anything is
/// made, naming the threaded level (the start failed on the kernel's bare EOPNOTSUPP on
/// `cgroup.subtree_control`: tenth hostile pass).
pub(super) fn check_domain_groups(
    config: &Config,
    cgroups: &headroom_host::Cgroups,
) -> Result<(), ConfigError> {
    let lcs = config
        .lcs
        .iter()
        .enumerate()
        .map(|(i, lc)| (format!("{}.cgroup", config.lc_key(i)), &lc.cgroup));
    let bes = config
        .be
        .iter()
        .enumerate()
        .map(|(i, be)| (format!("be[{i}].cgroup"), &be.cgroup));
    let problems = lcs
        .chain(bes)
        .filter_map(|(key, group)| {
            let (dir, kind) = cgroups.not_domain(group)?;
            Some(ConfigError::Invalid {
                key,
                value: group.to_string(),
                reason: headroom_host::cgroup::not_domain_reason(&dir, &kind),
            })
        })
        .collect();
    into_result(problems)
}

/// `safety.be_memory_limit_bytes` (`limit`) refused when it is below what a BE group (of
/// `groups`, where the host can read its use) uses now: the kernel refuses that write at every
/// tick (cgroup v1: EBUSY), keeping BE frozen, and v2 kills BE for it (eighth hostile pass for
/// `ctl set`). The one rule for a live `ctl set` and for the config at start (sixteenth
/// hostile pass: a config's limit below an adopted BE's use was accepted at start).
pub(super) fn check_memory_limit(
    cgroups: &headroom_host::Cgroups,
    groups: &[headroom_types::GroupPath],
    limit: Option<u64>,
) -> Result<(), ConfigError> {
    let Some(limit) = limit else {
        return Ok(());
    };
    for g in groups {
        let Ok(used) = cgroups.memory_usage(g) else {
            continue;
        };
        if used > limit {
            return Err(ConfigError::Invalid {
                key: "safety.be_memory_limit_bytes".into(),
                value: limit.to_string(),
                reason: format!(
                    "below what BE group {g} uses now ({used} bytes): the kernel cannot \
                     hold BE there without reclaim it may not manage (cgroup v1 refuses \
                     the write, EBUSY; v2 kills BE); give at least {used}, or lower it \
                     in the config file and restart"
                ),
            });
        }
    }
    Ok(())
}

/// What a `ctl set` of `safety.be_pids_max` (`limit`, 0 = none) below the tasks a BE group (of
/// `groups`) holds now (`pids.current`) is warned of: the kernel takes the write (a `pids.max`
/// below `pids.current` only stops new forks), and BE starts nothing more, not even a process
/// it waits on, until enough of its own end. Accepted, not refused: a BE pressing its limit
/// holds as many tasks as any limit it is given, so a refusal kept the operator from ever
/// tightening it live (hostile pass 26's low). `None`: nothing to warn of.
pub(super) fn pids_limit_warning(
    cgroups: &headroom_host::Cgroups,
    groups: &[headroom_types::GroupPath],
    limit: Option<u64>,
) -> Option<String> {
    let limit = limit.filter(|n| *n != 0)?;
    let over: Vec<String> = groups
        .iter()
        .filter_map(|g| {
            let count = cgroups.pids_current(g).ok()?;
            (count > limit).then(|| format!("{g} holds {count} tasks"))
        })
        .collect();
    (!over.is_empty()).then(|| {
        format!(
            "safety.be_pids_max = {limit} is below what BE holds now ({}): BE starts nothing \
             more (no fork, no thread) until some of its tasks end",
            over.join(", ")
        )
    })
}

/// What is said once at start of the BE groups' limits: their process count
/// ([`say_pids_unbounded`]) and the reach of the BE commands ([`say_be_scope`]).
pub(super) fn say_be_limits(
    config: &Config,
    machine: &headroom_control::policy::MachineInfo,
    cgroups: &headroom_host::Cgroups,
    groups: &[headroom_types::GroupPath],
) {
    say_pids_unbounded(config, machine, cgroups, groups);
    say_be_scope(config);
}

/// Said once at start where the agent launches a BE command: whether it is scoped to its own
/// processes (`crates/host/src/spawn/scope.rs`), or why not (a WARNING: a BE run as a user
/// can then signal and ptrace every process of that user). Not an error.
fn say_be_scope(config: &Config) {
    if config.be.iter().all(|b| b.command.is_empty()) {
        return;
    }
    match headroom_host::spawn::scope::available() {
        Ok(()) => tracing::info!(
            "BE commands are scoped to their own processes (Landlock): they signal and ptrace \
             only what they fork"
        ),
        Err(why) => tracing::warn!(
            reason = %why,
            "BE commands are not scoped to their own processes: a BE run as a user can signal, \
             ptrace and open /proc/<pid>/mem of every other process of that user"
        ),
    }
}

/// Said once at start: where the BE groups' process count is to be bounded but this host has no
/// pids controller (a v1 host without the `pids` hierarchy), nothing bounds it; a BE group
/// keeping its own lower `pids.max` under the default; a BE group under kubelet's pods root
/// whose `pids.max` is `max` (a WARNING: kubelet's, and unbounded unless its `podPidsLimit` is
/// set). Not an error.
fn say_pids_unbounded(
    config: &Config,
    machine: &headroom_control::policy::MachineInfo,
    cgroups: &headroom_host::Cgroups,
    groups: &[headroom_types::GroupPath],
) {
    use headroom_control::actuation::target::{pids_note, PidsNote};
    let limit = config
        .safety
        .be_pids_limit(machine.host_tasks(), config.be.len());
    let has_pids = machine
        .mechanisms
        .has(headroom_types::mechanism::Mechanism::Pids);
    if has_pids {
        let default = config.safety.be_pids_max.is_none();
        for g in groups {
            match pids_note(g, cgroups.pids_max(g).ok(), limit, default) {
                Some(note @ PidsNote::KubeletUnbounded { .. }) => tracing::warn!("{note}"),
                Some(note) => tracing::info!("{note}"),
                None => {}
            }
        }
    }
    let Some(limit) = limit else {
        return;
    };
    if !has_pids {
        tracing::warn!(
            be_pids_max = limit,
            "no pids controller here (cgroup v1 without a pids hierarchy, or v2 without pids): \
             BE's process count is not bounded, and a BE that forks without end can take every \
             pid on the host"
        );
    }
}

/// Every `safety.be_io_limits` device that is not a whole disk here (also checked on a live
/// `set`). The kernel refuses a throttle on a device it lacks or on a partition (ENODEV), and
/// a refused write that confines BE freezes it until the write goes through: for good, from
/// a config the agent had accepted (fifth hostile pass).
pub(super) fn check_io_devices(root: &Path, config: &Config) -> Result<(), ConfigError> {
    into_result(io_device_problems(root, config))
}

fn io_device_problems(root: &Path, config: &Config) -> Vec<ConfigError> {
    if !config.actuators.io {
        return Vec::new();
    }
    let mut problems = Vec::new();
    for (i, limit) in config.safety.be_io_limits.iter().enumerate() {
        let dev = root.join(format!("sys/dev/block/{}", limit.device));
        let reason = if !dev.exists() {
            "no such block device here (see /proc/partitions)"
        } else if dev.join("partition").exists() {
            "a partition: the kernel throttles whole disks only; name the disk it is on"
        } else {
            continue;
        };
        problems.push(ConfigError::Invalid {
            key: format!("safety.be_io_limits[{i}].device"),
            value: format!("{:?}", limit.device.to_string()),
            reason: reason.into(),
        });
    }
    problems
}

fn into_result(mut problems: Vec<ConfigError>) -> Result<(), ConfigError> {
    match problems.len() {
        0 => Ok(()),
        1 => Err(problems.remove(0)),
        _ => Err(ConfigError::Several(problems)),
    }
}

/// Whether `pid` is a running process (a zombie has ended).
fn runs(root: &Path, pid: u32) -> bool {
    root.join(format!("proc/{pid}")).is_dir() && !pids::is_zombie(root, pid)
}

/// Why `program` cannot be run (as `execvp` finds it), or `None` when it can.
fn not_runnable(program: &str) -> Option<String> {
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return (!runnable(Path::new(program)))
            .then(|| format!("{program} is not an executable file: name a program that is there"));
    }
    let dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    (!dirs.iter().any(|d| runnable(&d.join(program))))
        .then(|| format!("{program:?} is not found in PATH: install it or give its full path"))
}

/// The longest run a deadline is set for (`--duration`): 100 years.
const MAX_RUN_FOR: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);

/// Refuses a run length the loop's clock cannot add (`--duration 1e19` started the agent,
/// which then panicked on its first deadline, leaving BE frozen, the groups and the state
/// file with no exit action: fifth hostile pass).
pub(super) fn check_run_for(run_for: Option<std::time::Duration>) -> Result<(), super::AgentError> {
    match run_for {
        Some(d) if d > MAX_RUN_FOR => Err(super::AgentError::Config(ConfigError::Invalid {
            key: "--duration".into(),
            value: format!("{} s", d.as_secs_f64()),
            reason: format!(
                "longer than {} s (100 years): leave it out to run until stopped",
                MAX_RUN_FOR.as_secs()
            ),
        })),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_limits_name_whole_disks_that_are_here() {
        let root = tempfile::tempdir().unwrap();
        let block = root.path().join("sys/dev/block");
        std::fs::create_dir_all(block.join("8:0")).unwrap();
        std::fs::create_dir_all(block.join("8:1")).unwrap();
        std::fs::write(block.join("8:1/partition"), "1\n").unwrap();
        let config = |dev: &str| {
            let mut c = Config::from_toml_str(&format!(
                "[lc]\nname = \"lc\"\ncgroup = \"a/lc\"\n[policy]\nkind = \"static-cores\"\n[[safety.be_io_limits]]\ndevice = \"{dev}\"\nread_bps = 1048576\n"
            ))
            .unwrap();
            c.actuators.io = true;
            c
        };
        assert!(check_io_devices(root.path(), &config("8:0")).is_ok());
        let partition = check_io_devices(root.path(), &config("8:1")).unwrap_err();
        assert!(partition.to_string().contains("partition"), "{partition}");
        let missing = check_io_devices(root.path(), &config("8:16")).unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("safety.be_io_limits[0].device"),
            "{missing}"
        );
    }

    #[test]
    fn programs_are_found_as_execvp_finds_them() {
        assert_eq!(not_runnable("sh"), None);
        assert_eq!(not_runnable("/bin/sh"), None);
        assert!(not_runnable("hp5-no-such-program").is_some());
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        assert!(
            not_runnable(plain.to_str().unwrap()).is_some(),
            "not executable"
        );
        assert!(
            not_runnable(dir.path().to_str().unwrap()).is_some(),
            "a directory"
        );
    }
}
