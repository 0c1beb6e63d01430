//! The seventh hostile pass's defects (issue 42, docs/safety-hostile-pass-7.md). Live tests
//! need root (cgroups) and print SKIP otherwise; their groups are `hp7-*`, removed (processes
//! killed first) by a guard, also when a test fails.

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_agent::runtime::Agent;
use headroom_types::GroupPath;

use live::marked::{alive, sleeps_with_marker, MarkedGroup as Guard};

/// A config on `top`: the LC pid `lc` in `top/lc`, one BE `sleep <arg>` in `top/be`, static
/// cores, `on_exit = "restore"`, the state file and socket in `dir`.
fn config(top: &GroupPath, lc: u32, arg: &str, dir: &Path) -> String {
    config_on(top, lc, "be", arg, "restore", dir)
}

/// [`config`] with the BE group `top/<be>` and `on_exit`.
fn config_on(top: &GroupPath, lc: u32, be: &str, arg: &str, on_exit: &str, dir: &Path) -> String {
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{lc}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/{be}\"\ncommand = [\"sleep\", \"{arg}\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"{on_exit}\"\nstate_file = \"{}/state.json\"\n\n\
         [api]\nsocket = \"{}/ctl.sock\"\nmetrics = \"\"\n",
        dir.display(),
        dir.display()
    )
}

const PARTIAL: &str = "an_operators_process_in_some_hierarchies_of_the_be_group_is_spared";

/// On cgroup v1 a process may sit in the BE group in some hierarchies only (`cgexec -g
/// memory:<group>`). A first start found the processes to spare in the first hierarchy
/// (cpu) only, while the kill of the group reads them all: with an earlier agent's marked BE
/// there, the operator's process was killed at start, said as "spared"; and `restore` killed
/// it at exit in any case.
#[test]
fn an_operators_process_in_some_hierarchies_of_the_be_group_is_spared() {
    let Some(guard) = Guard::setup(PARTIAL, "hp7", 7, "partial", 1) else {
        return;
    };
    let be = guard.top.join("be").unwrap();
    if let Err(e) = guard.cgroups.create(&be) {
        return eprintln!("SKIP {PARTIAL}: creating {be}: {e}");
    }
    let dirs = guard.cgroups.group_dirs(&be);
    if dirs.len() < 2 {
        return eprintln!("SKIP {PARTIAL}: one hierarchy (cgroup v2): nothing to split");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let spawn = |arg: String, mark: Option<&GroupPath>| {
        let mut c = std::process::Command::new("sleep");
        c.arg(arg).env_remove("HEADROOM_BE_OWNER");
        if let Some(g) = mark {
            c.env("HEADROOM_BE_OWNER", g.as_str());
        }
        c.spawn().unwrap()
    };
    // An earlier agent's BE that no state file recorded (marked), in every hierarchy.
    let earlier = format!("{}1", guard.marker);
    let mut procs = live::Children(vec![spawn(earlier.clone(), Some(&be))]);
    guard
        .cgroups
        .move_process(&be, procs.pid(0) as i32)
        .unwrap();
    // The operator's own process (no mark), in the group's last hierarchy only.
    let operator = format!("{}3", guard.marker);
    procs.0.push(spawn(operator.clone(), None));
    let last = &dirs[dirs.len() - 1].1;
    std::fs::write(last.join("cgroup.procs"), procs.pid(1).to_string()).unwrap();
    let text = config(
        &guard.top,
        lc.pid(0),
        &format!("{}2", guard.marker),
        dir.path(),
    );
    let agent = match Agent::start(live::options(&text, Duration::from_secs(2))) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {PARTIAL}: the agent does not start here: {e}"),
    };
    let result = agent.run().map(|_| ());
    let earlier_left = sleeps_with_marker(&earlier);
    let operator_alive = alive(procs.pid(1));
    drop(procs);
    assert!(result.is_ok(), "the run: {result:?}");
    assert!(
        earlier_left.is_empty(),
        "the earlier agent's marked BE was stopped: {earlier_left:?}"
    );
    assert!(
        operator_alive,
        "the operator's process in {} only was spared",
        last.display()
    );
}

const REUSED: &str = "a_dropped_group_someone_made_again_keeps_their_processes";

/// Run 1 (`on_exit = "freeze"`) on `top/be`; then its BE is stopped and the group removed by
/// hand, and an operator makes `top/be` again for a process of their own (no mark). Run 2's
/// config drops `top/be`: its release killed the operator's process, because the state file
/// says an agent ran a command there.
#[test]
fn a_dropped_group_someone_made_again_keeps_their_processes() {
    let Some(guard) = Guard::setup(REUSED, "hp7", 7, "reused", 2) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let earlier = format!("{}1", guard.marker);
    let text = config_on(&guard.top, lc.pid(0), "be", &earlier, "freeze", dir.path());
    let run = |text: &str| -> Result<(), String> {
        let agent = Agent::start(live::options(text, Duration::from_millis(1500)))
            .map_err(|e| format!("the agent does not start here: {e}"))?;
        agent.run().map(|_| ()).map_err(|e| format!("the run: {e}"))
    };
    if let Err(why) = run(&text) {
        return eprintln!("SKIP {REUSED}: {why}");
    }
    let be = guard.top.join("be").unwrap();
    // The operator empties and removes the group, then makes it again for their own process.
    let _ = guard.cgroups.thaw(&be);
    let _ = guard.cgroups.kill_all(&be);
    guard.cgroups.remove(&be).unwrap();
    guard.cgroups.create(&be).unwrap();
    let operator = format!("{}3", guard.marker);
    let mine = live::Children(vec![std::process::Command::new("sleep")
        .arg(&operator)
        .env_remove("HEADROOM_BE_OWNER")
        .spawn()
        .unwrap()]);
    guard.cgroups.move_process(&be, mine.pid(0) as i32).unwrap();
    let text = config_on(
        &guard.top,
        lc.pid(0),
        "be2",
        &format!("{}2", guard.marker),
        "restore",
        dir.path(),
    );
    let result = run(&text);
    let operator_alive = alive(mine.pid(0));
    let _ = guard.cgroups.thaw(&be);
    drop(mine);
    assert!(result.is_ok(), "run 2: {result:?}");
    assert!(
        operator_alive,
        "the operator's process in the group made again was spared"
    );
}
