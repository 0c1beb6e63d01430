//! What the live-discovery agent tests share (`agent_kube_live.rs`, `agent_kube_kill9.rs`): the
//! stand-in's pods, kubelet's groups made for a test and removed by a guard, the agent's
//! discovery config and its start.

use std::path::Path;
use std::process::Child;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use headroom_host::{Cgroups, Controller, LinuxHost};
use headroom_kube::stand_in::{self, with_ports, StandIn};
use headroom_types::GroupPath;
use serde_json::{json, Value};

pub const UID_A: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
pub const UID_B: &str = "bbbbbbbb-0000-4000-8000-00000000000b";
pub const UID_BAD: &str = "cccccccc-0000-4000-8000-00000000000c";
pub const UID_PORTS: &str = "dddddddd-0000-4000-8000-00000000000d";
/// shop/ports' declared TCP containerPort (no pod serves it: the sensor only watches it).
pub const TCP_PORT: u16 = 47311;

pub fn pod(name: &str, uid: &str, slo: &str, rv: u32) -> Value {
    let slo = json!({"headroom.io/slo-p99-us": slo});
    stand_in::pod(name, uid, "node-a", "Running", "Burstable", slo, rv)
}

/// A pod whose one container declares `ports` (`spec.containers[0].ports`).
pub fn pod_with_ports(name: &str, uid: &str, slo: &str, rv: u32, ports: Value) -> Value {
    with_ports(pod(name, uid, slo, rv), ports)
}

/// The test's groups (removed deepest first) and processes.
pub struct Guard {
    pub cgroups: Cgroups,
    pub groups: Vec<GroupPath>,
    pub children: Vec<Child>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // A frozen process dies only once thawed (an agent killed with BE frozen).
        for g in &self.groups {
            if self.cgroups.exists(g) {
                let _ = self.cgroups.thaw(g);
            }
        }
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for g in self.groups.iter().rev() {
            for _ in 0..50 {
                if !self.cgroups.exists(g) || self.cgroups.remove(g).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

pub fn group(s: &str) -> GroupPath {
    GroupPath::new(s).unwrap()
}

/// Kubelet's groups of pod `a` (`kubepods/burstable/pod<UID_A>`, a sleeper in it) made for the
/// test, and the groups the agent makes (BestEffort, discovery), all removed by the guard; the
/// pod's group.
pub fn pod_a_group(cgroups: &Cgroups, guard: &mut Guard) -> GroupPath {
    let pa = group(&format!("kubepods/burstable/pod{UID_A}"));
    for g in ["kubepods", "kubepods/burstable"] {
        cgroups.create(&group(g)).unwrap();
        guard.groups.push(group(g));
    }
    cgroups.create(&pa).unwrap();
    guard.groups.push(pa.clone());
    sleeper_in(guard, &pa);
    guard.groups.insert(2, group("kubepods/besteffort"));
    guard.groups.insert(0, group("headroom-discovery"));
    pa
}

/// The stand-in API server listing pod `a` (SLO 500 µs) and an agent discovering it, its
/// config, state, socket and `agent.log` in the returned directory: the server's event sender
/// and the server (both kept until the test ends) and the agent's index in the guard.
pub fn discovery_agent_on_pod_a(
    guard: &mut Guard,
) -> (mpsc::Sender<Value>, StandIn, tempfile::TempDir, usize) {
    let (tx, rx) = mpsc::channel();
    let server = StandIn::start(vec![pod("a", UID_A, "500", 3)], rx).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let kubeconfig = server.kubeconfig(d).unwrap();
    let cfg = write_discovery_config(d, &kubeconfig, "");
    let agent_idx = spawn_agent(guard, &cfg, &d.join("agent.log"), &[]);
    (tx, server, dir, agent_idx)
}

pub fn sleeper_in(guard: &mut Guard, g: &GroupPath) -> u32 {
    let c = super::sleep_60();
    let pid = c.id();
    guard.cgroups.move_process(g, pid as i32).unwrap();
    guard.children.push(c);
    pid
}

pub fn wait_for(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    super::within(timeout, Duration::from_millis(50), f)
}

/// A log without its colours' escape sequences.
pub fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // `ESC [ … m`
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub fn lc_names(st: &Value) -> Vec<String> {
    st["lcs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Root, writable cpu/cpuset cgroups and no `kubepods` or `headroom-discovery` group yet (a
/// real kubelet's is not ours to touch): the cgroups, an empty guard, and this file's one-at-a-
/// time lock; `None` after saying SKIP.
pub fn live_setup(test: &str) -> Option<(Cgroups, std::sync::MutexGuard<'static, ()>, Guard)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP {test}: not root");
        return None;
    }
    let cgroups = match LinuxHost::system().cgroups() {
        Ok(c) if c.backend(Controller::Cpu).is_ok() && c.backend(Controller::Cpuset).is_ok() => c,
        _ => {
            eprintln!("SKIP {test}: no writable cpu/cpuset cgroups");
            return None;
        }
    };
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if cgroups.exists(&group("kubepods")) || cgroups.exists(&group("headroom-discovery")) {
        eprintln!("SKIP {test}: a kubepods (or headroom-discovery) group exists already");
        return None;
    }
    let guard = Guard {
        cgroups: cgroups.clone(),
        groups: Vec::new(),
        children: Vec::new(),
    };
    Some((cgroups, one, guard))
}

/// The groups this file's tests make (`kubepods`, `headroom-discovery`) are the same names:
/// one test at a time.
pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The agent's config with live discovery on the stand-in (multi, BE = the BestEffort parent,
/// restore on exit), `api_extra` appended to its `[api]` table.
pub fn write_discovery_config(
    d: &std::path::Path,
    kubeconfig: &std::path::Path,
    api_extra: &str,
) -> std::path::PathBuf {
    let cfg = d.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
[kubernetes]
discover = true
node_name = "node-a"
kubeconfig = "{kc}"
cgroup_layout = "cgroupfs"

[[be]]
name = "besteffort-pods"
cgroup = "kubepods/besteffort"

[policy]
kind = "multi"

[safety]
on_exit = "restore"
state_file = "{d}/state.json"

[api]
socket = "{d}/ctl.sock"
{api_extra}"#,
            kc = kubeconfig.display(),
            d = d.display()
        ),
    )
    .unwrap();
    cfg
}

/// Starts `headroom agent --config cfg` with `extra` arguments, its stderr in `stderr_to`; the
/// index of its child in the guard.
pub fn spawn_agent(guard: &mut Guard, cfg: &Path, stderr_to: &Path, extra: &[&str]) -> usize {
    guard
        .children
        .push(super::spawn_agent(cfg, stderr_to, extra));
    guard.children.len() - 1
}
