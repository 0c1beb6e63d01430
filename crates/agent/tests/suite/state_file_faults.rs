//! The state file under faults (issue 42, item 6): one removed while the agent runs is written
//! again, so a kill -9 after it does not leave the next start blind; a corrupt one at start is
//! set aside (renamed, the new name logged) and the agent starts as a first start, confining BE,
//! instead of refusing and leaving BE running with no agent. Needs root (cgroups); prints SKIP
//! otherwise.

use crate::live;

use std::path::Path;
use std::time::{Duration, Instant};

use headroom_agent::runtime::Agent;
use headroom_agent::state::AgentState;

fn config(top: &str, dir: &Path, lc_pid: u32) -> String {
    live::agent_config(
        &format!("{top}/lc"),
        &format!("{top}/be"),
        &format!("pids = [{lc_pid}]"),
        &dir.join("state.json"),
        &dir.join("ctl.sock"),
    )
}

fn read_state(path: &Path) -> Option<AgentState> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

const REMOVED: &str = "a_state_file_removed_while_the_agent_runs_is_written_again";

#[test]
fn a_state_file_removed_while_the_agent_runs_is_written_again() {
    if !live::is_root() {
        return eprintln!("SKIP {REMOVED}: needs root (cgroups)");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top = format!("headroom-state-removed-{}", std::process::id());
    let runner =
        match live::start_agent(&config(&top, dir.path(), lc.pid(0)), Duration::from_secs(6)) {
            Ok(r) => r,
            Err(e) => return eprintln!("SKIP {REMOVED}: {e}"),
        };
    let state = dir.path().join("state.json");
    std::thread::sleep(Duration::from_millis(1500));
    let before = read_state(&state).expect("the agent wrote its state file");
    std::fs::remove_file(&state).unwrap();
    // Nothing the state records changes from here on: only noticing the removal rewrites it.
    let deadline = Instant::now() + Duration::from_secs(3);
    let again = loop {
        if let Some(s) = read_state(&state) {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let again = again.expect("the removed state file was written again within 3 s");
    assert_eq!(
        again.owned_pids, before.owned_pids,
        "BE's pid recorded again"
    );
    assert_eq!(again.created_groups, before.created_groups);
    assert!(!again.created_groups.is_empty(), "the groups it created");
    assert_eq!(again.originals, before.originals, "the originals kept");
    runner.join().unwrap().expect("the agent ran to its end");
}

const CORRUPT: &str = "a_corrupt_state_file_is_set_aside_and_the_agent_confines_be";

#[test]
fn a_corrupt_state_file_is_set_aside_and_the_agent_confines_be() {
    if !live::is_root() {
        return eprintln!("SKIP {CORRUPT}: needs root (cgroups)");
    }
    let dir = tempfile::tempdir().unwrap();
    let lc = live::Children::sleepers(1);
    let top = format!("headroom-state-corrupt-{}", std::process::id());
    let state = dir.path().join("state.json");
    let garbage = "{\"version\": 2, \"pid\": 12";
    std::fs::write(&state, garbage).unwrap();
    let agent = match Agent::start(live::options(
        &config(&top, dir.path(), lc.pid(0)),
        Duration::from_secs(3),
    )) {
        Ok(a) => a,
        Err(e) => {
            let msg = e.to_string();
            if msg.contains("state file") {
                panic!("a corrupt state file refused the start: {msg}");
            }
            return eprintln!("SKIP {CORRUPT}: the agent does not start here: {e}");
        }
    };
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("state.json.corrupt-"))
        })
        .collect();
    assert_eq!(aside.len(), 1, "the corrupt file set aside: {aside:?}");
    assert_eq!(std::fs::read_to_string(&aside[0]).unwrap(), garbage);
    let fresh = read_state(&state).expect("a valid state file in its place");
    assert!(
        fresh.last_allocation.is_some() && !fresh.originals.is_empty(),
        "BE confined and the originals recorded before the agent runs: {fresh:?}"
    );
    assert_eq!(
        fresh.owned_pids.len(),
        1,
        "BE launched (into its confined group)"
    );
    // `ctl status` says where the unreadable file went, while the agent runs.
    let socket = dir.path().join("ctl.sock");
    let began = std::time::Instant::now();
    let asker = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            let answer = headroom_agent::publish::control::request(
                &socket,
                &headroom_agent::publish::control::Request::Status,
            );
            if let Some(st) = answer.ok().and_then(|a| a.status) {
                eprintln!("status answered {:?} after the run began", began.elapsed());
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    });
    agent.run().expect("the agent ran and restored");
    let st = asker.join().unwrap().expect("a status while the agent ran");
    assert_eq!(
        st.state_set_aside.as_deref(),
        Some(aside[0].display().to_string().as_str()),
        "{st:?}"
    );
    assert!(!state.exists(), "a clean restore leaves no state file");
}
