//! The fifteenth hostile pass (issue 42): pass 14's new rules attacked. A config file a group
//! of users may write, and a pid file written by the LC's (unprivileged) user that names one
//! of root's processes. Root for the other user's part (skipped otherwise).

use crate::live;
use live::procs_of;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

/// One test at a time (the agent test runs in this process).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Pass 14's config rule refused a file others could write (mode `o+w`) but read one its
/// group could write: `root:65534` mode 0664 had its `[[be]] command` run as root, written
/// by any member of that group (the agent's directory rule refuses `g+w` too). Refused,
/// naming the mode; root's group (gid 0) may still write it.
#[test]
fn a_config_its_group_could_write_is_refused() {
    let _serial = serial();
    if !live::is_root() {
        return eprintln!("SKIP a_config_its_group_could_write_is_refused: needs root (chown)");
    }
    let d = tempfile::tempdir().unwrap();
    let text = "[lc]\nname = \"lc\"\ncgroup = \"hp15/lc\"\n\n[[be]]\nname = \"be\"\ncgroup = \"hp15/be\"\ncommand = [\"id\"]\n\n[policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n";
    let read = |p: &std::path::Path| headroom_agent::config_file::read_config(p).map(|_| ());
    let roots = d.path().join("roots.toml");
    std::fs::write(&roots, text).unwrap();
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o664)).unwrap();
    std::os::unix::fs::chown(&roots, Some(0), Some(0)).unwrap();
    assert!(read(&roots).is_ok(), "root:root 0664: {:?}", read(&roots));
    let grp = d.path().join("group.toml");
    std::fs::write(&grp, text).unwrap();
    std::fs::set_permissions(&grp, std::fs::Permissions::from_mode(0o664)).unwrap();
    std::os::unix::fs::chown(&grp, Some(0), Some(65534)).unwrap();
    match read(&grp) {
        Err(e) => assert!(e.to_string().contains("gid 65534"), "{e}"),
        Ok(()) => panic!(
            "{}: a config (root:65534, mode 0664) the group 65534 could write was read",
            grp.display()
        ),
    }
}

/// A `sleep 60` as `uid` (with its gid).
fn sleeper_as(uid: u32) -> live::Children {
    use std::os::unix::process::CommandExt;
    live::Children(vec![std::process::Command::new("sleep")
        .arg("60")
        .uid(uid)
        .gid(uid)
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("spawning sleep")])
}

const PID_FILE: &str = "a_pid_file_the_lcs_user_writes_cannot_pull_roots_process_into_the_lc";

/// The LC runs as uid 65534 and writes its own pid file (owned by 65534, as a daemon's is).
/// Pass 14's rule counts root as the LC's user always, so that user wrote a root process's
/// pid into the file and root moved that process into the LC group (its cpuset and memory
/// limit) and gave its threads the LC's SCHED_FIFO. A pid file's pid must run as the file's
/// owner when that owner is not root or the agent's user; refused and said.
#[test]
fn a_pid_file_the_lcs_user_writes_cannot_pull_roots_process_into_the_lc() {
    let _serial = serial();
    if !live::is_root() {
        return eprintln!("SKIP {PID_FILE}: needs root (cgroups, another uid)");
    }
    let lc_proc = sleeper_as(65534);
    let roots = live::Children::sleepers(1);
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("lc.pid");
    std::fs::write(&pid_file, format!("{}\n", lc_proc.pid(0))).unwrap();
    std::os::unix::fs::chown(&pid_file, Some(65534), Some(65534)).unwrap();
    let top = format!("hp15-pidfile-{}", std::process::id());
    let run_for = Duration::from_secs(9);
    let _clean = live::RemoveOnDrop::new(&top).wait_for_agent(run_for);
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!(
            "pids = [{}]\npid_file = \"{}\"",
            lc_proc.pid(0),
            pid_file.display()
        ),
        &dir.path().join("state.json"),
        &dir.path().join("ctl.sock"),
    );
    let runner = match live::start_agent(&text, run_for) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {PID_FILE}: {e}"),
    };
    let lc = format!("{top}/lc");
    assert!(live::eventually(Duration::from_secs(4), || procs_of(&lc)
        .contains(&lc_proc.pid(0))));
    std::thread::sleep(Duration::from_millis(1500));
    // the LC's user (the pid file's owner) names root's process
    std::fs::write(&pid_file, format!("{}\n", roots.pid(0))).unwrap();
    let taken = live::eventually(Duration::from_secs(3), || {
        procs_of(&lc).contains(&roots.pid(0))
    });
    let said = live::followed(&dir.path().join("ctl.sock"));
    assert!(
        !taken,
        "root's process {} named by uid 65534's pid file was moved into the LC group {lc}",
        roots.pid(0)
    );
    assert!(
        said.iter().any(|r| r.contains("pid file")),
        "ctl status says it: {said:?}"
    );
    runner.join().unwrap().expect("the agent ran and restored");
}
