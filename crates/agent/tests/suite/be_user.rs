//! `[[be]] user`: the BE command runs as that user (setgroups, setgid, setuid before exec), so
//! it cannot write its pid into the root group's `cgroup.procs` and leave its confinement; a
//! restart and a new agent adopting it keep the user; the program a command names is refused
//! to run as root when another user owns it (docs/agent.md "Who BE runs as"). Before, every
//! command ran as root. Live tests need root (cgroups) and print SKIP otherwise; their groups
//! are `bu-*`, removed (processes killed first) by a guard, also when a test fails.

use crate::live;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use headroom_agent::runtime::Agent;
use headroom_types::GroupPath;

use live::marked::{sleeps_with_marker, MarkedGroup as Guard};

/// A config on `top`: the LC pid `lc` in `top/lc`, one BE in `top/be` running `command` (as
/// `user` when given), restarted after 50 ms, static cores, `on_exit`, the state file `state`
/// and the socket in `dir`.
fn config(
    top: &GroupPath,
    lc: u32,
    command: &[&str],
    user: Option<&str>,
    on_exit: &str,
    dir: &Path,
) -> String {
    let user = user
        .map(|u| format!("user = \"{u}\"\n"))
        .unwrap_or_default();
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{lc}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = {command:?}\n{user}\
         restart_backoff_ms = 50\nrestart_backoff_max_ms = 100\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"{on_exit}\"\nstate_file = \"{}/state.json\"\n\n\
         [api]\nsocket = \"{}/ctl.sock\"\nmetrics = \"\"\n",
        dir.display(),
        dir.display()
    )
}

/// Runs an agent on `text` for `run_for` in this thread; `Err` when it does not start.
fn run_once(text: &str, run_for: Duration) -> Result<(), String> {
    let agent = Agent::start(live::options(text, run_for))
        .map_err(|e| format!("the agent does not start here: {e}"))?;
    agent
        .run()
        .map(|_| ())
        .map_err(|e| format!("the run failed: {e}"))
}

/// The agent's directory (root's, 0755: its socket and state file) and `out` in it, which any
/// user may write (a BE command running as nobody leaves its findings there).
fn open_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).unwrap();
    (dir, out)
}

/// `/proc/<pid>/status`'s `name:` line, its fields.
fn status_ids(pid: u32, name: &str) -> Vec<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

const NOBODY: &str = "a_be_command_with_user_nobody_runs_as_65534_and_cannot_leave_its_group";

/// A BE command with `user = "nobody"` runs as uid 65534 with nobody's gid and groups, and its
/// write of its own pid into the root group's `cgroup.procs` is refused (EACCES): it stays in
/// its BE group. Before, it ran as root and the write moved it out.
#[test]
fn a_be_command_with_user_nobody_runs_as_65534_and_cannot_leave_its_group() {
    let Some(guard) = Guard::setup(NOBODY, "bu", 7, "nobody", 1) else {
        return;
    };
    let Some(who) = live::nobody(NOBODY) else {
        return;
    };
    let (dir, out) = open_dir();
    let be = guard.top.join("be").unwrap();
    // The root of the first hierarchy the BE group is in.
    let _ = guard.cgroups.create(&be);
    let Some(root_procs) = guard
        .cgroups
        .group_dirs(&be)
        .first()
        .map(|(b, _)| b.mount().join("cgroup.procs"))
    else {
        return eprintln!("SKIP {NOBODY}: no hierarchy holds the BE group");
    };
    let err = out.join("err");
    let script = format!(
        "{{ echo $$ > {}; }} 2> {}; exec sleep {}",
        root_procs.display(),
        err.display(),
        guard.marker
    );
    let lc = live::Children::sleepers(1);
    let text = config(
        &guard.top,
        lc.pid(0),
        &["sh", "-c", &script],
        Some("nobody"),
        "restore",
        dir.path(),
    );
    let runner = match live::start_agent(&text, Duration::from_secs(4)) {
        Ok(r) => r,
        Err(why) => panic!("{why}"),
    };
    let found = live::eventually(Duration::from_secs(5), || {
        !sleeps_with_marker(&guard.marker).is_empty() && err.exists()
    });
    let pid = sleeps_with_marker(&guard.marker).first().copied();
    let (uids, gids, groups, in_be) = match pid {
        Some(pid) => (
            status_ids(pid, "Uid:"),
            status_ids(pid, "Gid:"),
            status_ids(pid, "Groups:"),
            guard
                .cgroups
                .procs(&be)
                .is_ok_and(|p| p.contains(&(pid as i32))),
        ),
        None => Default::default(),
    };
    let said = std::fs::read_to_string(&err).unwrap_or_default();
    let result = runner.join();
    assert!(found, "the BE command ran and wrote {}", err.display());
    assert!(matches!(result, Ok(Ok(_))), "the run: {result:?}");
    assert_eq!(uids, vec![65534; 4], "real, effective, saved, fs uid");
    assert_eq!(gids, vec![who.gid(); 4], "real, effective, saved, fs gid");
    let mut want = who.groups();
    want.sort_unstable();
    let mut groups = groups;
    groups.sort_unstable();
    assert_eq!(groups, want, "nobody's supplementary groups, not root's");
    assert!(
        said.contains("Permission denied"),
        "the write to {} refused: {said:?}",
        root_procs.display()
    );
    assert!(in_be, "the BE command stayed in its group");
}

const RESTART: &str = "a_restarted_be_command_keeps_its_user";

/// The supervisor's restarts run the command as its user too: a command that exits at once,
/// restarted after 50 to 100 ms, saw uid 65534 each time.
#[test]
fn a_restarted_be_command_keeps_its_user() {
    let Some(guard) = Guard::setup(RESTART, "bu", 7, "restart", 2) else {
        return;
    };
    if live::nobody(RESTART).is_none() {
        return;
    }
    let (dir, out) = open_dir();
    let uids = out.join("uids");
    let script = format!("id -u >> {}; exit 3", uids.display());
    let lc = live::Children::sleepers(1);
    let text = config(
        &guard.top,
        lc.pid(0),
        &["sh", "-c", &script],
        Some("nobody"),
        "restore",
        dir.path(),
    );
    let runner = match live::start_agent(&text, Duration::from_secs(3)) {
        Ok(r) => r,
        Err(why) => panic!("{why}"),
    };
    let lines = || {
        std::fs::read_to_string(&uids)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    live::eventually(Duration::from_secs(3), || lines().len() >= 2);
    let seen = lines();
    let result = runner.join();
    assert!(matches!(result, Ok(Ok(_))), "the run: {result:?}");
    assert!(seen.len() >= 2, "started and restarted: {seen:?}");
    assert!(
        seen.iter().all(|u| u == "65534"),
        "every run as nobody: {seen:?}"
    );
}

const ADOPT: &str = "a_new_agent_adopts_the_be_only_as_its_user";

/// A run leaves its BE (`on_exit = "freeze"`, as a kill -9 would); the next agent adopts it
/// when it runs as the config's user (the same pid, still 65534), and when the earlier run had
/// no user (root), does not adopt it: it is stopped and started again as nobody. Before, a
/// root BE was adopted whatever `user` said.
#[test]
fn a_new_agent_adopts_the_be_only_as_its_user() {
    let Some(guard) = Guard::setup(ADOPT, "bu", 7, "adopt", 3) else {
        return;
    };
    if live::nobody(ADOPT).is_none() {
        return;
    }
    let (dir, _) = open_dir();
    let lc = live::Children::sleepers(1);
    let run = |user: Option<&str>, on_exit: &str| {
        let text = config(
            &guard.top,
            lc.pid(0),
            &["sleep", &guard.marker],
            user,
            on_exit,
            dir.path(),
        );
        run_once(&text, Duration::from_millis(1500))
    };
    let uid_of = |pid: u32| status_ids(pid, "Uid:").first().copied();
    // As nobody, left frozen; adopted as nobody: the same process.
    run(Some("nobody"), "freeze").unwrap();
    let first = sleeps_with_marker(&guard.marker);
    assert_eq!(first.len(), 1, "run 1 left its BE: {first:?}");
    assert_eq!(uid_of(first[0]), Some(65534));
    run(Some("nobody"), "freeze").unwrap();
    let second = sleeps_with_marker(&guard.marker);
    assert_eq!(second, first, "adopted, not started again");
    // As root (no user), left frozen; the next agent, with user = nobody, starts it again.
    guard.cgroups.kill_all(&guard.top.join("be").unwrap()).ok();
    run(None, "freeze").unwrap();
    let as_root = sleeps_with_marker(&guard.marker);
    assert_eq!(as_root.len(), 1, "run 3 left its BE: {as_root:?}");
    assert_eq!(uid_of(as_root[0]), Some(0));
    run(Some("nobody"), "freeze").unwrap();
    let again = sleeps_with_marker(&guard.marker);
    assert_eq!(again.len(), 1, "one BE: {again:?}");
    assert_ne!(again, as_root, "the root BE was not adopted");
    assert_eq!(uid_of(again[0]), Some(65534), "started again as nobody");
}

const OWNER: &str = "a_be_program_owned_by_65534_is_refused_to_run_as_root";

/// A BE program file owned by uid 65534 (who could rewrite it) is refused at start when the
/// command would run as root (exit 2, key `be[0].command`), and accepted for `user = 65534`,
/// who can run only what it could anyway. Before, root ran it: uid 65534 had root.
#[test]
fn a_be_program_owned_by_65534_is_refused_to_run_as_root() {
    let Some(guard) = Guard::setup(OWNER, "bu", 7, "owner", 4) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Others may enter it (nobody runs the program in the second half), not write it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let program = dir.path().join("job");
    std::fs::write(
        &program,
        format!("#!/bin/sh\nexec sleep {}\n", guard.marker),
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&program, Some(65534), Some(65534)).unwrap();
    let lc = live::Children::sleepers(1);
    let path = program.to_str().unwrap();
    let text = config(&guard.top, lc.pid(0), &[path], None, "restore", dir.path());
    let refused = match Agent::start(live::options(&text, Duration::from_millis(500))) {
        Ok(agent) => {
            let _ = agent.run();
            None
        }
        Err(e) => Some(e.to_string()),
    };
    let ran = sleeps_with_marker(&guard.marker);
    let refused = refused.expect("a 65534-owned BE program refused to run as root");
    assert!(
        refused.contains("be[0].command") && refused.contains("owned by uid 65534"),
        "{refused}"
    );
    assert!(ran.is_empty(), "never ran: {ran:?}");
    // Run as its owner: accepted (the rule's relaxation for a non-root user).
    let text = config(
        &guard.top,
        lc.pid(0),
        &[path],
        Some("65534"),
        "restore",
        dir.path(),
    );
    let as_owner = run_once(&text, Duration::from_millis(500));
    assert!(as_owner.is_ok(), "run as its owner: {as_owner:?}");
}

const SCOPED: &str = "a_be_command_run_as_nobody_cannot_reach_another_process_of_nobody";

/// Hostile pass 25's low: a BE as nobody opened the `/proc/<pid>/mem` of a root-group process
/// of uid 65534 read-write, so it could run its work there, unconfined, or kill it. The agent
/// launches every BE command scoped to its own processes (Landlock,
/// `crates/host/src/spawn/scope.rs`): its signal to such a process and its read of that
/// process's environment are refused. SKIP where the kernel cannot scope (said at start).
#[test]
fn a_be_command_run_as_nobody_cannot_reach_another_process_of_nobody() {
    use std::os::unix::process::CommandExt;
    if let Err(why) = headroom_host::spawn::scope::available() {
        return eprintln!("SKIP {SCOPED}: {why}");
    }
    let Some(guard) = Guard::setup(SCOPED, "bu", 7, "scoped", 5) else {
        return;
    };
    if live::nobody(SCOPED).is_none() {
        return;
    }
    let (dir, out) = open_dir();
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .uid(65534)
        .gid(65534)
        .spawn()
        .unwrap();
    let v = victim.id();
    let reach = out.join("reach");
    let script = format!(
        "{{ kill -0 {v} && echo signal; cat /proc/{v}/environ >/dev/null && echo environ; \
         echo done; }} > {} 2>/dev/null; exec sleep {}",
        reach.display(),
        guard.marker
    );
    let lc = live::Children::sleepers(1);
    let text = config(
        &guard.top,
        lc.pid(0),
        &["sh", "-c", &script],
        Some("nobody"),
        "restore",
        dir.path(),
    );
    let runner = match live::start_agent(&text, Duration::from_secs(3)) {
        Ok(r) => r,
        Err(why) => panic!("{why}"),
    };
    let ran = live::eventually(Duration::from_secs(5), || {
        std::fs::read_to_string(&reach).is_ok_and(|s| s.ends_with("done\n"))
    });
    let said = std::fs::read_to_string(&reach).unwrap_or_default();
    let result = runner.join();
    let _ = victim.kill();
    let _ = victim.wait();
    assert!(ran, "the BE command ran and wrote {}", reach.display());
    assert!(matches!(result, Ok(Ok(_))), "the run: {result:?}");
    assert_eq!(
        said, "done\n",
        "the BE as nobody reached another process of nobody ({v}) outside its groups"
    );
}
