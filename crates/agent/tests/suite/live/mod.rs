//! What the tests that run a real agent in this process share: stand-in services that end
//! with the test, and an agent started on a TOML text in a thread of its own.

use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use headroom_agent::runtime::{Agent, AgentError, AgentOptions, RunSummary};
use headroom_control::config::Config;

pub mod discovery;
pub mod lc_command;
pub mod marked;
pub mod own_process;

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

/// One `[kubernetes]` agent at a time: each makes and locks the one discovery holder group
/// (`headroom-discovery`), whichever file its test is in.
#[allow(dead_code)] // the standalone files that share this module run neither kind
pub fn the_discovery_holder() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// nobody's uid, gid and supplementary groups, as the agent looks them up; `None` (after a
/// SKIP line) where this host has no `nobody` of uid 65534.
#[allow(dead_code)] // not every test that shares this module runs a command as nobody
pub fn nobody(test: &str) -> Option<headroom_host::spawn::RunAs> {
    let spec = headroom_types::UserSpec::name("nobody").unwrap();
    match headroom_host::spawn::RunAs::resolve(&spec) {
        Ok(Some(u)) if u.uid() == 65534 => Some(u),
        other => {
            eprintln!("SKIP {test}: no user nobody of uid 65534 here ({other:?})");
            None
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

/// Removes a test's top group `0` and its `lc` and `be` leaves in every hierarchy, when they are
/// empty (also on failure). Unlike [`RemoveOnDrop`] it kills nothing: the LC in them may be this
/// very process.
#[allow(dead_code)] // not every test that shares this module has this process as its LC
pub struct EmptyGroupsRemoved(pub String);

impl Drop for EmptyGroupsRemoved {
    fn drop(&mut self) {
        let Ok(mounts) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        for m in mounts.flatten() {
            let top = m.path().join(&self.0);
            for leaf in ["lc", "be"] {
                let _ = std::fs::remove_dir(top.join(leaf));
            }
            let _ = std::fs::remove_dir(&top);
        }
    }
}

/// The config of a test whose LC is the sleeper `lc_pid` (`Children::sleepers`): the LC in
/// `<group>/lc`, one BE `command` in `<group>/be`, static cores (CPU 0), no metrics, and the
/// given `[safety]` / `[api]` lines. Never this test process itself: the suite's tests share
/// the process, and every child another test forks while the process sits in an LC group
/// starts in that group (its agent then refuses the group as another agent's, and the group
/// outlives the test).
#[allow(dead_code)] // not every test that shares this module runs this config
pub fn sleeper_lc_config(
    lc_pid: u32,
    group: &str,
    be_command: &str,
    safety: &str,
    api: &str,
) -> String {
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{group}/lc\"\npids = [{lc_pid}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{group}/be\"\ncommand = {be_command}\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [safety]\n{safety}\n\n[api]\nmetrics = \"\"\n{api}\n"
    )
}

/// The config of an agent run in its own process (`own_process`) on `top`: the LC pid `lc` in
/// `<top>/lc`, one BE `batch` in `<top>/be` with `be_keys` (its `command`, `user`, …), static
/// cores (CPU 0), polled idle sensing, `on_exit`, and the state file and control socket in
/// `dir`, no metrics.
#[allow(dead_code)] // not every test that shares this module runs this config
pub fn own_process_config(top: &str, lc: u32, be_keys: &str, on_exit: &str, dir: &Path) -> String {
    format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{lc}]\n\n\
         [[be]]\nname = \"batch\"\ncgroup = \"{top}/be\"\n{be_keys}\n\n\
         [policy]\nkind = \"static-cores\"\n[policy.static-cores]\ncpus = \"0\"\n\n\
         [sensors]\nidle_sensing = \"poll\"\n\n\
         [safety]\non_exit = \"{on_exit}\"\nstate_file = \"{}/state.json\"\n\n\
         [api]\nsocket = \"{}/ctl.sock\"\nmetrics = \"\"\n",
        dir.display(),
        dir.display()
    )
}

#[allow(dead_code)]
pub fn python() -> &'static str {
    // uid 65534 cannot run root's pyenv shim (/root is 0700)
    if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// A process on loopback port `port` (0: any) that made its listening socket as
/// `socket_uid` and then runs as `uid` (python3, started as root: `setresuid` keeps root as
/// the saved uid while the socket is made, then drops to `uid` for good): root holding another
/// user's socket, as a descriptor passed to it would be, or a daemon that binds as root and
/// becomes its user (`memcached -u`). Its port beside it; `None` when python3 cannot run.
#[allow(dead_code)] // not every test that shares this module stands in a listening LC
pub fn listener(uid: u32, socket_uid: u32, port: u16) -> Option<(Children, u16)> {
    let script = format!(
        "import os,socket,time\n\
         os.setgroups([])\n\
         if {socket_uid} != 0:\n    os.setresgid({socket_uid},{socket_uid},0)\n    os.setresuid({socket_uid},{socket_uid},0)\n\
         s=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         s.bind(('127.0.0.1',{port}))\ns.listen()\n\
         if {socket_uid} != 0:\n    os.setresuid(0,0,0)\n    os.setresgid(0,0,0)\n\
         if {uid} != 0:\n    os.setresgid({uid},{uid},{uid})\n    os.setresuid({uid},{uid},{uid})\n\
         print(s.getsockname()[1],flush=True)\ntime.sleep(60)\n"
    );
    let mut child = std::process::Command::new(python())
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .stdin(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut line = String::new();
    let got = std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take()?),
        &mut line,
    );
    let children = Children(vec![child]);
    match (got, line.trim().parse()) {
        (Ok(_), Ok(p)) => Some((children, p)),
        _ => None,
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

/// A `sleep 60` given pid `want`: the kernel's next pid is `last + 1`, so this writes
/// `want - 1` to `ns_last_pid` and forks (bounded tries, others fork beside us). `None` when
/// the number did not come round.
#[allow(dead_code)] // not every test that shares this module reuses a number
pub fn sleeper_with_pid(want: u32) -> Option<std::process::Child> {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (want - 1).to_string()).ok()?;
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::process::Stdio::null())
            .spawn()
            .ok()?;
        if child.id() == want {
            return Some(child);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    None
}
