//! `headroom bench agent`: the agent's own cost and speed.
//!
//! - CPU use of a running `headroom agent` (blind, B = 1, no BE command, no decision log) at
//!   `poll_ms` = 1 and 10 over `--seconds` (default 10): the child's user+system time from
//!   getrusage(RUSAGE_CHILDREN), as a percentage of one CPU.
//! - Reaction time from a load step to the BE shrink: BE spins in its group on CPU 0, the LC
//!   (an idle process) is pinned on CPU 1; a step starts a spinner pinned on CPU 1 in the LC
//!   group and the time until the BE cpuset or freezer file changes is measured; the spinner is
//!   stopped and BE allowed to grow back before the next step (`--steps`, default 50).
//!
//! Needs root and writable cgroups; groups and processes are removed at the end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use headroom_host::{Cgroups, FreezeState, GroupPath, LinuxHost};

#[derive(clap::Parser, Debug)]
#[command(name = "headroom bench agent", no_binary_name = true)]
struct Flags {
    /// Seconds of each CPU-use measurement
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Load steps for the reaction time
    #[arg(long, default_value_t = 50)]
    steps: usize,
    /// poll_ms of the reaction-time agent
    #[arg(long, default_value_t = 1)]
    poll_ms: u64,
}

/// A scratch directory removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Cleanup {
    cgroups: Cgroups,
    top: GroupPath,
    children: Vec<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for name in ["be", "lc"] {
            let Ok(g) = self.top.join(name) else { continue };
            if !self.cgroups.exists(&g) {
                continue;
            }
            let _ = self.cgroups.thaw(&g);
            for _ in 0..50 {
                let procs = self.cgroups.procs(&g).unwrap_or_default();
                if procs.is_empty() {
                    break;
                }
                for pid in procs {
                    // SAFETY: kill(2) on processes of the benchmark's own group.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.cgroups.remove(&self.top);
    }
}

fn children_cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn write_config(
    dir: &Path,
    top: &GroupPath,
    poll_ms: u64,
    lc_pid: u32,
    be_command: bool,
) -> PathBuf {
    let bin = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("headroom"));
    let be_cmd = if be_command {
        format!(
            "command = [\"{}\", \"antagonist\", \"spin\", \"--threads\", \"2\", \"--duration\", \"600\"]",
            bin.display()
        )
    } else {
        String::new()
    };
    let text = format!(
        "[lc]\nname = \"lc\"\ncgroup = \"{top}/lc\"\npids = [{lc_pid}]\n\n[[be]]\nname = \"be\"\ncgroup = \"{top}/be\"\n{be_cmd}\n\n\
         [policy]\nkind = \"blind\"\n[policy.blind]\nbuffer_cores = 1\npoll_ms = {poll_ms}\ngrow_interval_ms = {poll_ms}\n\n\
         [safety]\non_exit = \"restore\"\nstate_file = \"{d}/state.json\"\n\n[api]\nsocket = \"{d}/ctl.sock\"\n",
        d = dir.display()
    );
    let path = dir.join(format!("agent-{poll_ms}ms.toml"));
    std::fs::write(&path, text).expect("writing the bench config");
    path
}

fn pinned(args: &[&str], cpu: usize) -> Command {
    use std::os::unix::process::CommandExt;
    let bin = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("headroom"));
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: sched_setaffinity of the child itself before exec.
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
    cmd
}

pub fn run(out: Option<PathBuf>, rest: &[String]) -> anyhow::Result<()> {
    use clap::Parser;
    let flags = Flags::try_parse_from(rest).map_err(|e| super::super::usage(e.to_string()))?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("headroom bench agent needs root (it creates cgroups)");
    }
    let cgroups = LinuxHost::system().cgroups().context("cgroups")?;
    let top = GroupPath::new(&format!("headroom-bench-agent-{}", std::process::id()))?;
    let dir = ScratchDir(
        std::env::temp_dir().join(format!("headroom-bench-agent-{}", std::process::id())),
    );
    std::fs::create_dir_all(dir.path())?;
    let mut clean = Cleanup {
        cgroups: cgroups.clone(),
        top: top.clone(),
        children: Vec::new(),
    };
    let bin = std::env::current_exe()?;
    // The LC: an idle process pinned on CPU 1.
    let lc = pinned(
        &[
            "antagonist",
            "square",
            "--on-ms",
            "0",
            "--off-ms",
            "1000",
            "--duration",
            "900",
        ],
        1,
    )
    .spawn()
    .context("starting the idle LC")?;
    let lc_pid = lc.id();
    clean.children.push(lc);

    let mut report = serde_json::Map::new();
    println!(
        "headroom bench agent  ({} CPUs, kernel {})",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    for poll_ms in [1u64, 10] {
        let cfg = write_config(dir.path(), &top, poll_ms, lc_pid, false);
        let before = children_cpu_s();
        let start = Instant::now();
        let status = Command::new(&bin)
            .args(["agent", "--config"])
            .arg(&cfg)
            .args(["--duration", &flags.seconds.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running the agent")?;
        let wall = start.elapsed().as_secs_f64();
        let cpu = children_cpu_s() - before;
        if !status.success() {
            bail!("agent at poll_ms {poll_ms} exited with {status}");
        }
        let pct = 100.0 * cpu / flags.seconds;
        println!(
            "cpu use at poll_ms = {poll_ms:>2}: {cpu:.3} s CPU over {:.1} s = {pct:.2}% of one CPU (wall incl. start/stop {wall:.1} s)",
            flags.seconds
        );
        report.insert(format!("cpu_pct_poll_{poll_ms}ms"), serde_json::json!(pct));
    }

    // Reaction time.
    let cfg = write_config(dir.path(), &top, flags.poll_ms, lc_pid, true);
    let agent = Command::new(&bin)
        .args(["agent", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    clean.children.push(agent);
    let be = top.join("be")?;
    let lc_group = top.join("lc")?;
    let state = |cg: &Cgroups| -> (String, bool) {
        (
            cg.cpuset_cpus(&be).map(|c| c.to_list()).unwrap_or_default(),
            cg.freeze_state(&be)
                .map(|s| s != FreezeState::Thawed)
                .unwrap_or(true),
        )
    };
    let mut reactions: Vec<f64> = Vec::new();
    let mut no_baseline = 0usize;
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..flags.steps {
        // Wait for BE to be running (grown back) before stepping.
        let t = Instant::now();
        let mut ready = false;
        while t.elapsed() < Duration::from_secs(3) {
            if !state(&cgroups).1 {
                ready = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if !ready {
            no_baseline += 1;
            continue;
        }
        let before = state(&cgroups);
        let mut step = pinned(
            &["antagonist", "spin", "--cpus", "1", "--duration", "10"],
            1,
        )
        .spawn()?;
        let t0 = Instant::now();
        let _ = cgroups.move_process(&lc_group, step.id() as i32);
        let mut reacted = None;
        while t0.elapsed() < Duration::from_secs(2) {
            if state(&cgroups) != before {
                reacted = Some(t0.elapsed());
                break;
            }
            std::hint::spin_loop();
        }
        let _ = step.kill();
        let _ = step.wait();
        if let Some(r) = reacted {
            reactions.push(r.as_secs_f64() * 1000.0);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reactions.sort_by(f64::total_cmp);
    let median = reactions.get(reactions.len() / 2).copied();
    let max = reactions.last().copied();
    println!(
        "reaction (poll_ms = {}): {} steps measured, median {} ms, max {} ms{}",
        flags.poll_ms,
        reactions.len(),
        median.map_or("-".into(), |m| format!("{m:.2}")),
        max.map_or("-".into(), |m| format!("{m:.2}")),
        if no_baseline > 0 {
            format!(
                "; {no_baseline} steps skipped: BE never ran (no idle CPU — load average {})",
                std::fs::read_to_string("/proc/loadavg")
                    .unwrap_or_default()
                    .trim()
            )
        } else {
            String::new()
        }
    );
    report.insert("reaction_ms_median".into(), serde_json::json!(median));
    report.insert("reaction_ms_max".into(), serde_json::json!(max));
    report.insert(
        "reaction_steps_measured".into(),
        serde_json::json!(reactions.len()),
    );
    report.insert(
        "reaction_steps_skipped".into(),
        serde_json::json!(no_baseline),
    );
    drop(clean);
    if let Some(out) = out {
        std::fs::create_dir_all(&out)?;
        let p = out.join("bench-agent.json");
        std::fs::write(
            &p,
            serde_json::to_string_pretty(&serde_json::Value::Object(report))?,
        )?;
        println!("wrote {}", p.display());
    }
    Ok(())
}
