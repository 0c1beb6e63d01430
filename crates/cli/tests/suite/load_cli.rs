//! `headroom load` as users and the bench call it: usage errors exit 2 naming the flag and value,
//! an unreachable server exits 1 naming the address, a real run writes the result JSON and CSV.

use crate::support;

use std::process::{Child, Command, Output, Stdio};

fn headroom(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
        .arg("load")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run headroom")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

struct Memcached {
    port: u16,
    child: Child,
}

/// Kills a spawned process when the test ends, passed or not.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn memcached(test: &str) -> Option<Memcached> {
    let path = support::find_memcached(test)?;
    let (child, addr) = support::start_memcached(test, path);
    Some(Memcached {
        port: addr.port(),
        child,
    })
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let o = headroom(&["-s", "127.0.0.1", "--frobnicate"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--frobnicate"), "{}", stderr(&o));
}

#[test]
fn bad_distribution_is_a_usage_error_naming_flag_and_value() {
    let o = headroom(&["-s", "127.0.0.1:1", "-i", "wibble:3"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("-i/--iadist") && e.contains("wibble:3"), "{e}");
    let o = headroom(&["-s", "127.0.0.1:1", "-V", "normal:3"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("-V/--valuesize"), "{}", stderr(&o));
}

#[test]
fn malformed_values_are_usage_errors() {
    for (args, needle) in [
        (vec!["-s", "127.0.0.1:1", "--scan", "10:5"], "--scan"),
        (vec!["-s", "127.0.0.1:1", "--search", "100:5"], "--search"),
        (vec!["-s", "127.0.0.1:1", "-q", "lots"], "--qps"),
        (
            vec!["-s", "127.0.0.1:1", "--protocol", "http"],
            "--protocol",
        ),
        (vec!["-s", "127.0.0.1:1", "-u", "1.5"], "-u/--update"),
        (vec!["-s", "127.0.0.1:1", "-t", "1e300"], "-t/--time"),
        (vec!["-s", "127.0.0.1:1", "-V", "1e12"], "-V/--valuesize"),
        (
            vec!["-s", "127.0.0.1:1", "-t", "1e300", "-u", "1.5"],
            "2 problems: ",
        ),
        (vec!["-q", "100"], "-s/--server"),
    ] {
        let o = headroom(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn unreachable_server_exits_1_naming_it() {
    let refusing = headroom_load::testkit::RefusingPort::new().unwrap();
    let port = refusing.port().to_string();
    let server = format!("127.0.0.1:{port}");
    let o = headroom(&["-s", &server, "-q", "100", "-t", "1", "--noload"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains(&server), "{}", stderr(&o));
    // The refusal is said once, not once by the error and again as its source.
    let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED).to_string();
    assert_eq!(stderr(&o).matches(&refused).count(), 1, "{}", stderr(&o));
}

#[test]
fn a_real_run_writes_json_and_csv() {
    let Some(mc) = memcached("a_real_run_writes_json_and_csv") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let csv = dir.path().join("r.csv");
    let server = format!("127.0.0.1:{}", mc.port);
    let o = headroom(&[
        "-s",
        &server,
        "-q",
        "1000",
        "-t",
        "1",
        "-r",
        "500",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
        // This test is about the outputs; 1000 samples sit at p99's threshold, so the checks
        // may fail on a busy machine (their exit status has its own test).
        "--invalid-exit-code",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("#type") && table.contains("99.9th") && table.contains("Checks:"),
        "{table}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["version"], 1);
    assert_eq!(v["target_qps"], 1000.0);
    assert!(v["read"]["count"].as_u64().unwrap() > 800);
    assert_eq!(v["misses"], 0);
    assert!(v["read"]["p99_ci_us"].as_array().unwrap().len() == 2);
    assert!(v["client"]["send_lag_p99_us"].is_number());
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv.lines().count(), 2);
    assert!(csv.starts_with("target_qps,achieved_qps,valid,"));
}

#[test]
fn loadonly_preloads_and_exits() {
    let Some(mc) = memcached("loadonly_preloads_and_exits") else {
        return;
    };
    let server = format!("127.0.0.1:{}", mc.port);
    let o = headroom(&["-s", &server, "-r", "2000", "--loadonly"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Loaded 2000 records"));
}

#[test]
fn agent_subcommand_serves_a_master() {
    let Some(mc) = memcached("agent_subcommand_serves_a_master") else {
        return;
    };
    // Both spellings of agent mode, each on a port the OS gives it, read back from the agent's
    // own "listening on" line: that line is written after the bind, so the agent is ready.
    let (_agent, port) = start_load_agent(&["load", "agent", "--bind", "127.0.0.1", "--port", "0"]);
    let (agent, port2) = start_load_agent(&["load", "-A", "--bind", "127.0.0.1", "-p", "0"]);
    let server = format!("127.0.0.1:{}", mc.port);
    let (spec1, spec2) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{port2}"));
    let o = headroom(&[
        "-s",
        &server,
        "-q",
        "600",
        "-t",
        "1",
        "-a",
        &spec1,
        "-a",
        &spec2,
        "--invalid-exit-code",
        "0",
    ]);
    drop(agent);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("3 client(s)"));
}

/// A `headroom load` agent and the port it reports it listens on.
fn start_load_agent(args: &[&str]) -> (Guard, u16) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let guard = Guard(child);
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let port = line
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or_else(|| panic!("no port in the agent's first line: {line:?}"));
    // Keep draining its stderr so the agent never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    (guard, port)
}

#[test]
fn failed_self_checks_exit_3_unless_told_otherwise() {
    // A server that accepts and closes every connection: every request is lost, the errors
    // check fails, the result is printed and the exit status says it is not valid.
    let server = headroom_load::testkit::ClosingServer::start().expect("start");
    let addr = server.addr().to_string();
    let base = ["-s", &addr, "-q", "200", "-t", "1", "--noload", "--quiet"];
    let out = headroom(&base);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "stdout {text} stderr {}",
        stderr(&out)
    );
    assert!(text.contains("[FAIL] errors"), "{text}");
    assert!(
        stderr(&out).contains("self-checks failed"),
        "{}",
        stderr(&out)
    );
    let mut zero = base.to_vec();
    zero.extend(["--invalid-exit-code", "0"]);
    let out = headroom(&zero);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn mutilate_flags_parse_with_their_meaning_or_a_clear_refusal() {
    let server = headroom_load::testkit::Mm1Server::start(20_000.0, 1).expect("start");
    let addr = server.addr().to_string();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let o = headroom(&[
        "-s",
        &addr,
        "-q",
        "200",
        "-t",
        "0.5",
        "--noload",
        "--quiet",
        "-B",
        "-R",
        "-S",
        "--moderate",
        "--no_nodelay",
        "-W",
        "0.2",
        "-l",
        "2",
        "--invalid-exit-code",
        "0",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["skipped"].is_u64(), "{v}");
    for (args, want) in [
        (vec!["-U", "me"], "not supported: SASL"),
        (vec!["-P", "secret"], "not supported: SASL"),
        (vec!["-l", "0"], "-l/--lambda_mul"),
        (vec!["--wait=-1"], "-W/--wait"),
    ] {
        let mut all = vec!["-s", addr.as_str(), "-q", "100", "-t", "0.2", "--noload"];
        all.extend(args.iter().copied());
        let o = headroom(&all);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
}

/// `headroom serve` on a free loopback port (its first stdout line names the address).
fn serve() -> (Guard, String) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(["serve", "--port", "0", "--threads", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn headroom serve");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read the listening line");
    let addr = line
        .split_whitespace()
        .find_map(|w| w.parse::<std::net::SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (Guard(child), addr.to_string())
}

/// One 2 s run at 2000/s against `server` with `--engine engine` (none: the default); the result
/// JSON and stderr (None when io_uring was asked for and this kernel or sandbox refuses it).
fn engine_run(
    server: &str,
    engine: Option<&str>,
    env: Option<(&str, &str)>,
) -> Option<(serde_json::Value, String)> {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_headroom"));
    cmd.args([
        "load", "-s", server, "-q", "2000", "-t", "2", "-c", "4", "--quiet",
    ])
    .args(["--seed", "3", "--invalid-exit-code", "0", "--json"])
    .arg(&json)
    .args(engine.map(|e| ["--engine", e]).into_iter().flatten())
    .stdin(Stdio::null());
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run headroom load");
    if engine == Some("io_uring") && stderr(&out).contains("io_uring unavailable") {
        return None;
    }
    assert!(out.status.success(), "{engine:?}: {}", stderr(&out));
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    Some((v, stderr(&out)))
}

#[test]
fn both_engines_measure_headroom_serve_alike() {
    let (_guard, server) = serve();
    let (epoll, _) = engine_run(&server, Some("epoll"), None).expect("epoll runs everywhere");
    let Some((uring, _)) = engine_run(&server, Some("io_uring"), None) else {
        eprintln!("SKIP both_engines_measure_headroom_serve_alike: io_uring unavailable here");
        return;
    };
    let p50 = |v: &serde_json::Value| v["read"]["p50_us"].as_f64().unwrap();
    let qps = |v: &serde_json::Value| v["achieved_qps"].as_f64().unwrap();
    eprintln!(
        "headroom serve at 2000/s: epoll p50 {:.1} us, {:.0}/s; io_uring p50 {:.1} us, {:.0}/s",
        p50(&epoll),
        qps(&epoll),
        p50(&uring),
        qps(&uring)
    );
    assert_eq!(epoll["client"]["engine"], "epoll");
    assert_eq!(uring["client"]["engine"], "io_uring");
    for v in [&epoll, &uring] {
        assert_eq!(v["errors"], 0, "{v}");
        assert!((qps(v) - 2000.0).abs() < 100.0, "{v}");
        assert!(v["client"].get("engine_fallback_reason").is_none(), "{v}");
    }
    // The same server, the same schedule, both timed from kernel stamps: medians of the same
    // order (a loaded 2-vCPU host moved one to 177 µs against 74 µs; an engine charging its own
    // lateness reads milliseconds).
    let (a, b) = (p50(&epoll), p50(&uring));
    assert!(
        a.max(b) < 3.0 * a.min(b) + 100.0,
        "epoll {a} us vs io_uring {b} us"
    );
}

#[test]
fn the_default_engine_is_io_uring_where_the_kernel_allows_it() {
    let (_guard, server) = serve();
    let (v, err) = engine_run(&server, None, None).expect("the default always runs");
    if err.contains("io_uring unavailable") {
        // This kernel or sandbox refuses io_uring: the default is epoll, with the reason.
        assert_eq!(v["client"]["engine"], "epoll", "{v}");
        assert!(v["client"]["engine_fallback_reason"].is_string(), "{v}");
        eprintln!("SKIP the_default_engine_is_io_uring_where_the_kernel_allows_it: {err}");
        return;
    }
    assert_eq!(v["client"]["engine"], "io_uring", "{v}");
    assert!(v["client"].get("engine_fallback_reason").is_none(), "{v}");
}

#[test]
fn io_uring_refused_falls_back_to_epoll_with_the_reason() {
    let (_guard, server) = serve();
    let env = ("HEADROOM_LOAD_SIMULATE_IO_URING_ERROR", "EPERM");
    // The default (auto) falls back.
    let (v, err) = engine_run(&server, None, Some(env)).expect("the default falls back");
    assert_eq!(v["client"]["engine"], "epoll", "{v}");
    let reason = v["client"]["engine_fallback_reason"].as_str().unwrap();
    assert!(reason.contains("io_uring unavailable"), "{reason}");
    assert!(reason.contains("Operation not permitted"), "{reason}");
    assert!(err.contains(reason), "the reason is printed: {err}");
    assert!(err.contains("using epoll"), "{err}");
    assert!(
        v["completed"].as_u64().unwrap() > 3000,
        "the run worked: {v}"
    );
    // Asked for by name, io_uring that cannot run is an error naming the flag, not a fallback.
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "load", "-s", &server, "-q", "100", "-t", "1", "--engine", "io_uring",
        ])
        .env(env.0, env.1)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--engine"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("io_uring unavailable"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_rate_the_server_cannot_carry_exits_3_naming_what_limited_it() {
    // One FIFO server at 2000/s offered 6000/s with -c auto: the connections grow to their cap,
    // replies queue at the server, and the run says so (stdout, stderr, JSON) and exits 3.
    let server = headroom_load::testkit::Mm1Server::start(2000.0, 5).expect("start");
    let addr = server.addr().to_string();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let json_s = json.to_str().unwrap();
    let out = headroom(&[
        "-s", &addr, "-q", "6000", "-t", "1", "-c", "auto", "--noload", "--quiet", "--fifo", "10",
        "--json", json_s,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text} {}", stderr(&out));
    assert!(
        stderr(&out).contains("rate not carried: limited by server: reached"),
        "{}",
        stderr(&out)
    );
    assert!(text.contains("Scheduling: SCHED_"), "{text}");
    assert!(
        text.contains("Connections: ") && text.contains("(auto: "),
        "{text}"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let client = &r["client"];
    assert!(client["limited_by"]
        .as_str()
        .unwrap()
        .starts_with("server:"));
    assert_eq!(client["connections"]["mode"], "auto");
    assert!(
        client["connections"]["grown"].as_u64().unwrap() > 0,
        "{client}"
    );
    // --fifo 10: granted (root, a real-time budget) or refused with the errno; either is said,
    // and a granted class may carry what it cost (ticks throttled by the real-time budget).
    let why = client["sched_reason"].as_str().unwrap();
    assert!(
        why == "--fifo 10"
            || why.starts_with("--fifo 10; ")
            || why.starts_with("SCHED_FIFO 10 refused ("),
        "{why}"
    );
    assert_eq!(
        headroom(&["-s", &addr, "-c", "many"]).status.code(),
        Some(2),
        "-c takes a number or auto"
    );
}
