//! End to end on the real kernel (root + writable cgroup v1/v2; skips otherwise): `headroom
//! serve` pinned on CPU 1 as the LC, a `spin` BE allowed on both CPUs, the agent in `blind` with
//! B = 1 and 100 ms polls. When the LC's load jumps on CPU 1 the BE allocation shrinks (here, on
//! two CPUs, from CPU 0 to nothing: frozen) within 3 poll intervals; `ctl off` restores the BE
//! group's original cpuset and shares; SIGTERM with on_exit = "freeze" leaves BE frozen; a
//! config with `cgroup = "../../x"` is refused with exit 2. Every group and process is removed
//! by a guard, also when the test fails.

use crate::support;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use headroom_host::{Controller, FreezeState};
use headroom_types::{CpuSet, GroupPath};
use support::{ctl, read_log, root_cgroups, sigterm_and_wait, wait_for, write_config, Guard, BIN};

/// An LC that is already SCHED_FIFO when the agent starts (launched under `chrt`, as the
/// scheduling bench does) joins its group: on cgroup v1 with RT group scheduling the kernel
/// refuses an RT task into a group whose `cpu.rt_runtime_us` is 0, so the agent gives the group
/// chain a budget before moving it.
#[test]
fn an_lc_already_sched_fifo_joins_its_group() {
    let test = "an_lc_already_sched_fifo_joins_its_group";
    let Some(cgroups) = root_cgroups(test, &[Controller::Cpu]) else {
        return;
    };
    let _rt = rt_budget();
    let mut guard = Guard::fresh(&cgroups, "headroom-rtlc");
    let (top, dir) = (guard.top.clone(), guard.dir.path().to_path_buf());
    let mut cmd = Command::new("sleep");
    cmd.arg("60").stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let param = libc::sched_param { sched_priority: 5 };
            if libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let lc_proc = cmd.spawn().expect("start a SCHED_FIFO sleep");
    let lc_pid = lc_proc.id();
    guard.children.push(lc_proc);
    assert_eq!(thread_state(lc_pid).1, libc::SCHED_FIFO);
    let text = format!(
        r#"
[lc]
name = "rt"
cgroup = "{top}/lc"
pids = [{lc_pid}]

[[be]]
name = "be"
cgroup = "{top}/be"

[policy]
kind = "static-cycles"
"#
    );
    let cfg = restore_config(&dir, "rt.toml", &text);
    let agent = guard.start_agent(&cfg, "rt.log");
    let log = || read_log(&dir, "rt.log");
    let lc = top.join("lc").unwrap();
    assert!(
        cgroups.procs(&lc).unwrap().contains(&(lc_pid as i32)),
        "the SCHED_FIFO LC is in its group; log:\n{}",
        log()
    );
    let budget = cgroups.rt_runtime_us(&lc).unwrap();
    eprintln!("LC group cpu.rt_runtime_us with a SCHED_FIFO LC: {budget:?}");
    if let Some(b) = budget {
        assert!(b > 0, "the LC group got a real-time budget");
    }
    assert_eq!(
        thread_state(lc_pid).1,
        libc::SCHED_FIFO,
        "the LC keeps its policy"
    );
    let st = sigterm_and_wait(&mut guard.children[agent]);
    assert!(st.success(), "agent exit status {st}; log:\n{}", log());
}

/// The machine's real-time budget (root `cpu.rt_runtime_us`) is one: an agent gives its LC
/// group chain all that is spare, so two tests whose agents need it would refuse each other
/// (EINVAL or "no real-time budget left") when the harness runs them at once. Every test here
/// runs an agent, so they take turns.
static RT_BUDGET: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rt_budget() -> std::sync::MutexGuard<'static, ()> {
    RT_BUDGET.lock().unwrap_or_else(|e| e.into_inner())
}
const POLL_MS: u64 = 100;

/// Writes an agent config: `head` plus what the tests here share (restore on exit, its state
/// file and control socket in `dir`, no metrics endpoint).
fn restore_config(dir: &Path, file: &str, head: &str) -> PathBuf {
    write_config(dir, file, head, "restore", &dir.join("ctl.sock"), "")
}

fn skip(reason: &str) {
    eprintln!("SKIP agent_e2e: {reason}");
}

fn pin_to(cmd: &mut Command, cpu: usize) {
    use std::os::unix::process::CommandExt;
    // SAFETY: sched_setaffinity on the child itself, before exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn config(
    dir: &Path,
    top: &GroupPath,
    lc_pid: u32,
    on_exit: &str,
    lc_cgroup: Option<&str>,
) -> PathBuf {
    let lc = lc_cgroup.map_or(format!("{top}/lc"), str::to_string);
    let text = format!(
        r#"
[lc]
name = "serve"
cgroup = "{lc}"
pids = [{lc_pid}]

[[be]]
name = "spin"
cgroup = "{top}/be"
command = ["{BIN}", "antagonist", "spin", "--threads", "2", "--duration", "150"]

[policy]
kind = "blind"
[policy.blind]
buffer_cores = 1
poll_ms = {POLL_MS}
grow_interval_ms = {POLL_MS}
"#
    );
    write_config(
        dir,
        &format!("agent-{on_exit}.toml"),
        &text,
        on_exit,
        &dir.join("ctl.sock"),
        "127.0.0.1:0",
    )
}

#[test]
fn agent_e2e() {
    let controllers = [Controller::Cpuset, Controller::Cpu, Controller::Freezer];
    let Some(cgroups) = root_cgroups("agent_e2e", &controllers) else {
        return;
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        return skip("needs 2 CPUs");
    }
    // its agent moves an LC whose threads may be real-time: the machine's one budget again
    let _rt = rt_budget();
    let top = GroupPath::new(&format!("headroom-e2e-{}", std::process::id())).unwrap();
    let be = top.join("be").unwrap();
    if let Err(e) = cgroups.create(&be) {
        return skip(&format!("cgroupfs not writable: {e}"));
    }
    let mut guard = Guard::new(&cgroups, top.clone());
    let dir = guard.dir.path().to_path_buf();
    // The BE group's settings before the agent: both CPUs, shares 512.
    cgroups
        .set_cpuset_cpus(&be, &CpuSet::parse_list("0-1").unwrap())
        .unwrap();
    cgroups.set_cpu_weight(&be, 512).unwrap();
    let be_cpus = || cgroups.cpuset_cpus(&be).unwrap().to_list();
    let frozen = || cgroups.freeze_state(&be).unwrap() != FreezeState::Thawed;

    // The LC: headroom serve on CPU 1 (it prints its address when ready).
    let mut serve = Command::new(BIN);
    serve
        .args(["serve", "--port", "0", "--threads", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    pin_to(&mut serve, 1);
    let mut serve = serve.spawn().expect("start headroom serve");
    let serve_pid = serve.id();
    let mut line = String::new();
    BufReader::new(serve.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    guard.children.push(serve);
    eprintln!("serve pid {serve_pid} at {}", line.trim());

    // 1. Load step → BE shrinks within 3 polls.
    let cfg = config(&dir, &top, serve_pid, "freeze", None);
    let agent = guard.start_agent(&cfg, "agent1.log");
    let lc = top.join("lc").unwrap();
    assert!(
        cgroups.procs(&lc).unwrap().contains(&(serve_pid as i32)),
        "serve moved into the LC group"
    );
    let baseline = wait_for("BE running on CPU 0 only", Duration::from_secs(20), || {
        !frozen() && be_cpus() == "0"
    });
    match baseline {
        None => eprintln!(
            "SKIP agent_e2e (load-step part): no idle CPU seen for 20 s (load average {}), so \
             blind isolation rightly kept BE frozen; the step cannot be measured",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
        ),
        Some(t) => {
            eprintln!("baseline after {t:?}: BE thawed on CPU 0, LC idle on CPU 1");
            // The LC's load jumps: a busy thread in the LC group on CPU 1.
            let mut step = Command::new(BIN);
            step.args(["antagonist", "spin", "--cpus", "1", "--duration", "20"])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let step = step.spawn().unwrap();
            let step_pid = step.id() as i32;
            guard.children.push(step);
            cgroups.move_process(&lc, step_pid).unwrap();
            let took = wait_for("BE to shrink", Duration::from_secs(5), frozen)
                .expect("BE never shrank after the load step");
            eprintln!("load step → BE shrunk (frozen) in {took:?}");
            let limit = Duration::from_millis(3 * POLL_MS + 50);
            assert!(
                took <= limit,
                "BE shrank after {took:?}, more than 3 polls ({limit:?})"
            );
            let idx = guard.children.len() - 1;
            let _ = guard.children[idx].kill();
            let _ = guard.children[idx].wait();
        }
    }

    // 2. ctl status, then the kill switch restores the originals.
    let (ok, out) = ctl(&dir, &["status"]);
    assert!(ok, "ctl status failed: {out}");
    assert!(out.contains("policy blind"), "{out}");
    // No [egress] device is configured, so egress shaping is listed as off with its reason.
    assert!(
        out.contains("actuators on:") && out.contains("no [egress] device configured"),
        "{out}"
    );
    let (ok, out) = ctl(&dir, &["off"]);
    assert!(ok, "ctl off failed: {out}");
    assert_eq!(be_cpus(), "0-1", "original cpuset back after ctl off");
    assert_eq!(
        cgroups.cpu_weight(&be).unwrap(),
        512,
        "original shares back"
    );
    assert!(!frozen(), "BE thawed after ctl off");
    std::thread::sleep(Duration::from_millis(3 * POLL_MS));
    assert_eq!(be_cpus(), "0-1", "no actuation after ctl off");
    let st = sigterm_and_wait(&mut guard.children[agent]);
    assert!(st.success(), "agent exit status {st}");
    // The kill switch restored the originals, but the exit action still runs: a BE left
    // running unconfined with no agent watching it is what on_exit = "freeze" prevents.
    assert!(
        frozen(),
        "after ctl off, SIGTERM still runs on_exit = \"freeze\""
    );

    // 3. SIGTERM with on_exit = "freeze" leaves BE frozen.
    let _ = std::fs::remove_file(dir.join("state.json"));
    let agent = guard.start_agent(&cfg, "agent2.log");
    std::thread::sleep(Duration::from_millis(5 * POLL_MS));
    let st = sigterm_and_wait(&mut guard.children[agent]);
    assert!(st.success(), "agent exit status {st}");
    assert!(frozen(), "BE frozen after SIGTERM with on_exit = freeze");
    let state = std::fs::read_to_string(dir.join("state.json")).unwrap();
    assert!(
        state.contains("\"originals\"") && state.contains("cpuset_cpus"),
        "state file keeps the originals: {state}"
    );

    // 4. An escaping cgroup path is refused with exit 2, naming the key.
    let bad = config(&dir, &top, serve_pid, "leave", Some("../../x"));
    let out = Command::new(BIN)
        .args(["agent", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("lc.cgroup"), "names the key: {err}");
}

fn thread_state(pid: u32) -> (String, i32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let cpus = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("")
        .trim()
        .to_string();
    // SAFETY: sched_getscheduler has no memory preconditions.
    let policy = unsafe { libc::sched_getscheduler(pid as i32) };
    (cpus, policy)
}

/// On exit the agent undoes everything it did to the LC and removes what it created: an LC
/// pinned and made SCHED_FIFO through `[lc.threads]` (on cgroup v1 that needs the agent to give
/// the LC group a real-time budget first) gets its affinity, policy and budget back, and the
/// groups the agent created are removed once empty — the BE group (its BE command stopped) and
/// the LC group, once the LC is back in the groups it came from (the agent never stops it).
#[test]
fn agent_exit_restores_the_lc_and_removes_its_groups() {
    let test = "agent_exit_restores_the_lc_and_removes_its_groups";
    let Some(cgroups) = root_cgroups(test, &[Controller::Cpu, Controller::Cpuset]) else {
        return;
    };
    let _rt = rt_budget();
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("SKIP {test}: needs 2 CPUs");
        return;
    }
    let mut guard = Guard::fresh(&cgroups, "headroom-exit");
    let (top, dir) = (guard.top.clone(), guard.dir.path().to_path_buf());
    // The LC: an idle process allowed on both CPUs, SCHED_OTHER.
    let lc_pid = guard.sleeper();
    let before = thread_state(lc_pid);
    assert_eq!(before.1, libc::SCHED_OTHER);
    let lc_groups_before = support::proc_cgroup(lc_pid);
    let text = format!(
        r#"
[lc]
name = "idle"
cgroup = "{top}/lc"
pids = [{lc_pid}]
[lc.threads]
pin = true
cpus = [1]
fifo_priority = 5

[[be]]
name = "spin"
cgroup = "{top}/be"
command = ["{BIN}", "antagonist", "spin", "--threads", "1", "--duration", "60"]

[policy]
kind = "blind"
[policy.blind]
poll_ms = 20
"#
    );
    let cfg = restore_config(&dir, "exit.toml", &text);
    let agent = guard.start_agent(&cfg, "exit1.log");
    let lc = top.join("lc").unwrap();
    let treated = wait_for(
        "the LC pinned on CPU 1 and SCHED_FIFO",
        Duration::from_secs(10),
        || thread_state(lc_pid) == ("1".to_string(), libc::SCHED_FIFO),
    );
    let log = || read_log(&dir, "exit1.log");
    assert!(
        treated.is_some(),
        "LC never treated: {:?}; agent log:\n{}",
        thread_state(lc_pid),
        log()
    );
    let rt_budget = cgroups.rt_runtime_us(&lc).unwrap();
    eprintln!("LC group cpu.rt_runtime_us while FIFO: {rt_budget:?}");
    if let Some(b) = rt_budget {
        assert!(b > 0, "an RT budget was given to the LC group");
    }
    let st = sigterm_and_wait(&mut guard.children[agent]);
    assert!(st.success(), "agent exit status {st}; log:\n{}", log());
    assert_eq!(
        thread_state(lc_pid),
        before,
        "LC affinity and policy restored; log:\n{}",
        log()
    );
    // The LC went back to the groups it came from, so the LC group (with its RT budget) the
    // agent created is empty and removed too.
    assert_eq!(
        support::proc_cgroup(lc_pid),
        lc_groups_before,
        "the LC is back in its original groups"
    );
    let be = top.join("be").unwrap();
    assert!(
        !cgroups.exists(&be),
        "the BE group the agent created is removed; log:\n{}",
        log()
    );
    assert!(
        !cgroups.exists(&lc),
        "the LC group the agent created is removed once the LC is back in its own"
    );
}

/// `memcached`'s `cmd_get` counter, read with `stats` (which is not a get).
fn memcached_gets(addr: std::net::SocketAddr) -> u64 {
    use std::io::Write as _;
    let mut s = std::net::TcpStream::connect(addr).expect("connect to memcached");
    s.write_all(b"stats\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "stats ended early");
        if line.starts_with("END") {
            panic!("no cmd_get in stats");
        }
        if let Some(v) = line.strip_prefix("STAT cmd_get ") {
            return v.trim().parse().unwrap();
        }
    }
}

/// Issue 30: with `[lc.latency] source = "kernel"` the agent times the LC's own requests in
/// the kernel (BPF on the LC's port) and adds no traffic: while a load generator runs,
/// `ctl status` shows the kernel sensor's window (requests counted, a finite percentile); when
/// the load stops, memcached's get counter stands still — no prober is sending.
#[test]
fn the_kernel_sensor_times_the_lcs_own_requests_and_sends_none() {
    const TEST: &str = "the_kernel_sensor_times_the_lcs_own_requests_and_sends_none";
    let Some(cgroups) = root_cgroups(TEST, &[Controller::Cpu]) else {
        return;
    };
    let Some(memcached) = support::find_memcached(TEST) else {
        return;
    };
    if let Err(e) = headroom_host::latency_bpf::LatencySensor::attach(&[1]) {
        eprintln!("SKIP {TEST}: the kernel latency sensor does not load here: {e}");
        return;
    }
    let _rt = rt_budget();
    let mut guard = Guard::fresh(&cgroups, "headroom-ksense");
    let (top, dir) = (guard.top.clone(), guard.dir.path().to_path_buf());
    let (mc, addr) = support::start_memcached(TEST, memcached);
    let mc_pid = mc.id();
    guard.children.push(mc);
    let port = addr.port();
    let text = format!(
        r#"
[lc]
name = "memcached"
cgroup = "{top}/lc"
pids = [{mc_pid}]
[lc.slo]
target_us = 100000
window_s = 1
min_samples = 100
[lc.latency]
source = "kernel"
port = {port}

[[be]]
name = "be"
cgroup = "{top}/be"

[policy]
kind = "none"
"#
    );
    let cfg = restore_config(&dir, "kernel.toml", &text);
    let agent = guard.start_agent(&cfg, "kernel.log");
    let log = || read_log(&dir, "kernel.log");
    let socket = dir.join("ctl.sock");
    let sources = || {
        headroom_agent::publish::control::request(
            &socket,
            &headroom_agent::publish::control::Request::Status,
        )
        .ok()
        .and_then(|r| r.status)
        .and_then(|s| s.lc.latency_sources)
    };

    // 3000 gets a second for 4 s from a load generator of our own.
    let mut load = Command::new(BIN)
        .args([
            "load",
            "-s",
            &addr.to_string(),
            "-q",
            "3000",
            "-t",
            "4",
            "-c",
            "4",
        ])
        .arg("--quiet")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start headroom load");
    let mut seen = None;
    wait_for(
        "a kernel window of the load's requests",
        Duration::from_secs(8),
        || {
            seen = sources().filter(|s| s.kernel_requests >= 100 && s.kernel_us.is_some());
            seen.is_some()
        },
    );
    let _ = load.wait();
    let seen = seen.unwrap_or_else(|| {
        panic!(
            "no kernel-sensor window with the load's requests; status {:?}; log:\n{}",
            sources(),
            log()
        )
    });
    assert_eq!(seen.chosen, "kernel", "{seen:?}");
    assert!(
        seen.kernel_us.is_some_and(|us| us.is_finite() && us > 0.0),
        "{seen:?}"
    );
    assert!(
        !seen.probe_running,
        "no prober without a fallback: {seen:?}"
    );

    // The load is over: nothing but the load generator sent gets, so none arrive now.
    let before = memcached_gets(addr);
    std::thread::sleep(Duration::from_millis(1500));
    let after = memcached_gets(addr);
    assert_eq!(
        after,
        before,
        "gets arrived with no load running: the agent added traffic; log:\n{}",
        log()
    );
    let st = sigterm_and_wait(&mut guard.children[agent]);
    assert!(st.success(), "agent exit status {st}; log:\n{}", log());
}
