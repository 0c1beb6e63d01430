//! `headroom antagonist` as a process: the square wave's duty cycle from its own /proc CPU time,
//! every kind's progress feed (contract 5) and the stability of its rate, bad input → exit 2.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_headroom");

/// The CPU-heavy tests measure rates and CPU time: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Kills the child on drop (a failing assertion must not leave a spinner behind).
struct Guard(Option<Child>);

impl Guard {
    fn pid(&self) -> u32 {
        self.0.as_ref().expect("child").id()
    }
    /// Hands the child back (it is then the caller's to wait for).
    fn take(mut self) -> Child {
        self.0.take().expect("child")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .arg("antagonist")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn headroom antagonist");
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("antagonist {args:?} did not finish within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// CPU seconds (user + system) of `pid` from /proc/PID/stat.
fn proc_cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}

#[test]
fn square_wave_duty_cycle_matches_on_over_period() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let child = Command::new(BIN)
        .args([
            "antagonist",
            "square",
            "--on-ms",
            "6",
            "--off-ms",
            "42",
            "--duration",
            "4",
            "--threads",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let g = Guard(Some(child));
    let pid = g.pid();
    // Skip start-up, then measure over 3 s (≈ 62 periods).
    std::thread::sleep(Duration::from_millis(500));
    let (t0, c0) = (Instant::now(), proc_cpu_s(pid));
    std::thread::sleep(Duration::from_millis(3000));
    let (t1, c1) = (Instant::now(), proc_cpu_s(pid));
    drop(g);
    let duty = (c1 - c0) / (t1 - t0).as_secs_f64();
    let expected = 6.0 / 48.0;
    eprintln!("square 6/42: measured duty cycle {duty:.4} (expected {expected:.4})");
    assert!(
        (duty - expected).abs() <= 0.10 * expected,
        "duty cycle {duty:.4} not within ±10% of {expected:.4}"
    );
}

/// One 2-second run: the summary's rate (ops per wall second), and between the first and last
/// progress lines the rate per CPU-second of the process and its CPU share.
struct Rate {
    wall: f64,
    per_cpu_s: f64,
    cpu_share: f64,
}

/// Runs one kind for 2 s with a progress file and checks the file.
fn measured_rate(kind_args: &[&str], dir: &Path, run_no: usize) -> Rate {
    let progress = dir.join(format!("{}-{run_no}.jsonl", kind_args[0]));
    let mut args: Vec<&str> = kind_args.to_vec();
    let progress_s = progress.to_str().unwrap().to_string();
    args.extend(["--duration", "2", "--progress", &progress_s]);
    let out = run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    let text = std::fs::read_to_string(&progress).expect("progress file written");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad progress line {l:?}: {e}")))
        .collect();
    assert!(
        lines.len() >= 2,
        "{args:?}: expected ≥ 2 progress lines, got {text:?}"
    );
    let mut last_total = 0;
    for l in &lines {
        assert!(l["t_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
        assert_eq!(
            l["kind"].as_str().unwrap(),
            if kind_args[0] == "net" && kind_args.contains(&"--sink-only") {
                "net-sink"
            } else {
                kind_args[0]
            }
        );
        assert!(
            l["ops_per_s"].as_f64().unwrap() > 0.0,
            "{args:?}: non-positive rate in {l}"
        );
        let total = l["ops_total"].as_u64().unwrap();
        assert!(total >= last_total, "ops_total went backwards");
        last_total = total;
        assert!(l["threads"].as_u64().unwrap() >= 1);
    }
    let summary: Value = serde_json::from_slice(
        out.stdout
            .split(|&b| b == b'\n')
            .rfind(|l| !l.is_empty())
            .unwrap(),
    )
    .expect("summary JSON on stdout");
    let wall = summary["ops_per_s"].as_f64().unwrap();
    assert!(wall > 0.0);
    let (first, last) = (&lines[0], &lines[lines.len() - 1]);
    let d_ops = (last["ops_total"].as_u64().unwrap() - first["ops_total"].as_u64().unwrap()) as f64;
    let d_cpu = last["cpu_s"].as_f64().unwrap() - first["cpu_s"].as_f64().unwrap();
    let d_t = (last["t_unix_ms"].as_u64().unwrap() - first["t_unix_ms"].as_u64().unwrap()) as f64
        / 1000.0;
    Rate {
        wall,
        per_cpu_s: d_ops / d_cpu.max(1e-6),
        cpu_share: d_cpu / d_t.max(1e-6),
    }
}

/// The 1-minute load average and the number of online CPUs.
fn load_average() -> (f64, usize) {
    let load1 = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (load1, cpus)
}

fn stable(a: f64, b: f64) -> bool {
    (a - b).abs() <= 0.2 * (a + b) / 2.0
}

#[test]
fn every_kind_reports_progress_at_a_stable_rate() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let disk_dir = dir.path().join("disk");
    std::fs::create_dir(&disk_dir).unwrap();
    let disk_dir_s = disk_dir.to_str().unwrap().to_string();
    let mut kinds: Vec<Vec<&str>> = vec![
        vec!["spin", "--threads", "1"],
        vec!["power", "--threads", "1"],
        vec!["llc", "--fraction", "0.25", "--threads", "1"],
        vec!["dram", "--mb", "64", "--threads", "1"],
        vec!["mix", "--mb", "64", "--threads", "1"],
        vec!["square", "--on-ms", "6", "--off-ms", "42"],
        vec!["memory", "--mb", "32", "--rate-mb-s", "40"],
        vec!["disk", "--path", &disk_dir_s, "--file-mb", "4"],
        // 64 KiB messages: the rate is bound by the kernel's copy, not by whether sender and sink
        // happen to share a CPU. With 256-byte messages it is bound by wake-ups, and runs differed
        // by 25-35% with the scheduler's placement (fresh-clone CI failure, 299k vs 222k msg/s);
        // at 64 KiB ten runs here stayed within 61k-69k msg/s.
        vec![
            "net",
            "--to",
            "127.0.0.1:0",
            "--sink",
            "--flows",
            "2",
            "--size",
            "65536",
        ],
    ];
    let has_smt_sibling =
        std::fs::read_to_string("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
            .map(|s| s.trim().contains([',', '-']))
            .unwrap_or(false);
    if has_smt_sibling {
        kinds.push(vec!["ht", "--cpu", "0"]);
    } else {
        eprintln!("SKIP ht rate: CPU 0 has no SMT sibling here (its error path is tested in bad_input_exits_2)");
    }
    for kind in &kinds {
        let mut verdict = Err(String::new());
        // The shared machine can take a large share of the CPU from one run: measure the pair up
        // to twice. When the two runs got different CPU shares, their wall rates are not
        // comparable, and the rate per CPU-second the antagonist achieved is judged instead.
        for attempt in 0..3 {
            let a = measured_rate(kind, dir.path(), 2 * attempt + 1);
            let b = measured_rate(kind, dir.path(), 2 * attempt + 2);
            eprintln!(
                "{:<8} wall {:>12.1} {:>12.1} ops/s | per CPU-s {:>12.1} {:>12.1} | CPU share {:.2} {:.2}",
                kind[0], a.wall, b.wall, a.per_cpu_s, b.per_cpu_s, a.cpu_share, b.cpu_share
            );
            if stable(a.wall, b.wall) {
                verdict = Ok(());
                break;
            }
            // Loopback traffic: most of the work is the kernel's (softirq, often charged to
            // whichever thread or ksoftirqd is on the CPU), so on 2 CPUs its rate swings with
            // where that work lands — a fresh-clone CI run read 42.7k vs 75.6k and 79.6k vs
            // 56.9k ops/s in back-to-back halves. For it, "stable" is: both halves make
            // progress and agree within a factor of 2.
            if kind[0] == "net"
                && a.wall > 0.0
                && b.wall > 0.0
                && a.wall.max(b.wall) <= 2.0 * a.wall.min(b.wall)
            {
                eprintln!("net: both runs progressed, within a factor of 2 (loopback variance)");
                verdict = Ok(());
                break;
            }
            if !stable(a.cpu_share, b.cpu_share) && stable(a.per_cpu_s, b.per_cpu_s) {
                eprintln!(
                    "{}: CPU share differed between runs; rate per CPU-second agrees",
                    kind[0]
                );
                verdict = Ok(());
                break;
            }
            verdict = Err(format!(
                "{kind:?}: rates {:.1} and {:.1} ops/s (per CPU-second {:.1} and {:.1}) differ by more than 20%",
                a.wall, b.wall, a.per_cpu_s, b.per_cpu_s
            ));
        }
        if let Err(e) = verdict {
            // A CPU hog's rate is the CPU it is given: on a machine that other tenants keep
            // overloaded the comparison says nothing about the antagonist, so it is skipped
            // (loudly) there and enforced everywhere else (CI runs on an otherwise idle VM).
            let (load1, cpus) = load_average();
            if load1 > 2.0 * cpus as f64 {
                eprintln!(
                    "SKIP stability of {}: load average {load1:.1} on {cpus} CPUs: {e}",
                    kind[0]
                );
            } else {
                panic!("{e}");
            }
        }
    }
    // The disk antagonist removes its scratch files.
    assert_eq!(
        std::fs::read_dir(&disk_dir).unwrap().count(),
        0,
        "disk files left behind"
    );
}

#[test]
fn sigterm_stops_an_unbounded_run_with_a_summary() {
    let child = Command::new(BIN)
        .args(["antagonist", "memory", "--mb", "8", "--rate-mb-s", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let g = Guard(Some(child));
    std::thread::sleep(Duration::from_millis(700));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(g.pid() as i32, libc::SIGTERM) }, 0);
    let out = g.take().wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();
    assert_eq!(summary["kind"], "memory");
    assert!(summary["ops_total"].as_u64().unwrap() >= 5);
}

#[test]
fn bad_input_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let no_dir = tmp.path().join("missing/dir/progress.jsonl");
    let no_dir_s = no_dir.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["bogus"], "unknown antagonist kind"),
        (vec!["spin", "--duration", "-1"], "--duration"),
        (vec!["spin", "--duration", "0"], "--duration"),
        // Panicked (Duration::from_secs_f64) before it was bounded.
        (vec!["spin", "--duration", "1e300"], "at most"),
        (vec!["spin", "--progress", no_dir_s], "progress file"),
        (vec!["spin", "--threads", "0"], "--threads"),
        (vec!["spin", "--cpus", "3-1"], "--cpus"),
        (vec!["spin", "--cpus", "4000"], "CPU"),
        (vec!["llc", "--fraction", "-1"], "--fraction"),
        (vec!["square", "--on-ms", "0"], "--on-ms"),
        (vec!["square", "--off-ms", "-5"], "--off-ms"),
        (vec!["net"], "--to"),
        (vec!["net", "--to", "nonsense"], "--to"),
        (vec!["net", "--to", "203.0.113.7:9"], "loopback"),
        (
            vec!["net", "--to", "127.0.0.1:0", "--sink", "--flows", "0"],
            "--flows",
        ),
        (vec!["disk"], "--path"),
        (
            vec!["disk", "--path", "/nonexistent/dir"],
            "not an existing directory",
        ),
        (vec!["memory", "--rate-mb-s", "-3"], "--rate-mb-s"),
        (vec!["ht"], "--cpu"),
    ];
    for (args, needle) in cases {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: stderr {stderr:?} lacks {needle:?}"
        );
    }
    // ht on a CPU without an SMT sibling is refused clearly (exit 2); with one it runs.
    let siblings =
        std::fs::read_to_string("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
            .unwrap_or_default();
    if !siblings.trim().contains([',', '-']) {
        let out = run(&["ht", "--cpu", "0", "--duration", "1"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("no SMT sibling"), "{stderr}");
    }
}
