//! Moving targets (issue 42, item 7): an LC restarted under a new pid — found by its pid file
//! or its listening port — is moved into its LC group, and a BE group someone else removed is
//! created again with BE moved back in; both are listed in `ctl status`. Before, neither
//! happened and nothing was said. Needs root (cgroups); prints SKIP otherwise.

use crate::live;

use std::path::{Path, PathBuf};
use std::time::Duration;

use headroom_agent::runtime::{AgentError, RunSummary};

/// The agent on `top/lc` (with the `[lc]` keys `lc`) and `top/be`, its state and socket in
/// `dir`, for 6 s, in a thread.
fn start(top: &str, dir: &Path, lc: &str) -> Result<Runner, String> {
    let text = live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        lc,
        &dir.join("state.json"),
        &dir.join("ctl.sock"),
    );
    live::start_agent(&text, Duration::from_secs(6))
}

type Runner = std::thread::JoinHandle<Result<RunSummary, AgentError>>;

/// The directory of the hierarchy's root group that holds `dir`, the directory of `group`.
fn hierarchy_root(dir: &Path, group: &str) -> PathBuf {
    dir.ancestors()
        .nth(group.split('/').count())
        .unwrap()
        .to_path_buf()
}

/// An agent running on `top` with a sleeping LC, once its BE runs: its directory, the LC,
/// the agent's thread, the BE group's name, its directories and BE's pid.
type WithBe = (
    tempfile::TempDir,
    live::Children,
    Runner,
    String,
    Vec<PathBuf>,
    u32,
);

fn start_with_be(top: &str) -> Result<WithBe, String> {
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let runner = start(top, dir.path(), &format!("pids = [{}]", lc.pid(0)))?;
    std::thread::sleep(Duration::from_millis(800));
    let be = format!("{top}/be");
    let be_dirs = group_dirs(&be);
    assert!(!be_dirs.is_empty());
    let be_pid = procs(&be_dirs[0])[0];
    Ok((dir, lc, runner, be, be_dirs, be_pid))
}

/// The group's directories in every v1 hierarchy that has it.
fn group_dirs(group: &str) -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| {
            d.flatten()
                .map(|e| e.path().join(group))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

fn procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

const PID_FILE: &str = "an_lc_restarted_under_a_new_pid_is_found_by_its_pid_file_and_moved_in";

#[test]
fn an_lc_restarted_under_a_new_pid_is_found_by_its_pid_file_and_moved_in() {
    if !live::is_root() {
        return eprintln!("SKIP {PID_FILE}: needs root (cgroups)");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut first = live::Children::sleepers(1);
    let pid_file = dir.path().join("lc.pid");
    std::fs::write(&pid_file, format!("{}\n", first.pid(0))).unwrap();
    let top = format!("headroom-follow-pidfile-{}", std::process::id());
    let lc = format!(
        "pids = [{}]\npid_file = \"{}\"",
        first.pid(0),
        pid_file.display()
    );
    let runner = match start(&top, dir.path(), &lc) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {PID_FILE}: {e}"),
    };
    let lc_dirs = group_dirs(&format!("{top}/lc"));
    assert!(!lc_dirs.is_empty());
    assert!(procs(&lc_dirs[0]).contains(&first.pid(0)));
    // the service manager restarts it: the old one dies, a new one writes its pid
    std::thread::sleep(Duration::from_millis(500));
    let _ = first.0[0].kill();
    let _ = first.0[0].wait();
    let second = live::Children::sleepers(1);
    std::fs::write(&pid_file, format!("{}\n", second.pid(0))).unwrap();
    let moved = live::eventually(Duration::from_secs(4), || {
        lc_dirs.iter().all(|d| procs(d).contains(&second.pid(0)))
    });
    assert!(
        moved,
        "the LC's new pid {} was not moved into its group",
        second.pid(0)
    );
    let said = live::followed(&dir.path().join("ctl.sock"));
    assert!(
        said.iter()
            .any(|r| r.contains(&format!("new pid {}", second.pid(0)))),
        "ctl status says it: {said:?}"
    );
    runner.join().unwrap().expect("the agent ran and restored");
    // `restore` moves it back out of the group the agent removes
    assert!(group_dirs(&format!("{top}/lc")).is_empty());
}

const PORT: &str = "an_lc_restarted_under_a_new_pid_is_found_by_its_listening_port";

#[test]
fn an_lc_restarted_under_a_new_pid_is_found_by_its_listening_port() {
    if !live::is_root() {
        return eprintln!("SKIP {PORT}: needs root (cgroups)");
    }
    let Some((mut first, port)) = live::listener(0, 0, 0) else {
        return eprintln!("SKIP {PORT}: no python3 to stand in for a listening LC");
    };
    let dir = tempfile::tempdir().unwrap();
    let top = format!("headroom-follow-port-{}", std::process::id());
    let lc = format!("pids = [{}]\nlisten_port = {port}", first.pid(0));
    let runner = match start(&top, dir.path(), &lc) {
        Ok(r) => r,
        Err(e) => return eprintln!("SKIP {PORT}: {e}"),
    };
    let lc_dirs = group_dirs(&format!("{top}/lc"));
    std::thread::sleep(Duration::from_millis(500));
    let _ = first.0[0].kill();
    let _ = first.0[0].wait();
    let (second, _) = live::listener(0, 0, port).expect("the port again");
    let moved = live::eventually(Duration::from_secs(4), || {
        lc_dirs.iter().all(|d| procs(d).contains(&second.pid(0)))
    });
    assert!(
        moved,
        "the LC listening on {port} under pid {} was not moved in",
        second.pid(0)
    );
    let said = live::followed(&dir.path().join("ctl.sock"));
    assert!(
        said.iter().any(|r| r.contains("new pid")),
        "ctl status says it: {said:?}"
    );
    runner.join().unwrap().expect("the agent ran and restored");
}

const BE_GROUP: &str = "a_be_group_removed_by_someone_else_is_created_again_with_be_in_it";

#[test]
fn a_be_group_removed_by_someone_else_is_created_again_with_be_in_it() {
    if !live::is_root() {
        return eprintln!("SKIP {BE_GROUP}: needs root (cgroups)");
    }
    let top = format!("headroom-follow-be-{}", std::process::id());
    let (dir, _lc, runner, be, be_dirs, be_pid) = match start_with_be(&top) {
        Ok(w) => w,
        Err(e) => return eprintln!("SKIP {BE_GROUP}: {e}"),
    };
    let sock = dir.path().join("ctl.sock");
    // someone else: BE moved to the root group (thawed first), its group removed
    for d in &be_dirs {
        if d.join("freezer.state").exists() {
            let _ = std::fs::write(d.join("freezer.state"), "THAWED");
        }
    }
    for d in &be_dirs {
        let root = hierarchy_root(d, &be);
        for p in procs(d) {
            std::fs::write(root.join("cgroup.procs"), p.to_string()).unwrap();
        }
    }
    for d in &be_dirs {
        std::fs::remove_dir(d).unwrap();
    }
    let back = live::eventually(Duration::from_secs(4), || {
        let dirs = group_dirs(&be);
        dirs.len() == be_dirs.len() && dirs.iter().all(|d| procs(d).contains(&be_pid))
    });
    assert!(
        back,
        "the BE group was not created again with BE {be_pid} in it"
    );
    let said = live::followed(&sock);
    assert!(
        said.iter().any(|r| r.contains("removed by someone else")),
        "ctl status says it: {said:?}"
    );
    // confined again: its cpuset is the policy's (cpus = "0" for the LC: BE elsewhere)
    let cpuset = PathBuf::from("/sys/fs/cgroup/cpuset").join(&be);
    if cpuset.is_dir() {
        let now = std::fs::read_to_string(cpuset.join("cpuset.cpus")).unwrap();
        let root = std::fs::read_to_string("/sys/fs/cgroup/cpuset/cpuset.cpus").unwrap();
        assert!(
            now.trim() != root.trim() || root.trim() == "0",
            "BE's cpuset {now:?} is the whole machine {root:?}"
        );
    }
    runner.join().unwrap().expect("the agent ran and restored");
}

const STRAY: &str = "a_be_process_moved_out_of_its_group_is_moved_back";

/// Third hostile pass (issue 42): a BE worker moved to the root group by someone else ran on,
/// unconfined, through a disable while `ctl status` said BE frozen. Moved back now.
#[test]
fn a_be_process_moved_out_of_its_group_is_moved_back() {
    if !live::is_root() {
        return eprintln!("SKIP {STRAY}: needs root (cgroups)");
    }
    let top = format!("headroom-hostile3-stray-{}", std::process::id());
    let (dir, _lc, runner, be, be_dirs, be_pid) = match start_with_be(&top) {
        Ok(w) => w,
        Err(e) => return eprintln!("SKIP {STRAY}: {e}"),
    };
    let sock = dir.path().join("ctl.sock");
    // someone else: BE moved to each hierarchy's root group
    for d in &be_dirs {
        let root = hierarchy_root(d, &be);
        std::fs::write(root.join("cgroup.procs"), be_pid.to_string()).unwrap();
    }
    let back = live::eventually(Duration::from_secs(4), || {
        group_dirs(&be).iter().all(|d| procs(d).contains(&be_pid))
    });
    let said = live::followed(&sock);
    let _ = runner.join();
    assert!(back, "BE {be_pid} was not moved back into {be}");
    assert!(
        said.iter().any(|r| r.contains("moved by someone else")),
        "ctl status says it: {said:?}"
    );
}
