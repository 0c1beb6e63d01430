//! What the tests that run a real agent in this process share: stand-in services that end
//! with the test, and an agent started on a TOML text in a thread of its own.

use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use headroom_agent::runtime::{Agent, AgentError, AgentOptions, RunSummary};
use headroom_control::config::Config;

pub mod marked;

/// Processes standing in for services: killed and reaped at the end, whatever happens.
pub struct Children(pub Vec<std::process::Child>);

impl Children {
    /// `n` `sleep 60` processes.
    #[allow(dead_code)] // not every test that shares this module runs sleepers
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

    #[allow(dead_code)] // not every test that shares this module runs sleepers
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

/// The config the cgroup tests run: the LC in group `lc` with the `[lc]` keys `lc_keys` (its
/// pids, a pid file, a port), one BE (`sleep 60`) in group `be`, static cores (CPU 0 for the
/// LC), `restore` on exit, the state file `state` and the control socket `socket`, no metrics.
#[allow(dead_code)] // not every test that shares this module runs this config
pub fn agent_config(lc: &str, be: &str, lc_keys: &str, state: &Path, socket: &Path) -> String {
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{lc}\"\n{lc_keys}\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{be}\"\ncommand = [\"sleep\", \"60\"]\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{}\"\n\n\
         [api]\nsocket = \"{}\"\nmetrics = \"\"\n",
        state.display(),
        socket.display()
    )
}

/// Options for an agent on `text` that runs for `run_for`, leaving signals to the test.
#[allow(dead_code)] // not every test that shares this module starts an agent
pub fn options(text: &str, run_for: Duration) -> AgentOptions {
    let mut o = AgentOptions::new(Config::from_toml_str(text).expect("the test's config"));
    o.handle_signals = false;
    o.run_for = Some(run_for);
    o
}

/// An agent on `text` for `run_for`, running in a thread; `Err` (the reason, for a SKIP line)
/// when it does not start here.
#[allow(dead_code)] // not every test that shares this module starts an agent this way
pub fn start_agent(
    text: &str,
    run_for: Duration,
) -> Result<JoinHandle<Result<RunSummary, AgentError>>, String> {
    let agent = Agent::start(options(text, run_for))
        .map_err(|e| format!("the agent does not start here: {e}"))?;
    Ok(std::thread::spawn(move || agent.run()))
}

/// Polls `f` every 50 ms for up to `within`: a hang detector, not a timing claim.
#[allow(dead_code)] // not every test that shares this module waits on a condition
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `ctl status` on `sock` lists as the targets the agent followed (the reasons, in words);
/// empty when the agent does not answer.
#[allow(dead_code)] // not every test that shares this module follows targets
pub fn followed(sock: &Path) -> Vec<String> {
    use headroom_agent::publish::control::{request, Request};
    request(sock, &Request::Status)
        .ok()
        .and_then(|r| r.status)
        .map(|s| s.targets_followed.into_iter().map(|r| r.reason).collect())
        .unwrap_or_default()
}

/// A stranger's fake agent: `python3`, run as `uid`, binds `path` and answers one request
/// with "off: original settings restored" (the spoof `ctl` must refuse). `Err` when python3
/// cannot be run; the caller SKIPs.
#[allow(dead_code)] // not every test that shares this module plays a stranger
pub fn fake_agent_as(uid: u32, path: &Path) -> std::io::Result<Children> {
    use std::os::unix::process::CommandExt;
    let fake = "import socket,sys,time\n\
        s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4); s.settimeout(20)\n\
        c,_=s.accept(); c.recv(4096)\n\
        c.sendall(b'{\"ok\":true,\"message\":\"off: original settings restored\"}\\n')\n\
        time.sleep(1)\n";
    let child = Command::new("python3")
        .arg("-c")
        .arg(fake)
        .arg(path)
        .uid(uid)
        .gid(uid)
        .stdout(Stdio::null())
        .spawn()?;
    Ok(Children(vec![child]))
}

/// Kills what is left in a test's top group and removes it, also when the test fails: an agent
/// started by a failing test is dropped without its exit action. Where an agent may still run in
/// its thread (`wait_for_agent`), a panicking test first waits for that run to end, or the
/// agent's recreation of a removed BE group would race the removal.
#[allow(dead_code)] // not every test that shares this module makes a top group
pub struct RemoveOnDrop {
    top: headroom_types::GroupPath,
    agent_ends: Option<std::time::Instant>,
}

#[allow(dead_code)]
impl RemoveOnDrop {
    pub fn new(top: &str) -> RemoveOnDrop {
        RemoveOnDrop {
            top: headroom_types::GroupPath::new(top).expect("a test's group path"),
            agent_ends: None,
        }
    }

    /// An agent runs on the group for at most `run_for` from now.
    pub fn wait_for_agent(mut self, run_for: Duration) -> RemoveOnDrop {
        self.agent_ends = Some(std::time::Instant::now() + run_for + Duration::from_secs(1));
        self
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(end) = self.agent_ends {
                std::thread::sleep(end.saturating_duration_since(std::time::Instant::now()));
            }
        }
        if let Ok(cg) = headroom_host::LinuxHost::system().cgroups() {
            let _ = cg.kill_all(&self.top);
            let _ = cg.remove(&self.top);
        }
    }
}

/// The processes in `group` in any v1 hierarchy under `/sys/fs/cgroup`.
#[allow(dead_code)] // not every test that shares this module looks into groups
pub fn procs_of(group: &str) -> Vec<u32> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|d| {
            d.flatten()
                .map(|e| e.path().join(group).join("cgroup.procs"))
                .filter_map(|p| std::fs::read_to_string(p).ok())
                .flat_map(|t| {
                    t.lines()
                        .filter_map(|l| l.trim().parse().ok())
                        .collect::<Vec<u32>>()
                })
                .collect()
        })
        .unwrap_or_default()
}
