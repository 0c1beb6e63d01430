//! An agent in a process of its own: this test binary run again for one test alone, which
//! then plays the agent on a config text instead of running the test. For what an agent's exit
//! ends (its relay threads, its fds) and must not: an agent in a thread of the test process
//! never exits.

#![allow(dead_code)] // the standalone test files that share `live` run no agent process

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The config text the process plays the agent on.
const CONFIG: &str = "HEADROOM_TEST_OWN_PROCESS_CONFIG";
/// For how long, in ms (SIGTERM ends it earlier).
const RUN_MS: &str = "HEADROOM_TEST_OWN_PROCESS_RUN_MS";

/// This binary run again for `test` (`module::name`) as an agent on `text` for at most
/// `run_for`, its fds 1 and 2 the file `log`, not on a journald stream.
pub fn spawn(test: &str, text: &str, run_for: Duration, log: &Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CONFIG, text)
        .env(RUN_MS, run_for.as_millis().to_string())
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("this test binary, run again as an agent")
}

/// In a process [`spawn`] made: plays the agent (logging to stderr at `info` when `log`,
/// ended by SIGTERM or its time) and returns true; the test then returns. Fails (a non-zero
/// exit) when the agent does not start or run. False in the test's own process.
pub fn play_the_agent(log: bool) -> bool {
    let Ok(text) = std::env::var(CONFIG) else {
        return false;
    };
    if log {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let ms: u64 = std::env::var(RUN_MS).unwrap().parse().unwrap();
    let mut options = super::options(&text, Duration::from_millis(ms));
    options.handle_signals = true; // this process's alone: SIGTERM ends the run
    let agent = headroom_agent::runtime::Agent::start(options).expect("the agent starts");
    agent.run().expect("the agent runs");
    true
}
