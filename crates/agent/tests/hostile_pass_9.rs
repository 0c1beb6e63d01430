//! The ninth hostile pass's defects (issue 42, docs/safety-hostile-pass-9.md). Dry runs: no
//! group is made, no root needed.

use std::path::Path;
use std::time::Duration;

use headroom_agent::runtime::{Agent, AgentOptions};
use headroom_control::config::Config;

/// A config whose LC is this test's own process (a dry run moves nothing), one BE `sleep`,
/// static cores, and the given `[safety]` / `[api]` lines.
fn dry_config(group: &str, safety: &str, api: &str) -> String {
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{group}/lc\"\npids = [{}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{group}/be\"\ncommand = [\"sleep\", \"5\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [safety]\n{safety}\n\n[api]\nmetrics = \"\"\n{api}\n",
        std::process::id()
    )
}

/// The start check resolved each path to its deepest existing part and gave up on `..` below
/// a missing directory. The state lock makes that directory, so `<d>/nope/../agent.log` then
/// lands in `<d>`: the decision log's machine description (`agent.log.machine.json`, removed
/// and made anew at start) replaced the config file of that name (ninth pass, live 21:23).
/// Refused at start now, before anything is made, and the config file is intact.
#[test]
fn a_path_through_dot_dot_below_a_missing_directory_is_resolved() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path().display();
    let config_path = d.path().join("agent.log.machine.json");
    let text = dry_config(
        "hp9-dry/x",
        &format!("state_file = \"{r}/nope/state.json\""),
        &format!("socket = \"{r}/ctl.sock\"\ndecision_log = \"{r}/nope/../agent.log\""),
    );
    std::fs::write(&config_path, &text).unwrap();
    let mut options = AgentOptions::new(Config::from_toml_str(&text).expect("the test's config"));
    options.dry_run = true;
    options.handle_signals = false;
    options.run_for = Some(Duration::from_millis(200));
    options.config_path = Some(config_path.clone());
    match Agent::start(options) {
        Ok(agent) => {
            let _ = agent.run();
            panic!(
                "the start was not refused; the config file now begins {:?}",
                first_bytes(&config_path)
            );
        }
        Err(e) => {
            assert!(e.is_usage(), "a usage error (exit 2): {e}");
            let msg = e.to_string();
            for k in ["--config", "api.decision_log"] {
                assert!(msg.contains(k), "{k} not named: {msg}");
            }
        }
    }
    assert_eq!(std::fs::read_to_string(&config_path).unwrap(), text);
    assert!(!d.path().join("nope").exists(), "nothing made");
}

fn first_bytes(p: &Path) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.chars().take(40).collect())
        .unwrap_or_else(|e| format!("<{e}>"))
}
