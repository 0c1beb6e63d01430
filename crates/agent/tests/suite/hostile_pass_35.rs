//! Hostile pass 35 (issue 42, docs/safety-hostile-pass-35.md): an LC killed leaves its pid
//! file, and once pid numbers wrap the number it holds names whoever got it next. The
//! follower moved that process (root's, so counted as the LC's) into the LC group: an
//! unrelated process moved by the agent. A pid file older than the process it names is
//! stale now; one written after the process started is followed as before.

use crate::live;

use std::time::{Duration, SystemTime};

use live::marked::{groups_of, MarkedGroup as Guard};

const STALE: &str = "a_stale_pid_file_naming_a_later_process_is_not_followed";

/// LC sleeper A moved in by `pids`, its pid file beside; A is killed, and the pid file then
/// names sleeper B, the file last written 10 min before B started (what a number reused after
/// the LC died looks like). B must stay out of the LC group, said in `ctl status`. Then the
/// file is written again naming B (a fresh file, as a restarted LC writes it): B is taken,
/// so the rule is the file's age, not B. On the code before, B was moved in at once.
#[test]
fn a_stale_pid_file_naming_a_later_process_is_not_followed() {
    let Some(guard) = Guard::setup(STALE, "hp35", 3, "stale-pid-file", 35) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let mut lc = live::Children::sleepers(1);
    let pid_file = dir.path().join("lc.pid");
    std::fs::write(&pid_file, format!("{}\n", lc.pid(0))).unwrap();
    let top = &guard.top;
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{}]\npid_file = \"{}\"\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"{}\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        lc.pid(0),
        pid_file.display(),
        guard.marker
    );
    let runner = match live::start_agent(&text, Duration::from_secs(9)) {
        Ok(r) => r,
        Err(why) => return eprintln!("SKIP {STALE}: {why}"),
    };
    let lc_group = format!("/{top}/lc");
    let a = lc.pid(0);
    assert!(
        live::eventually(Duration::from_secs(3), || groups_of(a).contains(&lc_group)),
        "LC A ({a}) in its group"
    );
    let _ = lc.0[0].kill();
    let _ = lc.0[0].wait();
    let other = live::Children::sleepers(1);
    let b = other.pid(0);
    std::fs::write(&pid_file, format!("{b}\n")).unwrap();
    let long_ago = SystemTime::now() - Duration::from_secs(600);
    std::fs::File::options()
        .write(true)
        .open(&pid_file)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    // Three follower looks: B must never be seen in the LC group.
    let mut taken = Vec::new();
    live::eventually(Duration::from_millis(3200), || {
        let now = groups_of(b);
        if now.contains(&lc_group) {
            taken = now;
        }
        false
    });
    let said = live::followed(&dir.path().join("ctl.sock"));
    // A fresh pid file naming B: followed.
    std::fs::write(&pid_file, format!("{b}\n")).unwrap();
    let fresh_taken = live::eventually(Duration::from_secs(4), || groups_of(b).contains(&lc_group));
    let _ = runner.join();
    assert!(
        taken.is_empty(),
        "B ({b}), started 10 min after the pid file was written, was moved into {lc_group}: {taken:?}"
    );
    assert!(
        said.iter()
            .any(|r| r.contains(&b.to_string()) && r.contains("stale")),
        "ctl status says it: {said:?}"
    );
    assert!(
        fresh_taken,
        "B ({b}), named by a pid file written after it started, was not followed"
    );
}

const CONFIG_OLDER: &str = "lc_pids_naming_a_process_started_after_the_config_file_are_refused";

/// The agent restarted (a unit's `Restart=`) after the LC it names by `pids` died while no
/// agent ran, its number reused: the config file is older than the process the number names
/// now. Refused at start (exit 2, naming `lc.pids` and why), nothing made, the process left
/// where it is. On the code before, that process was moved into the LC group for the run.
#[test]
fn lc_pids_naming_a_process_started_after_the_config_file_are_refused() {
    let Some(guard) = Guard::setup(CONFIG_OLDER, "hp35", 3, "config-older", 36) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let other = live::Children::sleepers(1);
    let b = other.pid(0);
    let top = &guard.top;
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{b}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\ncommand = [\"sleep\", \"{}\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n\
         [api]\nsocket = \"{d}/ctl.sock\"\nmetrics = \"\"\n",
        guard.marker
    );
    let path = dir.path().join("headroom.toml");
    std::fs::write(&path, &text).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(600))
        .unwrap();
    let mut options = live::options(&text, Duration::from_millis(500));
    options.config_path = Some(path);
    let lc_group = format!("/{top}/lc");
    let outcome = match headroom_agent::runtime::Agent::start(options) {
        Ok(agent) => {
            let moved = groups_of(b).contains(&lc_group);
            let _ = agent.run();
            Err(moved)
        }
        Err(e) => Ok(e),
    };
    let made = guard
        .cgroups
        .group_dirs(&guard.top.join("lc").unwrap())
        .iter()
        .any(|(_, dir)| dir.is_dir());
    let err = match outcome {
        Ok(e) => e,
        Err(moved) => panic!(
            "the agent started on pid {b}, which started 10 min after the config file was written (moved into {lc_group}: {moved})"
        ),
    };
    let msg = err.to_string();
    assert!(err.is_usage(), "a usage error (exit 2): {msg}");
    assert!(
        msg.contains("pids") && msg.contains("after the config file"),
        "lc.pids and why named: {msg}"
    );
    assert!(!made, "nothing made: {top}/lc exists");
}
