//! Hostile pass 25 (issue 42): a `[[be]] cgroup` that held the agent itself (its own group,
//! or one above it, in any hierarchy) was accepted. The start froze BE, and the agent with it:
//! it hung at once (no tick, no control socket, SIGTERM never handled, so no exit action)
//! with BE frozen, until it was killed, and again at every restart. Had it run on, a
//! restart's kill of the BE processes it did not record would SIGKILL it. Now refused at
//! start, exit 2, before anything is made.
//!
//! The agent's groups are read from `<root>/proc/self/cgroup`: here a root of the test's own,
//! so the test process is never put in a group (it shares the process with other tests).

use std::path::Path;
use std::time::Duration;

use headroom_agent::runtime::Agent;

use crate::live;

/// Starts an agent on the suite's config (LC `hp25-self/lc`, BE `hp25-self/be`) whose host
/// root holds `proc/self/cgroup` = `groups`; the start's error, in words.
fn start_error(dir: &Path, groups: &str) -> String {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("proc/self")).unwrap();
    std::fs::write(root.join("proc/self/cgroup"), groups).unwrap();
    let text = live::agent_config(
        "hp25-self/lc",
        "hp25-self/be",
        "command = [\"sleep\", \"60\"]",
        &dir.join("state.json"),
        &dir.join("ctl.sock"),
    );
    let mut options = live::options(&text, Duration::from_secs(1));
    options.root = root;
    match Agent::start(options) {
        Ok(_) => panic!("an agent started on a host root that has no cgroups"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_be_group_that_holds_the_agent_is_refused_at_start() {
    // Below the BE group in the freezer hierarchy only: freezing BE would freeze the agent.
    let dir = tempfile::tempdir().unwrap();
    let err = start_error(
        dir.path(),
        "9:name=systemd:/\n6:freezer:/hp25-self/be/inner\n3:cpuset:/\n1:cpu,cpuacct:/system.slice\n",
    );
    assert!(
        err.contains("be[0].cgroup") && err.contains("holds the agent itself"),
        "a BE group holding the agent was not refused: {err}"
    );
    // In a group beside BE's (a name BE's is a prefix of, the LC's): not this refusal.
    let dir = tempfile::tempdir().unwrap();
    let err = start_error(
        dir.path(),
        "6:freezer:/hp25-self/bee\n1:cpu,cpuacct:/hp25-self/lc\n0::/\n",
    );
    assert!(
        !err.contains("holds the agent itself"),
        "refused a BE group that does not hold the agent: {err}"
    );
}
