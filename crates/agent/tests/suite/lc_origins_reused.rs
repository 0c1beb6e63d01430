//! A recorded LC pid that names another process by the time the agent restores (the LC died
//! while no agent ran, and pid numbers wrapped: hostile pass 33 saw them wrap) was moved into
//! the LC's old group all the same. Only a process still in an LC group goes back now.

use crate::live;

use std::path::Path;
use std::time::Duration;

use headroom_types::GroupPath;
use live::marked::MarkedGroup as Guard;

const TEST: &str = "a_recorded_lc_pid_naming_another_process_is_not_moved_back";

fn config(top: &str, lc: u32, on_exit: &str, dir: &Path) -> String {
    live::own_process_config(top, lc, "", on_exit, dir)
}

/// Agent one moves LC sleeper A in and stops with `freeze` (its state keeps A's origin). The
/// record is then made to name sleeper B, which sits in a group of its own (as a reused pid
/// would be someone else's); agent two restores: B stays where it was, A (still in the LC
/// group) goes back. On the code before, B was moved into A's old group.
#[test]
fn a_recorded_lc_pid_naming_another_process_is_not_moved_back() {
    if live::own_process::play_the_agent(true) {
        return;
    }
    let Some(guard) = Guard::setup(TEST, "lor", 3, "lc-origins-reused", 27) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sleepers = live::Children::sleepers(2);
    let (a, b) = (sleepers.pid(0), sleepers.pid(1));
    let top = guard.top.to_string();
    let cg = &guard.cgroups;
    let elsewhere = guard.top.join("elsewhere").unwrap();
    cg.create(&elsewhere).unwrap();
    cg.move_process(&elsewhere, b as i32).unwrap();
    let log = |n: &str| dir.path().join(format!("agent-{n}.log"));
    let said = |n: &str| std::fs::read_to_string(log(n)).unwrap_or_default();

    let mut one = agent_process(&config(&top, a, "freeze", dir.path()), 1500, &log("one"));
    let ended = one.wait().unwrap();
    assert!(ended.success(), "agent one ({ended}): {}", said("one"));
    let state_path = dir.path().join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    let origins = state["lc_origins"].as_object_mut().expect("lc_origins");
    let a_origin = origins.remove(&a.to_string()).expect("A's origin recorded");
    origins.insert(b.to_string(), a_origin.clone());
    origins.insert(a.to_string(), a_origin);
    std::fs::write(&state_path, state.to_string()).unwrap();

    let lc_group = GroupPath::new(&format!("{top}/lc")).unwrap();
    let mut two = agent_process(&config(&top, a, "restore", dir.path()), 1500, &log("two"));
    let ended = two.wait().unwrap();
    let b_stayed = cg
        .procs(&elsewhere)
        .unwrap_or_default()
        .contains(&(b as i32));
    let a_out = !cg
        .procs(&lc_group)
        .unwrap_or_default()
        .contains(&(a as i32));
    // B back to the root for the guard's removal
    let _ = cg.move_process(&GroupPath::root(), b as i32);
    assert!(ended.success(), "agent two ({ended}): {}", said("two"));
    assert!(
        b_stayed,
        "B ({b}), named by the record, was moved out of its own group: {}",
        said("two")
    );
    assert!(a_out, "A ({a}) was left in the LC group: {}", said("two"));
}

fn agent_process(text: &str, run_ms: u64, log: &Path) -> std::process::Child {
    let test = format!("lc_origins_reused::{TEST}");
    live::own_process::spawn(&test, text, Duration::from_millis(run_ms), log)
}
