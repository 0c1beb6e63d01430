//! What the tests that run a real agent in this process share: stand-in services that end
//! with the test, and an agent started on a TOML text in a thread of its own.

use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use headroom_agent::runtime::{Agent, AgentError, AgentOptions, RunSummary};
use headroom_control::config::Config;

/// Processes standing in for services: killed and reaped at the end, whatever happens.
pub struct Children(pub Vec<std::process::Child>);

impl Children {
    /// `n` `sleep 60` processes.
    pub fn sleepers(n: usize) -> Children {
        Children(
            (0..n)
                .map(|_| {
                    Command::new("sleep")
                        .arg("60")
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("spawning sleep")
                })
                .collect(),
        )
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.0[i].id()
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether the test runs as root (cgroups, BPF).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// An agent on `text` for `run_for`, running in a thread; `Err` (the reason, for a SKIP line)
/// when it does not start here.
#[allow(dead_code)] // not every test that shares this module starts an agent this way
pub fn start_agent(
    text: &str,
    run_for: Duration,
) -> Result<JoinHandle<Result<RunSummary, AgentError>>, String> {
    let config = Config::from_toml_str(text).expect("the test's config");
    let mut options = AgentOptions::new(config);
    options.handle_signals = false;
    options.run_for = Some(run_for);
    let agent = Agent::start(options).map_err(|e| format!("the agent does not start here: {e}"))?;
    Ok(std::thread::spawn(move || agent.run()))
}
