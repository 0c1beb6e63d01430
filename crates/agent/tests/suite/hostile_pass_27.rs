//! Hostile pass 27 (issue 42): an `[lc] command` launched as root that becomes another user
//! itself (`memcached -u nobody`, a daemon dropping its privileges) was never found again by a
//! start: the look for a copy left in the LC group, and the record `restore` leaves, both took
//! only a process running as the command's user (root), so after a kill -9 or a `restore` a
//! restart launched a second copy beside it. And its low: `restore` left the LC group it made
//! held by what the LC command forked.

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_types::GroupPath;
use live::marked::MarkedGroup as Guard;

/// The LC command: python3 that becomes uid 65534 at once and sleeps (its command line, with the
/// test's marker as its last argument, stays the same: as `memcached -u nobody`'s does).
fn dropping_command(marker: &str) -> Vec<String> {
    vec![
        "/usr/bin/python3".to_string(),
        "-c".to_string(),
        "import os,time;os.setgroups([]);os.setresgid(65534,65534,65534);\
         os.setresuid(65534,65534,65534);time.sleep(60)"
            .to_string(),
        marker.to_string(),
    ]
}

struct Case {
    guard: Guard,
    _dir: tempfile::TempDir,
    command: Vec<String>,
    text: String,
    lc_group: GroupPath,
}

impl Case {
    fn new(test: &str, name: &str, id: u32) -> Option<Case> {
        if !Path::new("/usr/bin/python3").exists() {
            eprintln!("SKIP {test}: no /usr/bin/python3");
            return None;
        }
        let guard = Guard::setup(test, "hp27", 5, name, id)?;
        let dir = tempfile::tempdir().unwrap();
        let command = dropping_command(&guard.marker);
        let quoted: Vec<String> = command.iter().map(|a| format!("{a:?}")).collect();
        let top = &guard.top;
        let text = live::agent_config(
            &format!("{top}/lc"),
            &format!("{top}/be"),
            &format!("command = [{}]", quoted.join(", ")),
            &dir.path().join("state.json"),
            &dir.path().join("ctl.sock"),
        );
        Some(Case {
            lc_group: GroupPath::new(&format!("{top}/lc")).unwrap(),
            guard,
            _dir: dir,
            command,
            text,
        })
    }

    /// The processes running the command, sorted.
    fn copies(&self) -> Vec<u32> {
        let mut c = headroom_host::pids::running(Path::new("/"), &self.command);
        c.sort_unstable();
        c
    }

    /// Whether `pid` is in the LC group in every hierarchy.
    fn in_lc_group(&self, pid: u32) -> bool {
        let cg = &self.guard.cgroups;
        let text = headroom_host::pids::cgroup_text(Path::new("/"), pid);
        let dirs = cg.process_dirs(&self.lc_group, &text);
        !dirs.is_empty() && dirs.iter().all(|d| d.ends_with(self.lc_group.as_str()))
    }
}

/// Waits until `pid` runs as uid 65534 (the command has dropped root).
fn dropped(pid: u32) -> bool {
    live::eventually(Duration::from_secs(10), || {
        headroom_host::pids::uids(Path::new("/"), pid) == Some((65534, 65534))
    })
}

const IN_GROUP: &str =
    "a_root_lc_command_that_became_another_user_in_its_group_is_taken_not_doubled";

/// After a kill -9 of the agent (or `freeze`), the LC command it launched as root, which then
/// became uid 65534 itself, is still in the LC group: the next start must take it, not launch a
/// second copy beside it.
#[test]
fn a_root_lc_command_that_became_another_user_in_its_group_is_taken_not_doubled() {
    let Some(case) = Case::new(IN_GROUP, "in-group", 1) else {
        return;
    };
    let cg = case.guard.cgroups.clone();
    cg.create(&case.lc_group).expect("the LC group");
    // As a killed agent left it: the command launched as root, in the LC group, now uid 65534.
    let (program, args) = case.command.split_first().unwrap();
    let mut left = std::process::Command::new(program)
        .args(args)
        .spawn()
        .unwrap();
    let pid = left.id();
    cg.move_process(&case.lc_group, pid as i32)
        .expect("the left copy into the LC group");
    assert!(
        dropped(pid),
        "the test's LC command did not become uid 65534"
    );
    let agent = match live::start_agent(&case.text, Duration::from_millis(1200)) {
        Ok(a) => a,
        Err(e) => {
            let _ = left.kill();
            let _ = left.wait();
            return eprintln!("SKIP {IN_GROUP}: {e}");
        }
    };
    let during = case.copies();
    let exit = agent.join().unwrap();
    let _ = left.kill();
    let _ = left.wait();
    exit.expect("the agent ran and restored");
    assert_eq!(
        during,
        vec![pid],
        "the start launched a second LC command beside the one left in its group (uid 65534)"
    );
}

const RECORDED: &str = "a_root_lc_command_that_became_another_user_is_taken_after_restore";

/// `restore` moves the LC command it launched out of the group it made and records it; the
/// command, launched as root, had become uid 65534 itself. The next start must take that very
/// process back into the group, not launch a second copy.
#[test]
fn a_root_lc_command_that_became_another_user_is_taken_after_restore() {
    let Some(case) = Case::new(RECORDED, "recorded", 2) else {
        return;
    };
    let first = match live::start_agent(&case.text, Duration::from_millis(1500)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {RECORDED}: {e}"),
    };
    let launched = case.copies();
    first.join().unwrap().expect("agent one ran and restored");
    assert_eq!(launched.len(), 1, "agent one launched its LC: {launched:?}");
    let pid = launched[0];
    assert!(dropped(pid), "the LC command did not become uid 65534");
    let second = match live::start_agent(&case.text, Duration::from_millis(1200)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {RECORDED}: {e}"),
    };
    let during = case.copies();
    let taken = case.in_lc_group(pid);
    second.join().unwrap().expect("agent two ran and restored");
    assert_eq!(
        during,
        vec![pid],
        "the restart launched a second LC command beside the one restore left (uid 65534)"
    );
    assert!(taken, "agent one's LC command was not taken into its group");
}

const FORKED: &str = "restore_moves_what_the_lc_command_forked_out_of_the_group_it_made";

/// Pass 27's low: `restore` moved only the LC command it launched out of the LC group it made,
/// not what that command forked, so the group stayed (a forked child held it). The exit must
/// move both out and remove the group in every hierarchy; both run on.
#[test]
fn restore_moves_what_the_lc_command_forked_out_of_the_group_it_made() {
    let Some(guard) = Guard::setup(FORKED, "hp27", 5, "forked", 3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let top = &guard.top;
    let marker = guard.marker.clone();
    // The command forks a `sleep <marker>` and then becomes one itself.
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("command = [\"/bin/sh\", \"-c\", \"sleep {marker} & exec sleep {marker}\"]"),
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let lc_group = GroupPath::new(&format!("{top}/lc")).unwrap();
    let sleeps = || {
        let mut s =
            headroom_host::pids::running(Path::new("/"), &["sleep".to_string(), marker.clone()]);
        s.sort_unstable();
        s
    };
    let agent = match live::start_agent(&text, Duration::from_millis(1500)) {
        Ok(a) => a,
        Err(e) => return eprintln!("SKIP {FORKED}: {e}"),
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sleeps().len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let launched = sleeps();
    agent.join().unwrap().expect("the agent ran and restored");
    assert_eq!(
        launched.len(),
        2,
        "the LC command and its child: {launched:?}"
    );
    assert_eq!(sleeps(), launched, "both run on after restore");
    let left: Vec<_> = guard
        .cgroups
        .group_dirs(&lc_group)
        .into_iter()
        .map(|(_, d)| d)
        .filter(|d| d.is_dir())
        .collect();
    assert!(
        left.is_empty(),
        "restore left the LC group it made, held by what the LC command forked: {left:?}"
    );
}
